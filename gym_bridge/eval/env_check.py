"""`gym-bridge env check`: exercise an environment's tools and verifier without a model.

An author runs it on a class (`my_env:MyEnv`) and a few rows before spending minutes of generation:
each row is checked as `gym-bridge data validate` checks it, the prompt and tools the model would be
shown are printed, the scripted tool calls (`--call NAME=JSON`) run on the row's own session through
the rollout's own tool dispatch (`EnvironmentSession.call_tool`, with the engine's limits), so each prints
what a model would read, and `verify` scores the row's known answer (or `--answer`) and an empty one,
so a verifier that cannot tell them apart stands out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.bounded.call import call_environment
from gym_bridge.core.engine import EngineConfig
from gym_bridge.core.errors import describe_error, ConfigError, DataError, FailRollout
from gym_bridge.core.environment import Environment, to_verify_result
from gym_bridge.core.items import Item, function_call_item, function_call_output_item, message_item
from gym_bridge.core.registry import get_environment
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings
from gym_bridge.core.session import EnvironmentSession
from gym_bridge.core.task import Task, iter_jsonl, parse_task
from gym_bridge.core.turn import ToolCall

ANSWER_FIELDS = ("expected_answer", "ground_truth", "answer", "expected", "target")
"""Row fields taken as the known answer when `--answer` is not given."""
SHOWN_CHARS = 400
"""Characters of a message or tool output printed at most."""


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call of the scripted trajectory (`--call NAME=JSON`)."""

    name: str
    arguments: dict[str, Any]


def parse_call(text: str) -> ScriptedCall:
    """`lookup={"order_id": "42"}` (or `lookup` with no arguments); raises GymBridgeError on a malformed one."""
    name, sep, raw = text.partition("=")
    try:
        arguments = json.loads(raw) if sep else {}
    except json.JSONDecodeError as error:
        raise ConfigError(f"--call {text!r}: the arguments are not valid JSON ({error})") from None
    if not name.strip() or not isinstance(arguments, dict):
        raise ConfigError(f"--call takes NAME=JSON_OBJECT, e.g. lookup='{{\"order_id\": \"42\"}}', got {text!r}")
    return ScriptedCall(name=name.strip(), arguments=arguments)


def _short(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"... ({len(text)} chars)"


def _tool_line(schema: dict[str, Any]) -> str:
    properties = (schema.get("parameters") or {}).get("properties", {})
    params = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in properties.items())
    return f"{schema['name']}({params}): {schema.get('description', '')}"


def _offered(task: Task, env_class: type[Environment]) -> list[dict[str, Any]]:
    """The tools a rollout of `task` offers the model: the row's, else its environment's (as the engine picks them)."""
    return list(task.tools) if task.tools is not None else [spec.schema for spec in env_class.tool_specs().values()]


def _shown(task: Task, env_class: type[Environment]) -> list[str]:
    """What the model is shown: the prompt messages and the tools offered."""
    lines = [f"    {message['role']}: {_short(str(message.get('content') or ''))}" for message in task.messages]
    lines += [f"    tool {_tool_line(schema)}" for schema in _offered(task, env_class)] or ["    tools: none"]
    return lines


async def _call(session: EnvironmentSession, call: ScriptedCall) -> tuple[str, str | None]:
    """The tool output the model would read (the rollout's own dispatch, `EnvironmentSession.call_tool`), and a problem
    or None: the rollout would fail as `env` (the tool crashed, hung or returned non-JSON), or the row offers no such
    tool."""
    parsed = ToolCall(name=call.name, arguments=json.dumps(call.arguments))
    try:
        content = await session.call_tool(parsed)
    except FailRollout as error:
        return "", error.reason
    if call.name not in session.offered:
        return content, f"the row offers no tool {call.name!r} (its tools: {sorted(session.offered)})"
    return content, None


async def _verify(env_class: type[Environment], task: Task, output: list[Item]) -> tuple[str, float | None]:
    """One verify on a fresh session: its description and reward (None when it failed)."""
    env = env_class()
    try:
        await call_environment(env, "setup", (task,), timeout_s=env_class.tool_timeout_s)
        result = to_verify_result(await call_environment(env, "verify", (task, output), timeout_s=env_class.verify_timeout_s))
    except Exception as error:
        return f"raised {describe_error(error)}", None
    finally:
        await call_environment(env, "close", timeout_s=env_class.tool_timeout_s)
    failure = f", failure {result.failure_kind}: {result.failure_reason}" if result.failure_kind else ""
    components = f", components {result.reward_components}" if result.reward_components else ""
    return f"reward {result.reward:g}{components}{failure}", result.reward


