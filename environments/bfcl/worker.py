"""The BFCL side of the bridge: a JSON-lines worker that runs inside `.venv-bfcl` (`make install-bfcl`).

It imports `bfcl-eval` (whose pins conflict with gym_bridge's venv) and nothing of gym_bridge. Each line on stdin is a
request `{"op": ..., ...}`; each answer is one line `{"ok": true, "result": ...}` or `{"ok": false, "error": ...}`.
Rows, tool schemas, the multi-turn backends and every verdict come from BFCL's own code. Call strings, which BFCL's
executor `eval`s, are built here only from calls whose name is one of the entry's functions, whose keys are
identifiers and whose arguments parsed as a JSON object (BFCL's own decoder then renders the JSON values).
"""

from __future__ import annotations

import copy
import json
import keyword
import os
import re
import sys
from typing import Any

os.environ.setdefault("OPENAI_API_KEY", "unused")  # BFCL's OpenAI handler builds a client; nothing is sent

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING  # noqa: E402
from bfcl_eval.constants.enums import Language  # noqa: E402
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI  # noqa: E402
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker  # noqa: E402
from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING  # noqa: E402
from bfcl_eval.model_handler.utils import convert_to_tool  # noqa: E402
from bfcl_eval.utils import (  # noqa: E402
    is_empty_output,
    is_function_calling_format_output,
    is_java,
    is_js,
    load_dataset_entry,
    load_ground_truth_entry,
)

MODEL = "gpt-4.1-2025-04-14-FC"
"""The BFCL registry entry whose conventions the bridge follows: an OpenAI function-calling model (tool names with
dots carry underscores, calls arrive as `{name: arguments JSON}`)."""

AST_CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
)
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES + MULTI_TURN_CATEGORIES
"""BFCL v4's categories that run offline here (web search needs the network, memory a sentence-transformers model)."""

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")

_config = MODEL_CONFIG_MAPPING[MODEL]
_handler = _config.model_handler(model_name=_config.model_name, temperature=0, registry_name=MODEL, is_fc_model=_config.is_fc_model)
"""BFCL's handler of `MODEL`, built as its eval runner builds it: its decoders turn calls into what the checkers read."""
_entries: dict[str, dict[str, Any]] = {}
"""Entries (as BFCL's checker loads them, without the language hints) by id, loaded per category on first use."""
_answers: dict[str, Any] = {}
_loaded: set[str] = set()
_sessions: dict[str, dict[str, Any]] = {}


def category_of(entry_id: str) -> str:
    """BFCL's category of an entry id (`live_simple_3-2-0` -> `live_simple`)."""
    return entry_id.split(":")[0].rsplit("_", 1)[0]


def _load(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; known: {', '.join(CATEGORIES)}")
    if category in _loaded:
        return
    for entry in load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False):
        _entries[entry["id"]] = entry
    if category not in RELEVANCE_CATEGORIES:
        for answer in load_ground_truth_entry(category):
            _answers[answer["id"]] = answer["ground_truth"]
    _loaded.add(category)


def entry(entry_id: str) -> dict[str, Any]:
    """The BFCL entry with this id (KeyError naming it when there is none)."""
    _load(category_of(entry_id))
    if entry_id not in _entries:
        raise KeyError(f"no BFCL entry {entry_id!r} in category {category_of(entry_id)!r}")
    return _entries[entry_id]


