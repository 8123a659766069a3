"""gym_bridge.nemo_rl (NeMo RL's native `EnvironmentInterface` way in) driven the way NeMo RL drives it.

NeMo RL is not installable here, so `run_native_rollout` below transcribes what
`nemo_rl/experience/rollouts.py::run_multi_turn_rollout` does each turn: append the generated
assistant message (`content` decoded with `skip_special_tokens=True`, its ids as `token_ids`), call
`env.step` with the logs reduced to `role`/`content` (`calculate_rewards`, via
`get_keys_from_message_log`), tokenize each observation's `content` with
`tokenizer(content, add_special_tokens=False)` and append it, add up `rewards`, drop samples whose
`terminateds` is set, and carry the returned `metadata` of the others into the next step. The
shapes are those of `nemo_rl/environments/interfaces.py` (`EnvironmentReturn`, `DatumSpec` in
`nemo_rl/data/interfaces.py`). The token stream NeMo RL assembles this way must equal the one
gym_bridge's engine produces for the same script.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch

import gym_bridge
from gym_bridge import Environment, VerifyResult, tool
from gym_bridge.nemo_rl._environment import EnvironmentReturn, GymBridgeEnvironment, datum_from_row
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import Generation, ScriptedPolicy
from gym_bridge.core.registry import get_environment
from gym_bridge.core.task import parse_task

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seattle"}}\n</tool_call>'


@gym_bridge.register
class CrashingLookup(Environment):
    name = "crashing_lookup"

    @tool
    def lookup(self, word: str) -> dict:
        """Look a word up.

        Args:
            word: The word.
        """
        raise RuntimeError("lookup service is down")

    def verify(self, task, output):
        return VerifyResult(reward=1.0)


def first_row(env: str) -> dict:
    return json.loads(get_environment(env).example_data.read_text().splitlines()[0])


def turn(tokenizer, text: str, logprob: float) -> Generation:
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Generation(token_ids=ids, logprobs=[logprob] * len(ids), finish_reason="stop")


def run_native_rollout(env, datums, generations, tokenizer, *, max_turns=8):
    """NeMo RL's multi-turn loop (see the module docstring); `generations[i]` are sample i's turns."""
    logs = [list(datum["message_log"]) for datum in datums]
    metadata = [datum["extra_env_info"] for datum in datums]
    final = [None] * len(datums)
    rewards = [0.0] * len(datums)
    active = list(range(len(datums)))
    for turn_index in range(max_turns):
        if not active:
            break
        for i in active:
            ids = generations[i][turn_index].token_ids
            logs[i].append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True), "token_ids": torch.tensor(ids)})
        result = env.step([[{"role": m["role"], "content": m["content"]} for m in logs[i]] for i in active], [metadata[i] for i in active])
        assert isinstance(result, EnvironmentReturn) and result.rewards.dtype == torch.float32 and result.terminateds.dtype == torch.bool
        still = []
        for k, i in enumerate(active):
            rewards[i] += float(result.rewards[k])
            content = result.observations[k]["content"]
            token_ids = tokenizer(content, return_tensors="pt", add_special_tokens=False).input_ids[0].to(torch.int64)
            logs[i].append({"role": result.observations[k]["role"], "content": content, "token_ids": token_ids})
            if bool(result.terminateds[k]):
                final[i] = result.metadata[k]
            else:
                metadata[i] = result.metadata[k]
                still.append(i)
        active = still
    return logs, rewards, final


def flat(log):
    """prompt ids, completion ids and the trainable mask NeMo RL derives from a message log."""
    prompt = log[0]["token_ids"].tolist()
    ids, mask = [], []
    for message in log[1:]:
        ids += message["token_ids"].tolist()
        mask += [int(message["role"] == "assistant")] * len(message["token_ids"])
    return prompt, ids, mask


def engine_tokens(row, generations, tokenizer, template):
    task = parse_task(row, index=0)
    policy = ScriptedPolicy({"": list(generations)})
    engine = Engine(policy, template, EngineConfig(limits=Limits(max_turns=8, max_completion_tokens=4096)))
    return asyncio.run(engine.rollout(task))


def test_weather_multi_step_and_math_in_one_batch_match_the_engine(smol_tokenizer, smol_template):
    tok = smol_tokenizer
    env = GymBridgeEnvironment({"max_turns": 8}, tokenizer=tok)
    scripts = {
        "weather": [turn(tok, WEATHER_CALL, -0.1), turn(tok, "It is cold in Seattle.", -0.2)],
        "multi_step": [turn(tok, f"<tool_call>\n{json.dumps({'name': 'get_synonym_value', 'arguments': {'synonym': w}})}\n</tool_call>", -0.3)
                       for w in ("Warm", "Blazing")]
                      + [turn(tok, '<tool_call>\n{"name": "extract_synonym_values", "arguments": {"synonym_values": [407, 711]}}\n</tool_call>', -0.4),
                         turn(tok, "Done.", -0.5)],
        "math": [turn(tok, "\\boxed{12}", -0.6)],
    }
    envs = list(scripts)
    rows = [first_row(name) for name in envs]
    datums = [datum_from_row(row, None, tok, 4096, idx) for idx, row in enumerate(rows)]
    for datum, row in zip(datums, rows):  # the DatumSpec shape NeMo RL's processors return
        assert set(datum) == {"message_log", "length", "extra_env_info", "loss_multiplier", "idx", "task_name"}
        assert datum["loss_multiplier"] == 1.0 and datum["length"] == len(datum["message_log"][0]["token_ids"])
    logs, rewards, final = run_native_rollout(env, datums, [scripts[name] for name in envs], tok)
    assert rewards == [1.0, 1.0, 1.0]
    for name, row, log, meta in zip(envs, rows, logs, final):
        assert meta["mask_sample"] is False and meta["failure_kind"] is None and meta["gym_bridge_reward"] == 1.0
        record = engine_tokens(row, scripts[name], tok, smol_template)
        prompt, ids, mask = flat(log)
        assert prompt == record.tokens.prompt_ids
        assert ids == record.tokens.completion_ids and mask == record.tokens.completion_mask
        assert log[-1] == {"role": "environment", "content": "", "token_ids": log[-1]["token_ids"]} and len(log[-1]["token_ids"]) == 0
    assert env.sessions == {}
    batch = {"total_reward": torch.tensor(rewards)}
    returned, metrics = env.global_post_process_and_metrics(batch)
    assert returned is batch
    assert metrics["gym_bridge/failed"] == 0.0 and metrics["gym_bridge/weather/reward"] == 1.0
    assert metrics["gym_bridge/num_turns"] == pytest.approx((2 + 4 + 1) / 3)
    assert env.global_post_process_and_metrics(batch)[1] == {}  # counted once


def test_a_failed_rollout_ends_the_sample_with_its_failure_kind(smol_tokenizer):
    tok = smol_tokenizer
    env = GymBridgeEnvironment({}, tokenizer=tok)
    row = {"responses_create_params": {"input": "Look up 'a'."}, "agent_ref": {"name": "crashing_lookup"}}
    datum = datum_from_row(row, None, tok, 4096, 0)
    call = turn(tok, '<tool_call>\n{"name": "lookup", "arguments": {"word": "a"}}\n</tool_call>', -0.1)
    logs, rewards, [meta] = run_native_rollout(env, [datum], [[call, call]], tok)
    assert rewards == [0.0] and meta["failure_kind"] == "env" and meta["mask_sample"] is True
    assert "lookup service is down" in meta["failure_reason"] and len(logs[0]) == 3  # prompt, the call, the empty final observation
    assert env.global_post_process_and_metrics(None)[1]["gym_bridge/failed/env"] == 1.0


def test_a_sample_nemo_rl_stops_stepping_is_ended_after_the_idle_timeout(smol_tokenizer):
    tok = smol_tokenizer
    env = GymBridgeEnvironment({"idle_timeout_s": 0.3}, tokenizer=tok)
    datum = datum_from_row(first_row("weather"), None, tok, 4096, 0)
    log = [{"role": "user", "content": datum["message_log"][0]["content"]}, {"role": "assistant", "content": WEATHER_CALL}]
    result = env.step([log], [datum["extra_env_info"]])
    assert result.terminateds.tolist() == [False] and len(env.sessions) == 1  # waits for the next turn ...
    time.sleep(0.6)  # ... which never comes (NeMo RL truncated the sample at max_seq_len)
    session = next(iter(env.sessions.values()))
    assert session.rollout.done() and session.rollout.result().failure_kind == "infra"


def test_bad_rows_and_overlong_prompts(smol_tokenizer):
    from gym_bridge.core.errors import DataError, UnknownEnvironmentError

    with pytest.raises(UnknownEnvironmentError, match="inventory"):
        datum_from_row({"prompt": "hi", "agent_ref": {"name": "inventory"}}, None, smol_tokenizer, 4096, 0)
    with pytest.raises(DataError, match="responses_create_params.input"):
        datum_from_row({"agent_ref": {"name": "math"}}, None, smol_tokenizer, 4096, 0)
    datum = datum_from_row({"gym_bridge_row": json.dumps(first_row("math"))}, None, smol_tokenizer, 8, 3)  # the verl-style column works too
    assert datum["loss_multiplier"] == 0.0 and len(datum["message_log"][0]["token_ids"]) == 4 and datum["idx"] == 3
    # what nemo_rl/data/datasets/response_datasets/nemogym_dataset.py::NemoGymDataset yields: the JSON line and a task name
    line = get_environment("math").example_data.read_text().splitlines()[1]
    datum = datum_from_row({"extra_env_info": line, "task_name": "nemo_rl-train"}, None, smol_tokenizer, 4096, 1)
    assert datum["task_name"] == "nemo_rl-train" and datum["extra_env_info"]["gym_bridge_row"] == json.loads(line)


def test_the_hook_imports_lazily_and_its_actor_is_a_ray_class():
    """`gym_bridge.nemo_rl` loads no torch, Ray or trainer on import (NeMo RL imports it in its driver
    and actors); `GymBridgeEnvironmentActor`, the class NeMo RL's `create_env` starts with
    `.options(...).remote(config)` (`nemo_rl/environments/utils.py`), is made with Ray on first use."""
    import subprocess
    import sys

    code = (
        "import sys, gym_bridge\n"
        "module = gym_bridge.nemo_rl\n"
        "print(','.join(m for m in ('torch', 'ray', 'verl', 'trl', 'transformers') if m in sys.modules))\n"
        "actor = module.GymBridgeEnvironmentActor\n"
        "print(hasattr(actor, 'remote') and hasattr(actor, 'options'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "" and out[1] == "True"


def test_the_tokenizer_comes_from_the_config_path(smol_tokenizer):
    """Issue 19 item 9: `GymBridgeEnvironment(config={"tokenizer": path})`, as NeMo RL's YAML gives it,
    loads that folder's tokenizer; it used to raise a TypeError unpacking the loaded tokenizer as a tuple."""
    from gym_bridge.policies.embedded import embedded_model_path

    env = GymBridgeEnvironment({"tokenizer": str(embedded_model_path())})
    assert env.eos_token_id == smol_tokenizer.eos_token_id
    assert env.template.tokenizer.encode("Seattle", add_special_tokens=False) == smol_tokenizer.encode("Seattle", add_special_tokens=False)
