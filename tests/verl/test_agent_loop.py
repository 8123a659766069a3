"""gym_bridge.verl against the real verl 0.9.1 classes on the CPU (no Ray, no vLLM).

verl's own `ppo_trainer` config is composed; a real `AgentLoopWorker` (verl/experimental/agent_loop/
agent_loop.py) is built from it with the shipped agent-loop YAML, reads the parquet file that
`gym-bridge data to-verl` writes through `GymBridgeDataset` (verl's `RLHFDataset`) and `collate_fn`,
and generates through verl's real `LLMServerClient.generate` against a scripted server with the
signature of verl's vLLM server (`tests/support/verl_stand_in.py`). The agent loop is also built
alone exactly as `AgentLoopWorker._run_agent_loop` builds it, to check its `AgentLoopOutput`.
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("verl.experimental.agent_loop", reason="needs the verl extra: pip install 'gym-bridge[verl]'")

from gym_bridge.verl._data import AGENT_LOOP_CONFIG, check_verl_files, write_verl_parquet  # noqa: E402
from gym_bridge.core.errors import DataError, UnknownEnvironmentError  # noqa: E402
from gym_bridge.core.policy import Generation  # noqa: E402
from gym_bridge.core.registry import get_environment  # noqa: E402
from tests.support.verl_stand_in import ScriptedServerClient, ScriptedVerlServer, verl_config  # noqa: E402

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seattle"}}\n</tool_call>'


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer):
    return smol_tokenizer


@pytest.fixture(scope="module")
def scripts(tokenizer):
    """Scripted turns per task (by a phrase of its prompt), one per tool output seen so far."""

    def turn(text: str, logprob: float) -> Generation:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[logprob - 0.001 * i for i in range(len(ids))], finish_reason="stop")

    return {
        "weather in Seattle": [turn(WEATHER_CALL, -0.1), turn("It is cold in Seattle.", -0.2)],
        'synonyms of "Hot"': [turn(call("get_synonym_value", synonym="Warm"), -0.3), turn(call("get_synonym_value", synonym="Blazing"), -0.4),
                              turn(call("extract_synonym_values", synonym_values=[407, 711]), -0.5), turn("Done.", -0.6)],
        "What is 7 + 5?": [turn("\\boxed{12}", -0.7)],
    }


def answer_from(scripts):
    def answer(prompt_text: str):
        for phrase, turns in scripts.items():
            if turns and phrase in prompt_text:
                return turns[min(prompt_text.count("<|im_start|>tool"), len(turns) - 1)]
        return RuntimeError(f"no script for {prompt_text[-200:]!r}")

    return answer


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    """weather row 0, multi_step row 0 and math row 0 of the bundled example data, via `gym-bridge data to-verl`."""
    folder = tmp_path_factory.mktemp("verl_data")
    paths = []
    for env in ("weather", "multi_step", "math"):
        first = get_environment(env).example_data.read_text().splitlines()[0]
        path = folder / f"{env}.jsonl"
        path.write_text(first + "\n")
        paths.append(path)
    return write_verl_parquet(paths, folder / "train.parquet").output


@pytest.fixture(scope="module")
def config(verl_trainer_config):
    return verl_trainer_config


@pytest.fixture(scope="module")
def worker(config, tokenizer, scripts):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    server = ScriptedVerlServer(tokenizer, answer_from(scripts))
    return AgentLoopWorker(config, ScriptedServerClient(config, server)), server


def batch_of(data_file, config, tokenizer, rows=None):
    """The rows as verl's trainer batches them: GymBridgeDataset items, collate_fn, DataProto."""
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    from gym_bridge.verl._agent_loop import GymBridgeDataset

    dataset = GymBridgeDataset(str(data_file), tokenizer, config.data)
    items = [dataset[i] for i in (rows if rows is not None else range(len(dataset)))]
    return DataProto.from_single_dict(collate_fn(items))


