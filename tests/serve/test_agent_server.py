"""`gym-bridge serve` (NeMo Gym's `/run` agent protocol) over loopback, backed by `gym-bridge serve-model`.

The rows are what NeMo RL sends: NeMo Gym example rows after
`nemo_rl/experience/rollouts.py::_prepare_nemo_gym_rows` (the trainer's temperature and top_p and
`max_output_tokens` stamped on `responses_create_params`, a `_rowidx`), POSTed as they are by
`nemo_gym/rollout_collection.py::RolloutCollectionHelper.run_examples`. The results are read the
way NeMo RL reads them: `tests/support/invariants.py::nemo_rl_token_view` follows
`nemo_rl/environments/nemo_gym.py::NemoGym._postprocess_nemo_gym_to_nemo_rl_result` (contiguity
assertion included), `reward`/`reward_components` as
`nemo_rl/environments/nemo_gym.py::validate_reward_components_match_scalar` checks them, and the
mask flag where `nemo_rl/experience/rollouts.py::_extract_mask_sample_flags` looks
(`instance_config.mask_sample`). Model calls are checked against what NeMo Gym's model server sends
(`responses_api_models/vllm_model/app.py::VLLMModel._preprocess_chat_completion_create_params`:
`logprobs=True`, `top_logprobs=0`, `return_tokens_as_token_ids=True`) and what NeMo RL's server
needs to keep the prefix exact (`nemo_rl/models/generation/vllm/vllm_worker_async.py`,
`NeMoRLOpenAIChatRequestMixin.model_post_init`: the last message carrying `prompt_token_ids`).
"""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from gym_bridge.serve.agent_server import AgentServerSettings, build_app
from gym_bridge.serve.agent_launch import from_nemo_gym_environ
from gym_bridge.core.policy import Generation
from gym_bridge.core.task import MAX_ROW_DEPTH
from gym_bridge.serve.model_server import build_app as build_model_app
from tests.support.http_server import app_in_thread
from tests.support.invariants import nemo_rl_token_view
from tests.support.scripted_model import ScriptedModel, by_turn

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seattle"}}\n</tool_call>'
TRAIN_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "max_output_tokens": 64}


def nemo_rl_row(path: str, line: int = 0, rowidx: int = 0, **sampling) -> dict:
    """A NeMo Gym example row as NeMo RL's `_prepare_nemo_gym_rows` sends it."""
    with open(path, encoding="utf-8") as handle:
        row = json.loads(handle.read().splitlines()[line])
    row["responses_create_params"].update({**TRAIN_SAMPLING, **sampling})
    row["_rowidx"] = rowidx
    return row


def recording(app, bodies: list[dict]):
    """An ASGI wrapper keeping the JSON body of every chat-completions request."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await app(scope, receive, send)
        chunks: list[bytes] = []

        async def recorded_receive():
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        await app(scope, recorded_receive, send)
        bodies.append(json.loads(b"".join(chunks)))

    return wrapped


def turn_of(tokenizer, text: str, logprob: float = -0.5) -> Generation:
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Generation(token_ids=ids, logprobs=[logprob - 0.01 * i for i in range(len(ids))], finish_reason="stop")


@pytest.fixture(scope="module")
def weather_path():
    from gym_bridge.core.registry import get_environment

    return str(get_environment("weather").example_data)


@pytest.fixture(scope="module")
def model_server(smol_tokenizer):
    """serve-model's real app over a scripted weather conversation: a tool call, then an answer."""
    model = ScriptedModel(smol_tokenizer, by_turn(turn_of(smol_tokenizer, WEATHER_CALL), turn_of(smol_tokenizer, "It is cold in Seattle.")))
    bodies: list[dict] = []
    app = recording(build_model_app(model, model_name="scripted", max_request_bytes=1 << 20), bodies)
    with app_in_thread(app) as url:
        yield url, model, bodies


@pytest.fixture(scope="module")
def agent_server(model_server):
    url = model_server[0]
    settings = AgentServerSettings(envs=("weather", "math", "multi_step"), model_base_urls=(url + "/v1",), model="scripted",
                                   max_request_bytes=64 * 1024, deadline_s=60, max_retries=0, request_timeout_s=30)
    with app_in_thread(build_app(settings)) as agent_url:
        yield agent_url


