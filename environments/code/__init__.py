"""code: Python programming tasks scored by unit tests run in a bubblewrap sandbox (NeMo Gym's `code_gen`).

The code block between the last two ``` fence lines of the final answer is run on every test of
`verifier_metadata.unit_tests` (`inputs`, `outputs`, `fn_name`; LiveCodeBench's format): as a
program on stdin when `fn_name` is null, else by calling `fn_name` with each input's JSON lines as
arguments. Reward 1.0 iff every test passes. What the code does wrong (crash, wrong output,
timeout, memory or process limits, network or file access) is scored 0 with the reason in
`metrics.failure`; a sandbox that fails to start masks the sample as a `verifier` failure.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar

from gym_bridge import Environment, Item, SetupError, Task, VerifyResult, final_text

from environments.code.generate import prepare_code_rows
from environments.code.sandbox import Sandbox, SandboxLimits, SandboxResult, default_python, probe

UNSAFE_HINT = (
    "or, only for code you trust on a machine you can lose, run it unsandboxed with "
    "`--env-setting code.unsafe_no_sandbox=true` (gym_bridge.configure('code', unsafe_no_sandbox=True))"
)


class CodeEnvironment(Environment):
    name = "code"
    aliases = ("code_gen", "code_gen_simple_agent")
    description = "Write a Python program or function; reward 1 if it passes every unit test in a bubblewrap sandbox."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # no tools: the sandbox work directory exists only inside verify, which runs once at the end
    settings = (
        "unsafe_no_sandbox", "wall_time_s", "cpu_time_s", "memory_mb", "max_processes", "max_output_bytes",
        "max_concurrency", "python",
    )
    verify_timeout_s: ClassVar[float] = 600.0
    unsafe_no_sandbox: ClassVar[bool] = False
    """Run solutions directly on this machine, with resource limits but no isolation at all."""
    wall_time_s: ClassVar[float] = 10.0
    """Per sandboxed run: one stdin test, or all calls of a function task."""
    cpu_time_s: ClassVar[int] = 5
    memory_mb: ClassVar[int] = 512
    max_processes: ClassVar[int] = 16
    max_output_bytes: ClassVar[int] = 1_000_000
    max_concurrency: ClassVar[int | None] = None
    """Sandboxes running at once in this process (None: the CPU count, at least 2)."""
    python: ClassVar[str | None] = None
    """Interpreter inside the sandbox (None: the system Python)."""

    @classmethod
    def check_ready(cls) -> None:
        if cls.unsafe_no_sandbox:
            return
        reason = probe(cls.python or default_python())
        if reason is not None:
            raise SetupError(f"environment {cls.name!r} refuses to run untrusted code without a sandbox: {reason}; {UNSAFE_HINT}")

    @classmethod
    def sandbox(cls) -> Sandbox:
        """The sandbox of these settings, shared by all rollouts."""
        limits = SandboxLimits(
            wall_time_s=cls.wall_time_s, cpu_time_s=cls.cpu_time_s, memory_mb=cls.memory_mb,
            max_processes=cls.max_processes, max_output_bytes=cls.max_output_bytes,
        )
        return _sandbox(limits, cls.python, cls.max_concurrency, cls.unsafe_no_sandbox)

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int) -> list[dict[str, Any]]:
        """`size` generated tasks with reference tests (see generate.py); splits draw disjoint seeds."""
        return prepare_code_rows(split=split, size=size, seed=seed)

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        try:
            tests = unit_tests(task)
        except ValueError as error:
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=f"{task.source}: {error}")
        code = extract_code(final_text(output))
        metrics: dict[str, Any] = {"tests_total": len(tests["inputs"]), "tests_passed": 0, "has_code": bool(code)}
        if not code:
            return _scored(False, metrics, failure="no_code")
        if not self.unsafe_no_sandbox:
            type(self).check_ready()
        metrics["sandbox"] = "none (unsafe)" if self.unsafe_no_sandbox else "bwrap"
        sandbox = self.sandbox()
        if tests["fn_name"] is None:
            for position, (stdin, expected) in enumerate(zip(tests["inputs"], tests["outputs"])):
                result = await sandbox.run("stdin", code, stdin=stdin.encode())
                if not result.started:
                    return _sandbox_failed(result, metrics)
                if result.failure is not None:
                    return _scored(False, metrics, failure=result.failure, detail=result.stderr_tail(), test=position)
                if not _solution_matches(same_stdout, result.stdout.decode("utf-8", "replace"), expected):
                    return _scored(False, metrics, failure="wrong_answer", test=position)
                metrics["tests_passed"] += 1
            return _scored(True, metrics)
        try:
            arguments = [[json.loads(line) for line in text.split("\n")] for text in tests["inputs"]]
            expected_values = [json.loads(text) for text in tests["outputs"]]
        except json.JSONDecodeError as error:
            reason = f"{task.source}: verifier_metadata.unit_tests: a function test's inputs/outputs are not JSON lines ({error})"
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=reason)
        result = await sandbox.run("call", code, tests={"fn_name": tests["fn_name"], "arguments": arguments})
        if not result.started:
            return _sandbox_failed(result, metrics)
        if result.failure is not None:
            return _scored(False, metrics, failure=result.failure, detail=result.stderr_tail())
        results = _call_results(result)
        if results is None or not _well_formed(results, len(expected_values)):
            return _scored(False, metrics, failure="runtime_error", detail="no well-formed results came back from the harness")
        for position, (got, expected) in enumerate(zip(results, expected_values)):
            if "error" in got:
                return _scored(False, metrics, failure="runtime_error", detail=got["error"], test=position)
            if "value" not in got or not _solution_matches(same_value, got["value"], expected):
                return _scored(False, metrics, failure="wrong_answer", test=position)
            metrics["tests_passed"] += 1
        return _scored(True, metrics)


def _sandbox(limits: SandboxLimits, python: str | None, max_concurrency: int | None, unsafe: bool) -> Sandbox:
    key = (limits, python, max_concurrency, unsafe)
    if key not in _SANDBOXES:
        _SANDBOXES[key] = Sandbox(limits, python=python, max_concurrency=max_concurrency, unsafe_no_sandbox=unsafe)
    return _SANDBOXES[key]


_SANDBOXES: dict[tuple, Sandbox] = {}


def unit_tests(task: Task) -> dict[str, Any]:
    """The row's `verifier_metadata.unit_tests` as `{inputs, outputs, fn_name}`; a JSON string is accepted.

    Raises ValueError naming the field when it is missing or malformed.
    """
    field = "verifier_metadata.unit_tests"
    raw = (task.get("verifier_metadata") or {}).get("unit_tests")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"{field}: not valid JSON ({error.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{field}: missing; give {{'inputs': [...], 'outputs': [...], 'fn_name': null}}")
    inputs, outputs, fn_name = raw.get("inputs"), raw.get("outputs"), raw.get("fn_name")
    for key, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, list) or not value or not all(isinstance(entry, str) for entry in value):
            raise ValueError(f"{field}.{key}: must be a non-empty list of strings")
    if len(inputs) != len(outputs):  # type: ignore[arg-type]
        raise ValueError(f"{field}: {len(inputs)} inputs but {len(outputs)} outputs")  # type: ignore[arg-type]
    if fn_name is not None and (not isinstance(fn_name, str) or not fn_name.isidentifier()):
        raise ValueError(f"{field}.fn_name: must be null or a Python identifier, got {fn_name!r}")
    return {"inputs": inputs, "outputs": outputs, "fn_name": fn_name}


_FENCE = re.compile(r"```")


def extract_code(text: str) -> str:
    """The lines between the last two lines that contain a ``` fence ('' with fewer than two)."""
    lines = text.split("\n")
    fences = [position for position, line in enumerate(lines) if _FENCE.search(line)]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1 : fences[-1]])


def same_stdout(got: str, expected: str) -> bool:
    """Line by line after stripping; lines that differ as text may still be equal as decimal numbers."""
    got_lines = [line.strip() for line in got.strip().split("\n")]
    expected_lines = [line.strip() for line in expected.strip().split("\n")]
    if len(got_lines) != len(expected_lines):
        return False
    return all(a == b or _same_decimals(a, b) for a, b in zip(got_lines, expected_lines))


def _same_decimals(got: str, expected: str) -> bool:
    from decimal import Decimal, InvalidOperation

    try:
        return [Decimal(token) for token in got.split()] == [Decimal(token) for token in expected.split()]
    except InvalidOperation:
        return False


def same_value(got: Any, expected: Any) -> bool:
    """Equal values, equal JSON, or numbers within a relative 1e-5 (and absolute 1e-8)."""
    if got == expected or json.dumps(got) == json.dumps(expected):
        return True
    try:
        a, b = float(got), float(expected)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def _solution_matches(compare: Callable[[Any, Any], bool], got: Any, expected: Any) -> bool:
    """`compare(got, expected)`, where any exception is the solution's output failing to compare
    (10**400 overflows float(), say): a wrong answer scored 0, never a masked verifier failure that
    a policy under RL could learn to reach instead of its penalty."""
    try:
        return compare(got, expected)
    except Exception:
        return False


def _call_results(result: SandboxResult) -> list[dict[str, Any]] | None:
    lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        results = json.loads(lines[-1])["results"] if lines else None
    except (ValueError, KeyError, TypeError, RecursionError):  # the solution shaped this output: too deep, too long a number
        return None
    return results if isinstance(results, list) and all(isinstance(entry, dict) for entry in results) else None


def _well_formed(results: list[dict[str, Any]] | None, expected: int) -> bool:
    """One result per test, or fewer ending with the error that stopped the run."""
    if not results:
        return False
    return len(results) == expected or (len(results) < expected and "error" in results[-1])


def _scored(passed: bool, metrics: dict[str, Any], *, failure: str | None = None, detail: str = "", test: int | None = None) -> VerifyResult:
    metrics = {**metrics, "failure": failure}
    if detail:
        metrics["failure_detail"] = detail
    if test is not None:
        metrics["failed_test"] = test
    return VerifyResult(reward=float(passed), reward_components={"tests_passed": float(passed)}, metrics=metrics)


def _sandbox_failed(result: SandboxResult, metrics: dict[str, Any]) -> VerifyResult:
    reason = f"the sandbox did not start: {result.stderr_tail() or f'exit status {result.exit_code}'}"
    return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=reason, metrics=metrics)
