"""A stand-in for the trainer's vLLM server in async tests: `/v1/completions` token by token, `/pause?mode=keep`
and `/resume` as vLLM's dev-mode endpoints behave, `/collective_rpc` as `FileWeightReceiver` answers it, and a served
weight version (moved by the test or by each weight file loaded).

Each answer is decided from the decoded prompt: a weather question without a tool output yet gets a
`get_weather` call, anything else an answer `\\boxed{N}` (right for even-numbered calls, off by one
for odd ones, so groups have rewards that differ). Tokens come one at a time, `token_delay_s` apart;
while paused ("keep"), a running generation waits and resumes where it was. The log-prob of a token is
`-(version + 1) / 10` for the version it was sampled under, so a record shows which tokens a weight
sync touched.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

_SUM = re.compile(r"What is (\d+) ([+\-*×]) (\d+)\?")


class AsyncVLLMStandIn:
    def __init__(self, tokenizer: Any, *, token_delay_s: float = 0.0, model: str = "stub") -> None:
        self.tokenizer = tokenizer
        self.token_delay_s = token_delay_s
        self.model = model
        self.version = 1
        self.paused = False
        self.pauses: list[str] = []
        self.requests = 0
        self.loaded: list[list[str]] = []
        """The tensor names of each weight file loaded through `/collective_rpc`."""
        self.tokens_sent = 0
        self._resumed = asyncio.Event()
        self._counter = itertools.count()
        self.app = self._build()

    def logprob(self) -> float:
        return -(self.version + 1) / 10

    def answer(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids)
        if "weather" in text and "<|im_start|>tool" not in text:
            return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        questions = _SUM.findall(text)
        if not questions:
            return "It is cold in Paris."
        a, op, b = questions[-1]
        result = {"+": int(a) + int(b), "-": int(a) - int(b)}.get(op, int(a) * int(b))
        return f"\\boxed{{{result + next(self._counter) % 2}}}"

    async def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = list(body["prompt"])
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = self.tokenizer.encode(self.answer(prompt), add_special_tokens=False)[: int(body["max_tokens"]) - 1] + [eos]
        logprobs: list[float] = []
        for _ in ids:
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            while self.paused:
                self._resumed.clear()
                await self._resumed.wait()
            logprobs.append(self.logprob())
            self.tokens_sent += 1
        choice = {"index": 0, "text": self.tokenizer.decode(ids), "token_ids": ids, "prompt_token_ids": prompt,
                  "finish_reason": "stop", "logprobs": {"token_logprobs": logprobs, "tokens": [f"token_id:{i}" for i in ids]}}
        return {"id": "cmpl", "object": "text_completion", "model": self.model, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            self.requests += 1
            return JSONResponse(await self._generate(await request.json()))

        @app.post("/pause")
        async def pause(mode: str = "abort") -> JSONResponse:
            self.pauses.append(mode)
            if mode != "keep":
                return JSONResponse({"error": "this stand-in only keeps requests"}, status_code=400)
            self.paused = True
            return JSONResponse({})

        @app.post("/resume")
        async def resume() -> JSONResponse:
            self.paused = False
            self._resumed.set()
            return JSONResponse({})

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> JSONResponse:
            """What `FileWeightReceiver` does in vLLM, minus a model: read the file, take every tensor as a parameter, serve
            the new version."""
            body = await request.json()
            if body.get("method") != "gym_bridge_load_weights":
                return JSONResponse({"error": f"no method {body.get('method')}"}, status_code=500)
            path = body["args"][0]
            if not path:
                return JSONResponse({"results": [{"tensors": 0, "loaded": 0, "parameters": 0}]})
            from safetensors import safe_open

            with safe_open(path, "pt") as weights:
                names = list(weights.keys())
            self.loaded.append(names)
            self.version += 1
            return JSONResponse({"results": [{"tensors": len(names), "loaded": len(names), "parameters": len(names)}]})

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> JSONResponse:
            return JSONResponse({})

        @app.get("/health")
        async def health() -> JSONResponse:
            return JSONResponse({})

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "max_model_len": 4096}]})

        return app
