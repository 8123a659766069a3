"""multi_step: look up several values, then submit them in order (NeMo Gym's `example_multi_step`).

The model calls `get_synonym_value` for each synonym named in the prompt, then submits the values
with `extract_synonym_values`. The last submission is graded: reward 1.0 iff it equals the row's
`expected_synonym_values` in order. The values are code-point sums, a deterministic stand-in
for a lookup; what is learned is the tool workflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym_bridge import Environment, Item, Task, VerifyResult, tool


class MultiStepEnvironment(Environment):
    name = "multi_step"
    aliases = ("example_multi_step", "example_multi_step_simple_agent")
    description = "Look up a value per synonym, then submit all values in order; reward 1 for an exact match."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # pure tools: replayed outputs always match
    inline_sync_tools = True  # the tools are quick pure functions

    @tool
    def get_synonym_value(self, synonym: str) -> dict[str, int]:
        """Get the value of a synonym.

        Args:
            synonym: The synonym, exactly as written in the instructions.
        """
        return {"synonym_value": sum(map(ord, synonym))}

    @tool
    def extract_synonym_values(self, synonym_values: list[int]) -> dict[str, bool]:
        """Submit the values of all synonyms, in the order they were listed.

        Args:
            synonym_values: One value per synonym, from get_synonym_value.
        """
        return {"success": True}

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        expected = list(task.get("expected_synonym_values") or [])
        actual = last_submission(output)
        accuracy = actual == expected
        overlap = len(set(actual) & set(expected)) / len(expected) if expected else float(not actual)
        return VerifyResult(
            reward=float(accuracy),
            metrics={
                "accuracy": accuracy,
                "set_overlap": overlap,
                "parsed_synonym_values": actual,
                "original_term_minefield_hit": task.get("minefield_label") in actual
                or task.get("minefield_label_value") in actual,
                "order_instruction_following_failure": not accuracy and overlap == 1.0,
            },
        )


def last_submission(output: list[Item]) -> list[int]:
    """The `synonym_values` of the last `extract_synonym_values` call; [] if none or malformed."""
    for item in reversed(output):
        if item["type"] == "function_call" and item["name"] == "extract_synonym_values":
            try:
                values: Any = json.loads(item["arguments"]).get("synonym_values")
            except (json.JSONDecodeError, AttributeError):
                return []
            if isinstance(values, list) and all(type(value) is int for value in values):
                return values
            return []
    return []
