"""Generation backends: batched vs one-at-a-time throughput of the transformers policy, and what the
remote client adds per request.

    .venv/bin/python benchmarks/backends.py [--max-new-tokens 32] [--repeats 3] [--overhead-requests 30]

1. The embedded SmolLM2-135M-Instruct on the CPU, greedy, `--max-new-tokens` per request, prompts
   that ask for long answers. At concurrency C (1, 8, 32) the same C prompts run all at once (the
   policy batches them into one `generate`) and C other prompts one after the other, alternately,
   `--repeats` times, every prompt distinct; tokens/s is generated tokens / wall seconds, reported as
   the median over the repeats with `_min`/`_max`.
2. `gym-bridge serve-model` in a subprocess with the same model; one-token greedy requests go
   alternately through `RemotePolicy` (HTTP on loopback) and straight to an in-process policy.
   The median of the paired latency differences is what the client, HTTP and the server add per request.
The last line printed is JSON with `batched_tokens_per_s_c{1,8,32}`, `sequential_tokens_per_s_c{1,8,32}`,
`batch_speedup_c{1,8,32}` and `remote_overhead_ms`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gym_bridge.core.policy import GenerationRequest, SamplingParams  # noqa: E402
from gym_bridge.core.template.chat_template import ChatTemplate  # noqa: E402
from gym_bridge.policies.remote import RemotePolicy  # noqa: E402
from gym_bridge.policies.transformers import TransformersPolicy  # noqa: E402
from tests.support.http_server import ServeModelProcess  # noqa: E402

CONCURRENCY = (1, 8, 32)
TOPICS = ["the sea", "a city at night", "an old clock", "a mountain village", "a robot", "autumn", "a library", "the moon"]
STYLES = ["a long story about", "a detailed essay on", "a long poem about", "a travel diary entry about"]


def prompts(template: ChatTemplate, count: int, draft: int) -> list[list[int]]:
    texts = [f"Write {style} {topic} (draft {draft})." for style in STYLES for topic in TOPICS][:count]
    return [template.prompt_ids([{"role": "user", "content": text}], None) for text in texts]


async def batched(policy: TransformersPolicy, requests: list[GenerationRequest]) -> tuple[int, float]:
    started = time.perf_counter()
    generations = await asyncio.gather(*(policy.generate(request) for request in requests))
    return sum(len(g.token_ids) for g in generations), time.perf_counter() - started


async def sequential(policy: TransformersPolicy, requests: list[GenerationRequest]) -> tuple[int, float]:
    started = time.perf_counter()
    tokens = 0
    for request in requests:
        tokens += len((await policy.generate(request)).token_ids)
    return tokens, time.perf_counter() - started


async def latencies_ms(policy, requests: list[GenerationRequest]) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for request in requests:
        started = time.perf_counter()
        await policy.generate(request)
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overhead-requests", type=int, default=30)
    args = parser.parse_args()

    policy = TransformersPolicy.from_pretrained(None, device="cpu", max_batch_size=max(CONCURRENCY))
    template = ChatTemplate(policy.tokenizer, eos_token_ids=sorted(policy.eos_token_ids))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    all_prompts = prompts(template, max(CONCURRENCY), draft=0)
    results: dict[str, float] = {}
    asyncio.run(sequential(policy, [GenerationRequest(prompt_ids=all_prompts[0], sampling=greedy)]))  # warm-up
    for concurrency in CONCURRENCY:
        rates_b, rates_s = [], []
        for repeat in range(args.repeats):
            drafts = (prompts(template, concurrency, draft=1 + 2 * repeat), prompts(template, concurrency, draft=2 + 2 * repeat))
            tokens_b, wall_b = asyncio.run(batched(policy, [GenerationRequest(prompt_ids=p, sampling=greedy) for p in drafts[0]]))
            tokens_s, wall_s = asyncio.run(sequential(policy, [GenerationRequest(prompt_ids=p, sampling=greedy) for p in drafts[1]]))
            rates_b.append(tokens_b / wall_b)
            rates_s.append(tokens_s / wall_s)
            print(f"c={concurrency}: batched {tokens_b} tokens in {wall_b:.2f} s, one at a time {tokens_s} tokens in {wall_s:.2f} s",
                  file=sys.stderr)
        for name, rates in (("batched", rates_b), ("sequential", rates_s)):
            results[f"{name}_tokens_per_s_c{concurrency}"] = round(statistics.median(rates), 1)
            results[f"{name}_tokens_per_s_c{concurrency}_min"] = round(min(rates), 1)
            results[f"{name}_tokens_per_s_c{concurrency}_max"] = round(max(rates), 1)
        results[f"batch_speedup_c{concurrency}"] = round(statistics.median(rates_b) / statistics.median(rates_s), 2)

    one_token = SamplingParams(temperature=0.0, max_new_tokens=1)
    requests = [GenerationRequest(prompt_ids=all_prompts[i % len(all_prompts)], sampling=one_token)
                for i in range(args.overhead_requests)]
    server = ServeModelProcess()
    try:
        remote = RemotePolicy(server.url, model="SmolLM2-135M-Instruct", request_timeout_s=60)

        async def paired() -> tuple[list[float], list[float]]:
            await latencies_ms(remote, requests[:3])  # warm-up: the connection, the first batch
            await latencies_ms(policy, requests[:3])
            remote_ms, local_ms = [], []
            for request in requests:  # alternate, so load from elsewhere hits both alike
                remote_ms += await latencies_ms(remote, [request])
                local_ms += await latencies_ms(policy, [request])
            await remote.aclose()
            return remote_ms, local_ms

        remote_ms, local_ms = asyncio.run(paired())
    finally:
        server.stop()
    policy.close()
    results["remote_median_ms"] = round(statistics.median(remote_ms), 2)
    results["local_median_ms"] = round(statistics.median(local_ms), 2)
    results["remote_overhead_ms"] = round(statistics.median([mine - theirs for mine, theirs in zip(remote_ms, local_ms)]), 2)
    results["max_new_tokens"] = args.max_new_tokens
    results["cpu_count"] = os.cpu_count() or 0
    results["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
