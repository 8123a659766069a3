"""gym_bridge's async rollout worker for TRL's AsyncGRPOTrainer, against a vLLM stand-in over real HTTP on loopback:
rows and advantages, failures left out but counted, mixed environments, policy versions through a weight sync
mid-episode (pause "keep" / resume), staleness by admission, and TRL's own queue dataset taking the rows."""

from __future__ import annotations

import json
import queue
import time
from collections import defaultdict

import httpx
import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.trl._async.settings import AsyncWorkerSettings  # noqa: E402
from gym_bridge.trl._async.worker import AsyncRolloutWorker  # noqa: E402
from gym_bridge.trl._async.rows import group_advantages  # noqa: E402
from gym_bridge.core.agent_loop import Limits  # noqa: E402
from gym_bridge.core.policy import SamplingParams  # noqa: E402
from gym_bridge.core.registry import register  # noqa: E402
from gym_bridge.core.task import load_tasks, parse_task  # noqa: E402
from gym_bridge.policies.remote import RemotePolicy  # noqa: E402
from tests.support.vllm_async_stand_in import AsyncVLLMStandIn  # noqa: E402
from tests.support.failing_env import RaisesOneInEight  # noqa: E402
from tests.support.http_server import app_in_thread  # noqa: E402

register(RaisesOneInEight)
ROOT = __import__("pathlib").Path(__file__).parents[2]


def mixed_tasks():
    arithmetic = load_tasks(ROOT / "environments/arithmetic/data/example.jsonl", limit=1)[0]
    weather = load_tasks(ROOT / "environments/weather/data/example.jsonl", limit=1)[0]
    flaky = parse_task({"prompt": "What is 2 + 3?", "environment": RaisesOneInEight.name}, index=2)
    return [arithmetic, parse_task(weather.row, index=1), flaky]


def make_worker(url, template, *, group_size=4, max_staleness=2, rows_per_version=8, records_path=None, tasks=None,
                row_version="last_call"):
    settings = AsyncWorkerSettings(group_size=group_size, max_staleness=max_staleness, rows_per_version=rows_per_version,
                                   sampling=SamplingParams(max_new_tokens=64), limits=Limits(max_turns=3, max_completion_tokens=512),
                                   records_path=records_path, row_version=row_version)
    return AsyncRolloutWorker(tasks or mixed_tasks(), RemotePolicy(url + "/v1", model="stub"), template, settings)


def drain_metrics(worker):
    totals = defaultdict(float)
    while True:
        try:
            for key, value in worker.metrics_queue.get_nowait().items():
                totals[key] += value if isinstance(value, float) else value[0]
        except queue.Empty:
            return totals


def take(worker, count, timeout_s=60):
    samples, deadline = [], time.monotonic() + timeout_s
    while len(samples) < count:
        assert time.monotonic() < deadline, f"only {len(samples)} rows in {timeout_s} s"
        worker.check_health(30)
        try:
            samples.append(worker.rollout_buffer.get(timeout=0.5))
        except queue.Empty:
            pass
    return samples


def test_group_advantages_leave_failed_rollouts_out(smol_template):
    from types import SimpleNamespace as R

    records = [R(reward=1.0, mask_sample=False), R(reward=0.0, mask_sample=True), R(reward=0.0, mask_sample=False)]
    group = group_advantages(records)  # scored rewards [1, 0]: mean 0.5, population std 0.5
    assert set(group.by_position) == {0, 2} and (group.mean, group.std) == (0.5, 0.5)
    assert group.by_position[0] == pytest.approx(1.0) and group.by_position[2] == pytest.approx(-1.0)
    assert group_advantages([R(reward=0.0, mask_sample=True)]).by_position == {}


def test_group_advantages_stay_finite_for_huge_finite_rewards():
    """Issue 36: 1e308 beside 0 overflowed the group's sum to inf and pushed NaN advantages to the trainer."""
    import math
    from types import SimpleNamespace as R

    huge = group_advantages([R(reward=1e308, mask_sample=False), R(reward=0.0, mask_sample=False)] * 2)
    # scaled by 1e308: [1, 0, 1, 0], mean 0.5, std 0.5 -> advantages +1, -1, as for rewards [1, 0]
    assert [round(a, 6) for a in huge.by_position.values()] == [1.0, -1.0, 1.0, -1.0]
    assert huge.mean == pytest.approx(0.5e308) and huge.std == pytest.approx(0.5e308)
    opposite = group_advantages([R(reward=1.7e308, mask_sample=False), R(reward=-1.7e308, mask_sample=False)])
    assert all(math.isfinite(a) for a in opposite.by_position.values()) and opposite.by_position[0] == pytest.approx(1.0)
    tiny = group_advantages([R(reward=1e-300, mask_sample=False), R(reward=2e-300, mask_sample=False)])
    # (r - mean) / (std + 1e-8) with std 5e-301: about -5e-293 and +5e-293, as TRL's formula gives; the scaling keeps 1e-8
    assert tiny.by_position == {0: pytest.approx(-5e-293, rel=1e-6), 1: pytest.approx(5e-293, rel=1e-6)}
    assert abs(group_advantages([R(reward=1.0, mask_sample=False), R(reward=1.0 + 1e-12, mask_sample=False)]).by_position[0]) < 1e-3


