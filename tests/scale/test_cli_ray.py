"""`gym-bridge eval --ray`: clear errors before anything runs, and a driver killed with SIGKILL
finished by `--resume` with every (task, repeat) exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gym_bridge.cli import main
from gym_bridge.evaluate import select_tasks
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
