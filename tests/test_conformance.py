"""One scripted trajectory through the three trainer paths: the same token ids, masks, log-probs and reward.

The weather task and a multi-turn script (a tool call, then an answer, each token with its own
log-prob) go through
- TRL: `gym_bridge.trl.make_rollout(policy=ScriptedPolicy)` with the stand-in trainer of
  `tests/trl/test_rollout.py`, read from the rows it returns (`prompt_ids`, `completion_ids`, `env_mask`,
  `logprobs`, `env_reward`);
- verl: `GymBridgeAgentLoop` built by verl 0.9.1's `AgentLoopWorker` from a `gym-bridge data to-verl`
  file, generating through verl's `LLMServerClient` against the scripted server stand-in, read from
  its `AgentLoopOutput`;
- NeMo RL's `/run`: `gym-bridge serve` against `gym-bridge serve-model` (scripted), read the way NeMo
  RL reads the result (`tests/support/invariants.py::nemo_rl_token_view`, `reward`).
The TRL and verl paths render with gym_bridge's template; on `/run` the model server renders each
prompt and keeps the prefix from the token ids sent back. All must agree exactly.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gym_bridge.serve.agent_server import AgentServerSettings, build_app
from gym_bridge.trl._rollout import make_rollout
from gym_bridge.trl._rewards import reward_metrics
from gym_bridge.trl._dataset import REGISTRY, load_dataset
from gym_bridge.core.policy import Generation, ScriptedPolicy
from gym_bridge.core.registry import get_environment, register
from gym_bridge.serve.model_server import build_app as build_model_app
from tests.trl.test_rollout import Trainer
from tests.support.http_server import app_in_thread
from tests.support.invariants import nemo_rl_token_view
from tests.support.scripted_model import ScriptedModel, by_turn

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seattle"}}\n</tool_call>'
BUDGET = 256


@pytest.fixture(scope="module")
def script(smol_tokenizer):
    def turn(text: str, first_logprob: float) -> Generation:
        ids = smol_tokenizer.encode(text, add_special_tokens=False) + [smol_tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[round(first_logprob - 0.013 * i, 6) for i in range(len(ids))], finish_reason="stop")

    return [turn(WEATHER_CALL, -0.05), turn("It is cold in Seattle today.", -0.4)]


@pytest.fixture(scope="module")
def row():
    row = json.loads(get_environment("weather").example_data.read_text().splitlines()[0])
    row["responses_create_params"].update(temperature=1.0, top_p=1.0, max_output_tokens=BUDGET)  # as NeMo RL stamps it
    return row


def via_trl(row, script, tokenizer) -> dict:  # script: the policy's generations in call order
    dataset = load_dataset([row])
    session = f"{REGISTRY.get(dataset['task_key'][0]).position}-0"
    rollout = make_rollout(policy=ScriptedPolicy({session: list(script)}))
    out = rollout(list(dataset["prompt"]), Trainer(tokenizer, num_generations=1, max_completion_length=BUDGET))
    return {"prompt_ids": out["prompt_ids"][0], "completion_ids": out["completion_ids"][0], "mask": out["env_mask"][0],
            "logprobs": out["logprobs"][0], "reward": out["env_reward"][0], "rewrites": out["harness_rewrites"][0]}


def via_verl(row, script, tokenizer, config, tmp_path, pick=None) -> dict:  # pick: prompt text -> generation
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    from gym_bridge.verl._agent_loop import GymBridgeDataset
    from gym_bridge.verl._data import write_verl_parquet
    from tests.verl.test_agent_loop import build_loop, sampling
    from tests.support.verl_stand_in import ScriptedServerClient, ScriptedVerlServer

    source = tmp_path / "row.jsonl"
    source.write_text(json.dumps(row) + "\n")
    data = write_verl_parquet([source], tmp_path / "row.parquet").output
    batch = DataProto.from_single_dict(collate_fn([GymBridgeDataset(str(data), tokenizer, config.data)[0]]))
    turns = by_turn(*script)
    server = ScriptedVerlServer(tokenizer, pick or (lambda text: turns(text, None)))
    worker = AgentLoopWorker(config, ScriptedServerClient(config, server))
    columns = {key: values[0] for key, values in batch.non_tensor_batch.items()}
    output = asyncio.run(build_loop(worker).run(sampling(config), **columns))
    return {"prompt_ids": output.prompt_ids, "completion_ids": output.response_ids, "mask": output.response_mask,
            "logprobs": output.response_logprobs, "reward": output.reward_score,
            "rewrites": output.extra_fields["reward_extra_info"]["gym_bridge_harness_rewrites"]}


def via_run(row, script, tokenizer, env: str = "weather", pick=None) -> dict:
    model = ScriptedModel(tokenizer, (lambda text, request: pick(text)) if pick else by_turn(*script))
    with app_in_thread(build_model_app(model, model_name="scripted")) as model_url:
        settings = AgentServerSettings(envs=(env,), model_base_urls=(model_url + "/v1",), model="scripted",
                                       max_completion_tokens=BUDGET, max_retries=0)
        with app_in_thread(build_app(settings)) as agent_url:
            answer = httpx.post(agent_url + "/run", json=row, timeout=60)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    view = nemo_rl_token_view(result)
    return {"prompt_ids": view["prompt_ids"], "completion_ids": view["completion_ids"], "mask": view["completion_mask"],
            "logprobs": view["completion_logprobs"], "reward": None if result["instance_config"]["mask_sample"] else result["reward"],
            "rewrites": result["metrics"]["verify"].get("rewrites", 0) if env != "weather" else 0}


def test_trl_verl_and_run_paths_agree(row, script, smol_tokenizer, verl_trainer_config, tmp_path):
    trl = via_trl(row, script, smol_tokenizer)
    verl = via_verl(row, script, smol_tokenizer, verl_trainer_config, tmp_path)
    run = via_run(row, script, smol_tokenizer)
    # the trajectory itself: two model turns around one tool output, reward 1
    assert trl["reward"] == 1.0 and trl["mask"].count(0) > 0 and trl["completion_ids"][-1] == smol_tokenizer.eos_token_id
    model_ids = [t for t, m in zip(trl["completion_ids"], trl["mask"]) if m]
    assert model_ids == script[0].token_ids + script[1].token_ids
    for name, other in (("verl", verl), ("/run", run)):
        for key in ("prompt_ids", "completion_ids", "mask", "logprobs", "reward"):
            assert other[key] == trl[key], f"{name} differs from TRL in {key}"


ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'


@pytest.fixture(scope="module")
def harness_script(smol_tokenizer):
    """The harness_example agent (`environments/harness_example/agent.py`, an `openai` tool loop run as a
    subprocess) calls the model twice: `add` then the answer."""
    def turn(text: str, first_logprob: float) -> Generation:
        ids = smol_tokenizer.encode(text, add_special_tokens=False) + [smol_tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[round(first_logprob - 0.011 * i, 6) for i in range(len(ids))], finish_reason="stop")

    return [turn(ADD_CALL, -0.07), turn("12 + 30 = 42", -0.3)]


@pytest.fixture(scope="module")
def harness_row():
    from environments.harness_example import HarnessExampleEnvironment

    register(HarnessExampleEnvironment)  # as its entry point does (an editable install made before it may lack it)
    row = json.loads(HarnessExampleEnvironment.example_data.read_text().splitlines()[0])
    row["responses_create_params"].update(temperature=1.0, top_p=1.0, max_output_tokens=BUDGET)
    return row


def test_a_harness_run_agrees_on_trl_verl_and_run(harness_row, harness_script, smol_tokenizer, verl_trainer_config, tmp_path):
    """TRL and verl capture in front of a token policy; `/run` in front of NeMo RL's chat policy, whose
    server renders each prompt and keeps the prefix from the token ids the capture session sends back."""
    trl = via_trl(harness_row, harness_script, smol_tokenizer)
    verl = via_verl(harness_row, harness_script, smol_tokenizer, verl_trainer_config, tmp_path)
    run = via_run(harness_row, harness_script, smol_tokenizer, env="harness_example")
    assert trl["reward"] == 1.0 and trl["mask"].count(0) > 0
    model_ids = [t for t, m in zip(trl["completion_ids"], trl["mask"]) if m]
    assert model_ids == harness_script[0].token_ids + harness_script[1].token_ids
    env_ids = [t for t, m in zip(trl["completion_ids"], trl["mask"]) if not m]
    assert '{"result": 42}' in smol_tokenizer.decode(env_ids)  # the agent ran its own tool
    for name, other in (("verl", verl), ("/run", run)):
        for key in ("prompt_ids", "completion_ids", "mask", "logprobs", "reward"):
            assert other[key] == trl[key], f"{name} differs from TRL in {key}"


SUMMARY = "Summary so far: add(12, 30) gave 42. What is 12 + 30?"


async def compacting_agent(client, task: dict) -> str:
    """Calls the model with the task, runs the tool, calls again, then drops everything but the system
    message and a summary (a history rewrite: a new token segment) and calls a third time."""
    messages, tools = list(task["messages"]), task["tools"]
    reply = (await client.chat.completions.create(model=task["model"], messages=messages, tools=tools)).choices[0].message
    call = reply.tool_calls[0]
    messages += [reply.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": '{"result": 42}'}]
    await client.chat.completions.create(model=task["model"], messages=messages, tools=tools)
    compacted = [messages[0], {"role": "user", "content": SUMMARY}]
    final = await client.chat.completions.create(model=task["model"], messages=compacted, tools=tools)
    return final.choices[0].message.content or ""


def test_a_harness_that_rewrites_its_history_trains_its_last_segment_on_every_path(
        harness_row, harness_script, smol_tokenizer, verl_trainer_config, tmp_path):
    """TRL and verl return one row per sample and `/run`'s calls must be contiguous for NeMo RL: every
    path gives the last segment (never re-tokenized), the rollout's reward, and counts the rewrite."""
    from environments.harness_example import HarnessExampleEnvironment

    class Compacting(HarnessExampleEnvironment):
        name = "compacting_harness"
        agent = compacting_agent

    register(Compacting)
    row = {**harness_row, "agent_ref": {"type": "responses_api_agents", "name": "compacting_harness"}}
    first, _ = harness_script

    def turn(text: str, first_logprob: float) -> Generation:
        ids = smol_tokenizer.encode(text, add_special_tokens=False) + [smol_tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[round(first_logprob - 0.01 * i, 6) for i in range(len(ids))], finish_reason="stop")

    note, last = turn("The tool said 42.", -0.2), turn("12 + 30 = 42", -0.1)

    def pick(text: str) -> Generation:
        return last if SUMMARY in text else note if "<|im_start|>tool" in text else first

    trl = via_trl(row, [first, note, last], smol_tokenizer)
    verl = via_verl(row, [], smol_tokenizer, verl_trainer_config, tmp_path, pick=pick)
    run = via_run(row, [], smol_tokenizer, env="compacting_harness", pick=pick)
    assert trl["reward"] == 1.0 and trl["rewrites"] == 1
    logged = reward_metrics([trl["reward"]], env_names=["compacting_harness"], reward_components=[{}], failure_kinds=[None],
                            harness_rewrites=[trl["rewrites"]])
    assert logged["gym_bridge/harness_rewrites"] == 1.0
    assert trl["completion_ids"] == last.token_ids and trl["mask"] == [1] * len(last.token_ids) and trl["logprobs"] == last.logprobs
    assert SUMMARY in smol_tokenizer.decode(trl["prompt_ids"]) and "<|im_start|>tool" not in smol_tokenizer.decode(trl["prompt_ids"])
    for name, other in (("verl", verl), ("/run", run)):
        for key in ("prompt_ids", "completion_ids", "mask", "logprobs", "reward", "rewrites"):
            assert other[key] == trl[key], f"{name} differs from TRL in {key}"
