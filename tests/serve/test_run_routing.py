"""`/run` routes a row only among the environments the server was started with (their names, aliases and
module paths): a body that names any other module path (`mod:Class`) gets 422 "not served here" without
the module being imported, since importing runs its top-level code inside the server."""

from __future__ import annotations

import sys
import textwrap

import httpx
import pytest

from gym_bridge.serve.agent_server import AgentServerSettings, build_app
from tests.support.http_server import app_in_thread

SERVED_MODULE = '''
from gym_bridge import Environment, VerifyResult


class EchoEnvironment(Environment):
    name = "echo_served_by_path"

    def verify(self, task, output):
        return VerifyResult(reward=0.0)
'''


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Two importable modules: one the server serves by path, one whose import writes `imported.txt`."""
    marker = tmp_path / "imported.txt"
    (tmp_path / "gb_served_echo_env.py").write_text(SERVED_MODULE, encoding="utf-8")
    (tmp_path / "gb_side_effect_env.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("imported")
        from tests.serve.test_run_routing import SERVED_MODULE  # noqa: F401
    """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    for name in ("gb_served_echo_env", "gb_side_effect_env"):
        sys.modules.pop(name, None)


def test_a_row_naming_an_unserved_module_gets_422_and_the_module_is_never_imported(modules):
    settings = AgentServerSettings(envs=("weather", "gb_served_echo_env:EchoEnvironment"), model_base_urls=("http://127.0.0.1:9/v1",),
                                   model="m", max_retries=0, request_timeout_s=5)
    with app_in_thread(build_app(settings)) as url:
        for name in ("gb_side_effect_env:Anything", "gb_side_effect_env"):
            answer = httpx.post(url + "/run", json={"responses_create_params": {"input": "hi"}, "agent_ref": {"name": name}}, timeout=30)
            assert answer.status_code == 422, answer.text
            assert answer.json() == {
                "detail": f"agent_ref.name: environment {name!r} is not served here; this server serves "
                          "['gb_served_echo_env:EchoEnvironment', 'weather']",
                "field": "agent_ref.name"}
        assert not modules.exists() and "gb_side_effect_env" not in sys.modules
        # what the server serves still routes: by the path it was started with, by name and by alias (the model
        # server is down, so each runs and comes back masked as `infra`)
        for name in ("gb_served_echo_env:EchoEnvironment", "echo_served_by_path", "weather", "example_single_tool_call_simple_agent"):
            answer = httpx.post(url + "/run", json={"responses_create_params": {"input": "hi"}, "agent_ref": {"name": name}}, timeout=30)
            assert answer.status_code == 200, (name, answer.text)
            assert answer.json()["mask_sample"] is True and answer.json()["failure_kind"] is not None