def test_for_trainer_checks_the_servers_ids_against_the_trainers_tokenizer(smol_tokenizer):
    """The worker's vLLM-server policy knows the tokenizer's size, so an out-of-vocabulary id fails its rollout
    as `infra` (see tests/scale/test_replica_answers.py) instead of reaching the trainer."""
    from types import SimpleNamespace

    args = SimpleNamespace(num_generations=4, max_staleness=2, per_device_train_batch_size=4, token_budget=0, gradient_accumulation_steps=1,
                           weight_sync_steps=1, max_completion_length=64, temperature=1.0, top_p=1.0, top_k=0,
                           vllm_server_base_url="http://127.0.0.1:9", request_timeout=30)
    worker = AsyncRolloutWorker.for_trainer(args, tasks=mixed_tasks(), tokenizer=smol_tokenizer, served_model="m")
    policy = worker.policy.policy  # under the VersionedPolicy that stamps versions
    assert isinstance(policy, RemotePolicy) and policy.vocab_size == len(smol_tokenizer) == 49152


def test_rows_rewards_failures_and_records(smol_template, smol_tokenizer, tmp_path):
    stand_in = AsyncVLLMStandIn(smol_tokenizer)
    records_path = tmp_path / "records.jsonl"
    RaisesOneInEight.setups = 0
    with app_in_thread(stand_in.app) as url:
        # (max_staleness + 1) * rows_per_version = 24 rows: six groups of 4 (two per environment) before the trainer
        # would have to move on; the flaky environment's 8 setups raise once, so 23 rows come
        worker = make_worker(url, smol_template, records_path=str(records_path), max_staleness=2, rows_per_version=8)
        worker.update_model_version(1)  # TRL's first sync happens before start()
        worker.start()
        try:
            samples = take(worker, 23)
            worker.check_health(30)  # a raising environment did not stop anything
        finally:
            worker.stop()
    by_group = defaultdict(list)
    for sample in samples:
        by_group[sample.group_id].append(sample)
        assert sample.input_ids.dtype.name == "int64" and sample.old_log_probs.dtype.name == "float32"
        trained = sample.completion_mask.astype(bool)
        assert trained.any() and (sample.old_log_probs[~trained] == 0).all()
        assert (sample.old_log_probs[trained] == pytest.approx(-0.2))  # every token sampled under version 1
        assert sample.model_version == 1
    for group_id, group in by_group.items():
        if len(group) == 4:  # a complete, failure-free group: advantages sum to zero
            assert sum(sample.advantage for sample in group) == pytest.approx(0.0, abs=1e-6)
    weather = [s for s in samples if s.group_id % 3 == 1]
    assert weather and all(s.metrics["rewards/weather"] == 1.0 for s in weather)
    arithmetic = [s for s in samples if s.group_id % 3 == 0]
    assert {s.metrics["reward"] for s in arithmetic} == {1.0, 0.1}  # right and off-by-one answers
    for group_id in {s.group_id for s in arithmetic}:  # right answers above the group's mean, wrong ones below
        for s in by_group[group_id]:
            assert (s.advantage > 0) == (s.metrics["reward"] == 1.0) or s.metrics["reward_std"] == 0
    assert sorted(by_group) == [0, 1, 2, 3, 4, 5]
    assert worker.counts["failed/env"] == 1 and worker.counts["failed"] == 1 and worker.counts["forced_admissions"] == 0
    totals = drain_metrics(worker)
    assert totals["gym_bridge/failures/env_total"] == worker.counts["failed/env"]
    assert totals["gym_bridge/staleness_max"] == 0  # consumed at version 1, sampled at version 1
    rows = [json.loads(line) for line in records_path.read_text().splitlines()]
    failed = [row for row in rows if row["failure_kind"]]
    assert failed and all("sandbox went away" in row["failure_reason"] for row in failed)
    consumed = [row for row in rows if not row["failure_kind"]]
    assert consumed and all(row["metrics"]["consumed_version"] == 1 and row["metrics"]["policy_version_min"] == 1 for row in consumed)
    # the rows are the records' token streams, untouched: prompt + completion, trained exactly where the model sampled
    first = next(s for s in samples if s.group_id == 1)
    call_items = [item for row in consumed if row["env"] == "weather" for item in row["response"]["output"] if "generation_token_ids" in item]
    assert len(call_items) >= 2 and all(item["policy_version"] == 1 for item in call_items)
    assert list(first.input_ids[: len(call_items[0]["prompt_token_ids"])]) == call_items[0]["prompt_token_ids"]


