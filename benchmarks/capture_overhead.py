"""What the capture endpoint adds to one model call of a harness.

An instant policy answers every call with the same canned token ids, so what is timed is the path
around generation. Two ways to make the same call, one at a time:

- direct:  what the default agent loop does in process per call: render the conversation with the
           embedded model's chat template, `policy.generate`, decode and parse the answer;
- capture: an `openai.AsyncOpenAI` client posts the conversation to the loopback capture endpoint
           (`gym_bridge.capture`), which validates it, renders, generates, parses, records the call
           and answers in OpenAI's shape; the client parses that answer.

The same two ways run once more against a model server, as in a remote-generation run: a
`RemotePolicy` on `benchmarks/stub_server.py` (vLLM's `/v1/completions` shape, answered at once, in
its own process). `remote_overhead_us_per_call` is then what the endpoint adds to a direct
`RemotePolicy` call (`--no-remote` skips this pair).

`overhead_us_per_call` is the median per-call time of capture minus that of direct. Each of
`--runs` runs makes `--calls` calls per way (after a warm-up) and yields a mean per call; the
report gives the median over runs with the min and max. The machine (`lscpu` model name, CPU
count) and the 1-minute load average are in the report: on a shared, loaded machine the spread is
wide. Run: `.venv/bin/python benchmarks/capture_overhead.py` (about half a minute). The last line
printed is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gym_bridge.capture.server import capture_server  # noqa: E402
from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession  # noqa: E402
from gym_bridge.core.agent_loop import Limits  # noqa: E402
from gym_bridge.core.policy import Generation, GenerationRequest, SamplingParams  # noqa: E402
from gym_bridge.core.template.chat_template import ChatTemplate  # noqa: E402
from gym_bridge.policies.embedded import load_embedded_tokenizer  # noqa: E402

MESSAGES: list[Any] = [{"role": "system", "content": "You are a careful assistant. Use the tools for arithmetic, then state the number."},
            {"role": "user", "content": "What is 12 + 30? Use the tools."}]
TOOLS: list[dict[str, Any]] = [{"type": "function", "name": "add", "description": "Add two numbers.",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}]
ANSWER = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'


class InstantPolicy:
    """A token policy that answers every request at once with the same generation."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    async def generate(self, request: GenerationRequest) -> Generation:
        return self.generation


def machine() -> dict[str, Any]:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "")
    except OSError:
        model = ""
    return {"cpu_model": model, "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}


async def direct_calls(template: ChatTemplate, policy: Any, sampling: SamplingParams, calls: int) -> float:
    """Mean seconds per in-process call: render, generate, decode, parse."""
    start = time.perf_counter()
    for _ in range(calls):
        prompt = template.prompt_ids(MESSAGES, TOOLS)
        generation = await policy.generate(GenerationRequest(prompt_ids=prompt, sampling=sampling))
        ids = generation.token_ids
        text = template.tokenizer.decode(ids[:-1], skip_special_tokens=False)
        template.parse(text, prompt_ids=prompt, tools=TOOLS)
    return (time.perf_counter() - start) / calls


async def capture_calls(template: ChatTemplate, policy: Any, sampling: SamplingParams, calls: int, *, expect_call: bool = True) -> float:
    """Mean seconds per call of an openai client through the capture endpoint (a fresh session per run)."""
    import openai

    session = CaptureSession(policy=policy, template=template, ledger=SessionLedger(sampling=sampling,
                             limits=Limits(max_turns=calls + 10, max_completion_tokens=10**9), model_name="policy", label="bench"))
    chat_tools: list[Any] = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in TOOLS]
    async with capture_server().session(session) as base_url:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=session.ledger.token, max_retries=0) as client:
            await client.chat.completions.create(model="policy", messages=MESSAGES, tools=chat_tools)  # connection warm-up
            start = time.perf_counter()
            for _ in range(calls):
                reply = await client.chat.completions.create(model="policy", messages=MESSAGES, tools=chat_tools)
                assert reply.choices[0].message.tool_calls or not expect_call, "the endpoint did not answer the scripted tool call"
            return (time.perf_counter() - start) / calls


def summary(values: list[float]) -> dict[str, float]:
    micros = [value * 1e6 for value in values]
    return {"median_us": round(statistics.median(micros), 1), "min_us": round(min(micros), 1), "max_us": round(max(micros), 1)}


async def main(runs: int, calls: int, *, remote: bool = True) -> dict[str, Any]:
    tokenizer = load_embedded_tokenizer()
    template = ChatTemplate(tokenizer)  # type: ignore[arg-type]  # a transformers tokenizer is one
    ids = tokenizer.encode(ANSWER, add_special_tokens=False) + [tokenizer.eos_token_id]
    policy = InstantPolicy(Generation(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop"))
    sampling = SamplingParams(max_new_tokens=64)
    await direct_calls(template, policy, sampling, 20)  # warm-up: the template's caches
    direct, capture = [], []
    for _ in range(runs):  # interleaved, so a burst of load hits both ways alike
        direct.append(await direct_calls(template, policy, sampling, calls))
        capture.append(await capture_calls(template, policy, sampling, calls))
    overheads = [c - d for c, d in zip(capture, direct)]
    report = {"benchmark": "capture_overhead", "runs": runs, "calls_per_run": calls, "machine": machine(),
              "direct_per_call": summary(direct), "capture_per_call": summary(capture), "overhead_per_call": summary(overheads),
              "overhead_us_per_call": round((statistics.median(capture) - statistics.median(direct)) * 1e6, 1)}
    if remote:
        report.update(await remote_pair(template, sampling, runs, calls))
    return report


async def remote_pair(template: ChatTemplate, sampling: SamplingParams, runs: int, calls: int) -> dict[str, Any]:
    """Direct `RemotePolicy` calls to the stub server against the same calls through the endpoint in front of it."""
    from gym_bridge.policies.remote import RemotePolicy

    stub = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / "stub_server.py"), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = stub.stdout.readline() if stub.stdout else ""
        if not line.startswith("serving "):
            raise SystemExit(f"the stub server did not start: {line!r}")
        policy = RemotePolicy(line.split(" at ")[-1].strip(), model="stub", request_timeout_s=60)
        try:
            await direct_calls(template, policy, sampling, 20)  # warm-up: the connection pool
            direct, capture = [], []
            for _ in range(runs):
                direct.append(await direct_calls(template, policy, sampling, calls))
                capture.append(await capture_calls(template, policy, sampling, calls, expect_call=False))
        finally:
            await policy.aclose()
    finally:
        stub.kill()
        stub.wait()
    overheads = [c - d for c, d in zip(capture, direct)]
    return {"remote_direct_per_call": summary(direct), "remote_capture_per_call": summary(capture),
            "remote_overhead_per_call": summary(overheads),
            "remote_overhead_us_per_call": round((statistics.median(capture) - statistics.median(direct)) * 1e6, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--no-remote", action="store_true", help="skip the pair against a RemotePolicy on the stub server")
    args = parser.parse_args()
    report = asyncio.run(main(args.runs, args.calls, remote=not args.no_remote))
    print(json.dumps(report))
