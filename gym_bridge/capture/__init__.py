"""Capture: an OpenAI-compatible endpoint in front of a token policy, so an existing agent
program (a harness) can be run, scored and trained token-exactly; see `harness.py`."""
