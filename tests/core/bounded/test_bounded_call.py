"""Tests for gym_bridge.core.bounded.call: environment code under a timeout, in daemon threads.

Issue 9 items 1 (no shared, starvable pool), 2 (a stuck call never keeps the process alive) and
3 (SystemExit / KeyboardInterrupt / CancelledError raised by environment code end only its call).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gym_bridge.core.bounded import call as bounded_call
from gym_bridge.core.bounded.call import StuckCallsError, call_bounded, stuck_calls
from gym_bridge.core.errors import AbortedCall, describe_error


@pytest.fixture
def release():
    """An event hung calls wait on; set at the end of the test so their threads finish."""
    event = threading.Event()
    yield event
    event.set()
    deadline = time.monotonic() + 5
    while stuck_calls() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_hung_calls_of_one_owner_do_not_starve_other_owners(release):
    """Item 1: 40 calls stuck past their timeout (more than the old 32-thread pool held) leave
    every later call of another environment on time."""

    async def scenario():
        hung = await asyncio.gather(
            *(call_bounded(release.wait, 30, timeout_s=0.05, owner="hangs") for _ in range(40)), return_exceptions=True
        )
        assert all(isinstance(result, TimeoutError) for result in hung)
        assert stuck_calls().get("hangs") == 40  # other owners may still have calls stuck from earlier tests
        return await asyncio.gather(*(call_bounded(lambda i=i: i * 2, timeout_s=0.5, owner="healthy") for i in range(10)))

    assert asyncio.run(scenario()) == [i * 2 for i in range(10)]


def test_timeout_measures_the_call_not_the_wait_for_a_thread():
    """Item 1: 96 concurrent 0.1 s calls under a 0.25 s timeout all finish (a 32-thread pool
    runs them in three waves, 0.3 s, and the last wave times out)."""

    async def scenario():
        return await asyncio.gather(*(call_bounded(time.sleep, 0.1, timeout_s=0.25) for _ in range(96)), return_exceptions=True)

    results = asyncio.run(scenario())
    assert [result for result in results if result is not None] == []


def test_an_owner_with_too_many_stuck_calls_is_refused_at_once(monkeypatch, release):
    """Item 1: stuck calls are capped per owner; the owner's later calls fail fast, others run,
    and the count drops when the stuck calls return."""
    monkeypatch.setattr(bounded_call, "MAX_STUCK_CALLS_PER_OWNER", 3)

    async def scenario():
        for _ in range(3):
            with pytest.raises(TimeoutError):
                await call_bounded(release.wait, 30, timeout_s=0.02, owner="sticky")
        started = time.perf_counter()
        with pytest.raises(StuckCallsError, match="sticky has 3 calls still running past their timeout"):
            await call_bounded(time.sleep, 0, timeout_s=5, owner="sticky")
        assert time.perf_counter() - started < 0.5
        assert await call_bounded(lambda: "fine", timeout_s=1, owner="other") == "fine"

    asyncio.run(scenario())
    release.set()
    deadline = time.monotonic() + 5
    while "sticky" in stuck_calls() and time.monotonic() < deadline:  # other tests' hung calls may still be counted
        time.sleep(0.01)
    assert "sticky" not in stuck_calls()


def test_async_functions_and_awaitables_returned_by_sync_ones():
    async def double(x):
        await asyncio.sleep(0)
        return 2 * x

    async def scenario():
        assert await call_bounded(double, 4, timeout_s=1) == 8
        assert await call_bounded(lambda: double(5), timeout_s=1) == 10
        with pytest.raises(TimeoutError):
            await call_bounded(asyncio.sleep, 5, timeout_s=0.05)

    asyncio.run(scenario())


def raise_system_exit():
    sys.exit(3)


def raise_keyboard_interrupt():
    raise KeyboardInterrupt


def raise_cancelled():
    raise asyncio.CancelledError


async def async_raise_system_exit():
    sys.exit(4)


async def async_raise_keyboard_interrupt():
    raise KeyboardInterrupt("from the verifier")


async def async_raise_cancelled():
    raise asyncio.CancelledError


@pytest.mark.parametrize(
    ("fn", "described"),
    [(raise_system_exit, "SystemExit: 3"), (raise_keyboard_interrupt, "KeyboardInterrupt"),
     (raise_cancelled, "CancelledError"), (async_raise_system_exit, "SystemExit: 4"),
     (async_raise_keyboard_interrupt, "KeyboardInterrupt: from the verifier"), (async_raise_cancelled, "CancelledError")],
)
def test_exit_and_interrupt_raised_by_the_code_end_only_its_call(fn, described):
    """Item 3: the code's own SystemExit, KeyboardInterrupt or CancelledError becomes AbortedCall."""

    async def scenario():
        with pytest.raises(AbortedCall) as caught:
            await call_bounded(fn, timeout_s=1)
        return caught.value

    assert describe_error(asyncio.run(scenario())) == described


def test_cancelling_the_caller_is_not_swallowed():
    """Item 3: the user's Ctrl-C (a cancellation of the run) still propagates through a call."""

    async def scenario():
        task = asyncio.ensure_future(call_bounded(asyncio.sleep, 10, timeout_s=30))
        thread_task = asyncio.ensure_future(call_bounded(time.sleep, 0.3, timeout_s=30))
        await asyncio.sleep(0.05)
        task.cancel()
        thread_task.cancel()
        for pending in (task, thread_task):
            with pytest.raises(asyncio.CancelledError):
                await pending

    asyncio.run(scenario())


def test_a_stuck_call_does_not_keep_the_process_alive(tmp_path):
    """Item 2: the interpreter exits right after its work although a call is stuck for an hour."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import asyncio, time
        from gym_bridge.core.bounded.call import call_bounded

        async def main():
            try:
                await call_bounded(time.sleep, 3600, timeout_s=0.05, owner="env")
            except TimeoutError:
                print("timed out", flush=True)

        asyncio.run(main())
    """))
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timed out"
    assert time.monotonic() - started < 30
