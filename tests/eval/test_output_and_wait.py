"""`gym-bridge eval` in a user's first hour (issue 28, items 16 and 17): it waits, bounded, for a server that is
still starting (the remote example of docs/backends.md pasted as a whole), refuses to replace the records of an existing
--output unless told (--resume or --overwrite), and writes under the git-ignored out/ by default."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gym_bridge.cli import main
from gym_bridge.policies.embedded import embedded_model_path
from tests.eval.test_remote_startup import vllm_like_app

ROOT = Path(__file__).resolve().parents[2]


def _serve_later(app, sock: socket.socket, delay_s: float) -> object:
    """Serve `app` on `sock` (bound, not listening: connections are refused meanwhile) after `delay_s`."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, lifespan="on"))

    def run() -> None:
        time.sleep(delay_s)
        server.run(sockets=[sock])

    threading.Thread(target=run, daemon=True).start()
    return server


def test_eval_waits_for_a_server_that_is_still_starting(tmp_path, capsys):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server = _serve_later(vllm_like_app(root=str(embedded_model_path())), sock, delay_s=2.0)
    output = tmp_path / "out.jsonl"
    try:
        started = time.monotonic()
        code = main(["eval", "--env", "weather", "--limit", "1", "--no-progress", "--base-url", url, "--output", str(output)])
        waited_s = time.monotonic() - started
    finally:
        server.should_exit = True
    assert code == 0, capsys.readouterr().err
    assert f"waiting up to 60 s for a server at {url} to start (connection refused" in capsys.readouterr().err
    assert waited_s >= 2.0 and [json.loads(line)["failure_kind"] for line in output.read_text().splitlines()] == [None]
    sock.close()


def test_the_wait_is_bounded_and_named(tmp_path, capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        started = time.monotonic()
        code = main(["eval", "--env", "weather", "--limit", "1", "--no-progress", "--base-url", url, "--wait-for-server-s", "1.5",
                     "--output", str(tmp_path / "out.jsonl")])
        elapsed_s = time.monotonic() - started
    assert code == 2 and 1.0 <= elapsed_s < 10
    assert f"no server answers at {url}" in capsys.readouterr().err


def test_eval_refuses_to_replace_existing_records_without_resume_or_overwrite(tmp_path, capsys):
    output = tmp_path / "out.jsonl"
    output.write_text('{"kept": true}\n')
    started = time.monotonic()
    assert main(["eval", "--env", "weather", "--limit", "1", "--no-progress", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"--output {output} already holds rollout records: pass --resume" in err and "--overwrite to replace them" in err
    assert output.read_text() == '{"kept": true}\n' and time.monotonic() - started < 10  # refused before a model loads
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--env", "weather", "--resume", "--overwrite", "--output", str(output)])
    assert exit_info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_overwrite_replaces_and_an_empty_output_needs_no_flag(tmp_path, capsys, monkeypatch):
    from gym_bridge.cli.eval import check_output_free

    output = tmp_path / "out.jsonl"
    output.write_text("")
    check_output_free(str(output), resume=False, overwrite=False)  # empty: nothing to lose
    output.write_text('{"kept": true}\n')
    check_output_free(str(output), resume=False, overwrite=True)
    check_output_free(str(output), resume=True, overwrite=False)


def test_the_default_output_is_under_the_git_ignored_out_folder(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "(default: out/gym_bridge_eval.jsonl)" in " ".join(capsys.readouterr().out.split())
    ignored = subprocess.run(["git", "check-ignore", "-q", "out/gym_bridge_eval.jsonl"], cwd=ROOT)
    assert ignored.returncode == 0
