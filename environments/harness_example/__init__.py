"""harness_example: an existing agent program (`agent.py`, a plain `openai` tool loop) is the rollout.

gym_bridge serves the agent an OpenAI-compatible endpoint in front of the run's policy and captures
every call's tokens; the agent runs its own `add` / `multiply` tools. The reward is 1.0 when the
agent's final answer contains the row's `expected_answer`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gym_bridge import HarnessEnvironment, Task, VerifyResult

class HarnessExampleEnvironment(HarnessEnvironment):
    name = "harness_example"
    description = "Arithmetic solved by an external openai-package agent with its own add/multiply tools."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    command = (sys.executable, str(Path(__file__).with_name("agent.py")))
    harness_timeout_s = 120.0
    resume = "restart"  # the agent program's own loop and tools cannot be picked up mid-run (HarnessEnvironment's kind)

    def score(self, task: Task, answer: str) -> VerifyResult:
        expected = str(task.get("expected_answer", ""))
        numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
        right = bool(expected) and expected in numbers
        return VerifyResult(reward=float(right), metrics={"answer": answer[-200:]})