def run(agent_url: str, row, **kwargs) -> httpx.Response:
    return httpx.post(agent_url + "/run", json=row, timeout=60, **kwargs)


def test_a_multi_turn_run_returns_what_nemo_rl_reads(agent_server, model_server, weather_path, smol_tokenizer, smol_template):
    url, model, bodies = model_server
    bodies.clear()
    row = nemo_rl_row(weather_path, rowidx=7)
    answer = run(agent_server, row)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    # the row comes back with the rollout
    assert result["responses_create_params"] == row["responses_create_params"] and result["_rowidx"] == 7
    assert result["agent_ref"] == row["agent_ref"] and result["env"] == "weather"
    assert result["reward"] == 1.0 and result["mask_sample"] is False and result["failure_kind"] is None
    assert result["instance_config"] == {"mask_sample": False}
    assert math.isclose(sum(result["reward_components"].values()), result["reward"])
    assert "tokens" not in result
    kinds = [item["type"] for item in result["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]
    # token fields ride on the last item of each model call, and the turns are contiguous
    calls = [item for item in result["response"]["output"] if "generation_token_ids" in item]
    assert [item["type"] for item in calls] == ["function_call", "message"]
    view = nemo_rl_token_view(result)
    first_turn = turn_of(smol_tokenizer, WEATHER_CALL)
    assert view["prompt_ids"] == calls[0]["prompt_token_ids"]
    env_ids = [token for token, m in zip(view["completion_ids"], view["completion_mask"]) if m == 0]
    assert smol_tokenizer.decode(env_ids) == (
        '\n<|im_start|>tool\n{"city": "Seattle", "weather_description": "The weather in Seattle is cold."}<|im_end|>\n<|im_start|>assistant\n'
    )
    assert view["completion_ids"][: len(first_turn.token_ids)] == first_turn.token_ids
    assert view["completion_logprobs"][: len(first_turn.logprobs)] == first_turn.logprobs
    # the token stream equals what gym_bridge's own template renders for this conversation
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the weather in Seattle?"}]
    tools = [{key: value for key, value in tool.items() if key != "strict"} for tool in row["responses_create_params"]["tools"]]
    assert view["prompt_ids"] == smol_template.prompt_ids(messages, tools)
    # the model calls, as NeMo Gym's model server makes them
    first, second = bodies
    for body in (first, second):
        assert (body["temperature"], body["top_p"], body["logprobs"], body["top_logprobs"]) == (0.7, 0.95, True, 0)
        assert body["return_tokens_as_token_ids"] is True and body["max_completion_tokens"] == 64
        assert "top_k" not in body  # NeMo RL's server refuses any top_k but -1
    assert not any("prompt_token_ids" in message for message in first["messages"])
    [assistant] = [message for message in second["messages"] if message["role"] == "assistant"]
    assert assistant["prompt_token_ids"] == calls[0]["prompt_token_ids"]
    assert assistant["generation_token_ids"] == first_turn.token_ids
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    # the second call's prompt was the exact earlier tokens plus the tool output
    assert list(model.requests[-1].prompt_ids) == calls[1]["prompt_token_ids"]


def test_single_turn_math_row_and_concurrent_runs(agent_server, smol_tokenizer):
    row = {"responses_create_params": {"input": "What is 7 + 5?", **TRAIN_SAMPLING}, "expected_answer": "12",
           "agent_ref": {"type": "responses_api_agents", "name": "math"}}

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(agent_server + "/run", json={**row, "_rowidx": i}) for i in range(12)))

    answers = asyncio.run(many())
    assert [answer.status_code for answer in answers] == [200] * 12
    results = [answer.json() for answer in answers]
    assert sorted(result["_rowidx"] for result in results) == list(range(12))
    for result in results:  # the scripted model calls get_weather, which math does not have: scored, not failed
        assert result["failure_kind"] is None and result["reward"] == 0.0
        view = nemo_rl_token_view(result)
        assert view["completion_mask"].count(1) > 0
    assert httpx.get(agent_server + "/health").json()["in_flight"] == 0


