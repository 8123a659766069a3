"""The growing trajectory of one rollout: its token stream and its Responses items.

The stream starts with the prompt ids and only ever appends: model tokens (trainable, with the
log-prob they were sampled under) or environment tokens (masked, log-prob 0.0). Each model call
records the prompt it saw, which is by construction the whole stream before it. That rule, "the
next prompt extends everything seen so far", is checked in one place (`extends`, `first_difference`)
wherever a prompt comes from outside: a chat server's ids, a harness's calls, their assembly. A trajectory's
answer is read in one place too (`final_text`; all its assistant text: `output_text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_bridge.core.items import Item, item_text


def final_text(output: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last assistant message of a trajectory's items ('' if it has none)."""
    for item in reversed(output):
        if item["type"] == "message" and item.get("role", "assistant") == "assistant":
            return item_text(item)
    return ""


def output_text(output: Sequence[Mapping[str, Any]]) -> str:
    """The text of every assistant message of a trajectory's items, joined (the Responses API's
    `output_text`; reasoning items are not included)."""
    return "".join(item_text(item) for item in output if item["type"] == "message")


def extends(context: Sequence[int], prompt: Sequence[int]) -> bool:
    """Whether `prompt` starts with every id of `context` (and is at least as long)."""
    return len(prompt) >= len(context) and list(prompt[: len(context)]) == list(context)


def first_difference(context: Sequence[int], prompt: Sequence[int]) -> int:
    """The first position where `prompt` departs from `context` (the shorter length when one is a prefix of the other)."""
    return next((i for i, (a, b) in enumerate(zip(prompt, context)) if a != b), min(len(prompt), len(context)))


@dataclass(frozen=True)
class TokenView:
    """The flat training view of a trajectory."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    """1 for model tokens (trainable), 0 for environment tokens."""
    completion_logprobs: list[float]
    """The sampled log-prob of each model token; 0.0 on environment tokens."""
    segments: tuple[TokenView, ...] = ()
    """Every token segment of a harness that rewrote its history (the flat view is the last); empty otherwise. A segment
    is the one meaning of the word in gym_bridge: the token view of a run of consecutive harness calls, each call's
    prompt starting with everything before it (`gym_bridge.capture.assembly`); a rewritten history starts the next."""

    def to_dict(self) -> dict[str, Any]:
        view: dict[str, Any] = {
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "completion_mask": self.completion_mask,
            "completion_logprobs": self.completion_logprobs,
        }
        if self.segments:
            view["segments"] = [segment.to_dict() for segment in self.segments]
        return view


@dataclass
class Trajectory:
    """Mutable while a rollout runs; `tokens()` and `output` are read when it ends."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    output: list[Item] = field(default_factory=list)
    model_calls: int = 0
    tool_calls: int = 0
    api_usage: dict[str, int] = field(default_factory=dict)
    """Token usage a chat API reported (chat policies leave the token lists empty)."""
    parse_errors: int = 0
    """Tool calls the model wrote that could not be read (shown to the model as errors)."""
    unparsed_tool_calls: int = 0
    """Turns without a parsed call that hold a tool-call marker of some syntax (scored as answers)."""
    segments: list[TokenView] = field(default_factory=list)
    """Every token segment, when a harness rewrote its history (`gym_bridge.capture`); the flat lists are the last."""
    policy_versions: list[int] = field(default_factory=list)
    """The policy version of each model call whose backend reported one, in call order."""

    def context_ids(self) -> list[int]:
        """Everything so far: the prompt of the next model call."""
        return self.prompt_ids + self.completion_ids

    @property
    def tokens_spent(self) -> int:
        """Tokens after the prompt so far (model and environment), or the output tokens a chat API reported."""
        return len(self.completion_ids) + self.api_usage.get("output_tokens", 0)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def append_model(self, token_ids: list[int], logprobs: list[float]) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(f"policy returned {len(token_ids)} ids but {len(logprobs)} log-probs")
        self.completion_ids.extend(token_ids)
        self.completion_mask.extend([1] * len(token_ids))
        self.completion_logprobs.extend(logprobs)
        self.model_calls += 1

    def add_api_usage(self, usage: dict[str, int]) -> None:
        for key in ("input_tokens", "output_tokens"):
            self.api_usage[key] = self.api_usage.get(key, 0) + int(usage.get(key, 0))

    def append_env(self, token_ids: list[int]) -> None:
        self.completion_ids.extend(token_ids)
        self.completion_mask.extend([0] * len(token_ids))
        self.completion_logprobs.extend([0.0] * len(token_ids))

    def tokens(self) -> TokenView:
        return TokenView(
            prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids,
            completion_mask=self.completion_mask,
            completion_logprobs=self.completion_logprobs,
            segments=tuple(self.segments),
        )
