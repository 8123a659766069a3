"""Small journal events for storage tests: a model call of given token ids, a tool call of given output."""

from __future__ import annotations

from gym_bridge.core.journal_event import ModelEvent, ToolEvent


def model(ids: list[int]) -> ModelEvent:
    """A model call that generated `ids` (log-probs 0, finish `stop`) from an empty prompt."""
    return ModelEvent(prompt_delta=[], prompt_length=0, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def tool(output: str) -> ToolEvent:
    """A call of tool `t` without arguments that returned `output`."""
    return ToolEvent(name="t", arguments="{}", output=output)
