"""The code environment: its verifier on right and wrong programs, and the sandbox on hostile ones.

Every hostile program below prints what an escape would produce, and the row expects exactly
that output: a sandbox that leaked would score it 1. Each must score 0 with its reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

import environments.code as code_env
from environments.code import CodeEnvironment, extract_code, same_stdout, same_value
from environments.code.sandbox import default_python, probe
from gym_bridge import Engine, EngineConfig, GymBridgeError, SamplingParams, ScriptedPolicy
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.items import message_item
from gym_bridge.core.task import load_tasks, parse_task
from tests.support.invariants import assert_token_invariants

SANDBOX_PROBLEM = probe(default_python())
needs_sandbox = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=f"no working bubblewrap here: {SANDBOX_PROBLEM}")


class FastCode(CodeEnvironment):
    """Tight limits so the hostile programs end quickly."""

    wall_time_s = 2.0
    cpu_time_s = 1
    memory_mb = 256
    max_processes = 8


def stdin_row(inputs: list[str], outputs: list[str], **extra) -> dict:
    tests = {"inputs": inputs, "outputs": outputs, "fn_name": None}
    return {"responses_create_params": {"input": "Solve it."}, "verifier_metadata": {"unit_tests": tests}, **extra}


def answer(code: str) -> list:
    return [message_item(f"Here is my solution.\n```python\n{code}\n```\nDone.", item_id="msg_1")]


def score(row: dict, code: str | None, env_class: type[CodeEnvironment] = FastCode):
    task = parse_task(row, index=0, default_env="code")
    output = answer(code) if code is not None else [message_item("I cannot solve this.", item_id="msg_1")]
    return asyncio.run(env_class().verify(task, output))


SUM_ROW = stdin_row(["3\n1 2 3\n", "2\n-5 5\n"], ["6\n", "0"])
CALL_ROW = {
    "responses_create_params": {"input": "Write add_all."},
    "verifier_metadata": {"unit_tests": {"inputs": ["[1, 2]\n10", "[]\n0"], "outputs": ["[11, 12]", "[0]"], "fn_name": "add_all"}},
}


# -- verifier: known right and known wrong ------------------------------------------------------


def test_extract_code_takes_the_last_fenced_block() -> None:
    text = "```python\nprint(1)\n```\nor better:\n```\nprint(2)\n```"
    assert extract_code(text) == "print(2)"
    assert extract_code("print(3)") == ""
    assert extract_code("```python\nprint(4)") == ""


def test_output_comparison_follows_livecodebench() -> None:
    assert same_stdout("1 2\n3  \n\n", "1 2\n3")          # trailing whitespace and blank lines
    assert same_stdout("0.50\n", "0.5")                    # equal as decimals
    assert not same_stdout("1 2", "1 3")
    assert not same_stdout("1\n2", "1")                     # line count differs
    assert same_value([1, 2], [1, 2]) and same_value((1, 2), [1, 2]) and not same_value([1, 2], [2, 1])
    assert same_value(0.1 + 0.2, 0.3) and not same_value(0.31, 0.3)
    assert not same_value(10**400, 1) and same_value(10**400, 10**400)  # no OverflowError


@needs_sandbox
def test_right_stdin_program_earns_1() -> None:
    result = score(SUM_ROW, "n = int(input())\nprint(sum(map(int, input().split())))")
    assert result.reward == 1.0 and result.metrics["tests_passed"] == 2 and result.metrics["failure"] is None
    assert result.metrics["sandbox"] == "bwrap"


@needs_sandbox
def test_wrong_or_crashing_stdin_program_earns_0_with_its_reason() -> None:
    wrong = score(SUM_ROW, "input()\nprint(max(map(int, input().split())))")  # right on no test: 3 != 6
    assert (wrong.reward, wrong.metrics["failure"], wrong.metrics["failed_test"]) == (0.0, "wrong_answer", 0)
    crash = score(SUM_ROW, "raise ValueError('boom')")
    assert (crash.reward, crash.metrics["failure"]) == (0.0, "runtime_error")
    assert "ValueError: boom" in crash.metrics["failure_detail"]
    assert not crash.mask_sample


def test_no_code_block_earns_0_without_running_anything() -> None:
    result = score(SUM_ROW, None)
    assert (result.reward, result.metrics["failure"], result.metrics["has_code"]) == (0.0, "no_code", False)


@needs_sandbox
def test_function_tasks_call_the_function_and_compare_values() -> None:
    right = "def add_all(xs, k):\n    print('debug output is ignored')\n    return [x + k for x in xs] or [k]"
    assert score(CALL_ROW, right).reward == 1.0
    as_class = "class Solution:\n    def add_all(self, xs: List[int], k: int) -> List[int]:\n        return [x + k for x in xs] or [k]"
    assert score(CALL_ROW, as_class).reward == 1.0   # LeetCode style, `List` without an import
    wrong = score(CALL_ROW, "def add_all(xs, k):\n    return xs")
    assert (wrong.reward, wrong.metrics["failure"]) == (0.0, "wrong_answer")
    missing = score(CALL_ROW, "def other(xs, k):\n    return xs")
    assert (missing.reward, missing.metrics["failure"]) == (0.0, "runtime_error")
    raises = score(CALL_ROW, "def add_all(xs, k):\n    return xs[5]")
    assert raises.metrics["failure"] == "runtime_error" and "IndexError" in raises.metrics["failure_detail"]


@needs_sandbox
@pytest.mark.parametrize(
    "body",
    [
        "return 10**400",                                  # float(10**400) raises OverflowError in the comparison
        "return [10**400]",
        "x = []\n    for _ in range(3000):\n        x = [x]\n    return x",  # too deep for the host's json.loads
        "return 10**5000",                                 # past Python's int-to-text digit limit
    ],
)
def test_output_that_cannot_be_compared_is_a_wrong_answer_never_masked(body: str) -> None:
    """Only the environment's own faults mask a sample: a policy must not escape its 0 by an odd answer."""
    row = {"responses_create_params": {"input": "x"}, "verifier_metadata": {"unit_tests": {"inputs": ["1"], "outputs": ["2"], "fn_name": "f"}}}
    result = score(row, f"def f(n):\n    {body}")
    assert (result.reward, result.mask_sample, result.failure_kind) == (0.0, False, None)
    assert result.metrics["failure"] in ("wrong_answer", "runtime_error")


