"""The TRL adapter's reward side: `env_reward`, the reward function that hands TRL each row's
environment reward, and `reward_metrics`, the `gym_bridge/` batch metrics it logs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gym_bridge.core.errors import FAILURE_KINDS, ConfigError

__all__ = ["env_reward", "reward_metrics"]


def env_reward(prompts: list[Any], completions: list[Any], env_reward: list[float | None] | None = None, **kwargs: Any) -> list[float | None]:
    """A TRL reward function: the environment's reward of each row (None for masked rollouts,
    which TRL leaves out of the group baseline).

    With TRL's `log_metric` it logs per-environment reward and reward components, failure
    fractions by kind, turns and tool calls (see `reward_metrics`); with `log_extra` it adds `env_name`,
    `failure_kind`, `num_turns` and `tool_calls` columns to the completions table (W&B / trackio show it
    with `log_completions=True`). Raises ValueError when the rows did
    not come from a gym_bridge rollout function.
    """
    if env_reward is None:
        raise ConfigError("env_reward needs the rows of gym_bridge's rollout: pass rollout_func=gym_bridge.trl.rollout to GRPOTrainer")
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    if log_metric is not None:
        metrics = reward_metrics(
            env_reward,
            env_names=kwargs.get("env_name") or [""] * len(env_reward),
            reward_components=kwargs.get("reward_components") or [{}] * len(env_reward),
            failure_kinds=kwargs.get("failure_kind") or [None] * len(env_reward),
            num_turns=kwargs.get("num_turns") or [],
            tool_calls=kwargs.get("tool_calls") or [],
            parse_errors=kwargs.get("parse_errors") or [],
            unparsed_tool_calls=kwargs.get("unparsed_tool_calls") or [],
            harness_rewrites=kwargs.get("harness_rewrites") or [],
        )
        for name, value in metrics.items():
            log_metric(name, value)
    if log_extra is not None:
        log_extra("env_name", list(kwargs.get("env_name") or [""] * len(env_reward)))
        log_extra("failure_kind", [kind or "" for kind in kwargs.get("failure_kind") or [None] * len(env_reward)])
        for column in ("num_turns", "tool_calls"):
            if kwargs.get(column) is not None:
                log_extra(column, list(kwargs[column]))
    return [None if value is None else float(value) for value in env_reward]


def reward_metrics(
    rewards: Sequence[float | None],
    *,
    env_names: Sequence[str],
    reward_components: Sequence[Mapping[str, float]],
    failure_kinds: Sequence[str | None],
    num_turns: Sequence[int] = (),
    tool_calls: Sequence[int] = (),
    parse_errors: Sequence[int] = (),
    unparsed_tool_calls: Sequence[int] = (),
    harness_rewrites: Sequence[int] = (),
) -> dict[str, float]:
    """Batch metrics under `gym_bridge/`: `failed` and `failed/<kind>` (fractions of rows, every
    kind every time, so ranks agree), `masked`, `<env>/reward` and `<env>/<component>` (means over
    that environment's scored rows), `num_turns` (mean), `parse_errors` and `unparsed_tool_calls`
    (per rollout: tool calls the parser could not read, turns taken as answers that hold a call), `tool_calls`
    (per rollout), `<env>/tool_call_rate` (share of that environment's rows with a tool call) and
    `harness_rewrites` (per rollout: history rewrites of a harness, whose earlier segments are not trained)."""
    count = len(rewards)
    if count == 0:
        return {}
    metrics = {"gym_bridge/failed": sum(kind is not None for kind in failure_kinds) / count}
    for kind in FAILURE_KINDS:
        metrics[f"gym_bridge/failed/{kind}"] = sum(failure == kind for failure in failure_kinds) / count
    metrics["gym_bridge/masked"] = sum(reward is None for reward in rewards) / count
    scored: dict[str, list[int]] = {}
    for row, (env, reward) in enumerate(zip(env_names, rewards)):
        if reward is not None:
            scored.setdefault(env, []).append(row)
    for env, rows in sorted(scored.items()):
        metrics[f"gym_bridge/{env}/reward"] = sum(float(rewards[row] or 0.0) for row in rows) / len(rows)  # rows hold scored rewards only
        names = sorted({name for row in rows for name in reward_components[row]})
        for name in names:
            metrics[f"gym_bridge/{env}/{name}"] = sum(reward_components[row].get(name, 0.0) for row in rows) / len(rows)
    if num_turns:
        metrics["gym_bridge/num_turns"] = sum(num_turns) / len(num_turns)
    if tool_calls:
        calling: dict[str, list[bool]] = {}
        for env, calls in zip(env_names, tool_calls):
            calling.setdefault(env, []).append(calls > 0)
        for env, flags in sorted(calling.items()):
            metrics[f"gym_bridge/{env}/tool_call_rate"] = sum(flags) / len(flags)
    for name, values in (("tool_calls", tool_calls), ("parse_errors", parse_errors), ("unparsed_tool_calls", unparsed_tool_calls),
                         ("harness_rewrites", harness_rewrites)):
        if values:
            metrics[f"gym_bridge/{name}"] = sum(values) / len(values)
    return metrics
