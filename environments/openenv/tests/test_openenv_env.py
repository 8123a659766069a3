"""openenv against real OpenEnv servers (openenv's own framework, run as a subprocess in .venv-openenv).

One server process serves the example guess game (`/guess`, simulation mode), an MCP calculator (`/calc`) and a
faulty environment (`/faulty`) that crashes or hangs on command. Scripted plays go through the real engine; the
conformance tests compare their rewards with OpenEnv's own client loop (`openenv_reference.py`) on the same plays.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

import pytest
from fastapi import FastAPI, WebSocket

from environments.openenv import DEFAULT_PYTHON, OpenEnvEnvironment
from environments.openenv.server import ServerSpec, server_url, stop_servers
from environments.openenv.session import OpenEnvError
from gym_bridge import Engine, EngineConfig, MissingExtraError, SamplingParams, ScriptedPolicy
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.task import load_tasks, parse_task
from tests.support.http_server import app_in_thread
from tests.support.invariants import assert_token_invariants

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.integration,  # one OpenEnv server process, started in 10-40 s on 2 busy cores
              pytest.mark.skipif(not DEFAULT_PYTHON.exists(), reason="OpenEnv's venv is missing: make openenv-venv")]
GUESS_ROWS = [task.row for task in load_tasks(OpenEnvEnvironment.example_data)]


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture(scope="module")
def url():
    spec = ServerSpec(python=str(DEFAULT_PYTHON), app="servers:app", app_dir=str(HERE))
    try:
        yield asyncio.run(server_url(spec, start_timeout_s=120))
    finally:
        stop_servers()


def env_for(base_url: str | None, **settings) -> type[OpenEnvEnvironment]:
    return type("OpenEnvUnderTest", (OpenEnvEnvironment,), {"base_url": base_url, "__module__": __name__, **settings})


def row(path: str, *, mode: str = "simulation", seed: int = 3, tools: list[dict] | None = None) -> dict:
    guess_tools = GUESS_ROWS[0]["responses_create_params"]["tools"]
    return {"responses_create_params": {"input": "play", "tools": tools or guess_tools},
            "openenv": {"url": path, "mode": mode, "reset": {"seed": seed}}}


def calc_tools() -> list[dict]:
    integer = {"type": "integer"}
    schema = {"type": "object", "properties": {"a": integer, "b": integer}, "required": ["a", "b"]}
    return [{"type": "function", "name": name, "description": name, "parameters": schema} for name in ("add", "multiply")] + [
        {"type": "function", "name": "submit_answer", "description": "submit", "parameters": {"type": "object", "properties": {"answer": integer}}}]


def run(env_class, rows_and_turns: list[tuple[dict, list]], smol_template, *, max_turns: int = 6) -> list:
    """One rollout per (row, scripted turns), all at once, through the real engine."""
    policy = ScriptedPolicy({f"{i}-0": turns for i, (_, turns) in enumerate(rows_and_turns)})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(max_turns=max_turns)))
    tasks = [parse_task(r, index=i, default_env="openenv") for i, (r, _) in enumerate(rows_and_turns)]

    async def go() -> list:
        return await asyncio.gather(*(engine.rollout(task, 0, env_class=env_class) for task in tasks))

    return asyncio.run(go())


def open_sessions(url: str, *, settle_s: float = 5.0) -> dict[str, int]:
    """The test server's environment instances not yet closed, once they stop changing (closing is asynchronous there)."""
    deadline, last = time.monotonic() + settle_s, None
    while True:
        now = httpx.get(url + "/open_sessions", timeout=5).json()
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.3)


def reference_rewards(server: str, plays: list[tuple[str, str, list]]) -> list[float]:
    """The rewards OpenEnv's own client loop gives the same plays ((url, mode, tool calls), reset with seed 3), run by
    the test server in OpenEnv's venv (`POST /reference`, `openenv_reference.py`)."""
    specs = [{"url": url, "mode": mode, "reset": {"seed": 3}, "turns": [list(step) for step in play]} for url, mode, play in plays]
    answer = httpx.post(server + "/reference", json=specs, timeout=120)
    assert answer.status_code == 200, answer.text[-2000:]
    return [float(reward) for reward in answer.json()["rewards"]]


# (path, mode, seed 3, the play: tool calls, one per turn) -> the reward gym_bridge must give
PLAYS = {
    "guess: win on the second try": ("/guess", "simulation", [("act", {"guess": 2}), ("act", {"guess": 4})], 1.0),  # target 3 % 16 + 1 = 4
    "guess: four wrong guesses lose": ("/guess", "simulation", [("act", {"guess": 1}), ("act", {"guess": 9}), ("act", {"guess": 7}),
                                                                  ("act", {"guess": 5})], 0.0),
    "calc: multiply, add, submit the right answer": ("/calc", "mcp", [("multiply", {"a": 5, "b": 6}), ("add", {"a": 30, "b": 5}),
                                                                        ("submit_answer", {"answer": 35})], 1.0),  # 5 * 6 + 5
    "calc: an unknown tool, then a wrong answer": ("/calc", "mcp", [("divide", {"a": 5, "b": 6}), ("submit_answer", {"answer": 30})], 0.0),
}


