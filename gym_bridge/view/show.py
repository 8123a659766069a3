"""`gym-bridge show`: rollouts as chat transcripts in the terminal.

Each rollout prints a header (environment, task, reward and its components, failure, metrics),
the prompt as the model saw it (decoded from its prompt ids: the system prompt and the tool
listing the template injected), then the conversation: assistant text, reasoning, tool calls
with their arguments, tool outputs. With `tokens=True` the completion follows as runs of
trained (model) and masked (environment) tokens. Colour is used only when asked for. Text from
the record (model and tool output) is printed with its control characters escaped (`terminal_safe`),
so a rollout cannot retitle the window, write the clipboard or erase lines of the terminal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gym_bridge.view.decode import Decoder
from gym_bridge.view.reading import policy_versions, token_runs, tools_offered, record_turns

_COLOURS = {"model": "\x1b[32m", "env": "\x1b[90m", "role": "\x1b[1;36m", "alarm": "\x1b[1;31m", "dim": "\x1b[2m"}
_RESET = "\x1b[0m"
_LABELS = {"system": "system", "user": "user", "assistant": "assistant", "reasoning": "reasoning",
           "tool_call": "tool call", "tool_output": "tool output", "developer": "system"}


_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
"""C0 controls but tab and newline, DEL, C1 controls (ESC, CSI, OSC, ...) and lone surrogates (not printable)."""


def terminal_safe(text: str) -> str:
    """`text` with every control character but tab and newline written as a visible escape (`\\x1b`, `\\x9b`)."""
    return _CONTROLS.sub(lambda match: f"\\x{ord(match[0]):02x}" if ord(match[0]) < 0x100 else f"\\u{ord(match[0]):04x}", text)


def _paint(text: str, style: str, colour: bool) -> str:
    return f"{_COLOURS[style]}{text}{_RESET}" if colour else text


def _block(label: str, text: str, *, colour: bool, style: str = "role") -> list[str]:
    """`label │ first line` and continuation lines under the bar."""
    width = 12
    lines = terminal_safe(text).split("\n") or [""]
    head = _paint(f"{terminal_safe(label):<{width}}", style, colour)
    return [f"{head}│ {lines[0]}", *(f"{'':<{width}}│ {line}" for line in lines[1:])]


def _numbers(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}" for key, value in values.items()) or "-"


def header(position: int, record: Mapping[str, Any]) -> list[str]:
    """The rollout's identity and scores."""
    metrics = record.get("metrics") or {}
    model = (record.get("response") or {}).get("model") or "?"
    lines = [
        f"═══ rollout #{position}  env={record.get('env')}  task={record.get('task_index')}  repeat={record.get('repeat_index')}  "
        f"reward={float(record.get('reward') or 0.0):.3f}" + ("  (masked)" if record.get("mask_sample") else ""),
        f"model: {model}   finish: {metrics.get('finish_reason', '?')}   turns: {metrics.get('turns', 0)}   "
        f"tool calls: {metrics.get('tool_calls', 0)}   parse errors: {metrics.get('parse_errors', 0)}   "
        f"unparsed calls: {metrics.get('unparsed_tool_calls', 0)}   latency: {float(metrics.get('latency_s') or 0):.2f} s",
        f"reward components: {_numbers(record.get('reward_components') or {})}",
    ]
    if record.get("failure_kind"):
        lines.append(f"FAILED ({record['failure_kind']}): {record.get('failure_reason')}")
    if metrics.get("verify"):
        lines.append(f"verify metrics: {_numbers(metrics['verify'])}")
    if "attempts" in metrics:
        lines.append(_resumed(metrics))
    versions = policy_versions(record)
    if versions.known:
        lines.append(versions.summary())
    return [terminal_safe(line) for line in lines]


def _resumed(metrics: Mapping[str, Any]) -> str:
    """How a rollout a killed run left in flight was finished (docs/resuming.md): its attempt, the turn it went on from."""
    restarted = metrics.get("resume_restarted")
    how = (f"started again from turn 0 ({restarted})" if restarted
           else f"continued from turn {metrics.get('resumed_from_turn', 0)} (the turns before it from the journal)")
    return f"resumed: attempt {metrics['attempts']}, {how}"


def _prompt(record: Mapping[str, Any], decoder: Decoder, *, colour: bool) -> list[str]:
    ids = (record.get("tokens") or {}).get("prompt_ids") or []
    offered = tools_offered(record)
    if not ids:
        return [_paint("(no prompt ids in this record: a chat-API rollout; the input messages follow)", "dim", colour)]
    title = f"─── prompt as the model saw it ({len(ids)} tokens, decoded with {decoder.source})"
    if offered:
        title += f"; tools offered: {', '.join(offered)}"
    return [_paint(terminal_safe(title), "dim", colour), terminal_safe(decoder.text(ids))]


def _conversation(record: Mapping[str, Any], *, colour: bool, with_input: bool) -> list[str]:
    lines = [_paint("─── conversation", "dim", colour)]
    turns = record_turns(record)
    input_count = len(turns) - len((record.get("response") or {}).get("output") or [])
    for index, turn in enumerate(turns):
        if index < input_count and not with_input:
            continue
        label = _LABELS.get(turn.role, turn.role)
        text = turn.text
        if turn.role == "tool_call":
            text = f"{turn.name}({_compact(turn.text)})" + (f"   [{turn.call_id}]" if turn.call_id else "")
        elif turn.role == "tool_output" and turn.call_id:
            text = f"[{turn.call_id}] {text}"
        lines += _block(label, text, colour=colour)
    return lines


def _compact(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return arguments


def _tokens(record: Mapping[str, Any], decoder: Decoder, *, colour: bool) -> list[str]:
    runs = token_runs(record)
    model = sum(len(run.ids) for run in runs if run.kind == "model")
    total = sum(len(run.ids) for run in runs)
    lines = [_paint(f"─── completion tokens: {model} model (trained), {total - model} env (masked)", "dim", colour)]
    for run in runs:
        label = "model" if run.kind == "model" else "env"
        lines += _block(f"{label} {len(run.ids)}", decoder.text(run.ids), colour=colour, style=label)
    return lines


def format_rollout(position: int, record: Mapping[str, Any], decoder: Decoder, *, tokens: bool = False, colour: bool = False) -> str:
    """One rollout as text (see the module docstring)."""
    lines = header(position, record)
    prompt = _prompt(record, decoder, colour=colour)
    lines += prompt
    lines += _conversation(record, colour=colour, with_input=not decoder.can_decode or not (record.get("tokens") or {}).get("prompt_ids"))
    if tokens:
        lines += _tokens(record, decoder, colour=colour)
    return "\n".join(lines)
