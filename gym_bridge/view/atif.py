"""Harbor's Agent Trajectory Interchange Format (ATIF v1.7), out of and back into rollout records.

One record becomes one trajectory: the task's input messages are `system` / `user` steps (an
assistant message of the input is an `agent` step marked `is_copied_context`); each model call
is an `agent` step holding its text (`message`), `reasoning_content`, `tool_calls` (arguments as
objects) and the `observation` of those calls' outputs, with the call's prompt and completion
token ids and log-probs in `metrics` (ATIF's RL fields); a simulated user's reply is a `user`
step. What ATIF has no field for rides in `extra`: the task row, reward and its components, the
failure, the run's metrics (root `extra.gym_bridge`) and item ids (step `extra`).

Read back (`from_atif`), a trajectory with that `extra` is the record again, token view included
(rebuilt from the per-call ids, which grow by appending); `gym-bridge verify` takes such files
and re-scores them. A trajectory from another producer has no task row: its input steps become
the row's input, and it needs `extra.gym_bridge.env` (or a row routing key) to find a verifier.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gym_bridge.core.errors import DataError
from gym_bridge.core.dialects.responses import to_messages
from gym_bridge.core.items import content_text, item_text
from gym_bridge.core.items import TOKEN_FIELDS
from gym_bridge.core.rollout_file import RolloutWriter, input_row
from gym_bridge.view.reading import Skipped, numbered_rollouts, require_some

ATIF_VERSION = "ATIF-v1.7"
_SOURCES = {"system": "system", "user": "user", "assistant": "agent", "tool": "user"}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gym-bridge")
    except Exception:  # not installed as a distribution (a source checkout)
        return "0"


def _tool_definitions(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    params = row.get("responses_create_params") or {}
    tools = (params.get("tools") if isinstance(params, Mapping) else None) or row.get("tools") or []
    definitions = []
    for tool in tools:
        function = tool.get("function", tool)
        definitions.append({"type": "function", "function": {key: function[key] for key in ("name", "description", "parameters") if key in function}})
    return definitions


def _input_steps(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    params = row.get("responses_create_params") or {}
    task_input = (params.get("input") if isinstance(params, Mapping) else None) or row.get("messages") or row.get("prompt") or ""
    steps = []
    for message in to_messages(task_input):
        step: dict[str, Any] = {"source": _SOURCES.get(message["role"], "user"), "message": str(message.get("content") or "")}
        if step["source"] == "agent":
            step["is_copied_context"] = True
        if message["role"] == "tool":
            step["extra"] = {"role": "tool"}
        steps.append(step)
    return steps


def _arguments(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A call's arguments as ATIF's object, plus `extra` keeping the text when the object does not give it back."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        value = None
    if isinstance(value, dict) and json.dumps(value, ensure_ascii=False) == text:
        return value, {}
    return (value if isinstance(value, dict) else {}), {"arguments_text": text}


def _agent_steps(output: Sequence[Mapping[str, Any]], model: str) -> Iterator[dict[str, Any]]:
    step: dict[str, Any] | None = None
    by_call: dict[str, dict[str, Any]] = {}
    for item in output:
        kind = item.get("type")
        if kind == "function_call_output":
            owner = by_call.get(str(item.get("call_id"))) or step
            if owner is None:
                raise DataError(f"a tool output (call {item.get('call_id')}) comes before any model call")
            owner.setdefault("observation", {"results": []})["results"].append(
                {"source_call_id": str(item.get("call_id")), "content": str(item.get("output", ""))})
            continue
        if kind == "message" and item.get("role") == "user":
            if step is not None:
                yield _finish(step)
                step = None
            yield {"source": "user", "message": item_text(dict(item)), "extra": {"item_ids": [item.get("id")]}}
            continue
        if step is None or step.get("_closed") or "observation" in step:
            if step is not None:
                yield _finish(step)
            step = {"source": "agent", "model_name": model, "message": "", "extra": {"item_ids": []}}
        step["extra"]["item_ids"].append(item.get("id"))
        if kind == "reasoning":
            step["reasoning_content"] = item_text(dict(item))
        elif kind == "message":
            step["message"] = item_text(dict(item))
            step["_message_item"] = True
        elif kind == "function_call":
            arguments, extra = _arguments(str(item.get("arguments", "")))
            call_id = str(item.get("call_id"))
            call: dict[str, Any] = {"tool_call_id": call_id, "function_name": str(item.get("name", "")), "arguments": arguments}
            if extra:
                call["extra"] = extra
            step.setdefault("tool_calls", []).append(call)
            by_call[call_id] = step
        if "generation_token_ids" in item:
            ids, generated = list(item.get("prompt_token_ids") or []), list(item.get("generation_token_ids") or [])
            step["metrics"] = {"prompt_tokens": len(ids), "completion_tokens": len(generated), "prompt_token_ids": ids,
                               "completion_token_ids": generated, "logprobs": list(item.get("generation_log_probs") or [])}
            step["_closed"] = True
    if step is not None:
        yield _finish(step)


def _finish(step: dict[str, Any]) -> dict[str, Any]:
    step.pop("_closed", None)
    if not step.pop("_message_item", False) and step.get("tool_calls"):
        step["extra"]["no_message_item"] = True
    return step


def to_atif(record: Mapping[str, Any]) -> dict[str, Any]:
    """One rollout record as an ATIF-v1.7 trajectory (see the module docstring)."""
    response = record.get("response") or {}
    model = str(response.get("model") or "")
    row = input_row(dict(record))
    steps = [*_input_steps(row), *_agent_steps(response.get("output") or [], model)]
    for number, step in enumerate(steps, start=1):
        step["step_id"] = number
    name = f"{record.get('env')}-{record.get('task_index')}-{record.get('repeat_index')}"
    usage = response.get("usage") or {}
    tokens = record.get("tokens") or {}
    rebuilt = _flat_tokens(steps)
    tail = list(tokens.get("completion_ids") or [])[len(rebuilt["completion_ids"]):]
    agent: dict[str, Any] = {"name": "gym_bridge", "version": _version(), "model_name": model}
    if _tool_definitions(row):
        agent["tool_definitions"] = _tool_definitions(row)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": name,
        "trajectory_id": name,
        "agent": agent,
        "steps": [{key: step[key] for key in sorted(step, key=_STEP_ORDER.index)} for step in steps],
        "final_metrics": {"total_prompt_tokens": usage.get("input_tokens"), "total_completion_tokens": usage.get("output_tokens"),
                          "total_steps": len(steps)},
        "extra": {"gym_bridge": {
            "row": row, "env": record.get("env"), "env_path": record.get("env_path", ""), "task_index": record.get("task_index"),
            "repeat_index": record.get("repeat_index"), "reward": record.get("reward"), "reward_components": record.get("reward_components"),
            "mask_sample": record.get("mask_sample"), "failure_kind": record.get("failure_kind"), "failure_reason": record.get("failure_reason"),
            "metrics": record.get("metrics"), "status": response.get("status"), "response_id": response.get("id"),
            "trailing_env_ids": tail,
        }},
    }


_STEP_ORDER = ["step_id", "source", "model_name", "message", "reasoning_content", "tool_calls", "observation", "metrics",
               "is_copied_context", "extra"]


def _flat_tokens(steps: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The record's flat token view from the agent steps' per-call ids: each call's prompt is everything before it."""
    prompt: list[int] = []
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for step in steps:
        metrics = step.get("metrics") or {}
        if step.get("source") != "agent" or "completion_token_ids" not in metrics:
            continue
        call_prompt = list(metrics.get("prompt_token_ids") or [])
        if not prompt:
            prompt = call_prompt
        else:
            env = call_prompt[len(prompt) + len(completion):]
            completion += env
            mask += [0] * len(env)
            logprobs += [0.0] * len(env)
        generated = list(metrics["completion_token_ids"])
        completion += generated
        mask += [1] * len(generated)
        logprobs += list(metrics.get("logprobs") or [0.0] * len(generated))
    return {"prompt_ids": prompt, "completion_ids": completion, "completion_mask": mask, "completion_logprobs": logprobs}


