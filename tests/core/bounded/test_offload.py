"""Tests for gym_bridge.core.bounded.offload: worker processes with a timeout, off the event loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import BrokenExecutor
from pathlib import Path

import pytest

from gym_bridge.core.bounded.offload import run_in_process


class Unpicklable(Exception):
    """Needs two constructor arguments, so unpickling it (which passes one) fails."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str) -> None:
    raise KeyError(message)


def fail_unpicklable() -> None:
    raise Unpicklable(7, "bad")


def die() -> None:
    os._exit(3)


def append_then_die(path: str) -> None:
    with open(path, "a") as handle:
        handle.write("x")
    os._exit(3)


def append_then_sleep(path: str, seconds: float) -> str:
    with open(path, "a") as handle:
        handle.write("x")
    time.sleep(seconds)
    return "slept"


def sleep_then_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_returns_the_value_computed_in_another_process() -> None:
    assert asyncio.run(run_in_process(add, 2, 3, timeout_s=30)) == 5
    assert asyncio.run(run_in_process(os.getpid, timeout_s=30)) != os.getpid()


def test_propagates_the_exception_type_with_the_worker_traceback() -> None:
    with pytest.raises(KeyError, match="missing") as caught:
        asyncio.run(run_in_process(fail, "missing", timeout_s=30))
    assert any("in fail" in note for note in caught.value.__notes__)


def test_unpicklable_exception_becomes_runtime_error_naming_it() -> None:
    with pytest.raises(RuntimeError, match="Unpicklable: 7: bad"):
        asyncio.run(run_in_process(fail_unpicklable, timeout_s=30))


def test_lambda_is_refused_before_anything_runs() -> None:
    with pytest.raises(TypeError, match="module-level function"):
        asyncio.run(run_in_process(lambda: 1, timeout_s=30))


def test_hung_call_times_out_and_the_pool_keeps_working() -> None:
    async def main() -> None:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="sleep"):
            await run_in_process(time.sleep, 60, timeout_s=1.0)
        assert time.monotonic() - started < 3.0  # ~timeout_s, not 60 s
        assert await run_in_process(add, 1, 1, timeout_s=30) == 2

    asyncio.run(main())


def test_a_killed_call_leaves_the_calls_beside_it_running(tmp_path: Path) -> None:
    marker = tmp_path / "runs"

    async def main() -> None:
        hung = asyncio.create_task(run_in_process(time.sleep, 60, timeout_s=0.5))
        survivor = asyncio.create_task(run_in_process(append_then_sleep, str(marker), 1.0, timeout_s=30))
        with pytest.raises(TimeoutError):
            await hung
        assert await survivor == "slept"

    asyncio.run(main())
    assert marker.read_text() == "x"  # each call has its own worker: the survivor was not killed and rerun


def test_a_worker_that_dies_fails_only_its_own_call() -> None:
    async def main() -> None:
        dying = asyncio.create_task(run_in_process(die, timeout_s=30))
        beside = asyncio.create_task(run_in_process(sleep_then_pid, 0.5, timeout_s=30))
        with pytest.raises(BrokenExecutor):
            await dying
        assert isinstance(await beside, int)
        assert await run_in_process(add, 2, 2, timeout_s=30) == 4

    asyncio.run(main())


def test_a_call_runs_once_even_when_its_worker_dies(tmp_path: Path) -> None:
    """No retry: a call that crashed its worker is not run a second time."""
    marker = tmp_path / "runs"

    async def main() -> None:
        with pytest.raises(BrokenExecutor):
            await run_in_process(append_then_die, str(marker), timeout_s=30)

    asyncio.run(main())
    assert marker.read_text() == "x"


def test_concurrent_calls_all_complete() -> None:
    async def main() -> list[int]:
        return await asyncio.gather(*(run_in_process(add, i, i, timeout_s=30) for i in range(8)))

    assert asyncio.run(main()) == [2 * i for i in range(8)]


def test_event_loop_keeps_running_while_a_call_runs() -> None:
    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await run_in_process(time.sleep, 0.5, timeout_s=30)
        task.cancel()
        return ticks

    assert asyncio.run(main()) >= 20  # 0.5 s / 10 ms = 50 ticks if never blocked


def test_interpreter_exits_promptly_with_a_call_still_running(tmp_path: Path) -> None:
    script = tmp_path / "hang_at_exit.py"
    script.write_text(textwrap.dedent("""
        import asyncio, threading, time
        from gym_bridge.core.bounded.offload import run_in_process

        def hang():
            try:
                asyncio.run(run_in_process(time.sleep, 60, timeout_s=100))
            except Exception:
                pass

        if __name__ == "__main__":
            threading.Thread(target=hang, daemon=True).start()
            time.sleep(0.5)
    """))
    root = Path(__file__).resolve().parents[3]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script)], env={**os.environ, "PYTHONPATH": str(root)}, timeout=30, capture_output=True
    )
    assert result.returncode == 0, result.stderr.decode()
    assert time.monotonic() - started < 10  # the hung worker was killed, not waited for