def test_malformed_unit_tests_are_a_masked_verifier_failure_naming_the_field() -> None:
    for tests, field in (
        (None, "verifier_metadata.unit_tests"),
        ({"inputs": ["1"], "outputs": []}, "verifier_metadata.unit_tests.outputs"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": "not a name"}, "verifier_metadata.unit_tests.fn_name"),
    ):
        row = {"responses_create_params": {"input": "x"}, "verifier_metadata": {"unit_tests": tests}}
        result = score(row, "print(1)")
        assert result.mask_sample and result.failure_kind == "verifier" and field in result.failure_reason


@needs_sandbox
def test_nemo_gym_code_gen_rows_load_and_score_the_same_way() -> None:
    # A row in NeMo Gym code_gen's shape: unit_tests as a JSON string (LiveCodeBench's
    # `input_output`), extra fields, and no agent_ref (rows route by `--env code_gen`).
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Print the sum of two integers."}]},
        "verifier_metadata": {"unit_tests": json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]})},
        "hash_id": "abc", "dataset": "taco", "source": "codeforces",
    }
    task = parse_task(row, index=0, default_env="code_gen")
    right = asyncio.run(CodeEnvironment().verify(task, answer("a, b = map(int, input().split())\nprint(a + b)")))
    wrong = asyncio.run(CodeEnvironment().verify(task, answer("print(3)")))
    assert (right.reward, wrong.reward) == (1.0, 0.0)


# -- the sandbox: hostile programs are contained and scored 0 -----------------------------------


def _no_sandbox_processes_left() -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"/sandbox/harness.py" in cmdline.read_bytes():
                return False
        except OSError:
            continue
    return True


@needs_sandbox
def test_fork_bomb_is_capped_and_killed() -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = score(stdin_row([""], ["escaped"]), bomb)
    assert result.reward == 0.0 and result.metrics["failure"] in ("timeout", "cpu_limit", "process_limit")
    assert _no_sandbox_processes_left()
    plain = score(stdin_row([""], ["escaped"]), "import os\nwhile True:\n    os.fork()")
    assert (plain.reward, plain.metrics["failure"]) == (0.0, "process_limit")


@needs_sandbox
def test_infinite_loop_hits_the_cpu_or_wall_clock_limit() -> None:
    result = score(stdin_row([""], ["done"]), "while True:\n    pass\nprint('done')")
    assert result.reward == 0.0 and result.metrics["failure"] in ("cpu_limit", "timeout")
    sleeper = score(stdin_row([""], ["done"]), "import time\ntime.sleep(60)\nprint('done')")
    assert (sleeper.reward, sleeper.metrics["failure"]) == (0.0, "timeout")
    assert _no_sandbox_processes_left()


@needs_sandbox
def test_memory_hog_hits_the_memory_limit() -> None:
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\nprint('escaped')"
    result = score(stdin_row([""], ["escaped"]), hog)
    assert (result.reward, result.metrics["failure"]) == (0.0, "memory_limit")