def _row_from_steps(trajectory: Mapping[str, Any], input_steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    roles = {"system": "system", "user": "user", "agent": "assistant"}
    messages = [{"role": roles.get(str(step.get("source")), "user"), "content": _text(step.get("message"))} for step in input_steps]
    params: dict[str, Any] = {"input": messages}
    tools = (trajectory.get("agent") or {}).get("tool_definitions") or []
    if tools:
        params["tools"] = [{"type": "function", **tool.get("function", tool)} for tool in tools]
    return {"responses_create_params": params}


def _text(message: Any) -> str:
    if isinstance(message, list):  # content parts (ATIF v1.6+)
        return content_text(message)
    return "" if message is None else str(message)


def _items(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for number, step in enumerate(steps):
        extra = step.get("extra") or {}
        ids = list(extra.get("item_ids") or [])
        if step.get("source") == "user":
            items.append({"type": "message", "id": ids[0] if ids else f"msg_user_{number}", "role": "user", "status": "completed",
                          "content": [{"type": "input_text", "text": _text(step.get("message"))}]})
            continue
        if step.get("source") != "agent":
            continue
        made: list[dict[str, Any]] = []
        if step.get("reasoning_content") is not None:
            made.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": str(step["reasoning_content"])}]})
        calls = step.get("tool_calls") or []
        if not extra.get("no_message_item") or not calls:
            made.append({"type": "message", "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": _text(step.get("message")), "annotations": []}]})
        for call in calls:
            text = (call.get("extra") or {}).get("arguments_text")
            made.append({"type": "function_call", "call_id": str(call.get("tool_call_id")), "name": str(call.get("function_name", "")),
                         "arguments": text if text is not None else json.dumps(call.get("arguments") or {}, ensure_ascii=False),
                         "status": "completed"})
        for position, item in enumerate(made):
            item_id = ids[position] if position < len(ids) else f"{item['type']}_{number}_{position}"
            made[position] = {"type": item["type"], "id": item_id, **{key: value for key, value in item.items() if key != "type"}}
        metrics = step.get("metrics") or {}
        if made and "completion_token_ids" in metrics:
            made[-1].update(zip(TOKEN_FIELDS, (list(metrics.get("prompt_token_ids") or []), list(metrics["completion_token_ids"]),
                                               list(metrics.get("logprobs") or []))))
        items += made
        for result in (step.get("observation") or {}).get("results") or []:
            items.append({"type": "function_call_output", "call_id": str(result.get("source_call_id")), "output": _text(result.get("content"))})
    return items


