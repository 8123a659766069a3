"""gym_bridge.verl under verl 0.9.1's V1 trainer path (its default, `trainer.use_v1=true`), on the CPU.

V1's `AgentLoopWorkerTQ` (verl/trainer/ppo/v1/agent_loop_tq.py) runs as is, built from verl's own
config with the shipped YAML: it spawns `rollout.n` sessions per row (`session_id` 0..n-1, plus the
batch's `global_steps` and `uid` in every sample's columns), runs gym_bridge's agent loop for each
through verl's real `LLMServerClient` against the scripted server of `verl_stand_in.py`, and puts
each `AgentLoopOutput` into TransferQueue under `{uid}_{session_id}_0`. The fast tests record what
the worker puts (TransferQueue's own storage runs in Ray actors, which take most of a minute to
start here); `test_the_v1_worker_fills_a_real_transfer_queue` (slow) runs real Ray and TransferQueue.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl.experimental.agent_loop", reason="needs the verl extra: pip install 'gym-bridge[verl]'")
tq = pytest.importorskip("transfer_queue", reason="verl 0.9.1's V1 trainer needs transferqueue: pip install 'gym-bridge[verl]'")

from gym_bridge.verl._data import AGENT_LOOP_CONFIG, write_verl_parquet  # noqa: E402
from gym_bridge.core.policy import Generation  # noqa: E402
from gym_bridge.core.registry import get_environment  # noqa: E402
from tests.support.verl_stand_in import ScriptedServerClient, ScriptedVerlServer, verl_config  # noqa: E402

N = 2


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer):
    return smol_tokenizer


@pytest.fixture(scope="module")
def config():
    from gym_bridge.policies.embedded import embedded_model_path

    return verl_config(str(embedded_model_path()), str(AGENT_LOOP_CONFIG), **{"actor_rollout_ref.rollout.n": N})


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    """weather row 0 and math row 0 of the bundled example data, via `gym-bridge data to-verl`."""
    folder = tmp_path_factory.mktemp("verl_v1_data")
    paths = []
    for env in ("weather", "math"):
        path = folder / f"{env}.jsonl"
        path.write_text(get_environment(env).example_data.read_text().splitlines()[0] + "\n")
        paths.append(path)
    return write_verl_parquet(paths, folder / "train.parquet").output


def script(tokenizer):
    """The weather row calls its tool, then answers; the math row answers; every turn ends on EOS."""

    def turn(text: str, logprob: float) -> Generation:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[logprob] * len(ids), finish_reason="stop")

    weather = [turn('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seattle"}}\n</tool_call>', -0.1),
               turn("It is cold in Seattle.", -0.2)]

    def answer(prompt_text: str):
        if "weather in Seattle" in prompt_text:
            return weather[min(prompt_text.count("<|im_start|>tool"), 1)]
        if "What is 7 + 5?" in prompt_text:
            return turn("\\boxed{12}", -0.3)
        return RuntimeError(f"no script for {prompt_text[-200:]!r}")

    return answer


def v1_batch(data_file, config, tokenizer, *, global_steps: int):
    """The rows as V1's trainer submits them (`PPOTrainer._fetch_one_gen_batch` and `_next_train_batch`):
    dataset items, `collate_fn`, a `uid` per row, a TensorDict with `global_steps`."""
    import uuid

    import numpy as np
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import collate_fn

    from gym_bridge.verl._agent_loop import GymBridgeDataset

    dataset = GymBridgeDataset(str(data_file), tokenizer, config.data)
    batch_dict = collate_fn([dataset[i] for i in range(len(dataset))])
    batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch_dict["raw_prompt"]))], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    return batch


def v1_worker(config, server):
    """verl's `AgentLoopWorkerTQ` (a Ray actor class) built in this process, as Ray would build it."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    return AgentLoopWorkerTQ.__ray_metadata__.modified_class(config, ScriptedServerClient(config, server))


async def generate(worker, batch) -> None:
    """`AgentLoopWorkerTQ.generate_sequences` returns once the sessions are spawned; wait for them."""
    await worker.generate_sequences(batch)
    while worker.background_tasks:
        await asyncio.gather(*list(worker.background_tasks))


class RecordedQueue:
    """TransferQueue's put calls as the V1 worker makes them, kept in memory."""

    def __init__(self) -> None:
        self.fields: dict[str, dict] = {}
        self.tags: dict[str, list[dict]] = {}

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(tq, "init", lambda conf=None: None)
        monkeypatch.setattr(tq, "async_kv_put", self.kv_put)
        monkeypatch.setattr(tq, "async_kv_batch_put", self.kv_batch_put)

    async def kv_put(self, key, partition_id, fields=None, tag=None):
        self.tags.setdefault(key, []).append(tag)

    async def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            self.fields[key] = {name: fields[name][i] for name in fields.keys()}
            self.tags.setdefault(key, []).append(tags[i])


