"""gym_bridge.verl under verl 0.9.1's async trainers, on the CPU (issue 30, item 4).

Real verl classes: V1's `AgentLoopWorkerTQ` (what `trainer_mode: colocate_async` and `separate_async` run)
and the legacy `AgentLoopWorker` (what fully async's `FullyAsyncAgentLoopManager` runs), each generating
through verl's real `FullyAsyncLLMServerClient` (what both modes hand the agent loop), built from verl's own
configs (`ppo_trainer`; fully async's `fully_async_ppo_trainer`, `async_training.partial_rollout: true`);
verl's own readers of `min_global_steps` / `max_global_steps`: `PPOTrainer._compute_metrics` (V1) and
`assemble_batch_from_rollout_samples` (fully async). Stand-ins (`verl_stand_in.py`): the vLLM server, whose
trainer pause aborts a call mid-generation and parks requests until the next weights are in, and, for V1,
TransferQueue's puts (recorded) and its `kv_batch_get` (the recorded fields). Not run: Ray, vLLM, the trainers'
`fit` loops and their weight sync (they need GPUs); the pause is the server's own schedule, not a trainer's.
"""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import pytest

pytest.importorskip("verl.experimental.agent_loop", reason="needs the verl extra: pip install 'gym-bridge[verl]'")
tq = pytest.importorskip("transfer_queue", reason="verl 0.9.1's V1 trainer needs transferqueue: pip install 'gym-bridge[verl]'")

from gym_bridge.verl._data import AGENT_LOOP_CONFIG, write_verl_parquet  # noqa: E402
from gym_bridge.core.environment import Environment  # noqa: E402
from gym_bridge.core.registry import get_environment, register  # noqa: E402
from tests.verl.test_v1_agent_loop import RecordedQueue, generate, script, v1_batch  # noqa: E402
from tests.support.verl_stand_in import ScriptedFullyAsyncClient, ScriptedVerlServer, verl_config  # noqa: E402

ABORT_AFTER = 3
"""Tokens the weather rollout's first call has sampled when the trainer pauses generation."""


@register
class ResetFails(Environment):
    """An environment whose reset raises: its rollouts fail before their first model call."""

    name = "reset_fails_for_verl_async_test"

    def setup(self, task):
        raise RuntimeError("the environment could not reset")

    def verify(self, task, output):
        return 1.0


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer):
    return smol_tokenizer


def data(folder, *envs: str):
    """Row 0 of each environment's example data (a one-line row for `reset_fails`), via `gym-bridge data to-verl`."""
    paths = []
    for env in envs:
        path = folder / f"{env}.jsonl"
        if env == "reset_fails":
            row = {"agent_ref": {"name": ResetFails.name}, "responses_create_params": {"input": [{"role": "user", "content": "Hi"}]}}
            path.write_text(json.dumps(row) + "\n")
        else:
            path.write_text(get_environment(env).example_data.read_text().splitlines()[0] + "\n")
        paths.append(path)
    return write_verl_parquet(paths, folder / "train.parquet").output


def loop_yaml(folder, **options) -> str:
    """The shipped agent-loop YAML with some options changed."""
    text = AGENT_LOOP_CONFIG.read_text()
    for key, value in options.items():
        lines = [line for line in text.splitlines() if line.strip().startswith(f"{key}:")]
        assert len(lines) == 1, key
        text = text.replace(lines[0], f"  {key}: {value}")
    path = folder / "agent_loop.yaml"
    path.write_text(text)
    return str(path)


def config_for(yaml_path: str, *, fully_async: bool = False, n: int = 1):
    from gym_bridge.policies.embedded import embedded_model_path

    overrides = {"actor_rollout_ref.rollout.n": n}
    if fully_async:
        import verl

        folder = os.path.join(os.path.dirname(verl.__file__), "experimental", "fully_async_policy", "config")
        return verl_config(str(embedded_model_path()), yaml_path, config_dir=folder, config_name="fully_async_ppo_trainer", **overrides)
    return verl_config(str(embedded_model_path()), yaml_path, **overrides)


