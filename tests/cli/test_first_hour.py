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


def test_the_progress_bar_shows_no_eta_until_the_first_wave_has_finished():
    """Item 18: 11 rollouts in one batch showed 0/11, then an ETA of an hour after the first finished."""
    import io

    from tqdm import tqdm

    from gym_bridge.eval.progress import progress_format

    bar = tqdm(total=11, desc="rollouts", file=io.StringIO(), bar_format=progress_format(0, first_wave=11))
    bar.set_postfix_str("generating the first batch", refresh=False)
    assert str(bar).startswith("rollouts: 0/11 [00:00 elapsed, ETA after the first 11 rollouts, generating the first batch]")
    bar.bar_format = progress_format(1, first_wave=11)
    bar.update(1)
    assert "<" not in str(bar) and "ETA after the first 11" in str(bar)
    bar.bar_format = progress_format(11, first_wave=11)
    bar.update(10)
    assert "11/11 [" in str(bar) and "<00:00" in str(bar)  # elapsed<remaining once the wave is done
    bar.close()


def test_no_lock_file_is_left_behind(tmp_path):
    """Item 18: `out.jsonl.lock` stayed after every run."""
    import subprocess
    import sys

    from gym_bridge.core.rollout_file import locked_output

    output = tmp_path / "out.jsonl"
    with locked_output(output):
        assert (tmp_path / "out.jsonl.lock").exists()
        code = f"from gym_bridge.core.rollout_file import locked_output\nwith locked_output({str(output)!r}): pass"
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert "OutputLockedError" in other.stderr  # still exclusive across processes
    assert sorted(path.name for path in tmp_path.iterdir()) == []
    with locked_output(output):  # a later run locks again (and a stale file from a killed run is taken over)
        pass
    (tmp_path / "out.jsonl.lock").write_text("12345\n")
    with locked_output(output):
        pass
    assert not (tmp_path / "out.jsonl.lock").exists()


@pytest.mark.parametrize(("requested", "load", "expected"), [
    (None, 0.5, 2),   # a quiet 2-core machine: torch's default
    (None, 2.0, 1),   # as busy as it has cores: 1 thread (2 generated 10-20x slower here)
    (None, 15.0, 1),
    (None, None, 2),  # no load average on this system
    (3, 15.0, 3),     # --threads wins
])
def test_serve_model_threads(requested, load, expected):
    from gym_bridge.cli.common import torch_threads

    assert torch_threads(requested, default=2, cores=2, load=load) == expected


def test_serve_model_threads_must_be_positive(capsys):
    assert main(["serve-model", "--port", "0", "--threads", "0"]) == 2
    assert "--threads must be at least 1" in capsys.readouterr().err