@needs_sandbox
def test_network_call_does_not_reach_the_host() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def reply_once() -> None:
        try:
            connection, _ = server.accept()
            connection.sendall(b"escaped\n")
            connection.close()
        except OSError:
            pass

    threading.Thread(target=reply_once, daemon=True).start()
    program = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint(s.recv(100).decode())"
    try:
        result = score(stdin_row([""], ["escaped"]), program)
    finally:
        server.close()
    assert (result.reward, result.metrics["failure"]) == (0.0, "runtime_error")
    assert "Connection refused" in result.metrics["failure_detail"] or "unreachable" in result.metrics["failure_detail"]
    outside = score(stdin_row([""], ["escaped"]), "import urllib.request\nprint(urllib.request.urlopen('http://pypi.org', timeout=2).read()[:0].decode() + 'escaped')")
    assert (outside.reward, outside.metrics["failure"]) == (0.0, "runtime_error")


def host_folder_outside_tmp() -> Path:
    """A folder the host can write that is not under /tmp (which the sandbox replaces with its own):
    the environment's package, unless this checkout itself lives under /tmp."""
    for folder in (Path(code_env.__file__).parent, Path.home(), Path("/var/tmp")):
        if not folder.resolve().is_relative_to("/tmp") and os.access(folder, os.W_OK):
            return folder
    pytest.skip("no writable folder outside /tmp on this host")


@needs_sandbox
def test_writes_outside_the_private_tmp_fail_and_leave_the_host_untouched() -> None:
    target = host_folder_outside_tmp() / f"escape_{uuid.uuid4().hex}.txt"
    program = f"import os\nos.makedirs({str(target.parent)!r}, exist_ok=True)\nopen({str(target)!r}, 'w').write('x')\nprint('escaped')"
    result = score(stdin_row([""], ["escaped"]), program)
    assert (result.reward, result.metrics["failure"]) == (0.0, "runtime_error")
    assert "Read-only file system" in result.metrics["failure_detail"]
    assert not target.exists()
    own_source = score(stdin_row([""], ["escaped"]), "open('/sandbox/solution.py', 'w').write('')\nprint('escaped')")
    assert own_source.reward == 0.0
    scratch = score(stdin_row([""], ["ok"]), "open('/tmp/scratch.txt', 'w').write('ok')\nprint(open('/tmp/scratch.txt').read())")
    assert scratch.reward == 1.0  # its own /tmp is writable
    assert not Path("/tmp/scratch.txt").exists()


@needs_sandbox
def test_secret_files_of_the_host_are_not_readable(tmp_path: Path) -> None:
    secrets = [tmp_path / "secret.txt", host_folder_outside_tmp() / f"secret_{uuid.uuid4().hex}.txt"]
    try:
        for secret in secrets:
            secret.write_text("hunter2")
            secret.chmod(0o600)
        for path in (*secrets, Path(code_env.__file__), Path.home() / ".bash_history"):
            result = score(stdin_row([""], ["hunter2"]), f"print(open({str(path)!r}).read())")
            assert (result.reward, result.metrics["failure"]) == (0.0, "runtime_error"), path
    finally:
        secrets[1].unlink(missing_ok=True)
    processes = score(stdin_row([""], ["1"]), "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) > 3)")
    assert processes.reward == 0.0  # host processes are invisible: only the sandbox's own few


@needs_sandbox
def test_huge_output_is_cut_and_scored_0() -> None:
    result = score(stdin_row([""], ["x"]), "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert (result.reward, result.metrics["failure"]) == (0.0, "output_limit")


# -- missing sandbox: refuse unless the unsafe mode is chosen -----------------------------------


def test_without_bwrap_the_environment_refuses_unless_unsafe_mode_is_chosen(monkeypatch) -> None:
    monkeypatch.setattr(code_env, "probe", lambda python: "bubblewrap is not installed (no `bwrap` on PATH): apt-get install bubblewrap")
    with pytest.raises(GymBridgeError, match="refuses to run untrusted code without a sandbox.*unsafe_no_sandbox=true"):
        CodeEnvironment.check_ready()
    with pytest.raises(GymBridgeError, match="refuses"):  # the engine records this as a `verifier` failure
        score(SUM_ROW, "print(6)", CodeEnvironment)
    unsafe = type("UnsafeCode", (CodeEnvironment,), {"unsafe_no_sandbox": True})
    unsafe.check_ready()
    result = score(SUM_ROW, "n = int(input())\nprint(sum(map(int, input().split())))", unsafe)
    assert result.reward == 1.0 and result.metrics["sandbox"] == "none (unsafe)"


def test_engine_refuses_the_run_before_any_rollout(monkeypatch, smol_template, turn) -> None:
    monkeypatch.setattr(code_env, "probe", lambda python: "bubblewrap is not installed")
    policy = ScriptedPolicy({"": [turn("print(1)")]})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64)))
    task = parse_task(SUM_ROW, index=0, default_env="code")

    async def run() -> list:
        return [record async for record in engine.stream([task])]

    with pytest.raises(GymBridgeError, match="bubblewrap is not installed"):
        asyncio.run(run())
    assert policy.calls == []


