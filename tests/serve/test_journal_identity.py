"""`gym-bridge serve` journals by default, and its journal's fingerprint holds what generates: each model server's
model id, root and tokenizer, as the servers report them at start (not only `--model`). A server restarted over
the journal against another model is refused (exit 2, both models named) instead of continuing the first model's
rollouts. Real `gym-bridge serve` processes and serve-model apps (a scripted model) on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gym_bridge.serve.model_server import build_app as build_model_app
from tests.support.http_server import app_in_thread
from tests.support.scripted_model import ScriptedModel, by_turn

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_servers(smol_tokenizer, turn):
    """Two serve-model apps: the same tokenizer, different models (name and root)."""
    model = ScriptedModel(smol_tokenizer, by_turn(turn("12")))
    with app_in_thread(build_model_app(model, model_name="policy", model_root="/models/a")) as a, \
            app_in_thread(build_model_app(model, model_name="policy", model_root="/models/b")) as b:
        yield f"{a}/v1", f"{b}/v1"


def serve(*args: str, cache: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gym_bridge.cli", "serve", "--env", "math", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "GYM_BRIDGE_CACHE": str(cache)})


def started(process: subprocess.Popen[str]) -> str:
    line = process.stdout.readline() if process.stdout else ""
    assert line.startswith("serving "), (line, process.stderr.read() if process.stderr else "")
    return line.split(" at ")[-1].strip()


def killed(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_restarted_over_its_journal_against_another_model_is_refused(model_servers, tmp_path):
    # before: without --model the fingerprint's model was "" both times, so the second server started and continued
    # the first model's rollouts (issue 36 item 9)
    model_a, model_b = model_servers
    journal = tmp_path / "journal"
    first = serve("--port", "0", "--journal", str(journal), "--model-base-url", model_a, cache=tmp_path)
    started(first)
    killed(first)  # its journal file (header: the fingerprint) stays
    refused = serve("--port", "0", "--journal", str(journal), "--model-base-url", model_b, cache=tmp_path)
    _, stderr = refused.communicate(timeout=120)
    assert refused.returncode == 2, stderr
    assert "is the journal of another run: model (journal: 'policy (root /models/a, tokenizer " in stderr
    assert "this run: 'policy (root /models/b, tokenizer " in stderr
    again = serve("--port", "0", "--journal", str(journal), "--model-base-url", model_a, cache=tmp_path)
    try:
        url = started(again)  # the same model: accepted
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        killed(again)


def test_serve_journals_by_default_under_its_port_and_no_journal_opts_out(model_servers, tmp_path):
    model_a, _ = model_servers
    port = free_port()
    process = serve("--port", str(port), "--model-base-url", model_a, cache=tmp_path)
    try:
        url = started(process)
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # serving: SIGTERM now shuts it down cleanly
        assert list((tmp_path / "serve_journal" / f"port-{port}").glob("*.log"))
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert not (tmp_path / "serve_journal" / f"port-{port}").exists()  # nothing in flight: removed at the end
    port = free_port()
    process = serve("--port", str(port), "--no-journal", "--model-base-url", "http://127.0.0.1:9/v1", cache=tmp_path)
    try:
        started(process)  # no journal: the model servers are not asked at start
        time.sleep(0.2)
        assert not (tmp_path / "serve_journal" / f"port-{port}").exists()
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_a_server_nemo_gym_starts_journals_by_default_unless_its_entry_says_null(tmp_path, monkeypatch):
    import yaml

    from gym_bridge.serve.agent_launch import from_nemo_gym_environ

    monkeypatch.setenv("GYM_BRIDGE_CACHE", str(tmp_path))
    entry = {"entrypoint": "app.py", "host": "10.0.0.1", "port": 5123, "envs": ["math"]}

    def launched(**extra):
        config = {"policy_base_url": ["http://10.0.0.1:41000/v1"], "weather": {"responses_api_agents": {"gym_bridge": {**entry, **extra}}}}
        return from_nemo_gym_environ({"NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": "weather"}).settings

    assert launched().journal_dir == str(tmp_path / "serve_journal" / "port-5123")
    assert launched(journal_dir=None).journal_dir is None
    assert launched(journal_dir=str(tmp_path / "j")).journal_dir == str(tmp_path / "j")