def to_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs as Responses-format tools, converted the way BFCL converts them for OpenAI models."""
    tools = convert_to_tool(functions, GORILLA_TO_OPENAPI, _handler.model_style)
    return [{"type": "function", "name": t["name"], "description": t.get("description", ""), "parameters": t["parameters"]} for t in tools]


def rows(category: str) -> list[dict[str, Any]]:
    """Every entry of `category` as the model is shown it (BFCL's inference view: language hints included)."""
    _load(category)
    shown = load_dataset_entry(category, include_prereq=False, include_language_specific_hint=True)
    result = []
    for item in shown:
        turns = item["question"]
        missed = {turn: [doc["name"] for doc in docs] for turn, docs in item.get("missed_function", {}).items()}
        result.append({"id": item["id"], "category": category, "turns": turns, "tools": to_tools(item["function"]),
                       "missed_function": missed, "ground_truth": _answers.get(item["id"])})
    return result


class Undecodable(ValueError):
    """Arguments that BFCL's decoder cannot read (not a JSON object): BFCL leaves the whole step out."""


def _checked_call(call: dict[str, Any], names: set[str], *, executable: bool = True) -> dict[str, Any]:
    """`{name: arguments}` for BFCL's decoders; ValueError for a call of an unknown function, arguments that are not
    a JSON object, or (`executable`: to be rendered as a call string) argument names that are not identifiers."""
    name, arguments = call.get("name"), call.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as error:
        raise Undecodable(f"arguments of {name} are not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise Undecodable(f"arguments of {name} are not a JSON object")
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"unknown function {name!r}")
    for key in parsed if executable else ():
        if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
            raise ValueError(f"argument name {key!r} of {name} is not an identifier")
    return {name: json.dumps(parsed)}


def _tool_names(functions: list[dict[str, Any]]) -> set[str]:
    return {tool["name"] for tool in to_tools(functions)}


def ast_check(entry_id: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """BFCL's verdict on one single-turn answer (`calls`: the model's tool calls, `{name, arguments}`), as its runner
    reaches it for an OpenAI function-calling model: decode, format check, then the AST or relevance rule."""
    item = entry(entry_id)
    category = category_of(entry_id)
    try:
        names = {name for name in _tool_names(item["function"]) if NAME.match(name)}
        checked = [_checked_call(call, names, executable=False) for call in calls]
        decoded = _handler.decode_ast(checked, language=None, has_tool_call_tag=False) if calls else None
    except Exception as error:  # BFCL: a result that does not decode is no function call
        decoded, decode_error = None, f"{type(error).__name__}: {error}"
    else:
        decode_error = "" if calls else "the answer holds no function call"
    if category in RELEVANCE_CATEGORIES:
        called = decoded is not None and not is_empty_output(decoded)
        valid = not called if "irrelevance" in category else called
        return {"valid": valid, "error_type": "" if valid else ("irrelevance_error:decoder_success" if called else "relevance_error:decoder_failed")}
    if decoded is None:
        return {"valid": False, "error_type": "ast_decoder:decoder_failed", "error": decode_error}
    if not is_function_calling_format_output(decoded):
        return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format"}
    language = Language.JAVA if is_java(category) else Language.JAVASCRIPT if is_js(category) else Language.PYTHON
    verdict = ast_checker(item["function"], decoded, _answers[entry_id], language, category, MODEL)
    if verdict["valid"]:
        return {"valid": True, "error_type": ""}
    return {"valid": False, "error_type": verdict.get("error_type", ""), "error": verdict.get("error", "")}


def _instance_prefix(model_name: str, entry_id: str) -> str:
    return re.sub(r"[-./:]", "_", f"{model_name}_{entry_id}_")


def _forget(model_name: str, entry_id: str) -> None:
    """Drop the backend instances BFCL's executor keeps in its module globals for `model_name` on this entry."""
    prefix = _instance_prefix(model_name, entry_id)
    store = vars(multi_turn_utils)
    for key in [key for key in store if key.startswith(prefix)]:
        del store[key]


def _execute(session: dict[str, Any], calls: list[str], model_name: str, *, evaluation: bool = False) -> list[str]:
    item = session["entry"]
    results, _ = multi_turn_utils.execute_multi_turn_func_call(
        calls, item["initial_config"], item["involved_classes"], model_name, item["id"],
        long_context="long_context" in category_of(item["id"]), is_evaL_run=evaluation)
    return [str(result) for result in results]


def open_session(session_id: str, entry_id: str) -> dict[str, Any]:
    """Start one rollout's backends (BFCL's initial state); returns the functions added later, by turn."""
    item = entry(entry_id)
    if category_of(entry_id) not in MULTI_TURN_CATEGORIES:
        raise ValueError(f"{entry_id!r} is not a multi-turn entry")
    model_name = f"gym_bridge_{session_id}"
    session = {"entry": item, "model": model_name, "names": set(_tool_names(item["function"]))}
    _sessions[session_id] = session
    _execute(session, [], model_name)
    added = {}
    for turn, docs in item.get("missed_function", {}).items():
        functions = json.dumps(docs)
        added[turn] = {"tools": to_tools(docs), "message": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=functions)}
    return {"added": added}


def add_functions(session_id: str, turn: str) -> None:
    """Make the functions BFCL holds out until `turn` callable in this session."""
    session = _sessions[session_id]
    session["names"] |= _tool_names(session["entry"].get("missed_function", {}).get(turn, []))


def call(session_id: str, call: dict[str, Any]) -> str:
    """Run one tool call on the session's backends; returns BFCL's execution result (an error text for a bad call)."""
    session = _sessions[session_id]
    try:
        rendered = _handler.decode_execute([_checked_call(call, session["names"])], has_tool_call_tag=False)
    except Exception as error:
        return f"Error during execution: {type(error).__name__}: {error}"
    return _execute(session, rendered, session["model"])[0]


def decode_turns(entry_id: str, turns: list[list[list[dict[str, Any]]]]) -> tuple[list[list[list[str]]], int]:
    """The model's calls per turn and step as BFCL's call strings, and how many calls were left out. As in BFCL's
    runner, a step whose arguments do not parse is left out whole, and so are steps without calls; a call of an unknown
    function or with an argument name that is no identifier is left out alone (BFCL would `eval` it into an error)."""
    item = entry(entry_id)
    names = _tool_names(item["function"]) | {name for docs in item.get("missed_function", {}).values() for name in _tool_names(docs)}
    decoded_turns, malformed = [], 0
    for turn in turns:
        steps = []
        for step in turn:
            good = []
            for one in step:
                try:
                    good.append(_checked_call(one, names))
                except Undecodable:  # BFCL's decoder fails on the step: the whole step is left out
                    malformed += 1
                    good = []
                    break
                except ValueError:  # an unknown function or argument name: BFCL's executor would fail it, changing nothing
                    malformed += 1
            strings = _handler.decode_execute(good, has_tool_call_tag=False) if good else []
            if strings:
                steps.append(strings)
        decoded_turns.append(steps)
    return decoded_turns, malformed


def multi_turn_check(entry_id: str, turns: list[list[list[dict[str, Any]]]], check_id: str) -> dict[str, Any]:
    """BFCL's verdict on a multi-turn episode: `turns` holds, per BFCL turn, the model's steps, each its calls."""
    item = entry(entry_id)
    ground_truth = _answers[entry_id]
    if len(turns) != len(ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error": f"{len(turns)} turns answered of {len(ground_truth)}", "malformed": 0}
    decoded, malformed = decode_turns(entry_id, turns)
    model_name = f"gym_bridge_check_{check_id}"
    try:
        verdict = multi_turn_checker(decoded, ground_truth, copy.deepcopy(item), category_of(entry_id), model_name)
    finally:
        _forget(model_name + "_eval", entry_id)
        _forget(model_name + "_ground_truth_eval", entry_id)
    return {"valid": bool(verdict["valid"]), "error_type": verdict.get("error_type", ""),
            "error": verdict.get("error_message", ""), "malformed": malformed, "decoded": decoded}


def _renderable(step: Any, item: dict[str, Any]) -> Any:
    """A step of a model result without the calls BFCL's runner would `eval` though they name no function of the
    entry or hold argument names that are no identifiers (arguments that are not JSON stay: BFCL never runs them)."""
    if not isinstance(step, list):
        return step
    names = _tool_names(item["function"]) | {name for docs in item.get("missed_function", {}).values() for name in _tool_names(docs)}
    kept = []
    for call in step:
        [(name, arguments)] = call.items()
        try:
            _checked_call({"name": name, "arguments": arguments}, names)
        except Undecodable:
            pass
        except ValueError:
            continue
        kept.append(call)
    return kept


def runner_verdict(entry_id: str, result: Any) -> dict[str, Any]:
    """BFCL's eval runner on one entry's model result in BFCL's own result format (single-turn: `[{name: arguments}]`
    or the answer's text; multi-turn: per turn, per step, either of those), for the equivalence tests. Calls the
    worker would not render as call strings must already be left out of a multi-turn result."""
    from bfcl_eval.constants.enums import ReturnFormat
    from bfcl_eval.eval_checker import eval_runner

    item = copy.deepcopy(entry(entry_id))
    category = category_of(entry_id)
    if category in RELEVANCE_CATEGORIES:
        verdict = eval_runner._evaluate_single_relevance_entry(_handler, entry_id, result, item, MODEL, category)
    elif category in MULTI_TURN_CATEGORIES:
        result = [[_renderable(step, item) for step in turn] for turn in result]
        verdict = eval_runner._evaluate_single_multi_turn_entry(_handler, entry_id, result, _answers[entry_id], item, MODEL, category)
        _forget(MODEL + "_eval", entry_id)
        _forget(MODEL + "_ground_truth_eval", entry_id)
    else:
        language = Language.JAVA if is_java(category) else Language.JAVASCRIPT if is_js(category) else Language.PYTHON
        return_format = ReturnFormat.JAVA if is_java(category) else ReturnFormat.JAVASCRIPT if is_js(category) else ReturnFormat.PYTHON
        verdict = eval_runner._evaluate_single_ast_entry(_handler, entry_id, result, _answers[entry_id], item, MODEL, category,
                                                         language=language, return_format=return_format)
    error = verdict.get("error")
    error_type = verdict.get("error_type") or (error.get("error_type", "") if isinstance(error, dict) else "")
    return {"valid": bool(verdict["valid"]), "error_type": "" if verdict["valid"] else error_type}


def close_session(session_id: str) -> None:
    session = _sessions.pop(session_id, None)
    if session is not None:
        _forget(session["model"], session["entry"]["id"])


def handle(request: dict[str, Any]) -> Any:
    op = request.get("op")
    if op == "hello":
        from importlib.metadata import version

        return {"bfcl_eval": version("bfcl-eval"), "categories": list(CATEGORIES)}
    if op == "rows":
        return rows(request["category"])
    if op == "ast_check":
        return ast_check(request["id"], request["calls"])
    if op == "open":
        return open_session(request["session"], request["id"])
    if op == "add_functions":
        return add_functions(request["session"], request["turn"])
    if op == "call":
        return call(request["session"], request["call"])
    if op == "multi_turn_check":
        return multi_turn_check(request["id"], request["turns"], request["check"])
    if op == "close":
        return close_session(request["session"])
    if op == "runner_verdict":
        return runner_verdict(request["id"], request["result"])
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # BFCL's code prints; only answers go to the real stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = {"ok": True, "result": handle(json.loads(line))}
        except Exception as error:
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(answer, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