@pytest.mark.parametrize("row_version", ["last_call", "first_call"])
def test_weight_sync_mid_episode_keeps_the_rollout_token_exact(smol_template, smol_tokenizer, tmp_path, row_version):
    """TRL's sync: pause (keep) -> send weights -> resume -> update_model_version, while a call is half sampled.
    The row carries its last call's version (2: the call returned after the sync) or its first call's (1)."""
    stand_in = AsyncVLLMStandIn(smol_tokenizer, token_delay_s=0.02)
    weather = [parse_task(load_tasks(ROOT / "environments/weather/data/example.jsonl", limit=1)[0].row, index=0)]
    with app_in_thread(stand_in.app) as url:
        worker = make_worker(url, smol_template, group_size=1, max_staleness=0, rows_per_version=1, tasks=weather,
                             records_path=str(tmp_path / "r.jsonl"), row_version=row_version)  # one rollout at a time
        worker.update_model_version(1)
        worker.start()
        try:
            while stand_in.tokens_sent < 5:  # the first call is under way
                time.sleep(0.005)
            httpx.post(url + "/pause", params={"mode": "keep"}).raise_for_status()
            sent_at_pause = stand_in.tokens_sent
            time.sleep(0.1)
            assert stand_in.tokens_sent == sent_at_pause  # kept, not aborted, not running
            stand_in.version = 2  # the new weights
            httpx.post(url + "/resume").raise_for_status()
            worker.update_model_version(2)
            [sample] = take(worker, 1)
        finally:
            worker.stop()
    row = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    calls = [item for item in row["response"]["output"] if "generation_token_ids" in item]
    assert [item["policy_version"] for item in calls] == [1, 2]  # each call's oldest token
    assert (row["metrics"]["policy_version_min"], row["metrics"]["policy_version_max"]) == (1, 2)
    first = calls[0]["generation_log_probs"]
    assert first[:sent_at_pause] == [-0.2] * sent_at_pause and set(first[sent_at_pause:]) == {-0.3}
    # token-exact: every call's prompt is everything before it; the row is the record's stream
    tokens = row["tokens"]
    stream = tokens["prompt_ids"] + tokens["completion_ids"]
    for item in calls:
        start = len(item["prompt_token_ids"])
        assert stream[:start] == item["prompt_token_ids"]
        assert stream[start:start + len(item["generation_token_ids"])] == item["generation_token_ids"]
    assert list(sample.input_ids[: len(stream)]) == stream
    assert sample.model_version == {"last_call": 2, "first_call": 1}[row_version]
    assert sample.metrics["gym_bridge/row_version_span"] == {"last_call": 1.0, "first_call": 0.0}[row_version]
    assert row["metrics"]["consumed_version"] == 2


def test_admission_keeps_every_row_within_max_staleness_through_trls_dataset(smol_template, smol_tokenizer):
    """TRL's own RolloutQueueDataset takes the rows (it drops those older than max_staleness); a stand-in trainer
    bumps the version every 4 rows, as AsyncGRPOTrainer does every optimizer step of 4 rows. Nothing is dropped."""
    from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset

    stand_in = AsyncVLLMStandIn(smol_tokenizer, token_delay_s=0.002)
    tasks = mixed_tasks()[:2]
    metrics = defaultdict(list)
    with app_in_thread(stand_in.app) as url:
        worker = make_worker(url, smol_template, group_size=2, max_staleness=1, rows_per_version=4, tasks=tasks)
        worker.update_model_version(1)
        worker.start()
        version = {"now": 1}
        dataset = RolloutQueueDataset(worker.rollout_buffer, lambda: version["now"], worker.check_health, 60, metrics,
                                      max_staleness=1, poll_interval_s=0.5)
        try:
            for taken, _ in enumerate(dataset, start=1):
                if taken % 4 == 0:
                    stand_in.version = version["now"] = version["now"] + 1
                    worker.update_model_version(version["now"])
                if taken == 24:
                    break
        finally:
            worker.stop()
    assert "sample/dropped_stale_total" not in metrics
    assert max(metrics["sample/staleness_max"]) <= 1 and version["now"] == 7


