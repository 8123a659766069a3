"""serve-model over real HTTP on loopback (a tiny local model, uvicorn in a thread): the endpoints,
vLLM's token fields, batching across clients, bad requests, and RemotePolicy / ChatAPIPolicy
driving rollouts through it."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import GenerationRequest, SamplingParams
from gym_bridge.core.errors import ContextOverflowError
from gym_bridge.core.task import parse_task
from gym_bridge.policies.remote import RemotePolicy
from gym_bridge.policies.discovery import served_models
from gym_bridge.policies.transformers import TransformersPolicy
from gym_bridge.serve.model_server import build_app
from tests.support.http_server import app_in_thread
from tests.support.invariants import assert_token_invariants

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """(root URL, policy) of serve-model over the tiny model, with a 64 KiB request limit."""
    policy = TransformersPolicy.from_pretrained(tiny_model_dir, device="cpu", batch_wait_s=0.05)
    app = build_app(policy, model_name=MODEL, model_root=str(tiny_model_dir), max_request_bytes=64 * 1024)
    with app_in_thread(app) as url:
        yield url, policy


@pytest.fixture
def url(server):
    return server[0]


def post(url, path, body, **kwargs):
    return httpx.post(url + path, json=body, timeout=60, **kwargs)


def test_models_health_and_tokenize(url, tiny_model_dir, smol_tokenizer):
    [entry] = httpx.get(url + "/v1/models").json()["data"]
    assert (entry["id"], entry["root"], entry["max_model_len"]) == (MODEL, str(tiny_model_dir), 4096)
    assert httpx.get(url + "/health").json()["status"] == "ok"
    tokens = post(url, "/tokenize", {"prompt": "Hello world", "add_special_tokens": False}).json()
    assert tokens["tokens"] == smol_tokenizer.encode("Hello world", add_special_tokens=False) and tokens["count"] == len(tokens["tokens"])
    chat = post(url, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}).json()["tokens"]
    assert smol_tokenizer.decode(chat).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert post(url, "/detokenize", {"tokens": tokens["tokens"]}).json()["prompt"] == "Hello world"


def test_completions_return_vllm_token_fields(url):
    body = {"model": MODEL, "prompt": [1, 504, 3, 22], "max_tokens": 6, "temperature": 0, "logprobs": 1,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "n": 2}
    answer = post(url, "/v1/completions", body).json()
    first, second = answer["choices"]
    assert first["prompt_token_ids"] == [1, 504, 3, 22] and len(first["token_ids"]) == 6
    assert first["logprobs"]["tokens"] == [f"token_id:{token}" for token in first["token_ids"]]
    assert len(first["logprobs"]["token_logprobs"]) == 6 and first["finish_reason"] == "length"
    assert first["token_ids"] == second["token_ids"]  # greedy
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert first["logprobs_mode"] == "raw"


def test_text_prompts_stop_strings_and_seeds(url):
    base = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 7, "return_token_ids": True}
    one, two = (post(url, "/v1/completions", base).json()["choices"][0] for _ in range(2))
    assert one["token_ids"] == two["token_ids"]  # the same seed samples the same ids
    stop = post(url, "/detokenize", {"tokens": one["token_ids"][5:6]}).json()["prompt"].strip()[:3]  # text of the 6th token
    assert stop and len(one["token_ids"]) == 12
    stopped = post(url, "/v1/completions", {**base, "stop": [stop]}).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop and stop not in stopped["text"]
    assert len(stopped["token_ids"]) < 12 and stopped["token_ids"] == one["token_ids"][: len(stopped["token_ids"])]
    kept = post(url, "/v1/completions", {**base, "stop": stop, "include_stop_str_in_output": True}).json()["choices"][0]
    assert kept["text"].endswith(stop) and kept["token_ids"] == stopped["token_ids"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": [1, 2], "temperature": -1}, 400, "temperature"),
        ({"prompt": [1, 2], "top_p": 0}, 400, "top_p"),
        ({"prompt": [1, "x", 2]}, 400, "invalid request"),
        ({"prompt": []}, 400, "prompt is empty"),
        ({"prompt": [10**9]}, 400, "token ids must be in"),
        ({"prompt": [1, 2], "n": 1000}, 400, "n:"),
        ({"prompt": [1, 2], "stream": True}, 400, "stream=true is not supported"),
        ({"prompt": [1, 2], "repetition_penalty": 1.3}, 400, "repetition_penalty=1.3 is not supported"),
        ({"prompt": [1, 2], "logprobs_mode": "weird"}, 400, "logprobs_mode must be"),
        ({"prompt": [1, 2], "stop": ["x" * 1000]}, 400, "stop strings must have 1 to 256 characters"),
        ({"prompt": [1, 2], "seed": -1}, 400, "seed"),
        ({"prompt": [1, 2], "model": "other"}, 404, "The model `other` does not exist"),
        ({"max_tokens": 3}, 400, "prompt: Field required"),
        ({"prompt": [1] * 4000, "max_tokens": 200}, 400, "maximum context length is 4096 tokens"),
    ],
)
def test_bad_requests_get_400_with_a_message(url, body, status, message):
    response = post(url, "/v1/completions", body)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_malformed_and_oversized_bodies(url):
    garbage = httpx.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert garbage.status_code == 400 and "not valid JSON" in garbage.json()["error"]["message"]
    assert httpx.post(url + "/v1/completions", content=b"[1, 2]").status_code == 400
    huge = post(url, "/v1/completions", {"prompt": [1] * 40_000})
    assert huge.status_code == 413 and "larger than 65536 bytes" in huge.json()["error"]["message"]

    def chunks():  # no content-length: the limit holds for streamed bodies too
        yield b'{"prompt": ['
        for _ in range(20_000):
            yield b"1, 1, "
        yield b"1]}"

    assert httpx.post(url + "/v1/completions", content=chunks()).status_code == 413
    assert httpx.get(url + "/health").status_code == 200  # and the server is fine


def test_requests_from_many_clients_are_batched(server):
    url, policy = server
    before = policy.model.generate
    sizes = []

    def counting(*args, **kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        return before(*args, **kwargs)

    policy.model.generate = counting
    try:
        async def clients():
            async with httpx.AsyncClient(timeout=60) as client:
                bodies = [{"prompt": [1, 2, 3 + i], "max_tokens": 4, "temperature": 0} for i in range(8)]
                return await asyncio.gather(*(client.post(url + "/v1/completions", json=body) for body in bodies))

        responses = asyncio.run(clients())
    finally:
        policy.model.generate = before
    assert all(response.status_code == 200 for response in responses)
    assert max(sizes) > 1 and sum(sizes) == 8  # 8 requests in fewer generate calls


def test_processed_logprobs_per_request(url):
    body = {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 2.0, "seed": 1, "logprobs": 0, "return_token_ids": True}
    raw = post(url, "/v1/completions", body).json()["choices"][0]
    processed = post(url, "/v1/completions", {**body, "logprobs_mode": "processed"}).json()["choices"][0]
    assert raw["token_ids"] == processed["token_ids"] and processed["logprobs_mode"] == "processed"
    assert raw["logprobs"]["token_logprobs"] != processed["logprobs"]["token_logprobs"]


def test_chat_completions_parse_tool_calls(url, smol_tokenizer):
    """A scripted model reply (through /v1/completions' sibling logic) is hard with a random model, so the
    message parsing is checked on the chat endpoint's fields and on `_assistant_message` directly."""
    from gym_bridge.core.dialects.chat import answer_choice
    from gym_bridge.core.template.chat_template import ChatTemplate
    from gym_bridge.serve.model_server import _assistant_message

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Look up a."}], "tools": tools, "max_tokens": 5,
            "temperature": 0, "logprobs": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
    answer = post(url, "/v1/chat/completions", body).json()
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == 5 and [entry["token"] for entry in choice["logprobs"]["content"]] == [
        f"token_id:{token}" for token in choice["token_ids"]]
    assert "lookup" in smol_tokenizer.decode(answer["prompt_token_ids"])  # the tools reached the prompt

    template, prompt, schemas = ChatTemplate(smol_tokenizer), answer["prompt_token_ids"], [{"name": "lookup"}]
    text = 'Sure.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "a"}}\n</tool_call>'
    message = _assistant_message(template, text, prompt_ids=prompt, tools=schemas)
    assert answer_choice(0, message, "stop")["finish_reason"] == "tool_calls" and message["content"] == "Sure."
    assert message["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"word": "a"}'}
    message = _assistant_message(template, "<tool_call>{bad</tool_call>", prompt_ids=prompt, tools=schemas)
    assert answer_choice(0, message, "stop")["finish_reason"] == "stop"
    assert message["tool_calls"] == [] and message["content"] == "<tool_call>{bad</tool_call>"


def test_chat_history_with_tool_calls_renders_like_the_engine(url, smol_template):
    messages = [{"role": "user", "content": "Look up a."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "a"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": '{"value": 4}'}]
    served = post(url, "/tokenize", {"messages": messages}).json()["tokens"]
    text = smol_template.tokenizer.decode(served)
    assert '<tool_call>\n{"name": "lookup", "arguments": {"word": "a"}}\n</tool_call>' in text
    assert text.endswith('<|im_start|>tool\n{"value": 4}<|im_end|>\n<|im_start|>assistant\n')


def test_remote_policy_over_real_http(url):
    policy = RemotePolicy(url, model=MODEL, request_timeout_s=30)

    async def run():
        requests = [GenerationRequest(prompt_ids=[1, 2, 3 + i], sampling=SamplingParams(temperature=0, max_new_tokens=5),
                                      session_id=str(i)) for i in range(4)]
        generations = await asyncio.gather(*(policy.generate(request) for request in requests))
        with pytest.raises(ContextOverflowError, match="maximum context length"):
            await policy.generate(GenerationRequest(prompt_ids=[1] * 4095, sampling=SamplingParams(max_new_tokens=5)))
        models = await served_models(url)
        await policy.aclose()
        return generations, models

    generations, models = asyncio.run(run())
    assert [len(generation.token_ids) for generation in generations] == [5] * 4
    assert models[0]["id"] == MODEL


def test_rollouts_through_serve_model_keep_the_token_invariants(url, smol_template):
    policy = RemotePolicy(url, model=MODEL, request_timeout_s=30)
    tasks = [parse_task({"prompt": f"What is {i}+1?", "environment": "math", "expected_answer": str(i + 1)}, index=i) for i in range(3)]
    config = EngineConfig(sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=0))

    async def run():
        records = [record async for record in Engine(policy, smol_template, config).stream(tasks, repeats=2)]
        await policy.aclose()
        return records

    records = asyncio.run(run())
    assert len(records) == 6
    for record in records:
        assert record.failure_kind is None, record.failure_reason
        assert_token_invariants(record.to_dict())
        assert sum(record.tokens.completion_mask) > 0


def test_chat_api_policy_through_serve_model(url):
    from gym_bridge.policies.chat_api import ChatAPIPolicy

    policy = ChatAPIPolicy(model=MODEL, base_url=url + "/v1", api="chat", request_timeout_s=30, max_retries=0)
    tasks = [parse_task({"prompt": "What is 1+1?", "environment": "math", "expected_answer": "2"}, index=0)]
    config = EngineConfig(sampling=SamplingParams(temperature=0, max_new_tokens=6))

    async def run():
        records = [record async for record in Engine(policy, None, config).stream(tasks)]
        await policy.aclose()
        return records

    [record] = asyncio.run(run())
    assert record.failure_kind is None and record.mask_sample is False
    assert record.tokens.completion_ids == [] and record.output[-1]["type"] == "message"
    row = record.to_dict()
    assert row["response"]["usage"]["output_tokens"] == 6
    json.dumps(row)


def test_eval_cli_against_serve_model_and_its_bad_inputs(url, tmp_path, capsys):
    from gym_bridge.cli import main
    from gym_bridge.core.rollout_file import read_records

    common = ["eval", "--env", "weather", "--limit", "1", "--max-new-tokens", "8", "--max-turns", "2", "--no-progress"]
    # the model name and the tokenizer (the served model's root folder) come from the server
    assert main([*common, "--base-url", url, "--output", str(tmp_path / "a.jsonl")]) == 0
    [record] = read_records(tmp_path / "a.jsonl")
    assert record["response"]["model"] == MODEL and record["failure_kind"] is None
    assert_token_invariants(record)

    # a chat API run: no tokens in the records
    assert main([*common, "--base-url", url + "/v1", "--api", "chat", "--model", MODEL, "--output", str(tmp_path / "c.jsonl")]) == 0
    [record] = read_records(tmp_path / "c.jsonl")
    assert record["tokens"]["completion_ids"] == [] and record["failure_kind"] is None

    capsys.readouterr()
    assert main([*common, "--base-url", url, "--model", "nope", "--output", str(tmp_path / "b.jsonl")]) == 2
    assert "does not serve --model 'nope'; it serves ['tiny']" in capsys.readouterr().err
    assert main([*common, "--base-url", url, "--api", "responses", "--output", str(tmp_path / "b.jsonl")]) == 2
    assert "needs exactly one --base-url and --model NAME" in capsys.readouterr().err


def test_eval_cli_with_an_unreachable_server(tmp_path, capsys):
    import socket

    from gym_bridge.cli import main
    from gym_bridge.core.rollout_file import read_records

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    common = ["eval", "--env", "math", "--limit", "2", "--base-url", dead, "--request-timeout-s", "1", "--max-retries", "1",
              "--no-progress", "--wait-for-server-s", "0.5", "--overwrite", "--output", str(tmp_path / "o.jsonl")]
    assert main(common) == 2
    err = capsys.readouterr().err
    assert f"no server answers at {dead}" in err and "start it first" in err and "--model NAME" not in err  # issue 19 item 18
    assert main([*common, "--model", "m"]) == 3  # known name: the rollouts fail as infra, counted in the summary (exit 3)
    captured = capsys.readouterr()
    assert "failures: infra=2" in captured.out and "rollouts will fail as `infra`" in captured.err
    assert all(record["failure_kind"] == "infra" and record["mask_sample"] for record in read_records(tmp_path / "o.jsonl"))


def test_eval_cli_refuses_a_tokenizer_that_does_not_match_the_server(tmp_path, capsys):
    from fastapi import FastAPI

    from gym_bridge.cli import main

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "org/other-model", "object": "model"}]}

    @app.post("/tokenize")
    async def tokenize():
        return {"count": 3, "tokens": [1, 2, 3], "max_model_len": 100}

    with app_in_thread(app) as other:
        code = main(["eval", "--env", "math", "--limit", "1", "--base-url", other, "--no-progress", "--output", str(tmp_path / "o.jsonl")])
    assert code == 2
    assert "the embedded SmolLM2 tokenizer does not tokenize like the server's model 'org/other-model'" in capsys.readouterr().err


