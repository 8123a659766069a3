"""Resuming rollouts in process: a run 'killed' mid-episode (an exception no boundary catches) and resumed from the
journal gives the uninterrupted record, without regenerating committed turns; snapshot, replay and restart kinds."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.journal import RunFingerprint, RunJournal
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from tests.support.invariants import assert_token_invariants
from tests.support.resume_kit import Killed, TurnPolicy, comparable, run
from tests.support.resume_kit import kill_then_resume as kill_and_resume

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {{"n": {n}}}}}\n</tool_call>'
executed: list[tuple[str, int]] = []
"""(environment, n) of every tool call run, across runs."""
drift = {"value": 0}
verified: list[int] = []
"""Task index of every verify call."""


class Counter(Environment):
    """Adds up what the model asks for; the reward is read from the session's state, so a session that comes back
    wrong scores wrong."""

    resume = "replay"
    inline_sync_tools = True
    slow_s = 0.0

    def setup(self, task):
        self.total = 0

    @tool
    def add(self, n: int) -> dict:
        """Add n.

        Args:
            n: How much.
        """
        executed.append((self.name, n))
        if self.slow_s:
            time.sleep(self.slow_s)
        self.total += n
        return {"total": self.total, "drift": drift["value"]}

    def verify(self, task, output):
        verified.append(task.index)
        return VerifyResult(reward=float(self.total == task.get("expected")), metrics={"total": self.total})


@register
class ReplayCounter(Counter):
    name = "replay_counter_for_resume_test"


@register
class SnapshotCounter(Counter):
    name = "snapshot_counter_for_resume_test"
    resume = "snapshot"

    def snapshot(self) -> Any:
        return {"total": self.total}

    def restore(self, task, state):
        if drift["value"]:
            raise RuntimeError("the saved state no longer loads")
        self.total = state["total"]


@register
class RestartCounter(Counter):
    name = "restart_counter_for_resume_test"
    resume = "restart"


@pytest.fixture
def script(turn):
    return [turn(CALL.format(name="add", n=n)) for n in (3, 4, 5)] + [turn("the total is 12")]


def tasks(env: str, count: int = 2):
    return [parse_task({"prompt": f"add 3, 4, 5 (#{i})", "environment": env, "expected": 12}, index=i) for i in range(count)]


def kill_then_resume(tmp_path, template, script, env: str, *, kill_at: int, count: int = 2, **options):
    return kill_and_resume(tmp_path / "journal", template, script, tasks(env, count), kill_at=kill_at,
                           before_resume=executed.clear, **options)


@pytest.mark.parametrize("env", [ReplayCounter.name, SnapshotCounter.name])
def test_a_resumed_rollout_equals_the_uninterrupted_one_and_no_committed_turn_is_generated_again(tmp_path, smol_template, script, env):
    rows = tasks(env)
    baseline_policy = TurnPolicy(smol_template, script)
    baseline = run(Engine(baseline_policy, smol_template, EngineConfig()), rows)
    assert baseline_policy.calls == 8 and all(record["reward"] == 1.0 for record in baseline.values())
    records, policy, journal = kill_then_resume(tmp_path, smol_template, script, env, kill_at=5)  # 4 calls made, the 5th killed
    assert {index: comparable(record) for index, record in records.items()} == {i: comparable(r) for i, r in baseline.items()}
    for record in records.values():
        assert_token_invariants(record)
    # a rollout with a committed turn resumed (attempt 2); one whose first call was in flight ran once (under load one
    # rollout may make all 4 calls before the other's setup ends)
    resumed = [record["metrics"] for record in records.values() if "attempts" in record["metrics"]]
    assert resumed and all(metrics["attempts"] == 2 for metrics in resumed)
    committed = sum(metrics["resumed_from_turn"] for metrics in resumed)
    assert committed >= 2  # of the 4 calls made, at most one per rollout was in flight (not committed)
    assert policy.calls == 8 - committed  # no committed turn was generated again
    # each committed turn but the answer (the 4th) made one tool call: a snapshot restores their effect, a replay
    # runs them again
    committed_calls = sum(min(metrics["resumed_from_turn"], 3) for metrics in resumed)
    assert len(executed) == (6 if env == ReplayCounter.name else 6 - committed_calls)
    assert not (tmp_path / "journal").exists()  # every record written: the journal is gone


def test_a_replay_that_differs_restarts_the_episode_and_the_record_says_why(tmp_path, smol_template, script):
    rows = tasks(ReplayCounter.name, 1)
    fingerprint = RunFingerprint.of_run(model="scripted", tasks=rows, settings={})
    journal = RunJournal.prepare(tmp_path / "journal", fingerprint, resume=False)
    config = EngineConfig()
    with pytest.raises(Killed):
        run(Engine(TurnPolicy(smol_template, script, kill_at=3), smol_template, config), rows, journal)
    drift["value"] = 1  # the tool now answers differently: replay cannot be trusted
    try:
        resumed = RunJournal.prepare(tmp_path / "journal", fingerprint, resume=True)
        policy = TurnPolicy(smol_template, script)
        record = run(Engine(policy, smol_template, config), rows, resumed)[0]
    finally:
        drift["value"] = 0
    assert record["reward"] == 1.0 and record["failure_kind"] is None
    assert record["metrics"]["attempts"] == 2 and record["metrics"]["resumed_from_turn"] == 0
    assert "replayed tool call 'add' of turn 1 returned another output" in record["metrics"]["resume_restarted"]
    assert policy.calls == 4  # all four turns generated again


def test_the_deadline_is_charged_with_the_time_earlier_attempts_used(tmp_path, smol_template, script):
    config = EngineConfig(deadline_s=1.5)
    SnapshotCounter.slow_s = 0.3
    try:
        # the killed attempt spends 0.6 s in its first model call and 0.3 s in its tool: 0.9 s committed before call 2;
        # resumed, turns 2 and 3 take 0.3 s of tools each: 0.9 + 0.6 > 1.5 (uninterrupted, the same policy takes 0.9 s)
        records, policy, _ = kill_then_resume(tmp_path, smol_template, script, SnapshotCounter.name, kill_at=2,
                                              config=config, first_delay_s=0.6, count=1)
    finally:
        SnapshotCounter.slow_s = 0.0
    assert records[0]["failure_kind"] == "timeout", records[0]["failure_reason"]
    assert records[0]["metrics"]["resumed_from_turn"] == 1


def test_a_restart_environment_journals_nothing(tmp_path, smol_template, script):
    records, policy, journal = kill_then_resume(tmp_path, smol_template, script, RestartCounter.name, kill_at=5)
    assert journal.commits == 0
    assert all(record["reward"] == 1.0 and "attempts" not in record["metrics"] for record in records.values())
    assert policy.calls == 8  # both episodes from turn 0


def test_max_turns_and_the_token_budget_carry_over_and_verify_runs_once(tmp_path, smol_template, script):
    # max_turns=3: the uninterrupted episode stops after its third call; killed at that call, the resumed one must too
    config = EngineConfig(limits=Limits(max_turns=3))
    verified.clear()
    baseline = run(Engine(TurnPolicy(smol_template, script), smol_template, config), tasks(SnapshotCounter.name, 1))[0]
    assert baseline["metrics"]["finish_reason"] == "max_turns" and verified == [0]
    verified.clear()
    records, policy, _ = kill_then_resume(tmp_path, smol_template, script, SnapshotCounter.name, kill_at=3, count=1, config=config)
    assert comparable(records[0]) == comparable(baseline) and policy.calls == 1 and verified == [0]
    # a token budget the first two turns nearly use up: the resumed third call gets only what is left
    spent = len(baseline["tokens"]["completion_ids"])
    tight = EngineConfig(limits=Limits(max_turns=8, max_completion_tokens=spent - 2))
    capped = run(Engine(TurnPolicy(smol_template, script), smol_template, tight), tasks(SnapshotCounter.name, 1))[0]
    records, _, _ = kill_then_resume(tmp_path / "tight", smol_template, script, SnapshotCounter.name, kill_at=3, count=1, config=tight)
    assert comparable(records[0]) == comparable(capped) and capped["metrics"]["finish_reason"] in ("length", "budget")


class ChatScript:
    """A chat policy (hosted APIs: messages in, text out) answering by how many assistant messages it was sent."""

    def __init__(self, texts: list[str], kill_at: int | None = None) -> None:
        self.texts, self.kill_at, self.calls = texts, kill_at, 0

    async def chat(self, request):
        from gym_bridge.core.turn import ToolCall, Turn

        self.calls += 1
        if self.calls == self.kill_at:
            raise Killed()
        turn = sum(1 for message in request.messages if message["role"] == "assistant")
        text = self.texts[min(turn, len(self.texts) - 1)]
        if text.startswith("add "):
            return Turn(text="", calls=(ToolCall(name="add", arguments=f'{{"n": {text[4:]}}}'),), usage={"input_tokens": 3})
        return Turn(text=text, usage={"input_tokens": 3, "output_tokens": 2})


def test_a_chat_policy_rollout_resumes_from_its_messages(tmp_path):
    from gym_bridge.core.journal import RunFingerprint

    texts = ["add 3", "add 4", "add 5", "the total is 12"]
    rows = tasks(SnapshotCounter.name, 1)
    baseline = run(Engine(ChatScript(texts), None, EngineConfig()), rows)[0]
    fingerprint = RunFingerprint.of_run(model="chat", tasks=rows, settings={})
    journal = RunJournal.prepare(tmp_path / "journal", fingerprint, resume=False)
    with pytest.raises(Killed):
        run(Engine(ChatScript(texts, kill_at=3), None, EngineConfig()), rows, journal)
    policy = ChatScript(texts)
    record = run(Engine(policy, None, EngineConfig()), rows, RunJournal.prepare(tmp_path / "journal", fingerprint, resume=True))[0]
    assert baseline["reward"] == 1.0 and comparable(record) == comparable(baseline)
    assert record["metrics"]["resumed_from_turn"] == 2 and policy.calls == 2


def test_a_resume_kind_is_checked_when_the_environment_class_is_made():
    with pytest.raises(TypeError, match="resume must be one of"):
        type("Typo", (Environment,), {"resume": "snapshots"})
    with pytest.raises(TypeError, match="does not define both snapshot\\(\\) and restore\\(\\)"):
        type("NoHooks", (Environment,), {"resume": "snapshot", "snapshot": lambda self: {}})


def test_a_restore_that_fails_restarts_the_episode_from_turn_0(tmp_path, smol_template, script):
    drift["value"] = 1
    try:
        records, policy, _ = kill_then_resume(tmp_path, smol_template, script, SnapshotCounter.name, kill_at=3, count=1)
    finally:
        drift["value"] = 0
    record = records[0]
    assert record["reward"] == 1.0 and record["metrics"]["resumed_from_turn"] == 0 and policy.calls == 4
    assert record["metrics"]["resume_restarted"].startswith("restore() failed:")
    assert "the saved state no longer loads" in record["metrics"]["resume_restarted"]


def test_the_journal_is_given_at_construction_and_only_a_rollout_with_a_key_commits(tmp_path, smol_template, script):
    import asyncio

    from gym_bridge.core.journal import RolloutKey, open_journal

    rows = tasks(ReplayCounter.name, 2)
    journal = open_journal(tmp_path / "journal", RunFingerprint.of_run(model="scripted", tasks=rows, settings={}), mode="fresh")
    plain = Engine(TurnPolicy(smol_template, script), smol_template, EngineConfig())
    journaled = plain.with_journal(journal)
    assert plain.journal is None and journaled.journal is journal and journaled.policy is plain.policy

    async def both() -> None:
        await journaled.rollout(rows[0], 0)  # no key: not journaled (serve's rows without a rollout id)
        assert journal.commits == 0
        await journaled.rollout(rows[1], 0, key=RolloutKey.of_task(1, 0))
        assert journal.commits == 3  # one commit before each of model calls 2, 3 and 4
        journal.finish(RolloutKey.of_task(1, 0))
        await journal.close()

    asyncio.run(both())
    assert not (tmp_path / "journal").exists()
