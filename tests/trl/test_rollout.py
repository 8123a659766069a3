"""gym_bridge.trl.rollout against a stand-in trainer and a scripted policy: TRL's row contract,
masks, budgets, failures as masked rows, clear errors, reward metrics."""

import asyncio
import json

import pytest

import gym_bridge
from gym_bridge.trl._rollout import make_rollout, repeat_indices, to_trl_batch
from gym_bridge.trl._trainer_args import sampling_from_args
from gym_bridge.trl._rewards import env_reward, reward_metrics
from gym_bridge.core.task import task_key
from gym_bridge.trl._dataset import REGISTRY, load_dataset
from gym_bridge.core.errors import DataError, GymBridgeError, UnknownEnvironmentError, BackendError, TokenPolicyRequiredError
from gym_bridge.core.policy import Generation, ScriptedPolicy
from tests.support.invariants import assert_token_invariants

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
ROWS = [
    {"responses_create_params": {"input": "Weather in Oslo?"}, "environment": "weather", "case": "rollout-test"},
    {"prompt": "What is 5 + 7? Answer in \\boxed{}.", "environment": "math", "expected_answer": "12", "case": "rollout-test"},
]


class Trainer:
    """The attributes of a TRL 1.16 GRPOTrainer that the rollout function reads."""

    def __init__(self, tokenizer, *, dataset=None, process_index=0, **args):
        settings = dict(max_completion_length=96, temperature=1.0, top_p=1.0, top_k=0, min_p=None,
                        repetition_penalty=1.0, generation_kwargs=None, num_generations=2)
        settings.update(args)
        self.args = type("Args", (), settings)()
        self.processing_class = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.model = type("Model", (), {"training": True})()
        self.accelerator = type("Accelerator", (), {"process_index": process_index})()
        self.num_generations = self.num_generations_eval = settings["num_generations"]
        self.train_dataset, self.eval_dataset = dataset, None
        self.tools, self.environment_factories = [], None


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(ROWS)


class CappedScriptedPolicy(ScriptedPolicy):
    """A scripted policy that, like a real one, stops at the request's max_new_tokens."""

    async def generate(self, request):
        generation = await super().generate(request)
        cap = request.sampling.max_new_tokens
        if len(generation.token_ids) <= cap:
            return generation
        return Generation(token_ids=generation.token_ids[:cap], logprobs=generation.logprobs[:cap], finish_reason="length")


def sessions(dataset, repeat):
    return [f"{REGISTRY.get(key).position}-{repeat}" for key in dataset["task_key"]]


def prompts_of(dataset, group_size=2):
    return [prompt for prompt in dataset["prompt"] for _ in range(group_size)]


def run(rollout, prompts, trainer):
    records = []
    options = rollout.options
    rollout.options = type(options)(**{**options.__dict__, "on_records": records.extend})
    return rollout(prompts, trainer), records