@needs_sandbox
def test_scripted_rollout_through_the_engine(smol_template, turn) -> None:
    solution = "Here:\n```python\nn = int(input())\nprint(sum(map(int, input().split())))\n```"
    policy = ScriptedPolicy({"0-0": [turn(solution)], "0-1": [turn("No idea.")]})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(max_turns=2)))
    task = parse_task(SUM_ROW, index=0, default_env="code")
    records = asyncio.run(engine.run_groups([task], group_size=2))[0]
    assert [record.reward for record in records] == [1.0, 0.0]
    assert records[1].verify_metrics["failure"] == "no_code"
    for record in records:
        assert_token_invariants(record.to_dict())


# -- data ---------------------------------------------------------------------------------------


def test_prepare_rows_is_seeded_and_splits_are_disjoint() -> None:
    train = CodeEnvironment.prepare_rows(split="train", size=40, seed=3)
    again = CodeEnvironment.prepare_rows(split="train", size=40, seed=3)
    validation = CodeEnvironment.prepare_rows(split="validation", size=10, seed=3)
    assert train == again and len(train) == 40 and len(validation) == 10
    prompts = lambda rows: {json.dumps(row["verifier_metadata"]) for row in rows}  # noqa: E731
    assert not prompts(train) & prompts(validation)
    assert {row["task_family"] for row in train} >= {"sum_numbers", "fizzbuzz"}
    for row in train + validation:
        parse_task(row, index=0)  # each row is a valid task


@needs_sandbox
def test_generated_rows_are_solvable() -> None:
    solutions = {
        "sum_numbers": "input()\nprint(sum(map(int, input().split())))",
        "fizzbuzz": "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i) for i in range(1, n + 1)]",
        "reverse_words": "print(' '.join(reversed(input().split())))",
    }
    rows = [row for row in CodeEnvironment.prepare_rows(split="train", size=60, seed=1) if row["task_family"] in solutions]
    assert len({row["task_family"] for row in rows}) == 3
    for row in [next(row for row in rows if row["task_family"] == family) for family in solutions]:
        assert score(row, solutions[row["task_family"]]).reward == 1.0, row["task_family"]


def test_example_data_routes_to_code() -> None:
    tasks = load_tasks(CodeEnvironment.example_data)
    assert len(tasks) >= 10 and {task.env_name for task in tasks} == {"code"}
    assert os.path.exists(CodeEnvironment.example_data)


def test_sandbox_uids_differ_across_processes_and_fit_bwrap() -> None:
    from environments.code.sandbox import MAX_SLOTS, sandbox_uid

    assert sandbox_uid(4_194_303, MAX_SLOTS - 1) < 2**31           # bwrap rejects larger uid maps
    assert len({sandbox_uid(pid, slot) for pid in (100, 101, 4_194_303) for slot in range(MAX_SLOTS)}) == 3 * MAX_SLOTS


@needs_sandbox
def test_a_cancelled_verify_kills_its_sandbox() -> None:
    """A rollout deadline cancels verify; the sleeper it was running must not live on."""
    task = parse_task(stdin_row([""], ["x"]), index=0, default_env="code")
    slow = type("SlowCode", (CodeEnvironment,), {"wall_time_s": 60.0})

    async def cancel_midway() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow().verify(task, answer("import time\ntime.sleep(600)")), timeout=1.0)

    asyncio.run(cancel_midway())
    time.sleep(0.2)
    assert _no_sandbox_processes_left()


@needs_sandbox
def test_the_sandbox_runs_on_uvloop_as_gym_bridge_eval_does() -> None:
    """`gym-bridge eval` runs on uvloop, whose subprocess API has no user=/group= (the privilege drop)."""
    uvloop = pytest.importorskip("uvloop")
    task = parse_task(SUM_ROW, index=0, default_env="code")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(FastCode().verify(task, answer("n = int(input())\nprint(sum(map(int, input().split())))")))
    assert result.reward == 1.0 and result.metrics["sandbox"] == "bwrap", result.metrics


@needs_sandbox
def test_solutions_run_without_root_and_without_groups() -> None:
    row = stdin_row([""], ["ok"])
    code = "import os\nprint('ok' if os.getuid() != 0 and os.getgid() != 0 and os.getgroups() in ([], [os.getgid()]) else ('root', os.getuid(), os.getgroups()))"
    result = score(row, code)
    assert result.reward == 1.0, result.metrics
