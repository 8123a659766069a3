"""An instant stand-in for `vllm serve`: `/v1/completions` in vLLM's response shape, no model.

    .venv/bin/python benchmarks/stub_server.py [--port 0] [--tokenizer DIR]   # prints "serving stub at URL"

Each turn is decided from the prompt ids alone, as a model would: the prompt is decoded, the tool
outputs in it are counted, and the next turn is a tool call or an answer. Rows of the `weather`
environment get one `get_weather` call, then an answer; rows of `multi_step` get one
`get_synonym_value` call per synonym listed in the prompt, then `extract_synonym_values` with the
values read back from the tool outputs, then an answer. So every rollout earns reward 1.

Answers follow vLLM's wire format field by field (`text`, `logprobs` with `text_offset`,
`token_logprobs`, `tokens` as `token_id:N` when `return_tokens_as_token_ids`, `top_logprobs` with
`logprobs + 1` entries, `prompt_token_ids` and `token_ids` only when `return_token_ids`, `usage`), so
a client pays here exactly what it would pay against vLLM. `GET /v1/models`, `POST /tokenize` and
`GET /health` answer as vLLM's do. It is a benchmark tool: one process, aiohttp, orjson.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import sys
import time
from pathlib import Path

import orjson
from aiohttp import web
from tokenizers import Tokenizer

MODEL_NAME = "stub"
MAX_MODEL_LEN = 32768
_SYNONYMS = re.compile(r"in this order: ([^.]+)\. Then")
_VALUE = re.compile(r'"synonym_value": (\d+)')
_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)
_CITY = re.compile(r"\b(?:in|to|for) ([A-Z][\w'-]*(?: [A-Z][\w'-]*)*)")


def _call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{orjson.dumps({'name': name, 'arguments': arguments}).decode()}\n</tool_call>"


class Stub:
    """Decides turns and renders vLLM-shaped answers with one tokenizer."""

    def __init__(self, tokenizer_dir: Path, *, tool_marker: str = "<|im_start|>tool\n", eos_token: str = "<|im_end|>") -> None:
        self.tokenizer_dir = tokenizer_dir
        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.tool_marker = tool_marker
        eos = self.tokenizer.token_to_id(eos_token)
        if eos is None:
            raise SystemExit(f"the tokenizer in {tokenizer_dir} has no {eos_token!r} token")
        self.eos_id = eos
        self.requests = 0
        self._ids = itertools.count()

    def next_turn(self, prompt_ids: list[int]) -> str:
        """The text a scripted model writes next, from what the prompt holds."""
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        tool_outputs = text.count(self.tool_marker)
        if '"get_synonym_value"' in text:
            found = _SYNONYMS.search(text)
            synonyms = [word.strip() for word in found.group(1).split(",")] if found else []
            if tool_outputs < len(synonyms):
                return _call("get_synonym_value", {"synonym": synonyms[tool_outputs]})
            if tool_outputs == len(synonyms):
                return _call("extract_synonym_values", {"synonym_values": [int(v) for v in _VALUE.findall(text)]})
            return "I submitted the values."
        users = _USER.findall(text)
        city_match = _CITY.search(users[-1]) if users else None
        city = city_match.group(1) if city_match else "Paris"
        if '"get_weather"' in text and tool_outputs == 0:
            return _call("get_weather", {"city": city})
        return f"It is cold in {city}, so wear a coat."

    def completion(self, body: dict) -> dict:
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(type(token) is int for token in prompt):
            raise web.HTTPBadRequest(text='{"error": {"message": "this stub takes a prompt of token ids"}}', content_type="application/json")
        max_tokens = int(body.get("max_tokens") or 16)
        if len(prompt) + max_tokens > MAX_MODEL_LEN:
            message = f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested {len(prompt) + max_tokens} tokens."
            raise web.HTTPBadRequest(text=orjson.dumps({"error": {"message": message, "code": 400}}).decode(), content_type="application/json")
        text = self.next_turn(prompt)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids + [self.eos_id]
        finish_reason = "stop"
        if len(ids) > max_tokens:
            ids, finish_reason = ids[:max_tokens], "length"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        logprobs_wanted = body.get("logprobs")
        choice: dict = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None,
                        "prompt_logprobs": None}
        if logprobs_wanted is not None:
            values = [-0.05 - 0.01 * (i % 7) for i in range(len(ids))]
            if body.get("return_tokens_as_token_ids"):
                tokens = [f"token_id:{token}" for token in ids]
            else:
                tokens = [self.tokenizer.decode([token], skip_special_tokens=False) for token in ids]
            offsets, position = [], 0
            for token in tokens:
                offsets.append(position)
                position += len(token)
            extra = max(0, int(logprobs_wanted))  # vLLM lists the sampled token plus the top `logprobs` ones
            choice["logprobs"] = {
                "text_offset": offsets, "token_logprobs": values, "tokens": tokens,
                "top_logprobs": [{token: value, **({f"token_id:{self.eos_id}": -20.0} if extra else {})}
                                 for token, value in zip(tokens, values)],
            }
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt
            choice["token_ids"] = ids
        self.requests += 1
        return {
            "id": f"cmpl-{next(self._ids):032x}", "object": "text_completion", "created": int(time.time()), "model": MODEL_NAME,
            "choices": [choice], "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(ids), "completion_tokens": len(ids),
                      "prompt_tokens_details": None},
            "kv_transfer_params": None,
        }


def build_app(stub: Stub, *, delay_s: float = 0.0) -> web.Application:
    def json_response(data: object) -> web.Response:
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def completions(request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise web.HTTPBadRequest(text='{"error": {"message": "body is not JSON"}}', content_type="application/json") from None
        if delay_s:
            await asyncio.sleep(delay_s)
        return json_response(stub.completion(body))

    async def models(request: web.Request) -> web.Response:
        entry = {"id": MODEL_NAME, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                 "root": str(stub.tokenizer_dir), "parent": None, "max_model_len": MAX_MODEL_LEN}
        return json_response({"object": "list", "data": [entry]})

    async def tokenize(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        tokens = stub.tokenizer.encode(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True))).ids
        return json_response({"count": len(tokens), "max_model_len": MAX_MODEL_LEN, "tokens": tokens, "token_strs": None})

    async def health(request: web.Request) -> web.Response:
        return json_response({"requests": stub.requests})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--tokenizer", default=None, help="folder with tokenizer.json (default: the embedded SmolLM2's)")
    parser.add_argument("--delay-s", type=float, default=0.0, help="wait this long before each completion (a slower model)")
    args = parser.parse_args()
    if args.tokenizer is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from gym_bridge.policies.embedded import embedded_model_path

        tokenizer_dir = embedded_model_path()
    else:
        tokenizer_dir = Path(args.tokenizer)
    stub = Stub(tokenizer_dir)

    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app = build_app(stub, delay_s=args.delay_s)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, args.host, args.port, backlog=4096)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    print(f"serving {MODEL_NAME} at http://{args.host}:{port}/v1", flush=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        loop.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        loop.run_until_complete(runner.cleanup())


if __name__ == "__main__":
    main()