def test_rows_follow_trls_contract_and_the_records(dataset, smol_tokenizer, turn):
    weather, math = sessions(dataset, 0)
    script = {
        weather: [turn(WEATHER_CALL), turn("Cold in Oslo.")],
        math: [turn("\\boxed{12}")],
        "": [turn("No idea.")],
    }
    rollout = make_rollout(policy=ScriptedPolicy(script))
    prompts = prompts_of(dataset)
    out, records = run(rollout, prompts, Trainer(smol_tokenizer))
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward", "reward_components",
                        "failure_kind", "env_name", "num_turns", "tool_calls", "finish_reason", "parse_errors", "unparsed_tool_calls",
                        "harness_rewrites"}
    assert all(len(values) == len(prompts) for values in out.values())
    # rows in prompt order; each group's repeats are 0 and 1 of the same task
    assert [(r.task.row["environment"], r.repeat_index) for r in records] == [("weather", 0), ("weather", 1), ("math", 0), ("math", 1)]
    assert out["env_reward"] == [1.0, 0.0, 1.0, 0.0]
    assert out["env_name"] == ["weather", "weather", "math", "math"] and out["num_turns"] == [2, 1, 1, 1]
    assert out["parse_errors"] == [0, 0, 0, 0] and out["unparsed_tool_calls"] == [0, 0, 0, 0]
    assert out["reward_components"][2] == {"correct": 1.0}
    for row, record in enumerate(records):
        assert_token_invariants(record.to_dict())
        ids, mask = out["completion_ids"][row], out["env_mask"][row]
        assert out["prompt_ids"][row] == record.tokens.prompt_ids
        assert ids == record.tokens.completion_ids and mask == record.tokens.completion_mask
        assert len(out["logprobs"][row]) == len(ids) and ids[-1] == smol_tokenizer.eos_token_id
        # mask is 1 exactly on the tokens the model sampled (log-prob -0.25), 0 elsewhere
        model_ids = [token for item in record.output for token in item.get("generation_token_ids", [])]
        assert [token for token, m in zip(ids, mask) if m] == model_ids
        assert all((lp == -0.25) == bool(m) for lp, m in zip(out["logprobs"][row], mask))
    # the env tokens of the tool-calling row are the tool output plus the template around it
    ids, mask = out["completion_ids"][0], out["env_mask"][0]
    env_text = smol_tokenizer.decode([token for token, m in zip(ids, mask) if not m])
    assert env_text == '\n<|im_start|>tool\n{"city": "Oslo", "weather_description": "The weather in Oslo is cold."}<|im_end|>\n<|im_start|>assistant\n'


def test_failed_rollouts_are_masked_rows_with_no_reward(dataset, smol_tokenizer, turn):
    weather, math = sessions(dataset, 0)
    script = {weather: [turn(WEATHER_CALL), BackendError("server went away")], math: [BackendError("boom")], "": [turn("\\boxed{12}")]}
    out, records = run(make_rollout(policy=ScriptedPolicy(script)), prompts_of(dataset), Trainer(smol_tokenizer))
    assert out["failure_kind"] == ["infra", None, "infra", None]
    assert out["env_reward"] == [None, 0.0, None, 1.0] and out["reward_components"][0] == {}
    assert len(records[0].tokens.completion_ids) > 0 and set(out["env_mask"][0]) == {0}  # partial trajectory, all masked
    assert out["completion_ids"][2] == [smol_tokenizer.eos_token_id] and out["env_mask"][2] == [0]  # empty -> one EOS
    assert out["logprobs"][2] == [0.0]


def test_budget_covers_all_turns_and_answers_end_on_eos(dataset, smol_tokenizer, turn):
    weather, math = sessions(dataset, 0)
    long_answer = Generation(token_ids=smol_tokenizer.encode("word " * 60, add_special_tokens=False)[:60], logprobs=[-0.5] * 60, finish_reason="stop")
    script = {weather: [turn(WEATHER_CALL), long_answer], math: [turn("\\boxed{12}", eos=False)], "": [turn("ok")]}
    policy = CappedScriptedPolicy(script)
    out, records = run(make_rollout(policy=policy), prompts_of(dataset), Trainer(smol_tokenizer, max_completion_length=64))
    assert len(out["completion_ids"][0]) == 64 and out["finish_reason"][0] == "length"
    # the second weather call asked for no more than what the first turn and the tool output left
    second = [call for call in policy.calls if call.session_id == weather][1]
    assert second.sampling.max_new_tokens == 64 - (len(second.prompt_ids) - len(records[0].tokens.prompt_ids))
    assert second.sampling.logprobs_mode == "processed"
    # a finished answer that the backend returned without EOS gets one, masked
    assert out["completion_ids"][2][-1] == smol_tokenizer.eos_token_id and out["env_mask"][2][-1] == 0
    assert out["completion_ids"][2][:-1] == records[2].tokens.completion_ids


def test_works_when_called_inside_a_running_event_loop(dataset, smol_tokenizer, turn):
    rollout = make_rollout(policy=ScriptedPolicy({"": [turn("\\boxed{12}")]}))

    async def inside():
        return rollout(prompts_of(dataset), Trainer(smol_tokenizer))

    assert len(asyncio.run(inside())["completion_ids"]) == 4