@pytest.mark.parametrize("body, field", [
    ({"agent_ref": {"name": "weather"}}, "responses_create_params.input"),
    ({"responses_create_params": {"input": "hi"}}, "agent_ref"),
    ({"responses_create_params": {"input": "hi"}, "agent_ref": {"name": "nope"}}, "agent_ref.name"),
    ({"responses_create_params": {"input": "hi"}, "agent_ref": {"name": "inventory"}}, "agent_ref.name"),
    ({"responses_create_params": {"input": "hi", "temperature": "hot"}, "agent_ref": {"name": "math"}}, "responses_create_params.temperature"),
    ({"responses_create_params": {"input": "hi", "max_output_tokens": 0}, "agent_ref": {"name": "math"}}, "responses_create_params.max_output_tokens"),
    ({"responses_create_params": {"input": "hi", "tools": [{"type": "function", "name": "get_weather", "parameters": {"properties": {"town": {}}}}]},
      "agent_ref": {"name": "weather"}}, "responses_create_params.tools[0].parameters"),
    ({"responses_create_params": "hi", "agent_ref": {"name": "math"}}, "responses_create_params"),
    ([1, 2], ""),
])
def test_malformed_rows_get_422_naming_the_field(agent_server, body, field):
    answer = run(agent_server, body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert answer.json()["detail"]


def test_bad_bodies_and_the_server_survives(agent_server):
    answer = httpx.post(agent_server + "/run", content=b"{not json", headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 422 and answer.json()["field"] == "body"
    big = {"responses_create_params": {"input": "x" * 70_000}, "agent_ref": {"name": "math"}}
    assert run(agent_server, big).status_code == 413
    assert httpx.get(agent_server + "/health").json()["status"] == "ok"


def test_a_failed_rollout_is_200_with_mask_sample(smol_tokenizer, weather_path):
    """The model server is down: the rollout fails as `infra` and comes back masked, not as an error."""
    settings = AgentServerSettings(envs=("weather",), model_base_urls=("http://127.0.0.1:9/v1",), model="m", max_retries=0, request_timeout_s=5)
    with app_in_thread(build_app(settings)) as agent_url:
        answer = run(agent_url, nemo_rl_row(weather_path))
        assert answer.status_code == 200
        result = answer.json()
        assert result["mask_sample"] is True and result["instance_config"] == {"mask_sample": True}
        assert result["failure_kind"] == "gym_bridge:infra" and "generation backend" in result["failure_reason"]
        assert result["reward"] == 0.0 and result["reward_components"] == {}
        assert httpx.get(agent_url + "/health").json()["completed"] == 1


def test_a_server_that_breaks_the_prefix_fails_the_rollout(smol_tokenizer, weather_path):
    """A chat server that re-renders without keeping the prefix (plain vLLM without NeMo RL's fix) is caught."""
    calls = iter([turn_of(smol_tokenizer, WEATHER_CALL), turn_of(smol_tokenizer, "Cold.")])
    model = ScriptedModel(smol_tokenizer, lambda text, request: next(calls))
    app = build_model_app(model, model_name="scripted")

    async def drop_token_fields(scope, receive, send):  # strip the fields the server keeps the prefix from
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            data = json.loads(body)
            for message in data["messages"]:
                message.pop("prompt_token_ids", None)
                message.pop("generation_token_ids", None)
                if message.get("tool_calls"):  # and re-render the turn differently from how it was sampled
                    message["content"] = "Let me check."
            payload = json.dumps(data).encode()
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"] + [(b"content-length", str(len(payload)).encode())]
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}

            return await app({**scope, "headers": headers}, replay, send)
        return await app(scope, receive, send)

    with app_in_thread(drop_token_fields) as url:
        settings = AgentServerSettings(envs=("weather",), model_base_urls=(url + "/v1",), model="scripted", max_retries=0)
        with app_in_thread(build_app(settings)) as agent_url:
            result = run(agent_url, nemo_rl_row(weather_path)).json()
    assert result["failure_kind"] == "gym_bridge:infra" and result["mask_sample"] is True
    assert "do not start with" in result["failure_reason"]


def test_settings_from_the_environment_nemo_gym_starts_servers_in():
    """NeMo RL puts `policy_base_url` (one URL per vLLM server) and `policy_model_name` in NeMo Gym's
    global config (`nemo_rl/environments/nemo_gym.py::NemoGym._spinup`); NeMo Gym starts each server
    with that config in `NEMO_GYM_CONFIG_DICT` and its name in `NEMO_GYM_CONFIG_PATH`, and fills in
    its host and port (`nemo_gym/global_config.py`, `validate_and_populate_defaults`)."""
    import yaml

    config = {
        "policy_base_url": ["http://10.0.0.1:41000/v1", "http://10.0.0.2:41000/v1"], "policy_model_name": "Qwen/Qwen3-4B",
        "policy_api_key": "dummy_key", "head_server": {"host": "0.0.0.0", "port": 5001},
        "weather": {"responses_api_agents": {"gym_bridge": {"entrypoint": "app.py", "host": "10.0.0.1", "port": 5123,
                                                            "envs": ["weather", "multi_step"], "max_turns": 12, "deadline_s": 900}}},
    }
    launch = from_nemo_gym_environ({"NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": "weather"})
    assert (launch.host, launch.port) == ("10.0.0.1", 5123)
    settings = launch.settings
    assert settings.envs == ("weather", "multi_step") and settings.model == "Qwen/Qwen3-4B"
    assert settings.model_base_urls == ("http://10.0.0.1:41000/v1", "http://10.0.0.2:41000/v1")
    assert (settings.max_turns, settings.deadline_s, settings.api_key) == (12, 900.0, "dummy_key")
    from gym_bridge.core.errors import GymBridgeError

    with pytest.raises(GymBridgeError, match="policy_base_url"):
        from_nemo_gym_environ({"NEMO_GYM_CONFIG_DICT": yaml.safe_dump({"weather": config["weather"]}), "NEMO_GYM_CONFIG_PATH": "weather"})
    with pytest.raises(GymBridgeError, match="NEMO_GYM_CONFIG_DICT"):
        from_nemo_gym_environ({})


class AgentServeProcess:
    """`gym-bridge serve ... --port 0` in a subprocess; `url` once it printed where it listens."""

    def __init__(self, *args: str) -> None:
        import os
        import subprocess
        import sys
        import tempfile
        from pathlib import Path

        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([sys.executable, "-m", "gym_bridge.cli", "serve", "--port", "0", *args],
                                        stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=Path(__file__).parents[2],
                                        env={**os.environ, "HF_HUB_OFFLINE": "1"})
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line.startswith("serving "):
            self.stop()
            self._stderr.seek(0)
            raise RuntimeError(f"gym-bridge serve did not start: {line!r} {self._stderr.read()}")
        self.url = line.split(" at ")[-1].strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)
        if self.process.stdout is not None:
            self.process.stdout.close()


