"""The shared request batcher with a fake batch function: merging, the gathering rule, failures, cancellation."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gym_bridge.core.errors import BackendError
from gym_bridge.policies.batcher import Batcher, GatherRule, Waiting


class Recorder:
    """A batch function that doubles each request and records the batches it saw."""

    def __init__(self, *, fail_on: int | None = None, gate: threading.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.fail_on = fail_on
        self.gate = gate

    def __call__(self, batch: list[Waiting[int, int]]) -> list[int | BaseException]:
        if self.gate is not None:
            self.gate.wait(5)
        requests = [item.request for item in batch]
        self.batches.append(requests)
        if self.fail_on is not None and self.fail_on in requests:
            raise RuntimeError(f"bad request {self.fail_on}")
        return [ValueError("odd") if request == 7 else 2 * request for request in requests]


def _batcher(run: Recorder, **rule: float) -> Batcher[int, int]:
    settings = {"max_batch_size": 64, "quiet_gap_s": 0.05, "max_wait_s": 0.05, **rule}
    return Batcher(run, rule=GatherRule(max_batch_size=int(settings.pop("max_batch_size")), **settings), name="Test")


def test_concurrent_requests_merge_into_one_batch_and_get_their_own_results() -> None:
    run = Recorder()

    async def main() -> list[int]:
        batcher = _batcher(run)
        results = await asyncio.gather(*(batcher.submit(n) for n in range(5)))
        await batcher.aclose()
        return list(results)

    assert asyncio.run(main()) == [0, 2, 4, 6, 8]
    assert run.batches == [[0, 1, 2, 3, 4]]


def test_max_batch_size_splits_and_an_exception_result_fails_only_its_request() -> None:
    run = Recorder()

    async def main() -> list[object]:
        batcher = _batcher(run, max_batch_size=3)
        results = await asyncio.gather(*(batcher.submit(n) for n in (1, 7, 2, 3)), return_exceptions=True)
        await batcher.aclose()
        return list(results)

    results = asyncio.run(main())
    assert results[0] == 2 and isinstance(results[1], ValueError) and results[2:] == [4, 6]
    assert run.batches == [[1, 7, 2], [3]]


def test_a_quiet_gap_closes_the_batch_and_max_wait_caps_it_while_requests_keep_coming() -> None:
    async def trickle(batcher: Batcher[int, int], *, gap_s: float, count: int) -> None:
        tasks = []
        for n in range(count):
            tasks.append(asyncio.ensure_future(batcher.submit(n)))
            await asyncio.sleep(gap_s)
        await asyncio.gather(*tasks, return_exceptions=True)  # 7 fails by design
        await batcher.aclose()

    gapped = Recorder()  # arrivals 0.1 s apart, a 0.03 s quiet gap: each alone
    asyncio.run(trickle(_batcher(gapped, quiet_gap_s=0.03, max_wait_s=1.0), gap_s=0.1, count=3))
    assert gapped.batches == [[0], [1], [2]]

    steady = Recorder()  # arrivals 0.01 s apart keep a 0.05 s gap open; the 0.12 s cap closes the batch
    asyncio.run(trickle(_batcher(steady, quiet_gap_s=0.05, max_wait_s=0.12), gap_s=0.01, count=40))
    assert len(steady.batches) > 1 and sorted(n for batch in steady.batches for n in batch) == list(range(40))
    assert max(len(batch) for batch in steady.batches) < 40


def test_fits_carries_a_misfit_into_the_next_batch_and_split_runs_groups_in_turn() -> None:
    run = Recorder()

    async def main() -> list[int]:
        batcher: Batcher[int, int] = Batcher(
            run, rule=GatherRule(max_batch_size=64, quiet_gap_s=0.05, max_wait_s=0.05), name="Test",
            fits=lambda batch, request: sum(batch) + request <= 10,
            split=lambda batch: [[item for item in batch if item.request % 2 == 0], [item for item in batch if item.request % 2]],
        )
        results = await asyncio.gather(*(batcher.submit(n) for n in (1, 2, 3, 4, 5)))
        await batcher.aclose()
        return list(results)

    assert asyncio.run(main()) == [2, 4, 6, 8, 10]
    assert run.batches == [[2, 4], [1, 3], [5]]  # 1+2+3+4 fits 10; 5 opens the next batch


def test_an_exception_in_the_batch_function_fails_every_request_of_the_batch_and_the_worker_survives() -> None:
    run = Recorder(fail_on=3)

    async def main() -> tuple[list[object], int]:
        batcher = _batcher(run)
        failed = await asyncio.gather(*(batcher.submit(n) for n in (1, 3)), return_exceptions=True)
        later = await batcher.submit(5)
        await batcher.aclose()
        return list(failed), later

    failed, later = asyncio.run(main())
    assert all(isinstance(error, BackendError) and "bad request 3" in str(error) for error in failed)
    assert isinstance(failed[0], BackendError) and isinstance(failed[0].__cause__, RuntimeError)
    assert later == 10


def test_a_cancelled_waiting_request_is_left_out_of_its_batch() -> None:
    run = Recorder()

    async def main() -> list[int]:
        batcher = _batcher(run, quiet_gap_s=0.1, max_wait_s=0.1)
        kept = asyncio.ensure_future(batcher.submit(1))
        dropped = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0.02)
        dropped.cancel()
        result = await kept
        await batcher.aclose()
        return [result]

    assert asyncio.run(main()) == [2]
    assert run.batches == [[1]]


def test_stopping_fails_queued_and_running_requests_instead_of_hanging() -> None:
    gate = threading.Event()
    run = Recorder(gate=gate)

    async def main() -> list[object]:
        batcher = _batcher(run, max_batch_size=1)
        tasks = [asyncio.ensure_future(batcher.submit(n)) for n in (1, 2)]
        await asyncio.sleep(0.05)  # 1 runs (blocked on the gate), 2 is queued
        batcher.stop()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        gate.set()
        return list(results)

    results = asyncio.run(main())
    assert all(isinstance(error, BackendError) and "Test was closed" in str(error) for error in results)


def test_a_rule_needs_a_positive_batch_size() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        GatherRule(max_batch_size=0, quiet_gap_s=0.0, max_wait_s=0.0)