def colocate_async_worker(config, server):
    """V1's `AgentLoopWorkerTQ` with the client `PPOTrainerColocateAsync.get_llm_client` gives it."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    return AgentLoopWorkerTQ.__ray_metadata__.modified_class(config, ScriptedFullyAsyncClient(config, server))


def records(folder) -> list[dict]:
    [path] = list((folder / "records").iterdir())
    return [json.loads(line) for line in path.read_text().splitlines()]


def model_calls(record: dict) -> list[dict]:
    return [item for item in record["response"]["output"] if "generation_token_ids" in item]


@pytest.fixture
def fresh_versions(monkeypatch):
    """No weights version reported to this process yet (an earlier test's server reported its own)."""
    from gym_bridge.verl import _agent_loop as adapter

    monkeypatch.setattr(adapter._reported, "latest", None)


def v1_metrics_reach_padding(monkeypatch, config, queue: RecordedQueue, keys: list[str], global_steps: int) -> None:
    """Run verl's `PPOTrainer._compute_metrics` over the samples V1's worker put, up to where it pads the
    fetched fields (past its `np.array([tag["min_global_steps"] ...], dtype=int)` lines); TransferQueue's
    `kv_batch_get` is stood in for by the recorded fields."""
    import torch
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import trainer_base

    class Padded(Exception):
        """`_compute_metrics` got past the lines that read the tags."""

    class Fetched(dict):
        def to_padded_tensor(self):
            raise Padded

    def fetch(*, keys, partition_id, fields, **_):
        def jagged(name):
            return torch.nested.as_nested_tensor([queue.fields[key][name] for key in keys], layout=torch.jagged)

        return Fetched(num_turns=torch.tensor([int(queue.fields[key]["num_turns"]) for key in keys]),
                       prompts=jagged("prompts"), responses=jagged("responses"))

    monkeypatch.setattr(trainer_base, "get_metric_data_with_optional_routed_experts", fetch)
    batch = KVBatchMeta(keys=keys, tags=[queue.tags[key][-1] for key in keys], partition_id="train")
    trainer = SimpleNamespace(config=config, _rollout_moe_lb_metrics_accumulator=None)
    with pytest.raises(Padded):
        trainer_base.PPOTrainer._compute_metrics(trainer, batch, {}, {}, global_steps=global_steps, epoch=0)


def test_a_rollout_failed_before_its_first_call_has_integer_versions_for_v1(monkeypatch, tmp_path, tokenizer, fresh_versions):
    """(a) V1 copies `extra_fields["min_global_steps"/"max_global_steps"]` into each sample's tag
    (agent_loop_tq.py, `_agent_loop_postprocess`) and `_compute_metrics` casts them with dtype=int
    (trainer_base.py): a reset error before any `generate` must still give integers there."""
    queue = RecordedQueue()
    queue.install(monkeypatch)
    config = config_for(loop_yaml(tmp_path), n=2)
    server = ScriptedVerlServer(tokenizer, script(tokenizer), global_steps=5)  # weights after 5 steps, serving step 6
    batch = v1_batch(data(tmp_path, "math", "reset_fails"), config, tokenizer, global_steps=6)
    asyncio.run(generate(colocate_async_worker(config, server), batch))
    math_uid, failing_uid = list(batch["uid"])
    keys = [f"{uid}_{session}_0" for uid in (math_uid, failing_uid) for session in range(2)]
    v1_metrics_reach_padding(monkeypatch, config, queue, keys, global_steps=6)  # a None there: TypeError from np.array
    for key in keys:
        extra, tag = queue.fields[key]["extra_fields"], queue.tags[key][-1]
        assert (tag["min_global_steps"], tag["max_global_steps"]) == (5, 5) and type(tag["min_global_steps"]) is int
        assert extra["gym_bridge_failure_kind"] == (None if key.startswith(math_uid) else "env")
    assert len(server.calls) == 2  # the failed rollouts made no call: their 5 is the weights in service (step 6 - 1)


def test_colocate_async_a_parked_aborted_call_is_resumed_token_exact_and_not_a_timeout(monkeypatch, tmp_path, tokenizer):
    """(b) and (c) under `colocate_async` (V1 worker, `FullyAsyncLLMServerClient`): the trainer pauses generation
    3 tokens into the rollout's first call and keeps the server's gate closed for 2 s (a train step and a weight
    update), longer than the rollout's 1 s deadline. verl's client re-sends prompt + those 3 tokens (after its own
    1 s wait, parked at the gate); the call's time is not the rollout's: it is scored, and its record is
    token-exact with each call's policy version."""
    queue = RecordedQueue()
    queue.install(monkeypatch)
    config = config_for(loop_yaml(tmp_path, deadline_s=1.0, records_path=tmp_path / "records" / "train.jsonl"))
    server = ScriptedVerlServer(tokenizer, script(tokenizer), global_steps=5, abort_at={0: ABORT_AFTER}, pause_s=2.0)
    batch = v1_batch(data(tmp_path, "weather"), config, tokenizer, global_steps=6)
    asyncio.run(generate(colocate_async_worker(config, server), batch))

    [uid] = list(batch["uid"])
    field, tag = queue.fields[f"{uid}_0_0"], queue.tags[f"{uid}_0_0"][-1]
    assert field["extra_fields"]["gym_bridge_failure_kind"] is None, field["extra_fields"]["gym_bridge_failure_reason"]
    assert field["rm_scores"].sum() == 1.0 and server.parked == 1
    assert (tag["min_global_steps"], tag["max_global_steps"]) == (5, 6)  # the rollout spans the weight update
    assert_resumed_token_exact(server, records(tmp_path), field, tokenizer)


def assert_resumed_token_exact(server, rollout_records, field, tokenizer):
    """The server saw the first call aborted after 3 tokens and its resume (prompt + those tokens); the record
    has the first call whole (ids and log-probs of both pieces, in order), the training row's mask is 1 on
    exactly the sampled tokens, and each call carries the oldest weights version its tokens came from."""
    weather = script(tokenizer)
    first, second = weather("weather in Seattle"), weather("weather in Seattle <|im_start|>tool")
    aborted, resumed, answer = server.calls
    assert (aborted.stop_reason, aborted.global_steps, aborted.token_ids) == ("aborted", 5, first.token_ids[:ABORT_AFTER])
    assert resumed.prompt_ids == aborted.prompt_ids + aborted.token_ids and resumed.global_steps == 6
    assert resumed.sampling_params["max_tokens"] == aborted.sampling_params["max_tokens"] - ABORT_AFTER  # verl's budget bookkeeping
    assert aborted.token_ids + resumed.token_ids == first.token_ids

    [record] = rollout_records
    assert record["reward"] == 1.0 and record["failure_kind"] is None
    calls = model_calls(record)
    assert [c["generation_token_ids"] for c in calls] == [first.token_ids, second.token_ids]
    assert [c["generation_log_probs"] for c in calls] == [aborted.log_probs + resumed.log_probs, answer.log_probs]
    assert [c["prompt_token_ids"] for c in calls] == [aborted.prompt_ids, answer.prompt_ids]
    assert [c["policy_version"] for c in calls] == [5, 6]
    assert (record["metrics"]["policy_version_min"], record["metrics"]["policy_version_max"]) == (5, 6)
    assert record["metrics"]["train_step"] == 5

    prompt, response, mask = field["prompts"].tolist(), field["responses"].tolist(), field["response_mask"].tolist()
    logprobs = field["rollout_log_probs"].tolist()
    assert prompt == aborted.prompt_ids and response[: len(first.token_ids)] == first.token_ids
    env_tokens = len(answer.prompt_ids) - len(prompt) - len(first.token_ids)
    assert mask == [1] * len(first.token_ids) + [0] * env_tokens + [1] * len(second.token_ids)
    assert response[len(first.token_ids) + env_tokens:] == second.token_ids
    expected = aborted.log_probs + resumed.log_probs + [0.0] * env_tokens + answer.log_probs
    assert logprobs == pytest.approx(expected)


def test_fully_async_resumes_a_partial_rollout_and_counts_a_failed_reset(tmp_path, tokenizer, fresh_versions):
    """(a), (b) and (c) under fully async (`FullyAsyncAgentLoopManager`'s legacy `AgentLoopWorker`,
    `FullyAsyncLLMServerClient`, fully async's own config with `partial_rollout: true`): the aborted weather
    rollout is resumed token-exact, and verl's `assemble_batch_from_rollout_samples` reads every sample's
    `min_global_steps` / `max_global_steps` (it subtracts them) and counts the weather rollout as partial."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample, assemble_batch_from_rollout_samples

    from tests.verl.test_agent_loop import batch_of

    config = config_for(loop_yaml(tmp_path, deadline_s=1.0, records_path=tmp_path / "records" / "train.jsonl"), fully_async=True)
    assert config.async_training.partial_rollout is True
    server = ScriptedVerlServer(tokenizer, script(tokenizer), global_steps=5, abort_at={0: ABORT_AFTER}, pause_s=2.0)
    worker = AgentLoopWorker(config, ScriptedFullyAsyncClient(config, server))
    output = asyncio.run(worker.generate_sequences(batch_of(data(tmp_path, "weather", "reset_fails"), config, tokenizer)))

    extra = output.non_tensor_batch
    assert list(extra["gym_bridge_failure_kind"]) == [None, "env"] and list(extra["gym_bridge_masked"]) == [False, True]
    # the failed reset came before any version was reported to this process, and the legacy worker passes no
    # dispatch step: the initial weights' 0 (only verl's metrics read it; the sample has no tokens)
    assert list(extra["min_global_steps"]) == [5, 0] and list(extra["max_global_steps"]) == [6, 0]
    row = {name: output.batch[name][0] for name in ("prompts", "responses", "response_mask", "rollout_log_probs", "attention_mask")}
    weather_records = [r for r in records(tmp_path) if r["env"] == "weather"]
    assert_resumed_token_exact(server, weather_records, unpadded(row, tokenizer), tokenizer)

    batch = assemble_batch_from_rollout_samples([RolloutSample(full_batch=output, sample_id="s0", epoch=0, rollout_status={})],
                                                tokenizer, config)
    assert batch.meta_info["fully_async/partial/total_partial_num"] == 1 and batch.meta_info["fully_async/partial/max_partial_span"] == 1
    assert list(batch.meta_info["trajectory_param_versions"]) == [6, 0]


def unpadded(row: dict, tokenizer) -> dict:
    """One sample of the legacy worker's padded batch without its padding (prompts left-padded, responses right)."""
    import torch

    prompt_length = row["prompts"].size(0)
    attention = row["attention_mask"]
    prompt_keep, response_keep = attention[:prompt_length].bool(), attention[prompt_length:].bool()
    return {"prompts": row["prompts"][prompt_keep], "responses": row["responses"][response_keep],
            "response_mask": row["response_mask"][response_keep],
            "rollout_log_probs": torch.as_tensor(row["rollout_log_probs"])[response_keep]}


def test_without_log_probs_the_fully_async_client_is_understood(monkeypatch, tmp_path, tokenizer):
    """`calculate_log_probs: false`: verl's `FullyAsyncLLMServerClient` answers `log_probs=[]` (its plain client
    None) with the ids; that is no log-probs, not a mismatch (it was an `infra` failure of every sample)."""
    from gym_bridge.policies.embedded import embedded_model_path

    queue = RecordedQueue()
    queue.install(monkeypatch)
    config = verl_config(str(embedded_model_path()), loop_yaml(tmp_path), **{"actor_rollout_ref.rollout.n": 1,
                                                                             "actor_rollout_ref.rollout.calculate_log_probs": False})
    server = ScriptedVerlServer(tokenizer, script(tokenizer))
    batch = v1_batch(data(tmp_path, "math"), config, tokenizer, global_steps=1)
    asyncio.run(generate(colocate_async_worker(config, server), batch))
    [uid] = list(batch["uid"])
    field = queue.fields[f"{uid}_0_0"]
    assert field["extra_fields"]["gym_bridge_failure_kind"] is None and field["rm_scores"].sum() == 1.0
    assert server.calls[0].log_probs is None and "rollout_log_probs" not in field.keys()


def test_the_version_of_a_rollout_that_reported_none(fresh_versions):
    """Which integer a sample without a reported version gets: the newest version reported to this process,
    else V1's dispatch step - 1, else 0; a rollout that reported versions keeps its own."""
    from gym_bridge.verl._agent_loop import VerlServerPolicy, trajectory_steps

    def policy() -> VerlServerPolicy:
        return VerlServerPolicy(None, {}, eos_token_ids=[0], prompt_length=8)

    failed = policy()
    assert trajectory_steps(failed) == {"min_global_steps": 0, "max_global_steps": 0}
    assert trajectory_steps(failed, dispatch_step=7) == {"min_global_steps": 6, "max_global_steps": 6}
    resumed = policy()
    assert resumed._observe_versions({"global_steps": 5, "min_global_steps": 4, "max_global_steps": 5}) == 4  # the call's version
    assert trajectory_steps(resumed, dispatch_step=7) == {"min_global_steps": 4, "max_global_steps": 5}
    assert trajectory_steps(failed, dispatch_step=7) == {"min_global_steps": 5, "max_global_steps": 5}