def test_the_serve_command(model_server, smol_tokenizer):
    url = model_server[0]
    server = AgentServeProcess("--env", "math", "--model-base-url", url + "/v1", "--max-turns", "2")
    try:
        row = {"responses_create_params": {"input": "What is 7 + 5?", **TRAIN_SAMPLING}, "expected_answer": "12",
               "agent_ref": {"type": "responses_api_agents", "name": "math"}, "_rowidx": 0}
        result = run(server.url, row).json()
        assert result["failure_kind"] is None and result["response"]["model"] == "scripted" and result["metrics"]["turns"] == 2
        assert nemo_rl_token_view(result)["completion_mask"].count(1) > 0
        assert run(server.url, {"agent_ref": {"name": "weather"}, "responses_create_params": {"input": "hi"}}).status_code == 422
    finally:
        server.stop()


@pytest.mark.slow
def test_serve_with_the_embedded_model_end_to_end():
    """`gym-bridge serve` against `gym-bridge serve-model` running the embedded SmolLM2: real sampling."""
    from gym_bridge.core.registry import get_environment
    from tests.support.http_server import ServeModelProcess

    model = ServeModelProcess()
    try:
        server = AgentServeProcess("--env", "math", "--env", "weather", "--model-base-url", model.url)
        try:
            weather = json.loads(get_environment("weather").example_data.read_text().splitlines()[0])
            math_row = {"responses_create_params": {"input": "What is 7 + 5? Answer with \\boxed{N}."}, "expected_answer": "12",
                        "agent_ref": {"name": "math"}}
            rows = [math_row, {**weather, "agent_ref": {"name": "weather"}}]
            for row in rows:
                row["responses_create_params"].update(TRAIN_SAMPLING)
                result = run(server.url, row).json()
                assert result["failure_kind"] is None, result["failure_reason"]
                view = nemo_rl_token_view(result)
                assert view["completion_mask"].count(1) > 0 and all(lp <= 0.0 for lp in view["completion_logprobs"])
                assert any(lp < 0.0 for lp in view["completion_logprobs"])
                assert result["reward"] in (0.0, 1.0) and math.isclose(sum(result["reward_components"].values()), result["reward"])
        finally:
            server.stop()
    finally:
        model.stop()


