"""The rollout record: one finished (or failed) rollout, as the engine hands it out.

`to_dict()` gives DESIGN.md's JSONL line: the input row's fields, a Responses object whose
output is the trajectory (token fields on the last item of each model call), the verify
result, identity (`env`, `env_path`, `task_index`, `repeat_index`), the flat `tokens` view and `metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from gym_bridge.core.errors import FailureKind
from gym_bridge.core.items import Item
from gym_bridge.core.task import Task
from gym_bridge.core.trajectory import TokenView

__all__ = ["LoopFinish", "RolloutFinish", "RolloutRecord"]

LoopFinish = Literal["answer", "max_turns", "length", "budget"]
"""How an agent loop ended a rollout: `answer`, `max_turns`, `length` (a model call hit its token
limit) or `budget` (the completion token budget ran out). One model call's end is `FinishReason`."""
RolloutFinish = Literal[LoopFinish, "failed"]
"""How a rollout ended: as its loop ended it, or `failed` (its record carries the failure kind)."""


@dataclass(frozen=True)
class RolloutRecord:
    task: Task
    repeat_index: int
    env: str
    output: list[Item]
    tokens: TokenView
    reward: float
    reward_components: dict[str, float]
    mask_sample: bool
    failure_kind: FailureKind | None
    failure_reason: str | None
    finish_reason: RolloutFinish
    turns: int
    tool_calls: int
    latency_s: float
    model: str = ""
    verify_metrics: dict[str, Any] = field(default_factory=dict)
    api_usage: dict[str, int] | None = None
    """Usage a chat API reported, for rollouts of a chat policy (their token lists are empty)."""
    parse_errors: int = 0
    """Tool calls the model wrote that could not be read (the model was shown the error)."""
    unparsed_tool_calls: int = 0
    """Turns taken as answers although they hold a tool-call marker (a syntax the parser does not read)."""
    env_path: str = ""
    """`module:Class` of the environment class, so `gym-bridge verify` finds environments named by module path."""
    policy_versions: tuple[int, ...] = ()
    """The policy version of each model call that reported one (`Generation.policy_version`), in call order."""
    resume: dict[str, Any] | None = None
    """For a rollout a killed run left in flight and a later run finished: `attempts`, `resumed_from_turn` and, when
    its journaled turns could not be used, `resume_restarted` (why); they go into `metrics`."""

    @property
    def task_index(self) -> int:
        return self.task.index

    @property
    def failed(self) -> bool:
        return self.failure_kind is not None

    def usage(self) -> dict[str, int]:
        if self.api_usage:
            prompt_tokens, model_tokens = self.api_usage.get("input_tokens", 0), self.api_usage.get("output_tokens", 0)
            return {"input_tokens": prompt_tokens, "output_tokens": model_tokens, "total_tokens": prompt_tokens + model_tokens}
        model_tokens = sum(self.tokens.completion_mask)
        prompt_tokens = len(self.tokens.prompt_ids) + len(self.tokens.completion_ids) - model_tokens
        return {"input_tokens": prompt_tokens, "output_tokens": model_tokens, "total_tokens": prompt_tokens + model_tokens}

    def to_dict(self) -> dict[str, Any]:
        """The JSONL line (NeMo Gym-compatible plus the flat training view)."""
        status = "failed" if self.failed else ("completed" if self.finish_reason == "answer" else "incomplete")
        response = {
            "id": f"resp_{self.task.index}_{self.repeat_index}",
            "object": "response",
            "model": self.model,
            "status": status,
            "output": self.output,
            "usage": self.usage(),
        }
        return {
            **self.task.row,
            "response": response,
            "reward": self.reward,
            "reward_components": self.reward_components,
            "mask_sample": self.mask_sample,
            "failure_kind": self.failure_kind,
            "failure_reason": self.failure_reason,
            "env": self.env,
            "env_path": self.env_path,
            "task_index": self.task.index,
            "repeat_index": self.repeat_index,
            "tokens": self.tokens.to_dict(),
            "metrics": {
                "turns": self.turns,
                "tool_calls": self.tool_calls,
                "latency_s": round(self.latency_s, 6),
                "finish_reason": self.finish_reason,
                "parse_errors": self.parse_errors,
                "unparsed_tool_calls": self.unparsed_tool_calls,
                "verify": self.verify_metrics,
                **self.version_metrics(),
                **(self.resume or {}),
            },
        }

    def version_metrics(self) -> dict[str, int]:
        """`policy_version_min` (the sample's version: its oldest token's) and `policy_version_max`; empty when
        no model call reported a version."""
        if not self.policy_versions:
            return {}
        return {"policy_version_min": min(self.policy_versions), "policy_version_max": max(self.policy_versions)}


def with_train_step(row: Mapping[str, Any], step: int | None) -> dict[str, Any]:
    """A record's row as a trainer writes it beside training (TRL's recipe and `make_rollout(records_path=...)`,
    verl's `records_path`): `metrics.train_step` is the optimizer steps done when its rollout was generated
    (so it trains step `step + 1`); None where the trainer does not say."""
    return {**row, "metrics": {**(row.get("metrics") or {}), "train_step": step}}


def with_consumed_version(row: Mapping[str, Any], version: int) -> dict[str, Any]:
    """A record's row with `metrics.consumed_version`: the trainer's policy version when the sample was handed to
    training (an async trainer's worker writes it). Its staleness is that minus `metrics.policy_version_min`."""
    return {**row, "metrics": {**(row.get("metrics") or {}), "consumed_version": version}}
