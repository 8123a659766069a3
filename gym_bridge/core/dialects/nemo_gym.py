"""The NeMo Gym dialect: NeMo Gym's `/run` and `/aggregate_metrics` wire formats, both directions.

In: a `/run` row's rollout id (`rollout_id`, the `_ng_task_index`/`_ng_rollout_index` NeMo Gym's rollout collection
stamps) and its sampling (`run_sampling`, from `responses_create_params`), and an `/aggregate_metrics` body
(`verify_responses`); the row itself is a task row (`gym_bridge.core.task.parse_task`). Out: a record as `/run`
answers it (`to_run_result`, failure kinds named in NeMo Gym's vocabulary) and the aggregate metrics. No server here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gym_bridge.core.errors import DataError
from gym_bridge.core.items import TOKEN_FIELDS
from gym_bridge.core.policy import SamplingParams
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.task import Task
from gym_bridge.core.trajectory import extends

TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
"""Where NeMo Gym's rollout collection numbers each row and result (its task and its repeat)."""


def rollout_id(row: Any) -> tuple[int, int] | None:
    """The rollout a `/run` row names, as NeMo Gym's rollout collection stamps it (`_ng_task_index`,
    `_ng_rollout_index`: the key a served rollout resumes on); None when it names none. Raises DataError naming the
    field for a half or bad id."""
    values = [row.get(name) for name in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)] if isinstance(row, Mapping) else [None, None]
    if values == [None, None]:
        return None
    checked: list[int] = []
    for name, value in zip((TASK_INDEX_KEY, ROLLOUT_INDEX_KEY), values):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataError(f"must be a non-negative integer with the other half of the rollout id, got {value!r}", field=name)
        checked.append(value)
    return checked[0], checked[1]


