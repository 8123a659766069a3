"""`gym-bridge eval --ray`: clear errors before anything runs, and a driver killed with SIGKILL
finished by `--resume` with every (task, repeat) exactly once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from gym_bridge.cli import main
from gym_bridge.eval.run import select_tasks
from tests.scale.stub_replicas import stub_replicas

pytestmark = pytest.mark.ray


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    code = main(["eval", "--env", "weather", "--ray", "--no-progress", "--output", str(tmp_path / "out.jsonl")])
    assert code == 2
    assert "pip install 'gym-bridge[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_an_unreachable_cluster_is_an_error_before_any_rollout(tmp_path, capsys):
    pytest.importorskip("ray")
    started = time.monotonic()
    code = main(["eval", "--env", "weather", "--ray", "127.0.0.1:9", "--no-progress", "--output", str(tmp_path / "out.jsonl")])
    assert code == 2 and time.monotonic() - started < 15
    assert "cannot reach the Ray cluster at 127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def _listener(answer: bytes | None):
    """A TCP listener on loopback that is no Ray head: it accepts and says nothing (`answer` None), or sends
    `answer` to whatever it is sent. Returns (address, stop)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            held.append(connection)
            if answer is not None:
                connection.recv(1024)
                connection.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()

    def close() -> None:
        stop.set()
        for connection in held:
            connection.close()
        server.close()

    return f"127.0.0.1:{server.getsockname()[1]}", close


@pytest.mark.parametrize(("answer", "message"), [
    (None, "accepts connections but gave no Ray answer within 3 s (--ray-connect-timeout-s): it is not a Ray head"),
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "answered, but not as a Ray head (b'HTTP/1.1 400 Bad Request"),
])
def test_a_port_that_is_no_ray_head_fails_within_the_connect_timeout(tmp_path, capsys, answer, message):
    """Issue 28 item 9: such a port made `ray.init` wait 600 s and more."""
    pytest.importorskip("ray")
    address, close = _listener(answer)
    try:
        started = time.monotonic()
        code = main(["eval", "--env", "weather", "--ray", address, "--ray-connect-timeout-s", "3", "--no-progress",
                     "--output", str(tmp_path / "out.jsonl")])
        elapsed_s = time.monotonic() - started
    finally:
        close()
    err = capsys.readouterr().err
    assert code == 2 and elapsed_s < 15, (elapsed_s, err)
    assert f"{address} {message}" in err and "`ray start --head` prints it" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_real_ray_head_passes_the_check():
    ray = pytest.importorskip("ray")
    from gym_bridge.scale.ray_cluster import check_reachable

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        check_reachable(ray.get_runtime_context().gcs_address, timeout_s=10)
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_driver_killed_mid_run_then_resumed_has_every_rollout_once(tmp_path):
    pytest.importorskip("ray")
    output = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with stub_replicas(2, delay_s=0.3) as replicas:
        command = [sys.executable, "-m", "gym_bridge.cli", "eval", "--env", "weather", "--num-repeats", "3", "--concurrency", "4",
                   "--ray", "--ray-workers", "2", "--no-progress", "--output", str(output)]
        for replica in replicas:
            command += ["--base-url", replica.url]
        driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not output.exists() or len(output.read_text().splitlines()) < 3):
            time.sleep(0.1)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        written = len(output.read_text().splitlines())
        resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    pairs = sorted((row["task_index"], row["repeat_index"]) for row in rows)
    tasks = len(select_tasks(env_names=["weather"]))
    assert 3 <= written < len(rows) and pairs == [(t, r) for t in range(tasks) for r in range(3)]
    assert all(row["failure_kind"] is None for row in rows)