def test_a_harness_rollout_with_rewritten_history_trains_every_segment(smol_template):
    """A harness that rewrote its history left two token segments: two rows, each with the rollout's advantage."""
    from gym_bridge.core.policy import ScriptedPolicy
    from gym_bridge.core.record import RolloutRecord
    from gym_bridge.core.trajectory import TokenView

    first = TokenView(prompt_ids=[1, 2], completion_ids=[3, 4, 5], completion_mask=[1, 0, 1], completion_logprobs=[-0.1, 0.0, -0.3])
    second = TokenView(prompt_ids=[1, 9], completion_ids=[6, 7], completion_mask=[1, 1], completion_logprobs=[-0.5, -0.6])
    flat = TokenView(prompt_ids=[1, 9], completion_ids=[6, 7], completion_mask=[1, 1], completion_logprobs=[-0.5, -0.6], segments=(first, second))
    task = mixed_tasks()[0]

    def record(reward, tokens, versions=(3, 4)):
        return RolloutRecord(task=task, repeat_index=0, env="arithmetic", output=[], tokens=tokens, reward=reward, reward_components={},
                             mask_sample=False, failure_kind=None, failure_reason=None, finish_reason="answer", turns=2, tool_calls=0,
                             latency_s=0.0, policy_versions=versions)

    plain = TokenView(prompt_ids=[1, 2], completion_ids=[8, 2], completion_mask=[1, 1], completion_logprobs=[-0.2, -0.2])
    settings = AsyncWorkerSettings(group_size=2, max_staleness=1, rows_per_version=4)
    worker = AsyncRolloutWorker([task], ScriptedPolicy({"": []}), smol_template, settings)
    samples = [row.sample for row in worker.rows.group(7, [record(1.0, flat), record(0.0, plain)], worker.env_classes[task.env_name]).rows]
    assert [list(sample.input_ids) for sample in samples] == [[1, 2, 3, 4, 5], [1, 9, 6, 7], [1, 2, 8, 2]]
    assert [list(sample.completion_mask) for sample in samples] == [[0, 0, 1, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1]]
    assert list(samples[0].old_log_probs) == pytest.approx([0.0, 0.0, -0.1, 0.0, -0.3])
    # rewards [1, 0]: mean 0.5, std 0.5, so advantages +1 (both segments of the harness rollout) and -1
    assert [sample.advantage for sample in samples] == pytest.approx([1.0, 1.0, -1.0])
    # no call went through the worker's clock (records built here): a row carries its last call's version, 4, and spans 1
    assert {sample.model_version for sample in samples} == {4} and {sample.group_id for sample in samples} == {7}
    assert {sample.metrics["gym_bridge/row_version_span"] for sample in samples} == {1.0}


def test_an_unknown_row_version_is_refused_naming_the_choices():
    from gym_bridge.core.errors import ConfigError

    with pytest.raises(ConfigError, match="row_version must be one of 'last_call', 'first_call', got 'oldest'"):
        AsyncWorkerSettings(group_size=2, max_staleness=1, rows_per_version=4, row_version="oldest")


def test_settings_that_could_never_admit_a_group_are_refused_and_a_dead_loop_is_reported(smol_template):
    from types import SimpleNamespace

    from gym_bridge.trl._trainer_args import rows_per_version
    from gym_bridge.core.policy import ScriptedPolicy

    # TRL's defaults with its token budget: one row per micro-batch is all the worker may count on
    trl_defaults = SimpleNamespace(per_device_train_batch_size=8, gradient_accumulation_steps=1, weight_sync_steps=1, token_budget=None)
    assert rows_per_version(trl_defaults) == 1 and rows_per_version(trl_defaults, num_processes=2) == 2
    assert rows_per_version(SimpleNamespace(**{**vars(trl_defaults), "token_budget": 0})) == 8
    with pytest.raises(ValueError, match="token_budget=0"):
        AsyncWorkerSettings(group_size=8, max_staleness=4, rows_per_version=1)
    worker = AsyncRolloutWorker(mixed_tasks()[:1], ScriptedPolicy({"": []}), smol_template,
                                AsyncWorkerSettings(group_size=2, max_staleness=1, rows_per_version=4))
    worker.check_health(1.0)  # not started: nothing to report
    worker.link.fail(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="rollout worker stopped: RuntimeError: boom"):
        worker.check_health(1.0)
