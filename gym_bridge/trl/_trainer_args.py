"""TRL's configs -> gym_bridge's sampling settings, limits and rows per step: one mapping for the sync and async paths.

`GRPOConfig` and `AsyncGRPOConfig` name the same sampling fields, and both paths read them here. They differ in two
places, each for a reason written at its function: which log-probs to ask for (what the generating server returns
and the trainer recomputes, `logprobs_mode_for`) and what `max_completion_length` bounds (all turns of a rollout
for `GRPOTrainer`, each model call for `AsyncGRPOTrainer`, `limits_from_args`).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.policy import LogprobsMode, SamplingParams

__all__ = ["TrainerKind", "limits_from_args", "logprobs_mode_for", "rows_per_step", "rows_per_version", "sampling_from_args"]

logger = logging.getLogger(__name__)

TrainerKind = Literal["sync", "async"]
"""`sync`: `GRPOTrainer` with `rollout_func`; `async`: `AsyncGRPOTrainer` with gym_bridge's rollout worker."""


def logprobs_mode_for(temperature: float, trainer: TrainerKind) -> LogprobsMode:
    """The log-probs to ask for. Both trainers recompute log-softmax(logits / temperature) for the ratio. The sync path
    generates in-process or on TRL's vLLM, which TRL runs with `processed_logprobs` (that very quantity): `processed`.
    The async path generates on a plain vLLM server, whose default is `raw_logprobs`: at temperature 1 raw is the same
    quantity and needs no server flag, so `raw`; at any other temperature `processed` (start the server with
    `--logprobs-mode processed_logprobs`)."""
    if trainer == "async" and float(temperature) == 1.0:
        return "raw"
    return "processed"


def sampling_from_args(args: Any, *, max_new_tokens: int, trainer: TrainerKind = "sync") -> SamplingParams:
    """SamplingParams from a GRPOConfig or AsyncGRPOConfig: temperature, top_p (None or 0: off), top_k (0, None or -1:
    off) and the log-probs `logprobs_mode_for` says; settings gym_bridge does not apply are named in a warning."""
    temperature = float(getattr(args, "temperature", 1.0))
    top_p = getattr(args, "top_p", None)
    top_k = getattr(args, "top_k", None)
    ignored = {
        name: value for name, value, neutral in (
            ("min_p", getattr(args, "min_p", None), (None, 0, 0.0)),
            ("repetition_penalty", getattr(args, "repetition_penalty", 1.0), (None, 1, 1.0)),
            ("generation_kwargs", getattr(args, "generation_kwargs", None), (None, {})),
        ) if value not in neutral
    }
    if ignored:
        logger.warning("gym_bridge.trl ignores these GRPOConfig generation settings: %s", ignored)
    return SamplingParams(
        temperature=temperature,
        top_p=float(top_p) if top_p not in (None, 0) else 1.0,
        top_k=int(top_k) if top_k is not None and top_k > 0 else 0,
        max_new_tokens=max_new_tokens,
        logprobs_mode=logprobs_mode_for(temperature, trainer),
    )


def limits_from_args(args: Any, *, trainer: TrainerKind, max_turns: int, max_completion_length: int | None = None,
                     max_new_tokens_per_turn: int | None = None, max_completion_tokens: int | None = None,
                     max_tool_output_chars: int | None = None) -> tuple[int, Limits]:
    """(tokens per model call, the rollout's limits). `max_completion_length` (default: the config's) means what the
    trainer makes of it: `GRPOTrainer` trains all turns of a rollout as one completion, so it bounds the rollout (a call
    gets `max_new_tokens_per_turn` of it, at most all); `AsyncGRPOTrainer` passes it to each model call, so it bounds a
    call and the rollout gets `max_completion_tokens` (default: `max_turns` calls' worth)."""
    length = int(max_completion_length or args.max_completion_length)
    extra = {} if max_tool_output_chars is None else {"max_tool_output_chars": max_tool_output_chars}
    if trainer == "sync":
        per_call = min(max_new_tokens_per_turn or length, length)
        return per_call, Limits(max_turns=max_turns, max_completion_tokens=length, **extra)
    return length, Limits(max_turns=max_turns, max_completion_tokens=max_completion_tokens or length * max_turns, **extra)


def rows_per_version(args: Any, *, num_processes: int = 1) -> int:
    """Rows an `AsyncGRPOConfig` trainer consumes at least between two weight syncs. With `token_budget=0` each
    micro-batch holds exactly `per_device_train_batch_size` rows per rank; with a token budget (TRL's default) as many
    as fit, at least one per rank, which is the count used (safe, but it admits less: prefer `token_budget=0`)."""
    per_micro_batch = int(args.per_device_train_batch_size) if args.token_budget is not None and args.token_budget <= 0 else 1
    return per_micro_batch * num_processes * int(args.gradient_accumulation_steps) * int(args.weight_sync_steps)


def rows_per_step(args: Any) -> int | None:
    """Rows an `AsyncGRPOConfig` trainer trains per optimizer step: exact with `token_budget=0` (fixed-count batches);
    None with a token budget, where it varies (a checkpoint then counts every row taken as trained)."""
    if args.token_budget is None or args.token_budget > 0:
        return None
    return int(args.per_device_train_batch_size) * int(args.world_size) * int(args.gradient_accumulation_steps)