def test_clear_errors(dataset, smol_tokenizer, turn):
    ok = ScriptedPolicy({"": [turn("fine")]})
    with pytest.raises(DataError, match="does not identify a gym_bridge task; build the dataset with gym_bridge.trl.load_dataset"):
        make_rollout(policy=ok)(["What is 2 + 2?"] * 2, Trainer(smol_tokenizer))
    with pytest.raises(DataError, match="neither in the trainer's datasets nor among the rows loaded"):
        make_rollout(policy=ok)(["[gym_bridge math 0123456789abcdef] ?"] * 2, Trainer(smol_tokenizer))
    trainer = Trainer(smol_tokenizer)
    trainer.tools = [lambda city: city]
    with pytest.raises(ValueError, match="GRPOTrainer got tools= .* together with gym_bridge.trl.rollout"):
        make_rollout(policy=ok)(prompts_of(dataset), trainer)


def test_an_unknown_environment_in_the_trainers_dataset_fails_on_the_first_batch(smol_tokenizer, turn):
    import datasets

    row = {"prompt": "hi", "environment": "no_such_env_for_trl"}
    key = task_key(row)
    dataset = datasets.Dataset.from_dict({"prompt": [f"[gym_bridge no_such_env_for_trl {key}] hi"], "task_key": [key], "task_row": [json.dumps(row)]})
    rollout = make_rollout(policy=ScriptedPolicy({"": [turn("hi")]}))
    with pytest.raises(UnknownEnvironmentError, match="unknown environment 'no_such_env_for_trl'"):
        rollout(list(dataset["prompt"]) * 2, Trainer(smol_tokenizer, dataset=dataset))


def test_a_policy_that_gives_no_token_ids_is_refused(dataset, smol_tokenizer):
    class ChatOnly:  # a chat policy: messages in, text out
        async def chat(self, request):
            raise AssertionError("never called")

    with pytest.raises(TokenPolicyRequiredError, match="cannot be used for training"):
        make_rollout(policy=ChatOnly())(prompts_of(dataset), Trainer(smol_tokenizer))

    class TextOnly:  # has generate, but hands back text without ids: caught by what it returns
        async def generate(self, request):
            return Generation(token_ids=[], logprobs=[], finish_reason="stop", text="Hello!")

    with pytest.raises(GymBridgeError, match="returned text without token ids"):
        make_rollout(policy=TextOnly())(prompts_of(dataset), Trainer(smol_tokenizer))


def test_a_first_batch_that_fails_entirely_is_an_error(dataset, smol_tokenizer):
    rollout = make_rollout(policy=ScriptedPolicy({"": [BackendError("connection refused")]}))
    with pytest.raises(GymBridgeError, match="every rollout of the first batch failed; the first as infra: .*connection refused"):
        rollout(prompts_of(dataset), Trainer(smol_tokenizer))


def test_repeat_indices_follow_trls_layout_across_ranks():
    # global batch a a b b c c over two ranks of 3 rows: rank 1 starts inside group b
    assert repeat_indices(["a", "a", "b"], group_size=2, offset=0) == [0, 1, 0]
    assert repeat_indices(["b", "c", "c"], group_size=2, offset=3) == [1, 0, 1]
    # prompts that do not follow the layout are counted by runs of equal neighbours
    assert repeat_indices(["a", "b", "b", "b"], group_size=2, offset=0) == [0, 0, 1, 2]


def test_sampling_comes_from_the_trainers_args():
    args = type("Args", (), {"temperature": 0.7, "top_p": None, "top_k": -1})()
    sampling = sampling_from_args(args, max_new_tokens=32)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens) == (0.7, 1.0, 0, 32)
    assert sampling.logprobs_mode == "processed"


@pytest.mark.parametrize(("temperature", "top_p", "top_k", "async_mode"),
                         [(1.0, 1.0, -1, "raw"), (1.0, 0, None, "raw"), (0.7, 0.9, 20, "processed"), (1.0, 0.95, 0, "raw")])