def test_the_v1_worker_runs_n_sessions_per_row_each_its_own_repeat(monkeypatch, config, data_file, tokenizer):
    from gym_bridge.verl._agent_loop import REWARD_EXTRA_KEYS, GymBridgeAgentLoop

    queue = RecordedQueue()
    queue.install(monkeypatch)
    seen: list[dict] = []
    run = GymBridgeAgentLoop.run

    async def recording_run(self, sampling_params, **kwargs):
        seen.append(kwargs)
        return await run(self, sampling_params, **kwargs)

    monkeypatch.setattr(GymBridgeAgentLoop, "run", recording_run)
    server = ScriptedVerlServer(tokenizer, script(tokenizer))
    worker = v1_worker(config, server)
    batch = v1_batch(data_file, config, tokenizer, global_steps=7)
    asyncio.run(generate(worker, batch))

    uids = list(batch["uid"])
    assert len(seen) == len(uids) * N
    for uid, env, reward in zip(uids, ("weather", "math"), (1.0, 1.0)):
        assert queue.tags[uid][-1] == {"status": "finished"}  # the group settled without an error
        for session in range(N):
            field = queue.fields[f"{uid}_{session}_0"]
            extra = field["extra_fields"]
            assert field["session_id"] == session and field["global_steps"] == 7 and field["uid"] == uid
            assert extra["gym_bridge_repeat_index"] == session  # not every sample as repeat 0
            assert extra["gym_bridge_masked"] is False and extra["gym_bridge_finish_reason"] == "answer"
            assert field["rm_scores"][-1] == reward == field["rm_scores"].sum()  # V1 puts the reward on the last token
            assert tuple(extra["reward_extra_info"]) == REWARD_EXTRA_KEYS
            assert extra["reward_extra_info"]["gym_bridge_env"] == env
            response, mask = field["responses"].tolist(), field["response_mask"].tolist()
            assert len(response) == len(mask) and sum(mask) > 0 and field["loss_mask"].tolist() == mask
            assert queue.tags[f"{uid}_{session}_0"][-1]["status"] == "success"
    # V1's own per-sample columns are not the task's: a row without `gym_bridge_row` keeps them out
    from gym_bridge.verl._data import task_from_columns

    columns = dict(seen[0])
    assert {"session_id", "global_steps", "uid"} <= set(columns)
    del columns["gym_bridge_row"]
    row = task_from_columns(columns, index=0, source="v1").row
    assert not {"session_id", "global_steps", "uid", "validate"} & set(row), sorted(row)
    assert row["messages"] == list(columns["raw_prompt"]) and "agent_ref" in row


def test_a_failed_session_is_a_masked_sample_in_the_queue(monkeypatch, config, data_file, tokenizer):
    queue = RecordedQueue()
    queue.install(monkeypatch)
    answer = script(tokenizer)
    server = ScriptedVerlServer(tokenizer, lambda text: RuntimeError("engine died") if "7 + 5" in text else answer(text))
    worker = v1_worker(config, server)
    batch = v1_batch(data_file, config, tokenizer, global_steps=1)
    asyncio.run(generate(worker, batch))
    math_uid = list(batch["uid"])[1]
    for session in range(N):
        field = queue.fields[f"{math_uid}_{session}_0"]
        assert field["extra_fields"]["gym_bridge_masked"] is True and field["extra_fields"]["gym_bridge_failure_kind"] == "infra"
        assert field["rm_scores"].abs().sum() == 0 and field["response_mask"].sum() == 0
    assert queue.tags[math_uid][-1] == {"status": "finished"}  # a masked sample, not a failed group


def test_a_generation_cut_by_verls_context_clamp_is_a_truncation_not_an_answer(config, data_file, tokenizer):
    """verl's server clamps `max_tokens` to `max_model_len - len(prompt)` and answers `completed` either
    way; without EOS the turn was cut: the rollout ends `length`, and no EOS is added after it."""
    from tests.verl.test_agent_loop import batch_of, build_loop, sampling

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    long_answer = tokenizer.encode("The sum of seven and five is twelve, so " * 8, add_special_tokens=False)
    server = ScriptedVerlServer(tokenizer, lambda text: Generation(token_ids=long_answer, logprobs=[-1.0] * len(long_answer),
                                                                   finish_reason="stop"))
    worker = AgentLoopWorker(config, ScriptedServerClient(config, server))
    legacy = batch_of(data_file, config, tokenizer)
    math = {key: values[1] for key, values in legacy.non_tensor_batch.items()}
    output = asyncio.run(build_loop(worker).run(sampling(config), **math))  # room enough: the whole answer, no EOS
    assert output.response_ids == long_answer and output.extra_fields["gym_bridge_finish_reason"] == "length"
    prompt_length = len(server.calls[0].prompt_ids)
    server.calls.clear()
    server.max_model_len = prompt_length + 10
    output = asyncio.run(build_loop(worker).run(sampling(config), **math))
    [call] = server.calls
    assert call.sampling_params["max_tokens"] == 10 < len(long_answer)  # clamped by the server, below the budget asked
    assert output.extra_fields["gym_bridge_finish_reason"] == "length"
    assert output.response_ids == long_answer[:10] and tokenizer.eos_token_id not in output.response_ids
    # a prompt with no room left at all is a masked context overflow, not an `infra` failure
    server.max_model_len = prompt_length
    output = asyncio.run(build_loop(worker).run(sampling(config), **math))
    assert output.extra_fields["gym_bridge_failure_kind"] == "context_overflow"