def test_the_nemo_gym_entry_point_serves_runs(model_server, tmp_path):
    """`recipes/nemo_rl/responses_api_agents/gym_bridge/app.py` started as NeMo Gym starts a server
    (`nemo_gym/cli/env.py::RunHelper.start`: `python app.py` in the server's folder with
    NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH set), with the config NeMo RL's `_spinup` makes."""
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {"policy_base_url": [model_server[0] + "/v1"], "policy_model_name": "scripted", "policy_api_key": "dummy_key",
              "math": {"responses_api_agents": {"gym_bridge": {"entrypoint": "app.py", "host": "127.0.0.1", "port": port, "envs": ["math"]}}}}
    folder = Path(__file__).parents[2] / "recipes" / "nemo_rl" / "responses_api_agents" / "gym_bridge"
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": "math", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).parents[2])}
    process = subprocess.Popen([sys.executable, "app.py"], cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).json()["envs"] == ["math"]:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode() if process.stderr else ""
            time.sleep(0.1)
        row = {"responses_create_params": {"input": "What is 7 + 5?", **TRAIN_SAMPLING}, "expected_answer": "12",
               "agent_ref": {"type": "responses_api_agents", "name": "math"}, "_rowidx": 3}
        result = run(url, row).json()
        assert result["failure_kind"] is None and result["_rowidx"] == 3 and result["response"]["model"] == "scripted"
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_a_run_past_its_deadline_is_200_with_a_timeout(smol_tokenizer, weather_path):
    """A model call that never returns: the `/run` ends at `deadline_s` with a masked `timeout` record."""
    import time

    class Stuck(ScriptedModel):
        async def generate(self, request):
            await asyncio.sleep(3)  # longer than the deadline; short enough for the server to stop

    app = build_model_app(Stuck(smol_tokenizer, lambda text, request: None), model_name="scripted")
    with app_in_thread(app) as url:
        settings = AgentServerSettings(envs=("weather",), model_base_urls=(url + "/v1",), model="scripted", deadline_s=0.5, max_retries=0)
        with app_in_thread(build_app(settings)) as agent_url:
            started = time.monotonic()
            result = run(agent_url, nemo_rl_row(weather_path)).json()
            elapsed = time.monotonic() - started
            assert httpx.get(agent_url + "/health").json()["in_flight"] == 0
    assert result["failure_kind"] == "agent_timeout" and result["mask_sample"] is True
    assert elapsed < 2.5


def test_an_environment_that_refuses_to_run_stops_the_server_at_start():
    """A missing sandbox or a bad setting is one clear error when the server starts, not a failure per /run."""
    from gym_bridge import configure, get_environment, register
    from gym_bridge.core.errors import GymBridgeError

    original = get_environment("llm_judge")
    configure("llm_judge", judge_api="telepathy")
    try:
        settings = AgentServerSettings(envs=("llm_judge",), model_base_urls=("http://127.0.0.1:9/v1",), model="m")
        with pytest.raises(GymBridgeError, match="judge_api must be completions, chat or responses"):
            build_app(settings)
    finally:
        register(original)


def test_a_client_that_disconnects_cancels_its_rollout(weather_path):
    """Issue 19 item 14: a `/run` client that gives up (NeMo RL's timeout, a killed trainer) cancels its
    rollout: the slot is freed at once and the model call in flight is dropped, instead of running on to
    the deadline (here 60 s) for nobody."""
    import socket
    import threading
    import time

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    asked, dropped, release = [], [], threading.Event()

    async def never_answers(request):
        asked.append(time.monotonic())
        while not release.is_set():
            if await request.is_disconnected():
                dropped.append(time.monotonic())
                break
            await asyncio.sleep(0.05)
        return JSONResponse({"error": {"message": "released"}}, status_code=503)

    model_app = FastAPI()
    model_app.add_route("/v1/chat/completions", never_answers, methods=["POST"])
    with app_in_thread(model_app) as model_url:
        settings = AgentServerSettings(envs=("weather",), model_base_urls=(model_url + "/v1",), model="m", deadline_s=60,
                                       max_retries=0, request_timeout_s=60)
        with app_in_thread(build_app(settings)) as agent_url:
            body = json.dumps(nemo_rl_row(weather_path)).encode()
            port = int(agent_url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port)) as client:   # a client that leaves mid-rollout
                client.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                deadline = time.monotonic() + 30
                while not asked and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert asked, "the rollout never called the model"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (httpx.get(agent_url + "/health").json()["in_flight"] or not dropped):
                time.sleep(0.05)
            health = httpx.get(agent_url + "/health").json()
        release.set()
    assert health["in_flight"] == 0 and health["completed"] == 0
    assert dropped and dropped[0] - asked[0] < 8        # the model call was dropped soon after the client left


