"""A rollout generated over HTTP is the same rollout as in-process: records byte-identical.

A server on loopback (FastAPI under uvicorn) answers `/v1/completions` in vLLM's shape from a script
of token ids and log-probs, picking each rollout's next turn from the prompt ids it is sent. The
same script in a `ScriptedPolicy` runs the same tasks in-process. Both runs go through `run_eval`,
so the comparison is of the JSONL lines a user gets: every field (tokens, masks, log-probs, token
fields of the items, rewards) must be equal byte for byte; only the measured latency differs.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import Generation, SamplingParams, ScriptedPolicy
from gym_bridge.core.rollout_file import read_records
from gym_bridge.core.task import load_tasks
from gym_bridge.eval.run import run_eval
from gym_bridge.policies.remote import RemotePolicy
from tests.support.http_server import app_in_thread
from tests.support.invariants import assert_token_invariants

REPEATS = 2


def _scripts(tasks, template, turn):
    """Per task: its first prompt's ids and the turns a model that does everything right writes."""
    scripts = {}
    for task in tasks:
        if task.get("expected_synonyms") is None:  # a weather row
            texts = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', "It is cold in Oslo."]
        else:
            words = task.get("expected_synonyms")
            texts = [f'<tool_call>\n{{"name": "get_synonym_value", "arguments": {{"synonym": "{word}"}}}}\n</tool_call>' for word in words]
            texts.append(f'<tool_call>\n{{"name": "extract_synonym_values", "arguments": {{"synonym_values": {task.get("expected_synonym_values")}}}}}\n</tool_call>')
            texts.append("I submitted the values.")
        generations = []
        for number, text in enumerate(texts):
            generation = turn(text)
            # log-probs that need every digit to survive the trip: thirds and sevenths, different per turn
            logprobs = [-(i % 5 + 1) / 3 - number / 7 for i in range(len(generation.token_ids))]
            generations.append(Generation(token_ids=generation.token_ids, logprobs=logprobs, finish_reason="stop"))
        scripts[tuple(template.prompt_ids(task.messages, task.tools))] = generations
    return scripts


def _server(scripts, eos_id, texts):
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        body = await request.json()
        prompt = body["prompt"]
        first = next(ids for ids in scripts if tuple(prompt[: len(ids)]) == ids)
        # each earlier turn added two EOS ids: the model's own and the one closing the tool output after it
        generation = scripts[first][prompt[len(first):].count(eos_id) // 2]
        ids = generation.token_ids
        choice = {"index": 0, "text": texts[id(generation)], "finish_reason": "stop", "stop_reason": None,
                  "logprobs": {"text_offset": list(range(len(ids))), "token_logprobs": generation.logprobs,
                               "tokens": [f"token_id:{token}" for token in ids],
                               "top_logprobs": [{f"token_id:{token}": value} for token, value in zip(ids, generation.logprobs)]}}
        if body.get("return_token_ids"):
            choice.update(prompt_token_ids=prompt, token_ids=ids)
        return {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}}

    return app


def test_remote_records_are_byte_identical_to_in_process_ones(tmp_path, smol_tokenizer, smol_template, turn):
    tasks = load_tasks("environments/multi_step/data/example.jsonl") + load_tasks("environments/weather/data/example.jsonl", start_index=8)
    scripts = _scripts(tasks, smol_template, turn)
    eos = smol_tokenizer.eos_token_id
    texts = {id(generation): smol_tokenizer.decode(generation.token_ids[:-1]) for generations in scripts.values() for generation in generations}
    config = EngineConfig(sampling=SamplingParams(temperature=1.0, max_new_tokens=128), max_concurrency=8, model_name="m")
    local = ScriptedPolicy({
        f"{task.index}-{repeat}": list(scripts[tuple(smol_template.prompt_ids(task.messages, task.tools))])
        for task in tasks for repeat in range(REPEATS)
    })

    async def run(policy, output):
        await run_eval(Engine(policy, smol_template, config), tasks, output=output, num_repeats=REPEATS)
        if isinstance(policy, RemotePolicy):
            await policy.aclose()

    asyncio.run(run(local, tmp_path / "local.jsonl"))
    with app_in_thread(_server(scripts, eos, texts)) as url:
        asyncio.run(run(RemotePolicy(url, model="m", request_timeout_s=60, max_retries=0), tmp_path / "remote.jsonl"))

    def lines(path):
        records = sorted(read_records(path), key=lambda record: (record["task_index"], record["repeat_index"]))
        for record in records:
            assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]
            assert_token_invariants(record)
            record["metrics"].pop("latency_s")
        return [json.dumps(record) for record in records]

    mine, theirs = lines(tmp_path / "remote.jsonl"), lines(tmp_path / "local.jsonl")
    assert len(mine) == len(tasks) * REPEATS == 32
    assert mine == theirs
    tool_calls = [json.loads(line)["metrics"]["tool_calls"] for line in mine]
    assert max(tool_calls) >= 3 and min(tool_calls) == 1  # multi-turn multi_step rollouts and one-call weather ones
