"""Seeing rollouts: `gym-bridge show` (a transcript in the terminal), `gym-bridge view` (one
self-contained HTML report) and `gym-bridge export --format atif` (Harbor's trajectory format).

Everything here reads rollout records (the JSONL lines of `gym-bridge eval`) after the run;
nothing here runs rollouts.
"""
