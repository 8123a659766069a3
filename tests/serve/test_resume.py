"""`gym-bridge serve --journal`: a `/run` row that names its rollout (NeMo Gym's `_ng_task_index`, `_ng_rollout_index`)
and is sent again after the client gave up, or after the server was restarted, continues from its last committed turn:
the same result as an uninterrupted run, with no committed model call made again. Real servers on loopback; the
model is a chat-policy stand-in that answers by turn (the model servers cannot run here)."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from gym_bridge.core.turn import ToolCall, Turn
from gym_bridge.serve.agent_server import AgentServerSettings, build_app
from tests.support.http_server import app_in_thread

CITIES = ("Paris", "London", "Rome")
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Weather in three cities?"}], "temperature": 0.7},
       "agent_ref": {"type": "responses_api_agents", "name": "weather"}, "_ng_task_index": 3, "_ng_rollout_index": 1}


class TurnChat:
    """Answers turn k (k assistant messages so far) with a `get_weather` call for CITIES[k], then a final text; a call
    numbered `hang_at` never returns (a stuck model call the client gives up on)."""

    def __init__(self, hang_at: int | None = None) -> None:
        self.calls, self.hang_at = 0, hang_at
        self.started = threading.Event()

    async def chat(self, request):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == self.hang_at:
            self.started.set()
            await asyncio.Event().wait()
        done = sum(1 for message in request.messages if message.get("role") == "assistant")
        if done < len(CITIES):
            arguments = json.dumps({"city": CITIES[done]})
            return Turn(text="", calls=(ToolCall(name="get_weather", arguments=arguments),), finish_reason="tool_calls")
        return Turn(text="Cold, cold and mild.", finish_reason="stop")


def settings(tmp_path, journal: bool = True) -> AgentServerSettings:
    return AgentServerSettings(envs=("weather",), model_base_urls=("http://127.0.0.1:9/v1",), model="m",
                               journal_dir=str(tmp_path / "journal") if journal else None)


def comparable(result: dict) -> tuple:
    return (result["response"]["output"], result["reward"], result["mask_sample"])


def cut_off(agent_url: str, policy: TurnChat) -> None:
    """POST ROW and give up (disconnect) once the model call numbered `policy.hang_at` is stuck."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(agent_url + "/run", json=ROW, timeout=httpx.Timeout(10.0, read=1.0))
    assert policy.started.is_set()


def test_a_rollout_sent_again_continues_from_its_last_turn_in_the_same_server_and_after_a_restart(tmp_path):
    clean = TurnChat()
    with app_in_thread(build_app(settings(tmp_path), policy=clean)) as agent_url:  # uninterrupted
        expected = httpx.post(agent_url + "/run", json=ROW, timeout=60).json()
    assert clean.calls == 4 and not expected["mask_sample"] and not (tmp_path / "journal").exists()

    stuck, retried = TurnChat(hang_at=3), TurnChat()
    server = build_app(settings(tmp_path), policy=stuck)
    with app_in_thread(server) as agent_url:
        cut_off(agent_url, stuck)  # two turns committed, the third call stuck
        server.state.agent_server.policy = server.state.agent_server.engine.policy = retried
        again = httpx.post(agent_url + "/run", json=ROW, timeout=60).json()
    assert comparable(again) == comparable(expected)
    assert retried.calls == 2  # the third call again (the one in flight) and the last: none of the committed two
    assert not (tmp_path / "journal").exists()  # finished: the journal is gone

    stuck = TurnChat(hang_at=4)
    with app_in_thread(build_app(settings(tmp_path), policy=stuck)) as agent_url:
        cut_off(agent_url, stuck)  # three turns committed; then this server stops with the rollout in flight
    assert (tmp_path / "journal").exists()
    restarted = TurnChat()
    with app_in_thread(build_app(settings(tmp_path), policy=restarted)) as agent_url:
        again = httpx.post(agent_url + "/run", json=ROW, timeout=60).json()
    assert comparable(again) == comparable(expected) and restarted.calls == 1


def test_a_half_rollout_id_is_refused_naming_the_field(tmp_path):
    with app_in_thread(build_app(settings(tmp_path), policy=TurnChat())) as agent_url:
        answer = httpx.post(agent_url + "/run", json={**ROW, "_ng_rollout_index": None}, timeout=60)
    assert answer.status_code == 422 and answer.json()["field"] == "_ng_rollout_index"


def test_a_retry_while_the_first_request_still_runs_is_refused_with_409(tmp_path):
    import threading as threads

    stuck = TurnChat(hang_at=2)
    with app_in_thread(build_app(settings(tmp_path), policy=stuck)) as agent_url:
        first = threads.Thread(target=_give_up, args=(agent_url,))
        first.start()
        assert stuck.started.wait(10)
        answer = httpx.post(agent_url + "/run", json=ROW, timeout=60)
        first.join(30)
    assert answer.status_code == 409 and "running already" in answer.json()["detail"]


def _give_up(agent_url: str) -> None:
    try:
        httpx.post(agent_url + "/run", json=ROW, timeout=httpx.Timeout(10.0, read=2.0))
    except httpx.ReadTimeout:
        pass
