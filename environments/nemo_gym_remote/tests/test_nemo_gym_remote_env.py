"""nemo_gym_remote against real HTTP servers on loopback: the example resources server and faulty ones.

The same scripted trajectories run through the in-process `weather` environment and through the
example server (which speaks NeMo Gym's resources-server protocol) must earn the same rewards.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from environments.nemo_gym_remote import NemoGymRemoteEnvironment
from environments.nemo_gym_remote.example_server import ServerState, build_app
from environments.weather import WeatherEnvironment
from gym_bridge import BackendError, DataError, Engine, EngineConfig, SamplingParams, ScriptedPolicy
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.registry import REMOTE_ENVIRONMENT, get_environment, register, resolve_tasks
from gym_bridge.core.task import load_tasks, parse_task
from tests.support.http_server import app_in_thread
from tests.support.invariants import assert_token_invariants

ROWS = [task.row for task in load_tasks(NemoGymRemoteEnvironment.example_data)]


def call(arguments: dict, name: str = "get_weather") -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# (model turns, what the in-process weather environment gives)
TRAJECTORIES = {
    "calls the tool": (lambda turn: [turn(call({"city": "Oslo"})), turn("It is cold in Oslo.")], 1.0),
    "answers without a tool": (lambda turn: [turn("It is sunny.")], 0.0),
    "bad arguments, then gives up": (lambda turn: [turn(call({"town": "Oslo"})), turn("I could not check.")], 1.0),
    "unknown tool": (lambda turn: [turn(call({"city": "Oslo"}, name="get_forecast")), turn("No idea.")], 0.0),
    "two calls": (lambda turn: [turn(call({"city": "Oslo"})), turn(call({"city": "Lima"})), turn("Cold in both.")], 1.0),
}


def remote(base_url: str | None = None, **settings) -> type[NemoGymRemoteEnvironment]:
    return type("Remote", (NemoGymRemoteEnvironment,), {"base_url": base_url, **settings})


def run_all(env_class, scripts: dict[str, list], smol_template, rows: list[dict] | None = None) -> list:
    """One rollout per script (session ids "i-0"), all at once, through the engine."""
    policy = ScriptedPolicy({f"{i}-0": steps for i, steps in enumerate(scripts.values())})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(max_turns=4)))
    rows = rows or [ROWS[i % len(ROWS)] for i in range(len(scripts))]
    tasks = [parse_task(row, index=i, default_env="nemo_gym_remote") for i, row in enumerate(rows)]

    async def go() -> list:
        return await asyncio.gather(*(engine.rollout(task, 0, env_class=env_class) for task in tasks))

    return asyncio.run(go())


@pytest.fixture(scope="module")
def server():
    state = ServerState()
    with app_in_thread(build_app(state)) as url:
        yield url, state


def test_same_rewards_as_the_in_process_weather_environment(server, smol_template, turn) -> None:
    url, _ = server
    scripts = {name: make(turn) for name, (make, _) in TRAJECTORIES.items()}
    remote_records = run_all(remote(url), scripts, smol_template)
    local_records = run_all(WeatherEnvironment, {name: make(turn) for name, (make, _) in TRAJECTORIES.items()}, smol_template)
    for (name, (_, expected)), remote_record, local_record in zip(TRAJECTORIES.items(), remote_records, local_records):
        assert remote_record.failure_kind is None, (name, remote_record.failure_reason)
        assert remote_record.reward == local_record.reward == expected, name
        assert_token_invariants(remote_record.to_dict())
    outputs = [item["output"] for item in remote_records[0].output if item["type"] == "function_call_output"]
    assert json.loads(outputs[0]) == {"city": "Oslo", "weather_description": "The weather in Oslo is cold."}
    rejected = [item["output"] for item in remote_records[2].output if item["type"] == "function_call_output"]
    assert "Field required" in rejected[0]                # the server's 422 is what the model reads
    unknown = [item["output"] for item in remote_records[3].output if item["type"] == "function_call_output"]
    assert "unknown tool 'get_forecast'" in unknown[0]   # never sent: not a tool of the row


def test_each_rollout_keeps_its_own_session_cookie(server, smol_template, turn) -> None:
    url, _ = server
    scripts = {f"r{i}": [turn(call({"city": f"C{j}"})) for j in range(i)] + [turn("Done.")] for i in range(4)}
    records = run_all(remote(url), scripts, smol_template)
    for i, record in enumerate(records):
        assert record.verify_metrics["session_seeded"] is True
        assert record.verify_metrics["session_tool_calls"] == i   # the server saw exactly this rollout's calls


def test_rows_route_by_agent_ref_remote_and_by_env_url(server) -> None:
    url, _ = server
    row = {**ROWS[0], "agent_ref": {"type": "responses_api_agents", "name": "example_single_tool_call", "remote": url}}
    task = parse_task(row, index=0)
    assert resolve_tasks([task]) == {"example_single_tool_call": get_environment(REMOTE_ENVIRONMENT)}
    local = parse_task({**ROWS[0], "agent_ref": {"name": "example_single_tool_call"}}, index=1, source="data.jsonl:2")
    with pytest.raises(DataError, match="data.jsonl:2: agent_ref.remote"):
        resolve_tasks([task, local])

    from gym_bridge.cli.eval_engine import _apply_env_options
    from gym_bridge.core.trust import DEFAULT_TRUST
    from gym_bridge.eval.run import select_tasks

    original = get_environment("weather")
    try:
        _apply_env_options([], [f"weather={url}"], DEFAULT_TRUST)
        tasks = select_tasks(env_names=["weather"], limit=2)
        bound = resolve_tasks(tasks)[tasks[0].env_name]   # weather's rows use its alias
        assert issubclass(bound, NemoGymRemoteEnvironment) and bound.base_url == url
        assert bound.example_data == WeatherEnvironment.example_data
        with pytest.raises(Exception, match="NAME=URL"):
            _apply_env_options([], ["weather:8000"], DEFAULT_TRUST)
    finally:
        register(original)


def test_a_server_that_is_down_fails_rollouts_as_env_quickly(smol_template, turn) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]   # closed again: nothing listens here
    started = time.perf_counter()
    records = run_all(remote(f"http://127.0.0.1:{port}", max_retries=2), {"a": [turn("Hi")], "b": [turn("Hi")]}, smol_template)
    assert time.perf_counter() - started < 10
    for record in records:
        assert record.failure_kind == "env" and record.mask_sample
        assert "seed_session" in record.failure_reason and "ConnectError" in record.failure_reason and "3 attempts" in record.failure_reason


def faulty_app(*, seed=None, tool=None, verify=None, tool_sleep_s: float = 0.0, calls: list | None = None):
    """A resources server whose routes answer as told (a body string, or a status and body)."""
    app = FastAPI()

    def answer(spec, default):
        if spec is None:
            return default
        status, body = spec
        return PlainTextResponse(body, status_code=status)

    @app.post("/seed_session")
    async def seed_session() -> object:
        return answer(seed, {})

    @app.post("/get_weather")
    async def get_weather(request: Request) -> object:
        if calls is not None:
            calls.append(await request.json())
        await asyncio.sleep(tool_sleep_s)
        return answer(tool, {"city": "x", "weather_description": "cold"})

    @app.post("/verify")
    async def verify_route() -> object:
        return answer(verify, {"reward": 1.0})

    return app


@pytest.mark.parametrize(
    "routes, where",
    [
        ({"seed": (200, "<html>oops</html>")}, "seed_session"),
        ({"seed": (503, "overloaded")}, "seed_session"),
        ({"verify": (200, "not json")}, "verify"),
        ({"verify": (200, '{"score": 1}')}, "verify"),
        ({"verify": (200, '{"reward": "high"}')}, "verify"),
        ({"tool": (500, "Internal Server Error")}, "get_weather"),
    ],
)
def test_garbage_answers_fail_the_rollout_as_env(routes, where, smol_template, turn) -> None:
    with app_in_thread(faulty_app(**routes)) as url:
        records = run_all(remote(url), {"a": [turn(call({"city": "Oslo"})), turn("Cold.")]}, smol_template)
    assert records[0].failure_kind == "env" and records[0].mask_sample, records[0].failure_reason
    assert where in records[0].failure_reason


def test_a_tool_that_ran_is_not_retried_and_a_slow_one_times_out(smol_template, turn) -> None:
    calls: list = []
    with app_in_thread(faulty_app(tool_sleep_s=1.5, calls=calls)) as url:
        started = time.perf_counter()
        records = run_all(remote(url, request_timeout_s=0.3, max_retries=3), {"a": [turn(call({"city": "Oslo"})), turn("x")]}, smol_template)
        elapsed = time.perf_counter() - started
    assert records[0].failure_kind == "env" and "ReadTimeout" in records[0].failure_reason
    assert calls == [{"city": "Oslo"}]                     # sent once, never again
    assert elapsed < 1.5


def test_connection_errors_before_sending_are_retried_even_for_tools(smol_template, turn) -> None:
    attempts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request.url.path)
        if request.url.path == "/get_weather" and attempts.count("/get_weather") == 1:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/verify":
            return httpx.Response(200, json={"reward": 1.0})
        return httpx.Response(200, json={"ok": True}, headers={"set-cookie": "sid=abc; Path=/"})

    env_class = remote("http://resources.test", transport=httpx.MockTransport(handler))
    records = run_all(env_class, {"a": [turn(call({"city": "Oslo"})), turn("Cold.")]}, smol_template)
    assert records[0].failure_kind is None and records[0].reward == 1.0
    assert attempts == ["/seed_session", "/get_weather", "/get_weather", "/verify"]


def test_typed_sessions_are_closed_on_every_path(smol_template, turn) -> None:
    state = ServerState()
    with app_in_thread(build_app(state)) as url:
        env_class = remote(url, session_protocol="typed")
        scripts = {"ok": [turn(call({"city": "Oslo"})), turn("Cold.")], "backend fails": [BackendError("the model server fell over")]}
        records = run_all(env_class, scripts, smol_template)
    assert records[0].reward == 1.0 and records[1].failure_kind == "infra"
    assert len(state.closed) == 2 and all(closed.startswith("gb-") for closed in state.closed)
    assert state.requests.count("/seed_session") == state.requests.count("/close_session") == 2


def test_a_sample_the_server_masks_stays_masked(smol_template, turn) -> None:
    body = json.dumps({"reward": 0.0, "mask_sample": True, "failure_kind": "judge_error", "failure_reason": "judge down"})
    with app_in_thread(faulty_app(verify=(200, body))) as url:
        records = run_all(remote(url), {"a": [turn("Hi")]}, smol_template)
    assert records[0].failure_kind == "verifier" and "judge down" in records[0].failure_reason


def test_a_row_without_a_server_names_what_to_add(smol_template, turn) -> None:
    records = run_all(remote(None), {"a": [turn("Hi")]}, smol_template)
    assert records[0].failure_kind == "env" and "--env-url nemo_gym_remote=URL" in records[0].failure_reason


# -- NeMo Gym's own server ---------------------------------------------------------------------

NEMO_GYM_VERSION = "0.7.0"
SERVER_SCRIPT = """
import sys
from unittest.mock import MagicMock

