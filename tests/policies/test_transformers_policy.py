"""TransformersPolicy on a tiny Llama built locally, checked against an independent reference.

The reference decodes greedily with plain forward passes over the whole sequence (no KV cache,
no `generate`), so agreement tests batching, padding, cutting and log-prob bookkeeping at once.
The tokenizer is a 43-word WordLevel vocabulary ("a".."z", digits, punctuation, specials).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from gym_bridge.core.policy import (
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
)
from gym_bridge.core.errors import BackendError, ContextOverflowError
from gym_bridge.policies.transformers import TransformersPolicy, stop_string_end

EOS_ID = 1
MAX_POSITIONS = 64
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
PROMPTS = [
    [3, 4, 5],
    [10, 11, 12, 13, 14, 15, 16, 17],
    [20],
    [30, 31, 32, 33, 34],
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    words = ["<pad>", "<eos>", "<unk>", *"abcdefghijklmnopqrstuvwxyz", *"0123456789", *".,!?"]
    backend = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


@pytest.fixture
def model(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    # Seed 7: greedy decoding of PROMPTS gives varied ids and no EOS within 16 tokens.
    torch.manual_seed(7)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.2,
        eos_token_id=EOS_ID,
        pad_token_id=0,
        bos_token_id=None,
    )
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture
def policy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> TransformersPolicy:
    policy = TransformersPolicy(model, tokenizer, batch_wait_s=0.01)
    yield policy
    policy.close()


def reference_greedy(model: torch.nn.Module, prompt_ids: list[int], *, max_new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy ids and their log-probs from full forward passes, ignoring EOS."""
    ids = list(prompt_ids)
    logprobs = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            step = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
            token = int(step.argmax())
            ids.append(token)
            logprobs.append(float(step[token]))
    return ids[len(prompt_ids) :], logprobs


def teacher_forced_logprobs(model: torch.nn.Module, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """Log-softmax of the raw logits at `token_ids`, from one forward pass over prompt plus ids."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt_ids) + token_ids])).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    return steps.gather(1, torch.tensor(token_ids)[:, None]).squeeze(1).tolist()


def generate_all(policy: TransformersPolicy, requests: list[GenerationRequest]) -> list[Generation]:
    async def run() -> list[Generation]:
        return await asyncio.gather(*(policy.generate(request) for request in requests))

    return asyncio.run(run())


def generate_one_by_one(policy: TransformersPolicy, requests: list[GenerationRequest]) -> list[Generation]:
    async def run() -> list[Generation]:
        return [await policy.generate(request) for request in requests]

    return asyncio.run(run())


def greedy_requests(max_new_tokens: int = 12) -> list[GenerationRequest]:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return [GenerationRequest(prompt_ids=prompt, sampling=sampling) for prompt in PROMPTS]


def count_generate_calls(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Wrap `model.generate`; the returned list collects each call's output sequences."""
    outputs: list[torch.Tensor] = []
    original = model.generate

    def counting_generate(*args: object, **kwargs: object) -> torch.Tensor:
        outputs.append(original(*args, **kwargs))
        return outputs[-1]

    monkeypatch.setattr(model, "generate", counting_generate)
    return outputs


def test_satisfies_the_policy_protocol(policy: TransformersPolicy) -> None:
    assert isinstance(policy, Policy)
    assert policy.eos_token_ids == frozenset({EOS_ID})


def test_greedy_matches_the_forward_pass_reference(policy: TransformersPolicy, model: torch.nn.Module) -> None:
    generations = generate_all(policy, greedy_requests())

    for prompt, generation in zip(PROMPTS, generations, strict=True):
        expected_ids, expected_logprobs = reference_greedy(model, prompt, max_new_tokens=12)
        assert EOS_ID not in expected_ids, "premise: the tiny model emits no EOS for these prompts"
        assert generation.token_ids == expected_ids
        assert generation.finish_reason == "length"
        assert len(generation.logprobs) == len(generation.token_ids)
        assert all(logprob <= 0 for logprob in generation.logprobs)
        assert generation.logprobs == pytest.approx(expected_logprobs, abs=1e-5)


def test_batched_equals_one_at_a_time(policy: TransformersPolicy) -> None:
    # Prompts of lengths 3, 8, 1 and 5 share one left-padded batch. Padding changes the shapes of
    # the matmuls, so float32 sums round differently: log-probs differ by up to 3e-6 here (9e-6 on
    # the 135M embedded model), well inside 1e-4; greedy ids agree exactly.
    requests = greedy_requests()
    batched = generate_all(policy, requests)
    single = generate_one_by_one(policy, requests)

    for together, alone in zip(batched, single, strict=True):
        assert together.token_ids == alone.token_ids
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert together.finish_reason == alone.finish_reason


def test_logprobs_equal_the_output_logits_of_generate(policy: TransformersPolicy, model: torch.nn.Module) -> None:
    generation = generate_all(policy, greedy_requests()[:1])[0]

    output = model.generate(
        input_ids=torch.tensor([PROMPTS[0]]),
        do_sample=False,
        max_new_tokens=12,
        eos_token_id=None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    logits = torch.stack(output.logits, dim=1)[0]
    expected = torch.log_softmax(logits, dim=-1).gather(1, output.sequences[0, len(PROMPTS[0]) :, None]).squeeze(1)
    assert generation.logprobs == pytest.approx(expected.tolist(), abs=1e-5)


def test_sampled_logprobs_are_raw_model_logprobs(policy: TransformersPolicy, model: torch.nn.Module) -> None:
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=10, max_new_tokens=10, seed=3)
    requests = [GenerationRequest(prompt_ids=prompt, sampling=sampling) for prompt in PROMPTS]

    for prompt, generation in zip(PROMPTS, generate_all(policy, requests), strict=True):
        recomputed = teacher_forced_logprobs(model, prompt, generation.token_ids)
        assert generation.logprobs == pytest.approx(recomputed, abs=1e-4)
        # Temperature 0.7 divides logits by 0.7; log-probs of those scaled logits differ clearly.
        with torch.no_grad():
            logits = model(torch.tensor([prompt + generation.token_ids])).logits[0, len(prompt) - 1 : -1]
        tempered = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(generation.token_ids)[:, None])
        assert max(abs(a - b) for a, b in zip(tempered.squeeze(1).tolist(), recomputed)) > 1e-2


