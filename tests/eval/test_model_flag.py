"""`gym-bridge eval --model PATH` with a path that is no model: exit 2 with an error naming the flag and the path,
no traceback, and (for a path that is missing, a file, or a folder without config.json) nothing written, not even
the output's folder or its lock file. It used to crash with transformers' traceback (exit 1)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gym_bridge.cli import main


def eval_with_model(model: str, output: Path) -> int:
    return main(["eval", "--env", "math", "--limit", "1", "--no-progress", "--model", model, "--output", str(output)])


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing" / "model", "no such file or folder"),
    (lambda tmp: (tmp / "weights.safetensors").touch() or tmp / "weights.safetensors", "is a file, not a model folder"),
    (lambda tmp: (tmp / "folder").mkdir() or tmp / "folder", "is not a model folder (it has no config.json)"),
])
def test_a_model_path_that_is_no_model_folder_is_refused_before_anything_is_written(tmp_path: Path, capsys, make, message) -> None:
    model = make(tmp_path)
    output = tmp_path / "out" / "rollouts.jsonl"
    started = time.monotonic()
    assert eval_with_model(str(model), output) == 2
    assert time.monotonic() - started < 5  # no model was loaded
    err = capsys.readouterr().err
    assert f"--model {model}" in err and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_model_that_transformers_cannot_load_is_said_with_the_flag(tmp_path: Path, capsys) -> None:
    """A folder with a config.json but no tokenizer or weights, and a hub id not in the cache (offline): the
    flag and transformers' reason, exit 2 (was a traceback, exit 1)."""
    folder = tmp_path / "config_only"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    for model in (str(folder), "nobody-here/no-such-model"):
        assert eval_with_model(model, tmp_path / "rollouts.jsonl") == 2
        err = capsys.readouterr().err
        assert f"error: --model {model} cannot be loaded: " in err and "Traceback" not in err
    assert not (tmp_path / "rollouts.jsonl").exists()


def test_with_base_url_the_model_is_a_served_name_not_a_path(tmp_path: Path, capsys) -> None:
    """`--model` with `--base-url` names the served model: no path check (the server is asked, here unreachable)."""
    code = main(["eval", "--env", "math", "--limit", "1", "--no-progress", "--model", "/served/name", "--base-url",
                 "http://127.0.0.1:9/v1", "--api", "chat", "--output", str(tmp_path / "rollouts.jsonl")])
    assert "no such file or folder" not in capsys.readouterr().err
    assert code in (0, 3)  # ran: its rollouts failed as `infra` against the unreachable server