import uvicorn
from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import SimpleWeatherResourcesServer, SimpleWeatherResourcesServerConfig

port = int(sys.argv[1])
config = SimpleWeatherResourcesServerConfig(host="127.0.0.1", port=port, entrypoint="app.py", name="example_single_tool_call")
server = SimpleWeatherResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
uvicorn.run(server.setup_webserver(), host="127.0.0.1", port=port, log_level="warning")
"""


def _python313() -> str | None:
    import glob
    import shutil

    import subprocess

    candidates = [shutil.which("python3.13"), *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")))]
    for path in filter(None, candidates):   # a pyenv shim may exist without that version being active
        works = subprocess.run([path, "-c", "import sys; assert sys.version_info[:2] == (3, 13)"], capture_output=True)
        if works.returncode == 0:
            return path
    return None


def _nemo_gym_venv() -> str:
    """A Python 3.13 virtualenv with nemo-gym installed (cached); skips the test when that cannot be had."""
    import subprocess
    from pathlib import Path

    python = _python313()
    if python is None:
        pytest.skip("no Python 3.13 interpreter found (python3.13 on PATH or ~/.pyenv/versions/3.13*)")
    cache = Path(os.environ.get("GYM_BRIDGE_CACHE", Path.home() / ".cache" / "gym_bridge")) / f"nemo_gym_{NEMO_GYM_VERSION}_py313"
    venv_python = cache / "bin" / "python"
    check = [str(venv_python), "-c", "import nemo_gym, resources_servers.example_single_tool_call.app"]
    if venv_python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(venv_python)
    steps = [
        [python, "-m", "venv", "--clear", str(cache)],
        [str(venv_python), "-m", "pip", "install", "--quiet", "--ignore-requires-python", f"nemo-gym=={NEMO_GYM_VERSION}"],
        check,
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=1500)
        if done.returncode != 0:
            pytest.skip(f"cannot install nemo-gym=={NEMO_GYM_VERSION} in a Python 3.13 virtualenv: {(done.stdout + done.stderr)[-500:]}")
    return str(venv_python)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_nemo_gyms_own_example_single_tool_call_server_gives_weathers_rewards(smol_template, turn, tmp_path) -> None:
    import subprocess

    python = _nemo_gym_venv()
    script = tmp_path / "serve_example_single_tool_call.py"
    script.write_text(SERVER_SCRIPT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen([python, str(script), str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"NeMo Gym's server did not start: {(tmp_path / 'server.log').read_text()[-1000:]}")
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        local = run_all(WeatherEnvironment, {name: make(turn) for name, (make, _) in TRAJECTORIES.items()}, smol_template)
        for protocol in ("legacy", "typed"):
            records = run_all(remote(url, session_protocol=protocol), {name: make(turn) for name, (make, _) in TRAJECTORIES.items()}, smol_template)
            for name, record, local_record in zip(TRAJECTORIES, records, local):
                assert record.failure_kind is None, (protocol, name, record.failure_reason)
                assert record.reward == local_record.reward == TRAJECTORIES[name][1], (protocol, name)
                assert_token_invariants(record.to_dict())
            outputs = [item["output"] for item in records[0].output if item["type"] == "function_call_output"]
            assert json.loads(outputs[0]) == {"city": "Oslo", "weather_description": "The weather in Oslo is cold."}
            rejected = [item["output"] for item in records[2].output if item["type"] == "function_call_output"]
            assert "Field required" in rejected[0]
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


# -- answers that are too long (issue 19, item 12) ---------------------------------------------


def flooding_app(sent: list[int], *, tool_mb: int = 0, verify_body: bytes | None = None):
    """A resources server whose tool streams `tool_mb` MiB (chunked, no length) and whose verify answers `verify_body`."""
    from fastapi.responses import Response, StreamingResponse

    app = FastAPI()

    async def flood():
        for _ in range(tool_mb):
            sent.append(1)
            yield b"x" * (1 << 20)
            await asyncio.sleep(0)

    @app.post("/seed_session")
    async def seed_session() -> object:
        return {}

    @app.post("/get_weather")
    async def get_weather() -> object:
        return StreamingResponse(flood(), media_type="text/plain")

    @app.post("/verify")
    async def verify_route() -> object:
        return Response(verify_body or b'{"reward": 1.0}', media_type="application/json")

    return app


def test_an_endless_tool_answer_is_cut_off_at_max_response_bytes(smol_template, turn) -> None:
    """Item 12: a tool route that streams 64 MiB is read only up to `max_response_bytes` (here the
    default, 16 MiB) and fails the rollout as `env`; the whole body used to be read and decoded on the
    event loop (200 MB in the report: +1.8 GB and every rollout stalled 11 s)."""
    sent: list[int] = []
    with app_in_thread(flooding_app(sent, tool_mb=64)) as url:
        records = run_all(remote(url), {"a": [turn(call({"city": "Oslo"})), turn("Cold.")]}, smol_template)
    record = records[0]
    assert (record.failure_kind, record.mask_sample) == ("env", True), record.failure_reason
    assert "get_weather answered more than max_response_bytes (16,777,216 bytes)" in record.failure_reason
    assert len(sent) < 40                                   # the server was not read to the end


def test_a_declared_length_over_the_cap_is_refused_unread_and_a_long_answer_under_it_is_parsed(smol_template, turn) -> None:
    """Item 12: a verify answer whose Content-Length is over `max_response_bytes` is refused before its
    body is read; one under it that is long (3 MB, parsed in a worker thread) still scores."""
    long_answer = json.dumps({"reward": 1.0, "echo": ["y" * 1000] * 3000, "note": "kept"}).encode()
    with app_in_thread(flooding_app([], verify_body=long_answer)) as url:
        refused = run_all(remote(url, max_response_bytes=100_000), {"a": [turn("It is cold.")]}, smol_template)[0]
        scored = run_all(remote(url), {"a": [turn("It is cold.")]}, smol_template)[0]
    assert refused.failure_kind == "env" and f"Content-Length {len(long_answer):,}" in refused.failure_reason
    assert "max_response_bytes (100,000 bytes)" in refused.failure_reason
    assert scored.failure_kind is None and scored.reward == 1.0 and scored.verify_metrics["note"] == "kept"