def test_processed_logprobs_are_temperature_scaled(policy: TransformersPolicy, model: torch.nn.Module) -> None:
    sampling = SamplingParams(temperature=0.7, max_new_tokens=10, seed=3, logprobs_mode="processed")
    requests = [GenerationRequest(prompt_ids=prompt, sampling=sampling) for prompt in PROMPTS]
    for prompt, generation in zip(PROMPTS, generate_all(policy, requests), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + generation.token_ids])).logits[0, len(prompt) - 1 : -1]
        # what TRL's trainer recomputes: log_softmax(logits / temperature) at the sampled ids
        tempered = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(generation.token_ids)[:, None])
        assert generation.logprobs == pytest.approx(tempered.squeeze(1).tolist(), abs=1e-4)


def test_seeded_sampling_is_reproducible_and_leaves_global_rng_alone(policy: TransformersPolicy) -> None:
    def sample(seed: int) -> list[list[int]]:
        sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=seed)
        requests = [GenerationRequest(prompt_ids=prompt, sampling=sampling) for prompt in PROMPTS]
        return [generation.token_ids for generation in generate_all(policy, requests)]

    rng_before = torch.get_rng_state()
    first, again, other = sample(7), sample(7), sample(8)

    assert first == again
    assert first != other
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_concurrent_requests_share_one_generate_call(
    policy: TransformersPolicy, model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_generate_calls(model, monkeypatch)
    requests = [GenerationRequest(prompt_ids=PROMPTS[i % 4], sampling=GREEDY) for i in range(8)]

    generations = generate_all(policy, requests)

    # All 8 are queued before the worker first runs, so one batch serves them.
    assert len(calls) == 1
    assert calls[0].shape[0] == 8
    assert [g.metrics["batch_size"] for g in generations] == [8.0] * 8


def test_incompatible_sampling_settings_get_separate_calls(
    policy: TransformersPolicy, model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_generate_calls(model, monkeypatch)
    hot = SamplingParams(temperature=1.0, max_new_tokens=4, seed=1)
    greedy_with_ignored_knobs = SamplingParams(temperature=0.0, top_k=3, top_p=0.5, max_new_tokens=6)
    requests = [
        GenerationRequest(prompt_ids=PROMPTS[0], sampling=GREEDY),
        GenerationRequest(prompt_ids=PROMPTS[1], sampling=hot),
        GenerationRequest(prompt_ids=PROMPTS[2], sampling=greedy_with_ignored_knobs),
        GenerationRequest(prompt_ids=PROMPTS[3], sampling=hot),
    ]

    generate_all(policy, requests)

    # Greedy ignores top-k/top-p, so both greedy requests batch together: 2 calls of 2 rows.
    assert sorted(call.shape[0] for call in calls) == [2, 2]


def test_each_row_is_cut_at_its_own_max_new_tokens(policy: TransformersPolicy, model: torch.nn.Module) -> None:
    requests = [
        GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(temperature=0.0, max_new_tokens=limit))
        for prompt, limit in zip(PROMPTS, [3, 7, 12, 1], strict=True)
    ]

    for request, generation in zip(requests, generate_all(policy, requests), strict=True):
        limit = request.sampling.max_new_tokens
        expected_ids, _ = reference_greedy(model, list(request.prompt_ids), max_new_tokens=limit)
        assert generation.token_ids == expected_ids
        assert len(generation.logprobs) == limit
        assert generation.finish_reason == "length"


def test_eos_ends_the_row_and_is_included(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> None:
    reference, _ = reference_greedy(model, PROMPTS[1], max_new_tokens=12)
    # Declare the 4th greedy token an EOS id; the row must end at its first occurrence.
    model.generation_config.eos_token_id = [EOS_ID, reference[3]]
    first_eos = reference.index(reference[3])
    policy = TransformersPolicy(model, tokenizer)

    generation, other_row = generate_all(policy, greedy_requests()[1:3])
    policy.close()

    assert policy.eos_token_ids == frozenset({EOS_ID, reference[3]})
    assert generation.token_ids == reference[: first_eos + 1]
    assert generation.finish_reason == "stop"
    assert len(generation.logprobs) == first_eos + 1
    assert other_row.finish_reason == ("stop" if other_row.token_ids[-1] == reference[3] else "length")


def test_stop_string_cuts_after_the_completing_token(
    policy: TransformersPolicy, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference, reference_logprobs = reference_greedy(model, PROMPTS[3], max_new_tokens=12)
    stop = tokenizer.decode(reference[4:6])  # two words joined by a space, e.g. "q r"
    expected_end = next(n for n in range(1, 13) if stop in tokenizer.decode(reference[:n]))
    calls = count_generate_calls(model, monkeypatch)
    stopping = SamplingParams(temperature=0.0, max_new_tokens=40, stop=("never said", stop))
    requests = [
        GenerationRequest(prompt_ids=PROMPTS[3], sampling=stopping),
        GenerationRequest(prompt_ids=PROMPTS[0], sampling=GREEDY),
    ]

    stopped, neighbour = generate_all(policy, requests)

    assert stopped.token_ids == reference[:expected_end]
    assert stopped.logprobs == pytest.approx(reference_logprobs[:expected_end], abs=1e-5)
    assert stopped.finish_reason == "stop"
    assert stopped.text is not None and stopped.text.endswith(stop)
    assert neighbour.token_ids == reference_greedy(model, PROMPTS[0], max_new_tokens=12)[0]
    # The batch ran 12 steps (the neighbour's limit), not 40: the stop-string row ended early.
    assert calls[0].shape[1] - len(PROMPTS[3]) == 12


def test_stop_string_end_finds_the_shortest_prefix(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer("a b c d c d e")["input_ids"]

    assert stop_string_end(ids, stops=("c d",), decode=tokenizer.decode) == 4
    assert stop_string_end(ids, stops=("d e", "b"), decode=tokenizer.decode) == 2
    assert stop_string_end(ids, stops=("z",), decode=tokenizer.decode) is None
    assert stop_string_end(ids, stops=(), decode=tokenizer.decode) is None


def test_model_generation_config_does_not_change_sampling(policy: TransformersPolicy, model: torch.nn.Module) -> None:
    reference, _ = reference_greedy(model, PROMPTS[0], max_new_tokens=12)
    checkpoint_defaults = model.generation_config
    checkpoint_defaults.repetition_penalty = 10.0
    checkpoint_defaults.suppress_tokens = [reference[0]]
    checkpoint_defaults.top_k = 2

    generation = generate_all(policy, greedy_requests()[:1])[0]

    assert generation.token_ids == reference
    assert model.generation_config is checkpoint_defaults


def test_context_overflow_is_raised_before_queueing(policy: TransformersPolicy) -> None:
    # 60 prompt tokens + 5 new ones = 65 > 64 positions; 59 + 5 = 64 fits exactly.
    overflowing = GenerationRequest(prompt_ids=[3] * 60, sampling=SamplingParams(temperature=0.0, max_new_tokens=5))
    fitting = GenerationRequest(prompt_ids=[3] * 59, sampling=SamplingParams(temperature=0.0, max_new_tokens=5))

    with pytest.raises(ContextOverflowError, match="60 tokens plus max_new_tokens=5 exceeds .* 64 tokens"):
        generate_all(policy, [overflowing])
    assert len(generate_all(policy, [fitting])[0].token_ids) <= 5


def test_invalid_prompts_are_rejected(policy: TransformersPolicy) -> None:
    with pytest.raises(ValueError, match="empty"):
        generate_all(policy, [GenerationRequest(prompt_ids=[], sampling=GREEDY)])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate_all(policy, [GenerationRequest(prompt_ids=[3, 43], sampling=GREEDY)])


def test_a_failing_batch_gives_backend_errors_and_the_worker_survives(
    policy: TransformersPolicy, model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = model.generate
    failures = iter([RuntimeError("CUDA out of memory (injected)")])

    def failing_once(*args: object, **kwargs: object) -> torch.Tensor:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", failing_once)

    async def run() -> tuple[list[BaseException | Generation], Generation]:
        first = await asyncio.gather(*(policy.generate(r) for r in greedy_requests()[:3]), return_exceptions=True)
        return first, await policy.generate(greedy_requests()[3])

    failed, later = asyncio.run(run())

    assert all(isinstance(result, BackendError) for result in failed)
    assert all("CUDA out of memory (injected)" in str(result) for result in failed)
    assert isinstance(failed[0].__cause__, RuntimeError)
    assert later.finish_reason == "length" and len(later.token_ids) == 12


def test_training_mode_and_use_cache_are_restored(
    policy: TransformersPolicy, model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    model.train()
    model.model.layers[1].eval()
    model.config.use_cache = False
    modes_before = {name: module.training for name, module in model.named_modules()}
    training_during_generate: list[bool] = []
    original = model.generate

    def recording_generate(*args: object, **kwargs: object) -> torch.Tensor:
        training_during_generate.append(model.training)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording_generate)

    generate_all(policy, greedy_requests())

    assert training_during_generate == [False]
    assert {name: module.training for name, module in model.named_modules()} == modes_before
    assert model.config.use_cache is False


@pytest.mark.parametrize("eval_during_generation", [True, False])
def test_generation_works_with_gradient_checkpointing(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, eval_during_generation: bool
) -> None:
    # Dropout is 0 in the tiny config, so train-mode generation (no KV cache under
    # checkpointing) must give the same greedy ids as eval mode.
    expected = [reference_greedy(model, prompt, max_new_tokens=12)[0] for prompt in PROMPTS]
    # `activation_checkpointing_enable` since transformers 5.20; vLLM's CPU build needs 5.16-5.19
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    policy = TransformersPolicy(model, tokenizer, eval_during_generation=eval_during_generation)

    generations = generate_all(policy, greedy_requests())
    policy.close()

    assert [generation.token_ids for generation in generations] == expected
    assert model.training and getattr(model, "is_activation_checkpointing", model.is_gradient_checkpointing)


def test_successive_event_loops_are_served(policy: TransformersPolicy) -> None:
    first = generate_all(policy, greedy_requests())
    second = generate_all(policy, greedy_requests())

    assert [g.token_ids for g in first] == [g.token_ids for g in second]


def test_close_rejects_later_calls(policy: TransformersPolicy) -> None:
    async def run() -> None:
        await policy.generate(greedy_requests()[0])
        policy.close()
        with pytest.raises(BackendError, match="closed"):
            await policy.generate(greedy_requests()[0])

    asyncio.run(run())


def test_close_fails_queued_and_running_requests_instead_of_hanging(
    policy: TransformersPolicy, model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = model.generate

    def slow_generate(*args: object, **kwargs: object) -> torch.Tensor:
        time.sleep(0.3)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", slow_generate)

    async def run() -> list[BaseException | Generation]:
        running = asyncio.ensure_future(policy.generate(greedy_requests()[0]))
        await asyncio.sleep(0.1)  # the first batch is now inside generate
        queued = asyncio.ensure_future(policy.generate(greedy_requests()[1]))
        await asyncio.sleep(0)
        policy.close()
        return await asyncio.wait_for(asyncio.gather(running, queued, return_exceptions=True), timeout=5)

    results = asyncio.run(run())

    assert [type(result) for result in results] == [BackendError, BackendError]


def test_close_during_the_batch_wait_fails_the_collected_requests(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> None:
    policy = TransformersPolicy(model, tokenizer, batch_wait_s=10.0)

    async def run() -> list[BaseException | Generation]:
        waiting = asyncio.ensure_future(policy.generate(greedy_requests()[0]))
        await asyncio.sleep(0.1)  # the worker holds the request while it waits for more
        policy.close()
        return await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), timeout=5)

    assert [type(result) for result in asyncio.run(run())] == [BackendError]


def test_importing_the_package_loads_neither_torch_nor_transformers() -> None:
    code = "import sys, gym_bridge.policies; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"