def build_loop(worker_obj, client=None):
    """The agent loop as `AgentLoopWorker._run_agent_loop` instantiates it."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    return hydra.utils.instantiate(
        config=_agent_loop_registry["gym_bridge"], trainer_config=DictConfigWrap(config=worker_obj.config),
        server_manager=client or worker_obj.llm_client, tokenizer=worker_obj.tokenizer, processor=worker_obj.processor,
        hf_model_type=worker_obj.hf_model_type, dataset_cls=worker_obj.dataset_cls, data_config=DictConfigWrap(worker_obj.config.data),
        tools=ToolListWrap(worker_obj.tools),
    )


def sampling(config):
    rollout = config.actor_rollout_ref.rollout
    return dict(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k, repetition_penalty=1.0, logprobs=rollout.calculate_log_probs)


def assert_invariants(output, calls, *, trainable: bool = True):
    """Each call's prompt is the prompt plus every response token before it, and its generation follows
    it in the response with its log-probs; everything else in the response (environment tokens) has
    mask 0 and log-prob 0.0; the mask is 1 exactly on the generations (0 everywhere when not trainable)."""
    prompt, response, mask, logprobs = output.prompt_ids, output.response_ids, output.response_mask, output.response_logprobs
    assert len(response) == len(mask) == len(logprobs)
    model_positions: set[int] = set()
    position = 0
    for c in calls:
        assert c.prompt_ids[: len(prompt)] == prompt
        start = len(c.prompt_ids) - len(prompt)
        assert c.prompt_ids == prompt + response[:start] and start >= position
        end = min(start + len(c.token_ids), len(response))
        assert response[start:end] == c.token_ids[: end - start]
        assert logprobs[start:end] == pytest.approx(c.log_probs[: end - start])
        model_positions.update(range(start, end))
        position = end
    for i, (m, lp) in enumerate(zip(mask, logprobs)):
        assert m == int(trainable and i in model_positions)
        if i not in model_positions:
            assert lp == 0.0


def test_agent_loop_outputs_for_weather_multi_step_and_math(worker, config, data_file, tokenizer, scripts):
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    from gym_bridge.verl._agent_loop import REWARD_EXTRA_KEYS, GymBridgeAgentLoop

    worker_obj, server = worker
    batch = batch_of(data_file, config, tokenizer)
    assert list(batch.non_tensor_batch["agent_name"]) == ["gym_bridge"] * 3
    expected = {"weather": (1.0, 2, 1), "multi_step": (1.0, 4, 3), "math": (1.0, 1, 0)}  # reward, model calls, tool rounds
    env_texts = {}
    for i in range(len(batch)):
        columns = {key: values[i] for key, values in batch.non_tensor_batch.items()}
        loop = build_loop(worker_obj)
        assert isinstance(loop, GymBridgeAgentLoop)
        server.calls.clear()
        server.acquired.clear()
        output = asyncio.run(loop.run(sampling(config), **columns))
        assert isinstance(output, AgentLoopOutput)
        env = columns["data_source"]
        reward, model_calls, tool_rounds = expected[env]
        assert len(server.calls) == model_calls and len(set(server.acquired)) == 1  # one sticky session
        assert_invariants(output, server.calls)
        assert output.reward_score == reward and output.num_turns == 1 + model_calls + tool_rounds
        info = output.extra_fields["reward_extra_info"]
        assert tuple(info) == REWARD_EXTRA_KEYS and info["gym_bridge_env"] == env and info["gym_bridge_masked"] == 0.0
        assert output.extra_fields["gym_bridge_masked"] is False and output.extra_fields["max_global_steps"] == 3
        assert len(output.prompt_ids) <= 1024 and len(output.response_ids) <= 256
        env_texts[env] = tokenizer.decode([t for t, m in zip(output.response_ids, output.response_mask) if not m])
        assert env_texts[env].count("<|im_start|>tool") == tool_rounds
        for c in server.calls:  # verl's sampling parameters reach the server, plus the turn's budget
            assert c.sampling_params["temperature"] == 1.0 and c.sampling_params["top_k"] == -1 and c.sampling_params["max_tokens"] <= 256
    # multi-turn: the multi_step tool outputs are in the response, in order
    text = env_texts["multi_step"]
    assert text.index('{"synonym_value": 407}') < text.index('{"synonym_value": 711}') < text.index('{"success": true}')


def test_the_worker_batches_gym_bridge_rows_like_verl_expects(worker, config, data_file, tokenizer):
    """`AgentLoopWorker.generate_sequences` with the shipped YAML: padding, masks, `rm_scores` at the last
    response token, `reward_extra_info` stacked over the batch, even with a failed rollout in it."""
    from gym_bridge.verl._agent_loop import REWARD_EXTRA_KEYS

    worker_obj, server = worker
    batch = batch_of(data_file, config, tokenizer)
    answer = server.answer
    server.answer = lambda text: RuntimeError("engine died") if "7 + 5" in text else answer(text)  # math fails
    try:
        output = asyncio.run(worker_obj.generate_sequences(batch))
    finally:
        server.answer = answer
    tensors, extra = output.batch, output.non_tensor_batch
    assert tensors["responses"].shape == (3, 256) and tensors["prompts"].shape == (3, 1024)
    assert output.meta_info["reward_extra_keys"] == list(REWARD_EXTRA_KEYS)
    assert list(extra["gym_bridge_env"]) == ["weather", "multi_step", "math"]
    assert list(extra["gym_bridge_masked"]) == [False, False, True] and list(extra["gym_bridge_failure_kind"]) == [None, None, "infra"]
    scores = tensors["rm_scores"].sum(dim=1).tolist()
    assert scores == [1.0, 1.0, 0.0]
    lengths = tensors["attention_mask"][:, 1024:].sum(dim=1)
    for row, length in enumerate(lengths.tolist()):
        assert tensors["rm_scores"][row, length - 1] == scores[row]  # the reward sits on the last response token
        assert tensors["response_mask"][row, length:].sum() == 0 and tensors["rollout_log_probs"][row, length:].abs().sum() == 0
    assert tensors["response_mask"][2].sum() == 0  # the failed rollout adds nothing to the loss
    assert tensors["response_mask"][0].sum() > 0 and tensors["response_mask"][1].sum() > 0


def test_failures_and_limits_are_masked_outputs_not_exceptions(worker, config, data_file, tokenizer, scripts):
    from verl.workers.rollout.llm_server import LLMServerClient

    from gym_bridge.verl._agent_loop import REWARD_EXTRA_KEYS

    worker_obj, _ = worker
    batch = batch_of(data_file, config, tokenizer)
    weather = {key: values[0] for key, values in batch.non_tensor_batch.items()}

    def run_with(answer, **overrides):
        cfg = verl_config(config.actor_rollout_ref.model.path, str(AGENT_LOOP_CONFIG), **overrides) if overrides else config
        server = ScriptedVerlServer(tokenizer, answer)
        client = ScriptedServerClient(cfg, server)
        assert isinstance(client, LLMServerClient)
        loop = build_loop(worker_obj, client)
        if overrides:
            loop.rollout_config, loop.prompt_length, loop.response_length = (
                cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.rollout.prompt_length, cfg.actor_rollout_ref.rollout.response_length)
        return asyncio.run(loop.run(sampling(cfg), **weather)), server.calls

    first, _ = scripts["weather in Seattle"]
    # the server fails on the second turn: the partial trajectory is kept, masked
    turns = iter([first, ConnectionError("server went away")])
    output, calls = run_with(lambda text: next(turns))
    assert output.extra_fields["gym_bridge_masked"] is True and output.extra_fields["gym_bridge_failure_kind"] == "infra"
    assert output.reward_score == 0.0 and set(output.response_mask) == {0} and len(output.response_ids) > len(first.token_ids)
    assert tuple(output.extra_fields["reward_extra_info"]) == REWARD_EXTRA_KEYS
    assert_invariants(output, calls, trainable=False)
    # a prompt longer than rollout.prompt_length: masked context overflow, prompt cut to fit verl's padding
    output, calls = run_with(lambda text: first, **{"actor_rollout_ref.rollout.prompt_length": 64, "data.max_prompt_length": 64})
    assert calls == [] and output.extra_fields["gym_bridge_failure_kind"] == "context_overflow"
    assert len(output.prompt_ids) == 64 and output.response_mask == [0]
    # rollout.response_length bounds all turns: a long answer is cut, and the rollout scored
    long_turn = Generation(token_ids=tokenizer.encode("cold " * 300, add_special_tokens=False)[:300], logprobs=[-1.0] * 300, finish_reason="stop")
    turns = iter([first, long_turn])
    output, calls = run_with(lambda text: next(turns), **{"actor_rollout_ref.rollout.response_length": 96, "data.max_response_length": 96})
    assert len(output.response_ids) == 96 and output.extra_fields["gym_bridge_finish_reason"] == "length"
    assert output.reward_score == 1.0 and sum(output.response_mask) == len(first.token_ids) + calls[1].sampling_params["max_tokens"]
    assert_invariants(output, calls)


def test_bad_rows_fail_when_the_data_is_written_or_loaded(tmp_path, config, tokenizer):
    good = json.dumps({"responses_create_params": {"input": "What is 7 + 5?"}, "expected_answer": "12", "agent_ref": {"name": "math"}})
    unknown = json.dumps({"responses_create_params": {"input": "hi"}, "agent_ref": {"name": "inventory"}})
    source = tmp_path / "rows.jsonl"
    source.write_text(good + "\n" + unknown + "\n")
    with pytest.raises(UnknownEnvironmentError, match=r"rows.jsonl:2: agent_ref.name: unknown environment 'inventory'"):
        write_verl_parquet([source], tmp_path / "out.parquet")
    source.write_text(good + "\n" + json.dumps({"agent_ref": {"name": "math"}}) + "\n")
    with pytest.raises(DataError, match=r"rows.jsonl:2: responses_create_params.input"):
        write_verl_parquet([source], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()
    # a parquet file written elsewhere, whose row names an environment not installed here, fails at dataset load
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gym_bridge.verl._agent_loop import GymBridgeDataset

    rows = [{"prompt": [{"role": "user", "content": "hi"}], "agent_name": "gym_bridge", "data_source": "x",
             "agent_ref": {"type": "responses_api_agents", "name": name}} for name in ("math", "inventory")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "foreign.parquet")
    with pytest.raises(UnknownEnvironmentError, match=r"foreign.parquet:row 2: agent_ref.name: unknown environment 'inventory'"):
        GymBridgeDataset(str(tmp_path / "foreign.parquet"), tokenizer, config.data)
    rows[1]["agent_ref"]["name"] = "math"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "routed.parquet")
    assert check_verl_files([tmp_path / "routed.parquet"]) == 2  # routed by the agent_ref column alone


def test_data_to_verl_cli_writes_what_verl_reads(tmp_path, capsys, config, tokenizer):
    from gym_bridge.verl._agent_loop import GymBridgeDataset
    from gym_bridge.cli import main

    paths = [str(get_environment(env).example_data) for env in ("weather", "math")]
    assert main(["data", "to-verl", *paths, "--output", str(tmp_path / "train.parquet"), "--limit", "2"]) == 0
    assert "wrote 4 rows (math=2, weather=2)" in capsys.readouterr().out
    dataset = GymBridgeDataset(str(tmp_path / "train.parquet"), tokenizer, config.data)
    item = dataset[2]
    assert item["agent_name"] == "gym_bridge" and item["data_source"] == "math" and item["index"] == 2
    assert item["reward_model"] == {"style": "rule", "ground_truth": "12"}
    assert item["raw_prompt"][-1]["role"] == "user" and json.loads(item["gym_bridge_row"])["expected_answer"] == "12"
    assert item["agent_ref"] == {"type": "responses_api_agents", "name": "math"}
    assert main(["data", "to-verl", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "x.parquet")]) == 2
    assert "missing.jsonl: file not found" in capsys.readouterr().err


def test_the_agent_loop_yaml_ships_with_the_package():
    import hydra
    from omegaconf import OmegaConf

    from gym_bridge.verl._agent_loop import GymBridgeAgentLoop

    [entry] = OmegaConf.load(AGENT_LOOP_CONFIG)
    assert entry.name == "gym_bridge" and entry._target_ == "gym_bridge.verl.GymBridgeAgentLoop"
    assert hydra.utils.get_class(entry._target_) is GymBridgeAgentLoop  # resolves through gym_bridge's lazy attribute


def test_the_recipe_overrides_compose_with_verls_config(tmp_path):
    """`recipes/verl_grpo.sh` (dry run): its data file is written and every Hydra override it passes to
    `verl.trainer.main_ppo` exists in verl 0.9.1's `ppo_trainer` config; the dataset class it names loads."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from verl.utils.dataset.rl_dataset import get_dataset_class

    from gym_bridge.verl._agent_loop import GymBridgeDataset

    root = Path(__file__).parents[2]
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "GPUS_PER_NODE": "8", "MODEL": "/models/qwen",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "recipes/verl_grpo.sh", "trainer.total_epochs=2"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("verl.trainer.main_ppo") + 1
    overrides = lines[start:]
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=gym_bridge" in overrides and overrides[-1] == "trainer.total_epochs=2"
    import verl

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert config.algorithm.adv_estimator == "gym_bridge_grpo" and config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(AGENT_LOOP_CONFIG)
    assert get_dataset_class(config.data) is GymBridgeDataset
    rows = sum(len(get_environment(name).example_data.read_text().splitlines()) for name in ("weather", "multi_step", "math"))
    assert check_verl_files([config.data.train_files]) == rows  # every example row of the 3 environments


