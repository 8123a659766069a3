"""Capture: an OpenAI-compatible endpoint in front of a token policy, so an existing agent
program (a harness) can be run, scored and trained token-exactly.

`assembly` merges captured calls into token segments; `session` serves one rollout's calls from a
token policy, `chat_session` from a chat policy that returns token ids (NeMo RL's, behind `/run`),
each holding a `ledger` (what both keep, and call admission);
`server` is the loopback HTTP server; `harness` runs a command or callable with limits;
`environment` is the `harness` environment kind (`HarnessEnvironment`, `HarnessLoop`).
"""

from gym_bridge.capture.assembly import Assembly, CapturedCall, assemble
from gym_bridge.capture.environment import HarnessEnvironment, HarnessLoop

__all__ = ["Assembly", "CapturedCall", "HarnessEnvironment", "HarnessLoop", "assemble"]