def test_max_concurrency_bounds_the_rollouts_of_a_worker(config, data_file, tokenizer):
    """The YAML's `max_concurrency` holds across the agent loops verl builds, one per sample."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, DictConfigWrap, ToolListWrap

    from gym_bridge.verl._agent_loop import GymBridgeAgentLoop
    from tests.verl.test_agent_loop import batch_of, sampling

    server = ScriptedVerlServer(tokenizer, script(tokenizer), delay_s=0.05)
    worker = AgentLoopWorker(config, ScriptedServerClient(config, server))
    [entry] = OmegaConf.load(AGENT_LOOP_CONFIG)
    entry.max_concurrency = 2
    math = {key: values[1] for key, values in batch_of(data_file, config, tokenizer).non_tensor_batch.items()}

    def loop() -> GymBridgeAgentLoop:
        return hydra.utils.instantiate(
            config=entry, trainer_config=DictConfigWrap(config=config), server_manager=worker.llm_client, tokenizer=worker.tokenizer,
            processor=None, hf_model_type=worker.hf_model_type, dataset_cls=worker.dataset_cls,
            data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))

    async def many() -> list:
        return await asyncio.gather(*(loop().run(sampling(config), **math, session_id=i) for i in range(6)))

    outputs = asyncio.run(many())
    assert [o.reward_score for o in outputs] == [1.0] * 6 and len(server.calls) == 6
    assert server.peak == 2 and loop().slots.peak == 2
    assert sorted(o.extra_fields["gym_bridge_repeat_index"] for o in outputs) == list(range(6))
    # per_env_concurrency bounds one environment's rollouts under a wider global bound
    entry.max_concurrency, entry.per_env_concurrency = 8, 1
    server.peak = 0
    outputs = asyncio.run(many())
    assert [o.reward_score for o in outputs] == [1.0] * 6 and server.peak == 1 and loop().slots.peak == 1


@pytest.mark.slow
@pytest.mark.integration
def test_the_v1_worker_fills_a_real_transfer_queue(config, data_file, tokenizer):
    """Real Ray and TransferQueue (its controller and storage actors): what the V1 worker puts is what
    V1's trainer reads back with `kv_batch_get`."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        tq.init()
        server = ScriptedVerlServer(tokenizer, script(tokenizer))
        worker = v1_worker(config, server)
        batch = v1_batch(data_file, config, tokenizer, global_steps=3)
        uids = list(batch["uid"])
        tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 3}] * len(uids))
        asyncio.run(generate(worker, batch))
        keys = [f"{uid}_{session}_0" for uid in uids for session in range(N)]
        listed = tq.kv_list(partition_id="train")["train"]
        assert all(listed[uid]["status"] == "finished" for uid in uids)
        assert all(listed[key]["status"] == "success" and listed[key]["global_steps"] == 3 for key in keys)
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores", "session_id", "response_mask"])
        assert [scores.sum().item() for scores in data["rm_scores"].unbind(0)] == [1.0] * len(keys)
        assert list(data["session_id"]) == [0, 1] * len(uids)
    finally:
        tq.close()
        ray.shutdown()


def test_records_path_writes_every_rollout_with_its_training_step(monkeypatch, tmp_path, data_file, tokenizer):
    """`records_path` in the agent-loop YAML: each worker process appends every rollout's record, with
    `metrics.train_step` = the optimizer steps done when it was generated (the weights version verl's
    server reports, as TRL's records carry the trainer's step), to its own file that `show` reads."""
    import json

    from gym_bridge.cli import main
    from gym_bridge.policies.embedded import embedded_model_path

    loop_yaml = tmp_path / "agent_loop.yaml"
    loop_yaml.write_text(AGENT_LOOP_CONFIG.read_text().replace("records_path: null", f"records_path: {tmp_path / 'records' / 'train.jsonl'}"))
    config = verl_config(str(embedded_model_path()), str(loop_yaml), **{"actor_rollout_ref.rollout.n": N})
    RecordedQueue().install(monkeypatch)
    server = ScriptedVerlServer(tokenizer, script(tokenizer), global_steps=5)  # weights after 5 optimizer steps
    asyncio.run(generate(v1_worker(config, server), v1_batch(data_file, config, tokenizer, global_steps=6)))
    files = list((tmp_path / "records").iterdir())
    assert [file.name.split(".")[0] for file in files] == ["train"] and files[0].name.endswith(".jsonl")  # this process's file
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert sorted((r["env"], r["repeat_index"]) for r in records) == [("math", 0), ("math", 1), ("weather", 0), ("weather", 1)]
    assert [r["metrics"]["train_step"] for r in records] == [5] * 4 and all(r["reward"] == 1.0 for r in records)
    assert main(["show", str(files[0]), "-n", "0", "--color", "never"]) == 0