class _ScriptedModel:
    """serve-model's policy with the tiny model's tokenizer and config but canned turns (a random model
    writes no tool call): `generate` pops the next scripted generation."""

    def __init__(self, policy, turns):
        self.tokenizer, self.model, self.eos_token_ids = policy.tokenizer, policy.model, policy.eos_token_ids
        self.turns = list(turns)

    async def generate(self, request):
        return self.turns.pop(0)


def test_one_model_answers_alike_through_serve_model_and_the_capture_endpoint(server, turn):
    """The same sampled turns, answered by serve-model's chat route and by a capture session over the same
    template: the same content, reasoning and calls (both read the turn with the model family's parsers
    and answer by one rule; ids differ by design). On main serve-model read calls with the generic parser
    and answered a malformed call as its text, capture dropped it."""
    from gym_bridge.capture.ledger import SessionLedger
    from gym_bridge.capture.session import CaptureSession
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.policy import ScriptedPolicy
    from gym_bridge.core.template.chat_template import ChatTemplate

    texts = ['Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "a"}}\n</tool_call>',
             "<tool_call>{bad</tool_call>",
             'Two.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "a"}}\n</tool_call>\n<tool_call>{bad</tool_call>',
             "The word is a."]
    _, policy = server
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]

    def shape(message):
        calls = [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in message.get("tool_calls") or []]
        return message["content"], message.get("reasoning_content"), calls

    served = []
    app = build_app(_ScriptedModel(policy, [turn(text) for text in texts]), model_name=MODEL)
    with app_in_thread(app) as url:
        for _ in texts:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "Look up a."}], "tools": tools, "max_tokens": 64}
            answer = post(url, "/v1/chat/completions", body).json()["choices"][0]
            served.append((shape(answer["message"]), answer["finish_reason"]))

    template = ChatTemplate(policy.tokenizer, eos_token_ids=sorted(policy.eos_token_ids))

    async def captured():
        session = CaptureSession(policy=ScriptedPolicy({"": [turn(text) for text in texts]}), template=template,
                                 ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=64),
                                                      limits=Limits(), model_name=MODEL, label="t"))
        out = []
        for _ in texts:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "Look up a."}], "tools": tools}
            answer = (await session.chat_completions(body))["choices"][0]
            out.append((shape(answer["message"]), answer["finish_reason"]))
        return out

    assert served == asyncio.run(captured())
    # the call is a call, a turn with a malformed call is answered as written, plain text is content
    assert served[0] == (("Let me look.", None, [("lookup", {"word": "a"})]), "tool_calls")
    assert served[1] == (("<tool_call>{bad</tool_call>", None, []), "stop")
    assert served[3] == (("The word is a.", None, []), "stop")