def test_an_eval_against_a_server_still_computing_says_to_raise_the_request_timeout(tmp_path, smol_template):
    """Item 15 end to end: a server that takes longer than the request timeout (it accepts and never answers);
    each request is sent once, the rollouts fail as infra, and the summary names the option to raise."""
    import asyncio

    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.metrics import format_table
    from gym_bridge.core.policy import SamplingParams
    from gym_bridge.core.task import load_tasks
    from gym_bridge.eval.run import run_eval
    from gym_bridge.policies.remote import RemotePolicy

    tasks = load_tasks("environments/math/data/example.jsonl", limit=3)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        policy = RemotePolicy(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", model="m", request_timeout_s=0.5, max_retries=3)
        config = EngineConfig(sampling=SamplingParams(max_new_tokens=8), model_name="m", deadline_s=30)

        async def run():
            try:
                return await run_eval(Engine(policy, smol_template, config), tasks, output=tmp_path / "out.jsonl")
            finally:
                await policy.aclose()

        started = time.monotonic()
        result = asyncio.run(run())
    assert time.monotonic() - started < 10  # one 0.5 s attempt per rollout, not 4
    assert result.summary["failures_by_kind"] == {"infra": 3}
    table = format_table(result.summary)
    assert "3 requests timed out after 0.5 s; raise --request-timeout-s" in table
    assert "  3 x infra: generation backend: http://127.0.0.1:" in table


# Issue 36, items 13, 16 and 17: bad flags and outputs are exit 2 naming the flag, before a model loads or out/ is made.

@pytest.fixture()
def no_model(monkeypatch):
    import gym_bridge.cli.eval as eval_cli

    async def refuse(args, trust):
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr(eval_cli, "_build_engine", refuse)


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--num-repeats", "0", "must be at least 1, got 0"),
    ("--limit", "-3", "must be at least 1, got -3"),
    ("--wait-for-server-s", "-5", "must be at least 0, got -5"),
    ("--top-p", "nan", "must be above 0 and at most 1, got nan"),
    ("--concurrency", "two", "must be a whole number, got 'two'"),
])
def test_bad_numbers_are_exit_2_naming_the_flag(flag, value, said, no_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--env", "weather", flag, value, "--output", str(tmp_path / "out" / "o.jsonl")])
    assert exit_info.value.code == 2
    assert f"gym-bridge eval: error: argument {flag}: {said}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_output_that_cannot_be_a_file_is_exit_2_naming_it(no_model, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a folder")
    assert main(["eval", "--env", "weather", "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a folder; name a file in it" in capsys.readouterr().err
    assert main(["eval", "--env", "weather", "--output", str(notes / "run.jsonl")]) == 2
    assert f"--output {notes / 'run.jsonl'}: {notes} is a file, not a folder" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]  # no lock file, nothing else


def test_a_misspelt_env_or_a_file_path_as_env_leaves_no_output_folder(no_model, tmp_path, capsys):
    output = tmp_path / "out" / "o.jsonl"
    assert main(["eval", "--env", "weathr", "--output", str(output)]) == 2
    assert "unknown environment 'weathr'" in capsys.readouterr().err
    assert main(["eval", "--env", "../units:Units", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert "'../units' is not a module name; write `module:Class`" in err and "TypeError" not in err
    assert not (tmp_path / "out").exists()


def test_an_unknown_option_names_the_command_and_its_closest_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--env", "weather", "--max-tokens", "5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gym-bridge eval ")
    assert err.endswith("gym-bridge eval: error: unrecognized arguments: --max-tokens 5 (did you mean --max-new-tokens for --max-tokens?)\n")


def test_journal_says_when_an_environment_restarts_its_episodes(no_model, monkeypatch, tmp_path, capsys):
    from gym_bridge.core.registry import get_environment

    monkeypatch.setattr(get_environment("weather"), "resume", "restart")  # what a new class without `resume` declares
    with pytest.raises(AssertionError, match="the model was loaded"):  # the note comes before the model would load
        main(["eval", "--env", "weather", "--env", "math", "--journal", "--output", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert "note: --journal does not continue weather mid-episode" in err and "math" not in err
    with pytest.raises(AssertionError, match="the model was loaded"):
        main(["eval", "--env", "weather", "--output", str(tmp_path / "o.jsonl")])
    assert "note:" not in capsys.readouterr().err


def test_the_progress_bar_names_environments_and_writes_a_log_file_rarely(monkeypatch, tmp_path, capsys):
    """Item 17: weather's rows route by the NeMo Gym alias `example_single_tool_call_simple_agent`, which the bar
    named (and, never seeing a record of that name, it showed no ETA); into a log file it wrote a line a second."""
    import asyncio
    import re

    from gym_bridge import ScriptedChatPolicy
    from gym_bridge.core.engine import Engine, EngineConfig

    class SlowChat(ScriptedChatPolicy):
        async def chat(self, request):
            await asyncio.sleep(0.05)
            return await super().chat(request)

    async def build_engine(args, trust):
        return Engine(SlowChat({"": ["Sunny."]}), None, EngineConfig(max_concurrency=args.concurrency), trust=trust)

    monkeypatch.setattr("gym_bridge.cli.eval._build_engine", build_engine)
    # 8 weather rows x 3 repeats, one at a time: about 1.2 s, in which the bar was written 17 times (every 0.1 s)
    assert main(["eval", "--env", "weather", "--num-repeats", "3", "--concurrency", "1", "--max-failure-fraction", "1",
                 "--output", str(tmp_path / "o.jsonl")]) == 0
    writes = [part for part in re.split(r"[\r\n]", capsys.readouterr().err) if "rollouts" in part]
    assert len(writes) <= 4, writes  # the first, and the last (capsys is no terminal)
    assert "24/24" in writes[-1] and "ETA after a first rollout" not in writes[-1]
    assert not any("example_single_tool_call" in write for write in writes)
