"""`gym-bridge serve-model --model PATH` with a path that is no model: exit 2 with eval's error naming the flag and
the path (the same check, `gym_bridge.cli.common.check_local_model`), before the port is bound or a model loads.
It used to crash with transformers' traceback ("Repo id must be in the form ...")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gym_bridge.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing" / "model", "no such file or folder"),
    (lambda tmp: (tmp / "weights.safetensors").touch() or tmp / "weights.safetensors", "is a file, not a model folder"),
    (lambda tmp: (tmp / "folder").mkdir() or tmp / "folder", "is not a model folder (it has no config.json)"),
])
def test_a_model_path_that_is_no_model_folder_is_refused_before_the_port_is_bound(tmp_path: Path, capsys, make, message) -> None:
    pytest.importorskip("fastapi")
    model = make(tmp_path)
    with socket.socket() as busy:  # the port is in use: the model's error comes first, so the port was not yet bound
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        started = time.monotonic()
        assert main(["serve-model", "--model", str(model), "--port", str(busy.getsockname()[1])]) == 2
    assert time.monotonic() - started < 5  # no model was loaded
    err = capsys.readouterr().err
    assert f"error: --model {model}" in err and message in err and "Traceback" not in err and "in use" not in err


def test_a_model_folder_that_transformers_cannot_load_is_said_with_the_flag(tmp_path: Path, capsys) -> None:
    pytest.importorskip("fastapi")
    folder = tmp_path / "config_only"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    assert main(["serve-model", "--model", str(folder), "--port", "0", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert f"error: --model {folder} cannot be loaded: " in err and "Traceback" not in err


def test_the_command_line_exits_2_without_a_traceback() -> None:
    pytest.importorskip("fastapi")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "gym_bridge", "serve-model", "--model", "/missing/path", "--port", "0"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: --model /missing/path: no such file or folder" in done.stderr and "Traceback" not in done.stderr
    assert "serving" not in done.stdout