MATH_ROW = {"responses_create_params": {"input": "What is 7 + 5?", **TRAIN_SAMPLING}, "expected_answer": "12",
            "agent_ref": {"type": "responses_api_agents", "name": "math"}}


@pytest.mark.parametrize("extra, field", [
    ({"hash_id": 2**127 + 5}, "hash_id"),                                    # a 128-bit id stored as a number
    ({"meta": json.loads("[" * 300 + "]" * 300)}, "meta" + "[0]" * (MAX_ROW_DEPTH - 1)),  # past orjson's 254 levels
])
def test_rows_a_record_cannot_hold_get_422_before_running(agent_server, extra, field):
    """Issue 19 item 4: these rows used to run their rollout, then fail the answer with a bare 500."""
    completed = httpx.get(agent_server + "/health").json()["completed"]
    answer = run(agent_server, {**MATH_ROW, **extra})
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert httpx.get(agent_server + "/health").json()["completed"] == completed  # no rollout ran
    too_deep = b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    answer = httpx.post(agent_server + "/run", content=too_deep, headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 422 and answer.json()["field"] == "body"


def test_a_row_with_nan_is_answered_with_null(agent_server):
    """Issue 19 item 5: pandas' missing value; JSON has no NaN, so the answer carries null (was a 500)."""
    body = json.dumps({**MATH_ROW, "difficulty": float("nan")}).encode()
    answer = httpx.post(agent_server + "/run", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["difficulty"] is None and answer.json()["failure_kind"] is None


def test_failure_kinds_use_nemo_gyms_shared_names_or_its_server_namespace():
    """NeMo Gym 0.7.0 (`nemo_gym/failure_kinds.py`) warns about a failure kind that is neither one of its
    registered names nor `<server>:<kind>`."""
    import re

    from gym_bridge.core.dialects.nemo_gym import NEMO_GYM_REGISTERED_KINDS, nemo_gym_failure_kind

    expected = {"timeout": "agent_timeout", "verifier": "verifier_error", "infra": "gym_bridge:infra", "env": "gym_bridge:env",
                "context_overflow": "gym_bridge:context_overflow", "judge_failed": "judge_failed", "sandbox:oom": "sandbox:oom",
                "Bad Kind!": "gym_bridge:bad_kind", None: None}
    for kind, name in expected.items():
        assert nemo_gym_failure_kind(kind) == name
        assert name is None or name in NEMO_GYM_REGISTERED_KINDS or re.fullmatch(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*", name)


def stripped(result: dict, task: int, repeat: int) -> dict:
    """A `/run` result as NeMo Gym 0.7.0's rollout collection sends it to `/aggregate_metrics`
    (`RolloutCollectionHelper._call_aggregate_metrics`: heavy fields dropped, `response` cut to its usage)."""
    entry = {k: v for k, v in result.items() if k not in ("response", "responses_create_params")}
    entry["response"] = {"usage": result["response"]["usage"]}
    return {**entry, "_ng_task_index": task, "_ng_rollout_index": repeat}


def test_aggregate_metrics_answers_what_nemo_gym_collection_reads(agent_server, weather_path):
    """NeMo Gym 0.7.0 POSTs `{"verify_responses": [...]}` to `/aggregate_metrics` after collecting and
    validates the answer as `AggregateMetrics` (`group_level_metrics`, `agent_metrics`, `key_metrics`,
    `repeat_level_metrics`); a 404 there failed the collection. Masked rollouts stay out of the means."""
    ok = run(agent_server, nemo_rl_row(weather_path)).json()
    assert ok["reward"] == 1.0
    failed = {**ok, "reward": 0.0, "mask_sample": True, "failure_kind": "gym_bridge:infra"}
    wrong = {**ok, "reward": 0.0}
    body = {"verify_responses": [stripped(ok, 0, 0), stripped(wrong, 0, 1), stripped(ok, 1, 0), stripped(failed, 1, 1)]}
    answer = httpx.post(agent_server + "/aggregate_metrics", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    metrics = answer.json()
    assert set(metrics) == {"group_level_metrics", "agent_metrics", "key_metrics", "repeat_level_metrics"}
    agent = metrics["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(2 / 3) and agent["max/reward"] == 1.0 and agent["min/reward"] == 0.0
    assert agent["median/reward"] == 1.0 and agent["std/reward"] == pytest.approx(math.sqrt(1 / 3))  # sample std, as NeMo Gym's pandas
    assert agent["coverage/masked_rollouts"] == 1 and agent["coverage/measured_rollouts"] == 3
    assert agent["coverage/fully_masked_tasks"] == 0 and "mean/mask_sample" not in agent and "mean/_ng_task_index" not in agent
    assert metrics["key_metrics"]["mean/reward"] == pytest.approx(2 / 3) and "max/reward" not in metrics["key_metrics"]
    assert metrics["key_metrics"]["coverage/masked_rollouts"] == 1
    groups = {group["_ng_task_index"]: group for group in metrics["group_level_metrics"]}
    assert groups[0]["mean/reward"] == 0.5 and groups[1]["mean/reward"] == 1.0
    repeats = {row["_ng_rollout_index"]: row["mean/reward"] for row in metrics["repeat_level_metrics"]}
    assert repeats == {0: 1.0, 1: 0.0}
    # every rollout masked: coverage only, no invented zero; an empty request: the empty answer
    only_masked = httpx.post(agent_server + "/aggregate_metrics", json={"verify_responses": [stripped(failed, 0, 0)]}, timeout=30).json()
    assert only_masked["agent_metrics"] == {"coverage/measured_rollouts": 0, "coverage/masked_rollouts": 1,
                                            "coverage/measured_tasks": 0, "coverage/fully_masked_tasks": 1}
    empty = httpx.post(agent_server + "/aggregate_metrics", json={"verify_responses": []}, timeout=30).json()
    assert empty == {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}, "repeat_level_metrics": []}
    bad = httpx.post(agent_server + "/aggregate_metrics", json={"verify_responses": {"a": 1}}, timeout=30)
    assert bad.status_code == 422 and bad.json()["field"] == "verify_responses"


def test_the_nemo_rl_recipe_fronts_every_agent_with_an_environment_server():
    """NeMo Gym 0.7.0 reaches an agent only through an environment server (`environment_servers` blocks;
    `rollout_collection.py::_environment_server_for_agent` wants exactly one per agent) and relays a bare
    agent with a DEPRECATED warning that a future release will reject; the recipe ships the
    `legacy_agent` form its migration script writes (`global_config.py::legacy_environment_server_block`)."""
    from pathlib import Path

    import yaml

    config = yaml.safe_load((Path(__file__).parents[2] / "recipes" / "nemo_rl" / "grpo_serve.yaml").read_text())["env"]["nemo_gym"]
    agents = {name for name, block in config.items() if isinstance(block, dict) and "responses_api_agents" in block}
    fronts: dict[str, list[str]] = {}
    for name, block in config.items():
        if isinstance(block, dict) and "environment_servers" in block:
            [(kind, server)] = block["environment_servers"].items()
            assert kind == "legacy_agent" and server["entrypoint"] == "app.py"
            assert server["agent_server"]["type"] == "responses_api_agents"
            fronts.setdefault(server["agent_server"]["name"], []).append(name)
    assert agents == {"weather", "multi_step", "math"}
    assert fronts == {agent: [f"{agent}_environment_server"] for agent in agents}


def test_runs_with_different_temperatures_share_one_engine_and_its_bound(monkeypatch):
    """Issue 21 item 7: one engine serves every `/run` (its `max_concurrency` holds across sampling
    settings), and each rollout samples with its own row's temperature and top_p."""
    import threading

    from gym_bridge.core.engine import Engine
    from gym_bridge.core.turn import Turn

    class Recording:
        def __init__(self) -> None:
            self.seen: list[tuple[str, float, float]] = []
            self.running = self.peak = 0

        async def chat(self, request):
            self.running += 1
            self.peak = max(self.peak, self.running)
            await asyncio.sleep(0.2)
            self.running -= 1
            self.seen.append((request.messages[-1]["content"], request.sampling.temperature, request.sampling.top_p))
            return Turn(text="\\boxed{12}")

    engines: list[int] = []
    rollout = Engine.rollout

    async def counted(self, *args, **kwargs):
        engines.append(id(self))
        return await rollout(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "rollout", counted)
    policy = Recording()
    settings = AgentServerSettings(envs=("math",), model_base_urls=("http://127.0.0.1:9/v1",), model="m", max_concurrency=1)
    rows = [{**MATH_ROW, "responses_create_params": {**MATH_ROW["responses_create_params"], "input": f"What is 7 + 5? ({name})",
                                                     "temperature": temperature, "top_p": top_p}}
            for name, temperature, top_p in (("a", 0.3, 0.9), ("b", 1.1, 0.5))]
    results: list[dict] = []
    with app_in_thread(build_app(settings, policy=policy)) as agent_url:
        threads = [threading.Thread(target=lambda row=row: results.append(run(agent_url, row).json())) for row in rows]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert [result["reward"] for result in results] == [1.0, 1.0]
    assert len(engines) == 2 and len(set(engines)) == 1      # both rollouts on one engine
    assert policy.peak == 1                                    # its bound of 1 held across the two settings
    assert sorted(policy.seen) == [("What is 7 + 5? (a)", 0.3, 0.9), ("What is 7 + 5? (b)", 1.1, 0.5)]


def test_model_servers_keep_each_rollout_on_one_server_through_the_project_router(smol_tokenizer):
    """Issue 29: `/run`'s model calls are routed by `policies/router.py`, not a `crc32 % n` of their own (issue 37:
    through the routed chat policy `build_policy` builds). Every call of
    one rollout (session) goes to the server of its first call (sticky: that server's prefix cache), and a new rollout
    goes to the least busy server: two sessions whose first calls overlap land on different servers, even when their
    ids hash to the same server (what the old `crc32(session_id) % n` rule did)."""
    import zlib

    from gym_bridge.core.policy import ChatRequest, SamplingParams
    from gym_bridge.policies.router import ReplicaRouter
    from gym_bridge.serve.agent_server import model_servers

    candidates = [f"{task}-0" for task in range(64)]
    first, second = next((a, b) for a in candidates for b in candidates if a < b and zlib.crc32(a.encode()) % 2 == zlib.crc32(b.encode()) % 2)
    bodies: list[list[dict]] = [[], []]
    apps = [recording(build_model_app(ScriptedModel(smol_tokenizer, by_turn(turn_of(smol_tokenizer, "Hello."))), model_name="scripted"),
                      seen) for seen in bodies]
    with app_in_thread(apps[0]) as url_a, app_in_thread(apps[1]) as url_b:
        servers = model_servers(AgentServerSettings(envs=("weather",), model_base_urls=(url_a + "/v1", url_b + "/v1"), model="scripted"))

        def request(session: str) -> ChatRequest:
            return ChatRequest(messages=[{"role": "user", "content": f"session {session}"}], tools=(),
                               sampling=SamplingParams(max_new_tokens=8), session_id=session)

        async def calls() -> None:
            await asyncio.gather(servers.chat(request(first)), servers.chat(request(second)))  # both first calls in flight
            for _ in range(3):
                await asyncio.gather(servers.chat(request(first)), servers.chat(request(second)))
            await servers.aclose()

        asyncio.run(calls())
    sessions = [{body["messages"][0]["content"] for body in seen} for seen in bodies]
    assert sorted(sessions, key=sorted) == sorted([{f"session {first}"}, {f"session {second}"}], key=sorted)  # one server each
    assert [len(seen) for seen in bodies] == [4, 4]
    assert isinstance(servers.router, ReplicaRouter)
    stats = servers.router.stats()
    assert stats["affinity_hits"] == 6 and stats["affinity_misses"] == 0
    assert [replica["episodes"] for replica in stats["replicas"]] == [1, 1]