async def _check_task(task: Task, env_class: type[Environment], *, calls: Sequence[ScriptedCall], answer: str | None,
                      limits: Limits, out: Callable[[str], None]) -> int:
    """Run the scripted calls and verify on one task; returns the number of problems."""
    problems = 0
    output: list[Item] = []
    session = EnvironmentSession(env_class, tools=tuple(_offered(task, env_class)), max_tool_output_chars=limits.max_tool_output_chars)
    env = session.env
    try:
        await call_environment(env, "setup", (task,), timeout_s=env_class.tool_timeout_s)
        for position, call in enumerate(calls):
            content, problem = await _call(session, call)
            out(f"  call {call.name}({json.dumps(call.arguments)}) -> {_short(content) if problem is None else 'PROBLEM: ' + problem}")
            problems += problem is not None
            call_id = f"call_check_{position}"
            output += [function_call_item(call.name, json.dumps(call.arguments), call_id=call_id, item_id=f"fc_check_{position}"),
                       function_call_output_item(content, call_id=call_id)]
    except Exception as error:
        out(f"  PROBLEM: setup raised {describe_error(error)}")
        return problems + 1
    finally:
        await call_environment(env, "close", timeout_s=env_class.tool_timeout_s)
    known = answer if answer is not None else next((str(task.row[key]) for key in ANSWER_FIELDS if key in task.row), None)
    candidates = [known] if answer is not None or known is None else [known, f"\\boxed{{{known}}}"]
    rewards = []
    for text in [candidate for candidate in candidates if candidate is not None]:
        described, reward = await _verify(env_class, task, [*output, message_item(text, item_id="msg_check")])
        out(f"  verify(answer {text!r}) -> {described}")
        problems += reward is None
        rewards.append(reward)
    if known is None:
        out(f"  no known answer in the row ({', '.join(ANSWER_FIELDS)}): pass --answer TEXT to score one")
    described, empty = await _verify(env_class, task, [*output, message_item("", item_id="msg_check")])
    out(f"  verify(empty answer) -> {described}")
    problems += empty is None
    scored = [reward for reward in rewards if reward is not None]
    if scored and empty is not None and max(scored) <= empty:
        out("  note: verify scores the known answer no higher than an empty one")
    return problems


def _rows(env_class: type[Environment], data_paths: Sequence[str]) -> list[tuple[str, Any]]:
    paths = [Path(path) for path in data_paths] or ([Path(env_class.example_data)] if env_class.example_data else [])
    if not paths:
        raise DataError(f"environment {env_class.name!r} ships no example data; pass --data FILE.jsonl")
    rows = []
    for path in paths:
        if not path.exists():
            raise DataError("file not found", source=str(path))
        rows += [(f"{path}:{line_number}", row) for line_number, row in iter_jsonl(path)]
    return rows


async def check_environment(env: str, *, data_paths: Sequence[str] = (), calls: Sequence[ScriptedCall] = (), answer: str | None = None,
                            limit: int | None = 3, limits: Limits | None = None, out: Callable[[str], None] = print,
                            trust: TrustSettings = DEFAULT_TRUST) -> int:
    """Check `env` (a name or `module:Class`) on its rows, module paths only where `trust` allows them; prints a report with
    `out` and returns the number of problems.
    Tool outputs are cut as a rollout with `limits` cuts them (default: an `EngineConfig`'s).

    Raises UnknownEnvironmentError / DataError for what must be fixed before anything can be checked.
    """
    from gym_bridge.data import check_row

    env_class = get_environment(env, trust)
    out(f"environment {env_class.name!r} ({env_class.__module__}:{env_class.__qualname__}); tools: "
        f"{', '.join(env_class.tool_specs()) or 'none'}")
    problems = 0
    rows = _rows(env_class, data_paths)
    for source, row in rows[:limit]:
        out(source)
        routed, found = check_row(row, source=source, default_env=env_class.name, trust=trust)
        for problem in found:
            out(f"  PROBLEM: {problem.field}: {problem.message}" if problem.field else f"  PROBLEM: {problem.message}")
        problems += len(found)
        if routed is None:
            continue
        task = parse_task(row, index=0, source=source, default_env=env_class.name)
        out("  the model is shown:")
        for line in _shown(task, routed):
            out(line)
        problems += await _check_task(task, routed, calls=calls, answer=answer, limits=limits or EngineConfig().limits, out=out)
    checked = len(rows[:limit])
    out(f"{checked} of {len(rows)} row(s) checked: " + ("ok" if not problems else f"{problems} problem(s)"))
    return problems
