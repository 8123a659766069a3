"""Helpers for resume tests in process: a policy that answers by turn and can 'die' at a chosen call, and a run that
kills an engine mid-episode and resumes it from the journal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Sequence

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal
from gym_bridge.core.policy import Generation, GenerationRequest
from gym_bridge.core.task import Task


class Killed(BaseException):
    """Stands in for SIGKILL: no boundary in the engine catches it."""


class TurnPolicy:
    """Answers with `turns[k]` when the prompt holds k finished assistant turns (so a resumed rollout gets the same
    answers); raises Killed at its `kill_at`-th call; counts its calls."""

    def __init__(self, template: Any, turns: Sequence[Generation], *, kill_at: int | None = None, delay_s: float = 0.0) -> None:
        self.template, self.turns, self.kill_at, self.delay_s = template, list(turns), kill_at, delay_s
        self.calls = 0

    async def generate(self, request: GenerationRequest) -> Generation:
        self.calls += 1
        if self.calls == self.kill_at:
            raise Killed()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        done = self.template.decode(list(request.prompt_ids)).count("<|im_start|>assistant") - 1
        return self.turns[min(done, len(self.turns) - 1)]

    async def aclose(self) -> None:
        pass


def run(engine: Engine, rows: Sequence[Task], journal: RunJournal | None = None) -> dict[int, dict[str, Any]]:
    """Records by task index; each finished rollout's journal is dropped, as `gym-bridge eval` does once it is written."""
    engine = engine.with_journal(journal)

    async def go() -> dict[int, dict[str, Any]]:
        records = {}
        async for record in engine.stream(rows):
            records[record.task_index] = record.to_dict()
            if journal is not None:
                journal.finish(RolloutKey.of_task(record.task_index, record.repeat_index))
        return records

    return asyncio.run(go())


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between runs (latency) or says it was resumed."""
    metrics = {k: v for k, v in record["metrics"].items() if k not in ("latency_s", "attempts", "resumed_from_turn")}
    return {**record, "metrics": metrics}


def kill_then_resume(directory: Path, template: Any, script: Sequence[Generation], rows: Sequence[Task], *, kill_at: int,
                     config: EngineConfig | None = None, first_delay_s: float = 0.0,
                     before_resume: Callable[[], None] | None = None) -> tuple[dict[int, dict[str, Any]], TurnPolicy, RunJournal]:
    """Run `rows` with a policy that dies at call `kill_at`, then resume them from the journal in `directory`.
    `before_resume` runs between the two. Returns the resumed run's records, its policy and its journal (closed)."""
    config = config or EngineConfig()
    fingerprint = RunFingerprint.of_run(model="scripted", tasks=rows, settings={})
    journal = RunJournal.prepare(directory, fingerprint, resume=False)
    try:
        run(Engine(TurnPolicy(template, script, kill_at=kill_at, delay_s=first_delay_s), template, config), rows, journal)
    except Killed:
        pass
    else:
        raise AssertionError(f"the first run finished before call {kill_at}")
    if before_resume is not None:
        before_resume()
    resumed = RunJournal.prepare(directory, fingerprint, resume=True)
    policy = TurnPolicy(template, script)
    records = run(Engine(policy, template, config), rows, resumed)
    asyncio.run(resumed.close())
    return records, policy, resumed