def run_sampling(task: Task, *, default_max_new_tokens: int) -> SamplingParams:
    """A `/run` row's sampling: NeMo RL stamps `temperature`, `top_p` and `max_output_tokens` on every row
    (`responses_create_params`), and its model server refuses a call whose temperature and top_p differ from the
    trainer's. Raises DataError naming the field."""
    params = task.create_params
    values: dict[str, float] = {}
    for name, default, low, high in (("temperature", 1.0, 0.0, 100.0), ("top_p", 1.0, 1e-9, 1.0)):
        value = params.get(name, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
            raise DataError(f"must be a number in [{low:g}, {high:g}], got {value!r}", field=f"responses_create_params.{name}")
        values[name] = float(value)
    max_tokens = params.get("max_output_tokens")
    if max_tokens is None:
        max_tokens = default_max_new_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise DataError(f"must be a positive integer, got {max_tokens!r}", field="responses_create_params.max_output_tokens")
    return SamplingParams(temperature=values["temperature"], top_p=values["top_p"], max_new_tokens=max_tokens)


NEMO_GYM_FAILURE_KINDS = {"timeout": "agent_timeout", "verifier": "verifier_error"}
"""gym_bridge failure kinds that have a name in NeMo Gym's shared vocabulary (`nemo_gym/failure_kinds.py`
of NeMo Gym 0.7.0: a rollout past its deadline inside the agent server, a verifier that raised)."""
NEMO_GYM_REGISTERED_KINDS = frozenset({
    "transport_unreachable", "transport_peer_drop", "transport_timeout", "transport_local_resource", "agent_run_error",
    "agent_request_failed", "agent_timeout", "agent_command_not_allowed", "judge_failed", "judge_unparseable", "verifier_error",
    "provider_unavailable", "provider_quota_exhausted", "provider_oom_killed", "session_lost", "session_expired",
    "session_release_failed", "cancelled", "kill_shaped", "shutdown", "persistence_failed", "cohort_incomplete",
})
"""NeMo Gym 0.7.0's registered failure kinds; an environment's own kind that is one of them passes as is."""
_KIND = re.compile(r"[a-z][a-z0-9_]*")


def nemo_gym_failure_kind(kind: str | None) -> str | None:
    """A gym_bridge failure kind as NeMo Gym names it: its shared name where one means the same
    (`timeout` -> `agent_timeout`, `verifier` -> `verifier_error`), a registered or already
    namespaced kind unchanged, anything else in NeMo Gym's `<server>:<kind>` form for kinds outside
    its vocabulary (`infra` -> `gym_bridge:infra`, `env`, `context_overflow`, an environment's own)."""
    if kind is None or kind in NEMO_GYM_REGISTERED_KINDS:
        return kind
    if kind in NEMO_GYM_FAILURE_KINDS:
        return NEMO_GYM_FAILURE_KINDS[kind]
    server, _, name = kind.rpartition(":")
    if server and _KIND.fullmatch(server) and _KIND.fullmatch(name):
        return kind
    name = re.sub(r"[^a-z0-9_]+", "_", kind.lower()).strip("_") or "unknown"
    return f"gym_bridge:{name if name[0].isalpha() else 'kind_' + name}"


def to_run_result(record: RolloutRecord) -> dict[str, Any]:
    """A record as `/run` answers it: the row, `response`, `reward`, `reward_components`, `mask_sample`,
    `failure_kind` (NeMo Gym's name, `nemo_gym_failure_kind`)/`failure_reason` and `metrics`, without
    the flat `tokens` view (NeMo RL rebuilds it from the output items). `mask_sample` is also set in
    `instance_config`, where NeMo RL reads it (`nemo_rl/experience/rollouts.py::_extract_mask_sample_flags`).
    A harness that rewrote its history left calls whose ids do not continue each other, which NeMo RL
    refuses ("Non-contiguous messages found!"); only the calls of its last segment keep their token
    ids, so NeMo RL trains that segment, as TRL and verl do (`metrics.verify.rewrites` counts the rest)."""
    result = record.to_dict()
    del result["tokens"]
    if record.tokens.segments:
        result["response"] = {**result["response"], "output": _last_segment_only(result["response"]["output"])}
    result["failure_kind"] = nemo_gym_failure_kind(record.failure_kind)
    instance_config = result.get("instance_config")
    if instance_config is None or isinstance(instance_config, Mapping):
        result["instance_config"] = {**(instance_config or {}), "mask_sample": record.mask_sample}
    return result


def _last_segment_only(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`output` with the token fields dropped from the calls before a harness's last segment; the record's own
    items are left as they are."""
    carrying = [item for item in output if item.get("generation_token_ids") is not None]
    kept = _calls_in_last_segment(carrying)
    earlier = {id(item) for item in carrying[: len(carrying) - kept]}
    return [{key: value for key, value in item.items() if key not in TOKEN_FIELDS} if id(item) in earlier else item
            for item in output]


def _calls_in_last_segment(calls: Sequence[Mapping[str, Any]]) -> int:
    """How many of the last calls form one segment: a call continues the one before it when its prompt ids start
    with that call's prompt and generated ids (the rule `gym_bridge.capture.assembly` merges calls by)."""
    kept = 1 if calls else 0
    for earlier, later in zip(reversed(calls[:-1]), reversed(calls[1:])):
        if not extends([*(earlier.get("prompt_token_ids") or []), *earlier["generation_token_ids"]], later.get("prompt_token_ids") or []):
            break
        kept += 1
    return kept


def from_aggregate_request(body: Any) -> list[Mapping[str, Any]]:
    """The results an `/aggregate_metrics` body carries (NeMo Gym's `AggregateMetricsRequest.verify_responses`);
    raises DataError naming `verify_responses` when it is not a list of objects."""
    responses = body.get("verify_responses") if isinstance(body, Mapping) else None
    if not isinstance(responses, list) or not all(isinstance(response, Mapping) for response in responses):
        raise DataError("must be a list of objects (NeMo Gym's AggregateMetricsRequest)", field="verify_responses")
    return responses


def aggregate_metrics(verify_responses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """NeMo Gym 0.7.0's `/aggregate_metrics` answer for the stripped `/run` results it collected
    (`AggregateMetricsRequest.verify_responses`): `AggregateMetrics` with `agent_metrics` (mean, max,
    min, median, sample std of `reward` and of every other top-level number over the measured rollouts),
    `key_metrics` (the means, as NeMo Gym's default), `group_level_metrics` (the same per `_ng_task_index`) and
    `repeat_level_metrics` (mean reward per `_ng_rollout_index`). Rollouts with `mask_sample` are
    left out of the quality numbers and counted under `coverage/...`, as NeMo Gym does; when every
    rollout was masked only the coverage is reported."""
    scored = [response for response in verify_responses if not response.get("mask_sample")]
    masked = len(verify_responses) - len(scored)
    coverage: dict[str, Any] = {}
    if masked:
        tasks = {response.get(TASK_INDEX_KEY, 0) for response in verify_responses}
        measured = {response.get(TASK_INDEX_KEY, 0) for response in scored}
        coverage = {"coverage/measured_rollouts": len(scored), "coverage/masked_rollouts": masked,
                    "coverage/measured_tasks": len(measured), "coverage/fully_masked_tasks": len(tasks - measured)}
    empty: dict[str, Any] = {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}, "repeat_level_metrics": []}
    if not verify_responses:
        return empty
    if not scored:
        return {**empty, "agent_metrics": dict(coverage), "key_metrics": dict(coverage)}
    agent_metrics = {**_number_stats(scored), **coverage}
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    repeats: dict[Any, list[Mapping[str, Any]]] = {}
    for response in scored:
        groups.setdefault(response.get(TASK_INDEX_KEY, 0), []).append(response)
        repeats.setdefault(response.get(ROLLOUT_INDEX_KEY, 0), []).append(response)
    group_level = [{TASK_INDEX_KEY: task, **_number_stats(rows)} for task, rows in sorted(groups.items(), key=lambda item: str(item[0]))]
    repeat_level = [{ROLLOUT_INDEX_KEY: repeat, "mean/reward": _mean([_number(row.get("reward")) or 0.0 for row in rows])}
                    for repeat, rows in sorted(repeats.items(), key=lambda item: str(item[0]))]
    key_metrics = {name: value for name, value in agent_metrics.items() if name.startswith(("mean/", "coverage/"))}
    return {"group_level_metrics": group_level, "agent_metrics": agent_metrics, "key_metrics": key_metrics,
            "repeat_level_metrics": repeat_level}


_NOT_METRICS = frozenset({TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, "task_index", "repeat_index", "mask_sample"})


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _number_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """`mean/`, `max/`, `min/`, `median/`, `std/` of each top-level number of the rows (`reward` first)."""
    names = ["reward"] + sorted({key for row in rows for key, value in row.items()
                                 if key != "reward" and key not in _NOT_METRICS and not key.startswith("_") and _number(value) is not None})
    stats: dict[str, float] = {}
    for name in names:
        values = [number for number in (_number(row.get(name)) for row in rows) if number is not None]
        if not values:
            continue
        mean = _mean(values)
        ordered = sorted(values)
        middle = len(ordered) // 2
        stats.update({
            f"mean/{name}": mean, f"max/{name}": ordered[-1], f"min/{name}": ordered[0],
            f"median/{name}": ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2,
            f"std/{name}": math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1)) if len(values) > 1 else 0.0,
        })
    return stats
