"""`gym-bridge eval --env E --limit 4` on the embedded model for every registered environment, as a
user would run it (`slow`: 10 minutes on 2 cores shared with other work).

`nemo_gym_remote` runs against its example resources server, started on a free loopback port.
Every rollout must end as a scored record; only `llm_judge` may mask its rollouts, because the
embedded 135M judge rarely writes a verdict (docs/environments.md)."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from gym_bridge.core.registry import known_environments
from gym_bridge.core.rollout_file import read_records
from tests.support.invariants import assert_token_invariants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MAY_MASK = {"llm_judge"}
REPO = Path(__file__).resolve().parents[1]
GYM_BRIDGE = str(Path(sys.executable).parent / "gym-bridge")
INSTALLED = sorted(entry_point.name for entry_point in entry_points(group="gym_bridge.environments"))
"""What `gym-bridge envs` lists in a fresh process: not the environments other test modules register as they are collected."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def example_server():
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "environments.nemo_gym_remote.example_server", "--port", str(port)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/docs", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the example resources server did not start")
        yield url
    finally:
        server.terminate()
        server.wait(10)


def test_every_bundled_environment_is_listed():
    assert {"arithmetic", "weather", "multi_step", "math", "workplace_assistant", "mcqa", "instruction_following",
            "reasoning_gym", "code", "llm_judge", "user_sim", "nemo_gym_remote"} <= set(known_environments())


@pytest.mark.parametrize("name", INSTALLED)
def test_eval_runs_on_the_embedded_model(name, tmp_path, request):
    output = tmp_path / f"{name}.jsonl"
    command = [GYM_BRIDGE, "eval", "--env", name, "--limit", "4", "--max-new-tokens", "48",
               "--max-turns", "3", "--seed", "0", "--no-progress", "--output", str(output)]
    if name == "nemo_gym_remote":
        command += ["--env-url", f"{name}={request.getfixturevalue('example_server')}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 3), done.stdout[-2000:] + done.stderr[-3000:]
    records = read_records(output)
    assert len(records) == 4 and {record["env"] for record in records} == {name}
    for record in records:
        if record["failure_kind"] is None:
            assert sum(record["tokens"]["completion_mask"]) > 0  # the model really generated
            assert_token_invariants(record)
        else:
            assert name in MAY_MASK, f"{record['failure_kind']}: {record['failure_reason']}"
    metrics = json.loads(output.with_suffix(".metrics.json").read_text())
    assert metrics["rollouts"] == 4