def test_the_sync_and_async_paths_map_a_trl_config_the_same_way(smol_tokenizer, temperature, top_p, top_k, async_mode):
    """One mapping (gym_bridge.trl._trainer_args): both paths give the same temperature, top_p and top_k (-1, 0 and None
    all mean off), and differ only in the log-prob mode, which follows the server that generates (see its docstring)."""
    from types import SimpleNamespace

    from gym_bridge.core.task import parse_task
    from gym_bridge.trl import AsyncRolloutWorker

    pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")
    args = SimpleNamespace(num_generations=2, max_staleness=1, per_device_train_batch_size=4, token_budget=0, gradient_accumulation_steps=1,
                           weight_sync_steps=1, max_completion_length=48, temperature=temperature, top_p=top_p, top_k=top_k,
                           vllm_server_base_url="http://127.0.0.1:9", request_timeout=30)
    sync = sampling_from_args(args, max_new_tokens=48)
    worker = AsyncRolloutWorker.for_trainer(args, tasks=[parse_task({"prompt": "2 + 2?", "environment": "arithmetic", "answer": "4"}, index=0)],
                                            tokenizer=smol_tokenizer, served_model="m", max_turns=3, journal_dir=False)
    settings = worker.settings.sampling
    assert (settings.temperature, settings.top_p, settings.top_k) == (sync.temperature, sync.top_p, sync.top_k)
    assert (sync.top_p, sync.top_k) == (top_p or 1.0, max(top_k or 0, 0))
    assert sync.logprobs_mode == "processed" and settings.logprobs_mode == async_mode
    # max_completion_length bounds a sync rollout's turns together, and each model call of an async one
    assert settings.max_new_tokens == 48 and worker.settings.limits.max_completion_tokens == 48 * 3


def test_to_trl_batch_masks_samples_the_verifier_masked(dataset, smol_tokenizer, turn):
    out, records = run(make_rollout(policy=ScriptedPolicy({"": [turn("\\boxed{12}")]})), prompts_of(dataset), Trainer(smol_tokenizer))
    masked = [records[0].__class__(**{**records[0].__dict__, "mask_sample": True})]
    batch = to_trl_batch(masked, eos_token_ids=[smol_tokenizer.eos_token_id], max_completion_length=96)
    assert batch["env_reward"] == [None] and set(batch["env_mask"][0]) == {0}


def test_env_reward_returns_the_rows_rewards_and_logs_metrics():
    logged, extra = {}, {}
    rewards = env_reward(
        ["p"] * 4, ["c"] * 4, env_reward=[1.0, None, 0.0, 0.5], env_name=["math", "math", "weather", "weather"],
        reward_components=[{"correct": 1.0}, {}, {}, {}], failure_kind=[None, "timeout", None, None], num_turns=[1, 2, 3, 2],
        parse_errors=[0, 2, 1, 0], unparsed_tool_calls=[1, 0, 0, 0], log_metric=logged.__setitem__, log_extra=extra.__setitem__, trainer_state=None,
    )
    assert rewards == [1.0, None, 0.0, 0.5]
    assert logged["gym_bridge/failed"] == 0.25 and logged["gym_bridge/failed/timeout"] == 0.25 and logged["gym_bridge/failed/env"] == 0.0
    assert logged["gym_bridge/math/reward"] == 1.0 and logged["gym_bridge/math/correct"] == 1.0
    assert logged["gym_bridge/weather/reward"] == 0.25 and logged["gym_bridge/num_turns"] == 2.0  # (0 + 0.5) / 2; 8 / 4
    assert logged["gym_bridge/parse_errors"] == 0.75 and logged["gym_bridge/unparsed_tool_calls"] == 0.25  # 3 / 4; 1 / 4
    assert extra == {"env_name": ["math", "math", "weather", "weather"], "failure_kind": ["", "timeout", "", ""], "num_turns": [1, 2, 3, 2]}
    with pytest.raises(ValueError, match="pass rollout_func=gym_bridge.trl.rollout"):
        env_reward(["p"], ["c"])
    assert reward_metrics([], env_names=[], reward_components=[], failure_kinds=[]) == {}