def test_scripted_plays_score_what_openenvs_own_loop_scores(url, smol_template, turn) -> None:
    cases = []
    for path, mode, play, _ in PLAYS.values():
        tools = calc_tools() if mode == "mcp" else None
        cases.append((row(url + path, mode=mode, tools=tools), [turn(call(name, args)) for name, args in play] + [turn("Done.")]))
    records = run(env_for(None), cases, smol_template)
    references = reference_rewards(url, [(url + path, mode, play) for path, mode, play, _ in PLAYS.values()])
    for (name, (path, mode, play, expected)), record, reference in zip(PLAYS.items(), records, references):
        assert record.failure_kind is None, (name, record.failure_reason)
        assert record.reward == expected == reference, name
        assert_token_invariants(record.to_dict())
    win = records[0]
    outputs = [json.loads(item["output"]) for item in win.output if item["type"] == "function_call_output"]
    assert outputs == [{"observation": {"message": "higher", "guesses_left": 3}, "reward": 0.0, "done": False},
                       {"observation": {"message": "correct", "guesses_left": 2}, "reward": 1.0, "done": True}]
    assert win.finish_reason == "answer" and win.turns == 2      # the episode's end ends the rollout: "Done." never generated
    calc = [json.loads(item["output"]) for item in records[2].output if item["type"] == "function_call_output"]
    assert calc[0]["observation"] == {"result": 30} and calc[2]["done"] is True
    unknown = [item["output"] for item in records[3].output if item["type"] == "function_call_output"][0]
    assert "unknown tool 'divide'" in unknown                    # not a tool of the row: never sent
    assert open_sessions(url)["calc"] == 0                       # each rollout's session, and the reference's, closed


def test_an_invalid_action_is_shown_to_the_model_and_scored(url, smol_template, turn) -> None:
    turns = [turn(call("act", {"guess": 40})), turn(call("act", {"number": 4})), turn(call("act", {"guess": 4})), turn("Done.")]
    [record] = run(env_for(None), [(row(url + "/guess"), turns)], smol_template)
    outputs = [item["output"] for item in record.output if item["type"] == "function_call_output"]
    assert "less than or equal to 16" in outputs[0] and "invalid action" in outputs[0]   # the server's 422-style verdict
    assert "invalid action" in outputs[1]
    assert record.failure_kind is None and record.reward == 1.0


def test_a_crash_and_a_hang_fail_only_their_own_rollouts(url, smol_template, turn) -> None:
    env_class = env_for(None, tool_timeout_s=4.0, request_timeout_s=2.0)
    tools = [{"type": "function", "name": "act", "description": "", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    cases = [(row(url + "/faulty", tools=tools), [turn(call("act", {"command": command})), turn("Done.")])
             for command in ("crash", "hang", "ok", "finish")]
    before = open_sessions(url)["faulty"]
    crash, hang, ok, finish = run(env_class, cases, smol_template)
    assert crash.failure_kind == "env" and "the environment crashed on purpose" in crash.failure_reason
    assert hang.failure_kind == "env" and "no answer to 'step' within 2 s" in hang.failure_reason
    assert (ok.failure_kind, ok.reward, finish.failure_kind, finish.reward) == (None, 0.5, None, 1.0)
    # every session was closed but the hung one, whose step thread never returns (so the server cannot close it)
    assert open_sessions(url)["faulty"] - before == 1


def test_a_rollout_cut_by_its_deadline_closes_its_session(url, smol_template, turn) -> None:
    closed = []

    class Watched(env_for(None, tool_timeout_s=30.0, request_timeout_s=25.0)):
        async def close(self) -> None:
            await super().close()
            closed.append(self.session.closed)

    tools = [{"type": "function", "name": "act", "description": "", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    engine = Engine(ScriptedPolicy({"0-0": [turn(call("act", {"command": "hang"}))]}), smol_template,
                    EngineConfig(sampling=SamplingParams(max_new_tokens=64), deadline_s=2.0))
    record = asyncio.run(engine.rollout(parse_task(row(url + "/faulty", tools=tools), index=0, default_env="openenv"), 0, env_class=Watched))
    assert record.failure_kind == "timeout" and closed == [True]   # cancelled mid-step, the session closed all the same


def test_a_server_that_is_down_or_answers_garbage_fails_as_env(smol_template, turn) -> None:
    garbage = FastAPI()

    @garbage.websocket("/ws")
    async def nonsense(socket: WebSocket) -> None:
        await socket.accept()
        await socket.receive_text()
        await socket.send_text("<html>not OpenEnv</html>")

    with app_in_thread(garbage) as garbage_url, app_in_thread(FastAPI()) as plain_url:
        scripts = [[turn(call("act", {"guess": 4}))]] * 3
        urls = ["http://127.0.0.1:9", garbage_url, plain_url]
        down, nonsense_record, plain = run(env_for(None), [(row(u), s) for u, s in zip(urls, scripts)], smol_template)
    assert down.failure_kind == "env" and "no OpenEnv server at http://127.0.0.1:9" in down.failure_reason
    assert nonsense_record.failure_kind == "env" and "not JSON" in nonsense_record.failure_reason
    assert plain.failure_kind == "env" and "not an OpenEnv session endpoint (HTTP 403" in plain.failure_reason


def test_a_server_it_starts_needs_openenvs_venv() -> None:
    missing = env_for(None, server_python="/nonexistent/python")
    with pytest.raises(MissingExtraError, match="make openenv-venv"):
        missing.check_ready()
    env_for("http://127.0.0.1:9", server_python="/nonexistent/python").check_ready()   # a URL needs no venv
    env_for(None, server_app="", server_python="/nonexistent/python").check_ready()    # nor rows that each name theirs


def test_a_server_that_fails_to_start_is_reported_with_its_log() -> None:
    spec = ServerSpec(python=str(DEFAULT_PYTHON), app="no_such_module:app", app_dir=str(HERE))
    with pytest.raises(OpenEnvError, match=r"no_such_module:app exited \(3\) while starting: .*Could not import module \"no_such_module\""):
        asyncio.run(server_url(spec, start_timeout_s=60))