def from_atif(trajectory: Mapping[str, Any], *, source: str = "") -> dict[str, Any]:
    """A rollout record from an ATIF trajectory (see the module docstring). Raises DataError naming `source` when it is not ATIF."""
    version = str(trajectory.get("schema_version") or "")
    steps = trajectory.get("steps")
    if not version.startswith("ATIF-v") or not isinstance(steps, list):
        raise DataError("is not an ATIF trajectory (needs schema_version 'ATIF-v…' and a steps list)", source=source)
    first_agent = next((i for i, step in enumerate(steps) if step.get("source") == "agent" and not step.get("is_copied_context")), len(steps))
    ours = ((trajectory.get("extra") or {}).get("gym_bridge")) or {}
    row = dict(ours.get("row") or _row_from_steps(trajectory, steps[:first_agent]))
    output = _items(steps[first_agent:])
    tokens = _flat_tokens(steps[first_agent:])
    tail = list(ours.get("trailing_env_ids") or [])
    tokens["completion_ids"] += tail
    tokens["completion_mask"] += [0] * len(tail)
    tokens["completion_logprobs"] += [0.0] * len(tail)
    final = trajectory.get("final_metrics") or {}
    prompt_tokens, model_tokens = int(final.get("total_prompt_tokens") or 0), int(final.get("total_completion_tokens") or 0)
    task_index, repeat_index = int(ours.get("task_index") or 0), int(ours.get("repeat_index") or 0)
    model = str((trajectory.get("agent") or {}).get("model_name") or "")
    return {
        **row,
        "response": {"id": ours.get("response_id") or f"resp_{task_index}_{repeat_index}", "object": "response", "model": model,
                     "status": ours.get("status") or "completed", "output": output,
                     "usage": {"input_tokens": prompt_tokens, "output_tokens": model_tokens, "total_tokens": prompt_tokens + model_tokens}},
        "reward": float(ours.get("reward") or 0.0),
        "reward_components": dict(ours.get("reward_components") or {}),
        "mask_sample": bool(ours.get("mask_sample")),
        "failure_kind": ours.get("failure_kind"),
        "failure_reason": ours.get("failure_reason"),
        "env": ours.get("env") or "",
        "env_path": ours.get("env_path") or "",
        "task_index": task_index,
        "repeat_index": repeat_index,
        "tokens": tokens,
        "metrics": dict(ours.get("metrics") or {}),
    }