def test_gym_bridge_trl_resolves_lazily():
    assert gym_bridge.trl.rollout.__class__.__name__ == "TRLRollout"
    assert gym_bridge.trl.load_dataset is load_dataset


def vllm_trainer(tokenizer, *, mode, **args):
    trainer = Trainer(tokenizer, vllm_mode=mode, vllm_server_base_url=None, vllm_server_host="10.0.0.5", vllm_server_port=8001,
                      vllm_tensor_parallel_size=1, **args)
    trainer.use_vllm = True
    return trainer


def test_backend_vllm_server_mode_calls_the_server_from_every_rank(smol_tokenizer):
    from gym_bridge.policies.remote import RemotePolicy

    state = make_rollout(server_model="served").prepare(vllm_trainer(smol_tokenizer, mode="server"))
    assert state.backend == "vllm_server" and isinstance(state.engine.policy, RemotePolicy)
    assert state.engine.policy.base_urls == ["http://10.0.0.5:8001/v1"] and state.engine.policy.model == "served"
    trainer = vllm_trainer(smol_tokenizer, mode="server")
    trainer.args.vllm_server_base_url = "http://gpu-node:9000"
    assert make_rollout(server_model="m").prepare(trainer).engine.policy.base_urls == ["http://gpu-node:9000/v1"]


def test_server_mode_catches_ids_outside_the_trainers_vocabulary(dataset, smol_tokenizer):
    """An id the trainer's tokenizer does not have, sampled by a vLLM server (real HTTP on loopback), fails its
    rollout as `infra` (a masked row) naming the ids, as it does in `eval --base-url`; it used to reach the trainer."""
    from tests.scale.test_replica_answers import OUTSIDE, bad_replica, outside_ids

    def answer(body):  # the weather task gets a usable answer (ids 28, EOS), the math task an id past the vocabulary
        if "Oslo" not in smol_tokenizer.decode(body["prompt"]):
            return outside_ids(body)
        choice = {"index": 0, "text": "ok", "finish_reason": "stop", "token_ids": [28, 2], "prompt_token_ids": body["prompt"],
                  "logprobs": {"token_logprobs": [-0.5, -0.5], "tokens": ["token_id:28", "token_id:2"]}}
        return {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}

    with bad_replica(answer) as url:
        trainer = vllm_trainer(smol_tokenizer, mode="server")
        trainer.args.vllm_server_base_url = url.removesuffix("/v1")
        trainer.accelerator.wait_for_everyone = lambda: None
        rollout = make_rollout(server_model="stub", server_max_retries=0)
        assert rollout.prepare(trainer).engine.policy.vocab_size == len(smol_tokenizer) == 49152
        out, records = run(rollout, prompts_of(dataset, group_size=1), trainer)
    assert out["env_name"] == ["weather", "math"] and out["failure_kind"] == [None, "infra"]
    assert out["completion_ids"][0] == [28, 2] and out["env_reward"][1] is None and set(out["env_mask"][1]) == {0}
    assert f"token ids outside the tokenizer's vocabulary [0, 49152): [{OUTSIDE}]" in records[1].failure_reason
    assert all(OUTSIDE not in ids for ids in out["completion_ids"])


def test_server_mode_request_timeout_and_retries_are_rollout_options(smol_tokenizer):
    default = make_rollout(server_model="m").prepare(vllm_trainer(smol_tokenizer, mode="server")).engine.policy
    assert (default.request_timeout_s, default.max_retries) == (120.0, 3)
    policy = make_rollout(server_model="m", server_request_timeout_s=900.0, server_max_retries=0).prepare(
        vllm_trainer(smol_tokenizer, mode="server")).engine.policy
    assert (policy.request_timeout_s, policy.max_retries) == (900.0, 0)
    with pytest.raises(ValueError, match="request_timeout_s must be positive"):
        make_rollout(server_model="m", server_request_timeout_s=0).prepare(vllm_trainer(smol_tokenizer, mode="server"))