def test_gym_bridge_grpo_keeps_masked_samples_out_of_the_group_statistics():
    """`algorithm.adv_estimator=gym_bridge_grpo`, registered by `import verl` (the package's `verl.plugins`
    entry point) and dispatched by verl's own `ray_trainer.compute_advantage`."""
    import numpy as np
    import torch
    from verl.protocol import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.ray_trainer import compute_advantage

    # group a: rewards 1, 0, 1 and a failed rollout (reward 0, mask all 0); group b: nothing masked
    scores = [1.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.25]
    lengths = [3, 2, 4, 0, 4, 1, 2, 3]
    mask = torch.tensor([[1] * n + [0] * (4 - n) for n in lengths], dtype=torch.int64)
    rewards = torch.zeros(8, 4)
    for row, (score, n) in enumerate(zip(scores, lengths)):
        rewards[row, max(n - 1, 0)] = score
    uid = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uid})
    advantages = compute_advantage(data, adv_estimator="gym_bridge_grpo", config=AlgoConfig(adv_estimator="gym_bridge_grpo")).batch["advantages"]
    # group a over its three trainable samples: mean 2/3, sample std sqrt(1/3)
    mean, std = 2 / 3, (1 / 3) ** 0.5
    for row in range(3):
        assert advantages[row, : lengths[row]].tolist() == pytest.approx([(scores[row] - mean) / (std + 1e-6)] * lengths[row], rel=1e-5)
    assert advantages[3].abs().sum() == 0
    # group b, with nothing masked, is exactly verl's GRPO
    expected, _ = compute_grpo_outcome_advantage(rewards[4:], mask[4:], uid[4:])
    assert torch.allclose(advantages[4:], expected)
    # and verl's GRPO lets the failed rollout's 0.0 pull group a's mean down to 1/2
    grpo, _ = compute_grpo_outcome_advantage(rewards[:4], mask[:4], uid[:4])
    assert grpo[0, 0] == pytest.approx((1.0 - 0.5) / (torch.tensor([1.0, 0.0, 1.0, 0.0]).std().item() + 1e-6), rel=1e-5)


def test_the_legacy_worker_numbers_the_repeats_of_a_row(worker, config, data_file, tokenizer):
    """`trainer.use_v1=false`: verl's trainer gives each row a `uid` and repeats it `rollout.n` times
    (`DataProto.repeat(interleave=True)`); each repeat is its own rollout (repeat index, session id)."""
    import uuid

    import numpy as np

    worker_obj, _ = worker
    batch = batch_of(data_file, config, tokenizer)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    batch = batch.repeat(repeat_times=2, interleave=True)
    output = asyncio.run(worker_obj.generate_sequences(batch))
    assert list(output.non_tensor_batch["gym_bridge_repeat_index"]) == [0, 1] * 3
    assert list(output.non_tensor_batch["gym_bridge_masked"]) == [False] * 6