def read_atif(path: str | Path) -> list[dict[str, Any]]:
    """The trajectories of a file: one JSON trajectory, a JSON list of them, or JSONL (one per line),
    or of every `*.json` in a folder. Raises DataError naming the file and line."""
    path = Path(path)
    if path.is_dir():
        return [trajectory for file in sorted(path.glob("*.json")) for trajectory in read_atif(file)]
    if not path.is_file():
        raise DataError("file not found", source=str(path))
    text = path.read_text(encoding="utf-8")
    try:
        value = json.loads(text)
        return value if isinstance(value, list) else [value]
    except json.JSONDecodeError:
        pass
    trajectories = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                trajectories.append(json.loads(line))
            except json.JSONDecodeError:
                raise DataError("malformed JSON", source=f"{path}:{line_number}") from None
    return trajectories


def is_atif_file(path: str | Path) -> bool:
    """Whether `path` holds ATIF trajectories (a folder of them, or a file whose first JSON value has an ATIF schema_version)."""
    path = Path(path)
    if path.is_dir():
        return any(path.glob("*.json"))
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(4096)
    return b'"schema_version"' in head and b'"ATIF-v' in head


def write_records_from_atif(path: str | Path, *, output: str | Path) -> Path:
    """Rollout records (JSONL) from the ATIF trajectories in `path`; raises DataError before writing anything."""
    records = [from_atif(trajectory, source=f"{path}: trajectory {number}") for number, trajectory in enumerate(read_atif(path), start=1)]
    with RolloutWriter(output, append=False) as writer:
        for record in records:
            writer.write(record)
    return Path(output)


def _file_name(trajectory_id: str, taken: set[str]) -> str:
    """A file name for a trajectory in an export folder: characters other than letters, digits, `.`, `_` and `-`
    become `_`, no leading dot (so no `..`, no `/`, no hidden file), at most 200 characters, and unique among `taken`."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", trajectory_id).lstrip(".")[:200] or "trajectory"
    name, number = f"{stem}.json", 1
    while name in taken:
        number += 1
        name = f"{stem}-{number}.json"
    taken.add(name)
    return name


def _inside(folder: Path, name: str) -> Path:
    """`folder / name`, checked to resolve inside `folder` (raises DataError otherwise)."""
    target = (folder / name).resolve()
    if target.parent != folder.resolve():
        raise DataError(f"refusing to write {target}: outside the export folder {folder}")
    return target


def _trajectories(path: str | Path, skipped: list[Skipped] | None) -> list[dict[str, Any]]:
    trajectories = []
    for line_number, record in numbered_rollouts(str(path), skipped=skipped):
        try:
            trajectories.append(to_atif(record))
        except DataError as error:
            if skipped is None:
                raise DataError(error.message, source=f"{path}:{line_number}") from None
            skipped.append(Skipped(f"{path}:{line_number}", error.message))
    require_some(skipped or [], len(trajectories))
    return trajectories


def export_atif(path: str | Path, *, output: str | Path, skipped: list[Skipped] | None = None) -> tuple[int, Path]:
    """Write every record of a rollout file as an ATIF trajectory: to a `.jsonl` file, one per line, or into a
    folder, one `<env>-<task>-<repeat>.json` each (a name made safe by `_file_name`; it never leaves the folder).
    Returns (count, where). Raises DataError before writing anything; with a `skipped` list, records that cannot
    be read or converted go there instead (see `iter_rollouts`)."""
    trajectories = _trajectories(path, skipped)
    output = Path(output)
    if output.suffix == ".jsonl":
        with RolloutWriter(output.with_name(output.name + ".tmp"), append=False) as writer:
            for trajectory in trajectories:
                writer.write(trajectory)
        output.with_name(output.name + ".tmp").replace(output)
        return len(trajectories), output
    output.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    for trajectory in trajectories:
        name = _file_name(str(trajectory["trajectory_id"]), taken)
        target, temp = _inside(output, name), _inside(output, name + ".tmp")
        temp.write_text(json.dumps(trajectory, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        temp.replace(target)
    return len(trajectories), output