def test_backend_vllm_colocate_uses_the_trainers_engine(smol_tokenizer):
    from gym_bridge.policies.vllm_engine import VLLMEnginePolicy

    trainer = vllm_trainer(smol_tokenizer, mode="colocate")
    trainer.vllm_generation = type("VLLMGeneration", (), {"llm": object(), "enable_sleep_mode": False})()
    state = make_rollout().prepare(trainer)
    assert state.backend == "vllm_colocate" and isinstance(state.engine.policy, VLLMEnginePolicy)
    assert state.engine.policy.llm is trainer.vllm_generation.llm
    trainer = vllm_trainer(smol_tokenizer, mode="colocate")
    trainer.args.vllm_tensor_parallel_size = 2
    with pytest.raises(ValueError, match="vllm_tensor_parallel_size > 1.*use vllm_mode='server'"):
        make_rollout().prepare(trainer)


@pytest.mark.parametrize("sharding, message", [("is_zero3", "ZeRO-3"), ("is_fsdp", "FSDP")])
def test_backend_trainer_model_refuses_sharded_generation(smol_tokenizer, sharding, message):
    trainer = Trainer(smol_tokenizer)
    trainer.use_vllm = False
    trainer._dist = type("DistributedBackend", (), {"is_zero3": sharding == "is_zero3", "is_fsdp": sharding == "is_fsdp"})()
    with pytest.raises(ValueError, match=f"{message}.*use vLLM"):
        make_rollout().prepare(trainer)


def test_vllm_sleep_mode_is_awake_for_the_batch_only():
    from gym_bridge.trl._backend import _vllm_awake

    calls = []

    class LLM:
        def wake_up(self, tags):
            calls.append(f"wake {tags}")

        def sleep(self, level):
            calls.append(f"sleep {level}")

    class Generation:  # TRL's VLLMGeneration after a level-2 sleep: weights dropped
        enable_sleep_mode, _llm_weights_sleeping, llm = True, True, LLM()

        def sync_weights(self):
            calls.append("sync")
            self._llm_weights_sleeping = False

    generation = Generation()
    with _vllm_awake(generation):
        calls.append("generate")
    assert calls == ["sync", "wake ['kv_cache']", "generate", "sleep 2"] and generation._llm_weights_sleeping


def test_parser_options_reach_the_template_and_unknown_names_fail_at_once(smol_tokenizer):
    from gym_bridge.core.errors import UnknownParserError

    with pytest.raises(UnknownParserError, match="known tool parsers: hermes"):
        make_rollout(tool_parser="hermes3")
    state = make_rollout(policy=ScriptedPolicy({}), tool_parser="mistral", reasoning_parser="none").prepare(Trainer(smol_tokenizer))
    assert (state.engine.template.profile.tool_parser, state.engine.template.profile.reasoning_parser) == ("mistral", "none")


@gym_bridge.register
class Unready(gym_bridge.Environment):
    name = "unready_for_trl_test"

    @classmethod
    def check_ready(cls):
        raise GymBridgeError("unready_for_trl_test: install the frobnicator")

    def verify(self, task, output):
        return 1.0


def test_an_environment_that_refuses_to_run_stops_the_first_batch(smol_tokenizer, turn):
    """`check_ready` (a missing sandbox, a bad setting) is asked before the first rollout under TRL too."""
    import datasets

    row = {"prompt": "hi", "environment": "unready_for_trl_test"}
    key = task_key(row)
    dataset = datasets.Dataset.from_dict({"prompt": [f"[gym_bridge unready_for_trl_test {key}] hi"], "task_key": [key], "task_row": [json.dumps(row)]})
    policy = ScriptedPolicy({"": [turn("hi")]})
    with pytest.raises(GymBridgeError, match="install the frobnicator"):
        make_rollout(policy=policy)(list(dataset["prompt"]) * 2, Trainer(smol_tokenizer, dataset=dataset))
    assert policy.calls == [], "no rollout may start when an environment refuses"


