"""The first hour with the CLI (issue 19, items 15, 17 and 18): setup mistakes are exit 2 with a message
naming what to fix, found before anything slow (loading a model) happens."""

from __future__ import annotations

import socket
import time

import pytest

from gym_bridge.cli import main


@pytest.fixture()
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_serve_model_on_a_busy_port_is_exit_2_before_the_model_loads(busy_port, monkeypatch, capsys):
    from gym_bridge.policies.transformers import TransformersPolicy

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(TransformersPolicy, "from_pretrained", no_load)
    started = time.monotonic()
    assert main(["serve-model", "--port", str(busy_port)]) == 2
    assert time.monotonic() - started < 5
    assert f"port {busy_port} on 127.0.0.1 is in use" in capsys.readouterr().err


def test_serve_on_a_busy_port_is_exit_2(busy_port, capsys):
    assert main(["serve", "--env", "math", "--port", str(busy_port), "--model-base-url", "http://127.0.0.1:1/v1"]) == 2
    assert f"port {busy_port} on 127.0.0.1 is in use" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "localhost:8000", "ftp://h/v1", "http://h:notaport/v1"])
def test_a_base_url_without_a_scheme_is_exit_2(url, tmp_path, capsys):
    assert main(["eval", "--env", "math", "--base-url", url, "--output", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--base-url" in err and repr(url) in err and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()


def test_serve_refuses_a_model_url_whose_host_does_not_resolve(capsys):
    assert main(["serve", "--env", "math", "--port", "0", "--model-base-url", "http://no-such-host.invalid:8000/v1"]) == 2
    assert "host 'no-such-host.invalid' does not resolve" in capsys.readouterr().err
    assert main(["serve", "--env", "math", "--port", "0", "--model-base-url", "vllm-host:8000/v1"]) == 2
    assert "is not an http(s) URL" in capsys.readouterr().err