def test_a_batch_parses_routes_and_checks_its_rows_once(smol_tokenizer, turn, monkeypatch):
    """Issue 29 item 6: a row `load_dataset` parsed is not parsed again by a batch; a batch's new rows are
    routed once each and each environment checked ready once; a later batch of the same rows does none of it."""
    import gym_bridge.trl._rollout as trl_module
    import gym_bridge.trl._dataset as trl_dataset
    import gym_bridge.core.registry as registry
    import gym_bridge.core.task as task_module

    second_weather = {"responses_create_params": {"input": "Weather in Rome?"}, "environment": "weather"}
    rows = [{**row, "case": "parsed-once"} for row in [*ROWS, second_weather]]  # keys no other test registered
    counts = {"parsed": 0, "routed": 0, "ready": 0}

    def counting(key, real):
        def call(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(registry, "_route", counting("routed", registry._route))
    parse = counting("parsed", task_module.parse_task)
    for module in (task_module, trl_module, trl_dataset):
        monkeypatch.setattr(module, "parse_task", parse)
    for name in ("weather", "math"):
        monkeypatch.setattr(gym_bridge.get_environment(name), "check_ready", classmethod(lambda cls: counts.__setitem__("ready", counts["ready"] + 1)))
    own = load_dataset(rows)
    assert counts == {"parsed": 3, "routed": 3, "ready": 0}  # load_dataset: each row parsed and routed once
    rollout = make_rollout(policy=ScriptedPolicy({"": [turn("\\boxed{12}")] * 8}))
    trainer = Trainer(smol_tokenizer, dataset=own)
    counts.update(parsed=0, routed=0)
    run(rollout, prompts_of(own, group_size=2), trainer)
    # 6 prompts of 3 rows: no parse (today: 3), 3 routings, one readiness check per environment (today: one per row, 3)
    assert counts == {"parsed": 0, "routed": 3, "ready": 2}
    run(rollout, prompts_of(own, group_size=2), trainer)
    assert counts == {"parsed": 0, "routed": 3, "ready": 2}  # the same trainer's next batch: nothing again


def test_a_batch_converts_each_record_once(dataset, smol_tokenizer, turn, monkeypatch, tmp_path):
    """Issue 29 item 6: in one batch each record becomes its training row once (TRL's columns and the tool-call
    alarm read it) and its JSONL line once, only where one is written: a recipe's `on_records` writer alone
    (today: twice, the batch made every line for the alarm too), or `records_path`."""
    import gym_bridge.trl._rollout as trl_module
    from gym_bridge.core.health import HealthSettings
    from gym_bridge.core.record import RolloutRecord

    counts = {"training_row": 0, "line": 0}
    real_row, real_line = trl_module.to_training_row, RolloutRecord.to_dict

    def training_row(*args, **kwargs):
        counts["training_row"] += 1
        return real_row(*args, **kwargs)

    def line(self):
        counts["line"] += 1
        return real_line(self)

    monkeypatch.setattr(trl_module, "to_training_row", training_row)
    monkeypatch.setattr(RolloutRecord, "to_dict", line)
    prompts = prompts_of(dataset)  # 4 rows: weather x2, math x2
    written = []
    recipe_style = make_rollout(policy=ScriptedPolicy({"": [turn("No idea.")] * 8}), health=HealthSettings(no_tool_call_after=2),
                                on_records=lambda records: written.extend(record.to_dict() for record in records))
    trainer = Trainer(smol_tokenizer)
    out = recipe_style(prompts, trainer)
    assert counts == {"training_row": 4, "line": 4} and len(written) == 4 and len(out["prompt_ids"]) == 4
    # the alarm still reads each rollout: weather offers a tool and its 2 rollouts called none
    assert [message.split(":")[0] for message in recipe_style.prepare(trainer).alarm.alarms] == ["environment 'weather' offers tools, but none of its first 2 rollouts called one"]

    counts.update(training_row=0, line=0)
    path = tmp_path / "records.jsonl"
    to_file = make_rollout(policy=ScriptedPolicy({"": [turn("No idea.")] * 8}), records_path=str(path))
    to_file(prompts, Trainer(smol_tokenizer))
    assert counts == {"training_row": 4, "line": 4}
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    assert [(row["env"], row["metrics"]["train_step"]) for row in lines] == [("weather", None), ("weather", None), ("math", None), ("math", None)]
