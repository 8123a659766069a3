"""A `Policy` backed by a Hugging Face causal LM: the embedded model, a local checkpoint, or a trainer's model.

Concurrent `generate` calls are queued (`gym_bridge.policies.batcher`); one background task per event loop gathers what arrives
within `batch_wait_s` (up to `max_batch_size` requests and `max_batch_tokens` padded tokens), groups
requests whose sampling settings agree, and runs one left-padded `model.generate` per group in a
worker thread. Each row is then cut after its own EOS, stop string or `max_new_tokens`; a row whose
caller was cancelled stops at the next step. Log-probs are the log-softmax of the raw logits at the
sampled ids, recorded step by step, never the temperature- or top-p-processed scores.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from gym_bridge.core.policy import (
    Generation,
    GenerationRequest,
    SamplingParams,
)
from gym_bridge.core.errors import ContextOverflowError, BackendClosedError
from gym_bridge.core.conversation import FinishReason
from gym_bridge.core.template.codec import Tokenizer
from gym_bridge.policies.batcher import Batcher, GatherRule, Waiting

UTF8_MAX_BYTES_PER_CHAR = 4


class TransformersPolicy:
    """Implements `Policy` with batched `model.generate` calls on one CPU or GPU device.

    The model is used as handed in: a trainer may pass its training model. With
    `eval_during_generation` (the default) every batch runs in eval mode and the previous
    train/eval state of every submodule, and `config.use_cache`, are restored afterwards.
    A seed seeds the whole batch it runs in (requests batch only with equal seeds), so the same
    seed and the same concurrent prompts give the same ids; the caller's RNG state is restored.
    `Generation.text` is the kept ids decoded with special tokens skipped.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        device: torch.device | str | None = None,
        eval_during_generation: bool = True,
        max_batch_tokens: int | None = None,
        release_memory_above_tokens: int | None = None,
    ) -> None:
        """`device` is where prompts are placed; it defaults to the model's device.

        `max_batch_tokens` bounds a batch's padded size, rows x (longest prompt + largest
        `max_new_tokens`); a single larger request still runs, alone. After a batch of at least
        `release_memory_above_tokens` padded tokens, freed memory goes back to the system
        (garbage collection, the CUDA cache, glibc's `malloc_trim`). None turns either off.
        """
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else model.device
        self.eos_token_ids = _eos_token_ids(model=model, tokenizer=tokenizer)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.release_memory_above_tokens = release_memory_above_tokens
        self.batch_wait_s = batch_wait_s
        self.eval_during_generation = eval_during_generation
        self._pad_token_id = _pad_token_id(model=model, tokenizer=tokenizer, eos_token_ids=self.eos_token_ids)
        self._vocab_size = _vocab_size(model)
        self._max_positions: int | None = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        self._model_lock = threading.Lock()
        self._batcher: Batcher[GenerationRequest, Generation] = Batcher(
            self._generate_batch,
            rule=GatherRule(max_batch_size=max_batch_size, quiet_gap_s=batch_wait_s, max_wait_s=batch_wait_s),
            name="TransformersPolicy",
            fits=self._fits_batch,
            split=_compatible_groups,
        )
        self._closed = False

    @classmethod
    def from_pretrained(
        cls,
        path_or_none: str | Path | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        max_batch_tokens: int | None = None,
        release_memory_above_tokens: int | None = None,
    ) -> TransformersPolicy:
        """Load a causal LM and its tokenizer from a folder or hub id; None means the embedded model.

        `device` defaults to CUDA when available, else the CPU. `dtype` defaults to float32 on the
        CPU and to the checkpoint's own dtype elsewhere. The other arguments are the constructor's.
        """
        if path_or_none is None:
            from gym_bridge.policies.embedded import embedded_model_path

            path_or_none = embedded_model_path()
        target = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            dtype = torch.float32 if target.type == "cpu" else "auto"
        tokenizer = AutoTokenizer.from_pretrained(path_or_none)
        model = AutoModelForCausalLM.from_pretrained(path_or_none, dtype=dtype).to(target).eval()  # type: ignore[arg-type]  # transformers types PreTrainedModel.to as functools.wraps(Module.to): unbound, self first
        return cls(model, tokenizer, max_batch_size=max_batch_size, batch_wait_s=batch_wait_s, device=target,
                   max_batch_tokens=max_batch_tokens, release_memory_above_tokens=release_memory_above_tokens)

    async def generate(self, request: GenerationRequest) -> Generation:
        """Continue `request.prompt_ids`, batched with concurrent calls of compatible sampling settings.

        Raises `ContextOverflowError` when the prompt plus `max_new_tokens` exceeds the model's
        context, `BackendError` when generation fails or the policy is closed, and `ValueError`
        for an empty prompt or ids outside the vocabulary.
        """
        if self._closed:
            raise BackendClosedError("TransformersPolicy is closed")
        self._check_request(request)
        if request.sampling.max_new_tokens <= 0:
            return Generation(token_ids=[], logprobs=[], finish_reason="length", text="")
        return await self._batcher.submit(request)

    def close(self) -> None:
        """Stop the background worker (from any thread); calls still queued, and later calls, get a `BackendError`."""
        self._closed = True
        self._batcher.stop()

    async def aclose(self) -> None:
        """`close`, waiting on this loop until the worker is gone."""
        self._closed = True
        self._batcher.stop()
        await self._batcher.aclose()

    def _check_request(self, request: GenerationRequest) -> None:
        prompt_length = len(request.prompt_ids)
        if prompt_length == 0:
            raise ValueError("prompt_ids is empty; a policy continues a non-empty prompt")
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= self._vocab_size:
            raise ValueError(f"prompt_ids hold ids outside the vocabulary [0, {self._vocab_size})")
        max_new_tokens = request.sampling.max_new_tokens
        if self._max_positions is not None and prompt_length + max_new_tokens > self._max_positions:
            raise ContextOverflowError(
                f"prompt of {prompt_length} tokens plus max_new_tokens={max_new_tokens} exceeds the "
                f"model's context of {self._max_positions} tokens "
                f"(at most {self._max_positions - max_new_tokens} prompt tokens fit)"
            )

    def _fits_batch(self, batch: Sequence[GenerationRequest], request: GenerationRequest) -> bool:
        """Whether `request` may join `batch` within `max_batch_tokens` padded tokens."""
        if self.max_batch_tokens is None:
            return True
        width = max(_padded_width(queued) for queued in (*batch, request))
        return (len(batch) + 1) * width <= self.max_batch_tokens

    def _generate_batch(self, batch: list[Waiting[GenerationRequest, Generation]]) -> list[Generation]:
        requests = [item.request for item in batch]
        sampling = requests[0].sampling
        input_ids, attention_mask = _left_padded(
            [request.prompt_ids for request in requests], pad_token_id=self._pad_token_id, device=self.device
        )
        prompt_length = input_ids.shape[1]
        scale = sampling.temperature if sampling.logprobs_mode == "processed" and sampling.temperature > 0 else 1.0
        recorder = _RawLogprobRecorder(prompt_length=prompt_length, temperature=scale)
        stopper = _RowStopper(
            prompt_length=prompt_length,
            max_new_tokens=[request.sampling.max_new_tokens for request in requests],
            stops=[request.sampling.stop for request in requests],
            eos_token_ids=self.eos_token_ids,
            decode=self._decode,
            device=self.device,
            abandoned=[item.future for item in batch],
        )
        with self._model_lock, self._generation_mode() as use_cache, torch.no_grad():
            started_s = time.perf_counter()
            with _seeded(sampling.seed, device=self.device):
                sequences = cast(_Generates, self.model).generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=self._generation_config(
                        sampling,
                        max_new_tokens=max(request.sampling.max_new_tokens for request in requests),
                        use_cache=use_cache,
                    ),
                    logits_processor=LogitsProcessorList([recorder]),
                    stopping_criteria=StoppingCriteriaList([stopper]),
                )
            generate_s = time.perf_counter() - started_s
        assert isinstance(sequences, torch.Tensor)  # the ids alone: no return_dict_in_generate
        logprobs = recorder.logprobs(sequences).cpu().tolist()
        generated = sequences[:, prompt_length:].cpu().tolist()
        padded_tokens = int(sequences.shape[0] * sequences.shape[1])
        del sequences, recorder, input_ids, attention_mask
        if self.release_memory_above_tokens is not None and padded_tokens >= self.release_memory_above_tokens:
            release_memory(self.device)
        metrics = {"batch_size": float(len(requests)), "generate_s": generate_s}
        return [
            self._finish_row(
                token_ids=row_ids,
                logprobs=row_logprobs,
                sampling=item.request.sampling,
                metrics={**metrics, "queue_wait_s": started_s - item.enqueued_at_s},
            )
            for item, row_ids, row_logprobs in zip(batch, generated, logprobs, strict=True)
        ]

    def _generation_config(self, sampling: SamplingParams, *, max_new_tokens: int, use_cache: bool) -> GenerationConfig:
        special = {
            "eos_token_id": sorted(self.eos_token_ids) or None,
            "pad_token_id": self._pad_token_id,
            "max_new_tokens": max_new_tokens,
            "use_cache": use_cache,
        }
        if sampling.temperature == 0:
            return GenerationConfig(do_sample=False, **special)
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            **special,
        )

    @contextmanager
    def _generation_mode(self) -> Iterator[bool]:
        """Switch to eval mode and a neutral generation config; yield whether the KV cache is usable.

        `generate` fills every setting left unset from `model.generation_config` (a checkpoint's
        repetition penalty, min-p, suppressed tokens...), so that config is swapped for a blank
        one while the batch runs: the request's sampling settings alone decide the tokens.
        """
        modes = {module: module.training for module in self.model.modules()}
        config_use_cache = getattr(self.model.config, "use_cache", None)
        model_generation_config = self.model.generation_config
        if self.eval_during_generation:
            self.model.eval()
        self.model.generation_config = GenerationConfig()
        try:
            yield not (self.model.training and _checkpoints_activations(self.model))
        finally:
            self.model.generation_config = model_generation_config
            for module, training in modes.items():
                module.training = training
            if config_use_cache is not None:
                self.model.config.use_cache = config_use_cache

    def _finish_row(
        self,
        *,
        token_ids: list[int],
        logprobs: list[float],
        sampling: SamplingParams,
        metrics: dict[str, float],
    ) -> Generation:
        kept = token_ids[: sampling.max_new_tokens]
        end = len(kept)
        finish_reason: FinishReason = "length"
        eos_index = next((index for index, token in enumerate(kept) if token in self.eos_token_ids), None)
        if eos_index is not None:
            end, finish_reason = eos_index + 1, "stop"
        stop_end = stop_string_end(kept[:end], stops=sampling.stop, decode=self._decode)
        if stop_end is not None:
            end, finish_reason = stop_end, "stop"
        return Generation(
            token_ids=kept[:end],
            logprobs=logprobs[:end],
            finish_reason=finish_reason,
            text=self._decode(kept[:end]),
            metrics=metrics,
        )

    def _decode(self, token_ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        assert isinstance(text, str)  # one id list decodes to one string (transformers types it str | list[str])
        return text


def stop_string_end(token_ids: Sequence[int], *, stops: Sequence[str], decode: Callable[[Sequence[int]], str]) -> int | None:
    """Return the length of the shortest prefix of `token_ids` whose text holds a stop string, or None.

    A binary search over prefixes: it assumes, as holds for real tokenizers, that once a prefix's
    text contains a stop string every longer prefix's text does too.
    """
    if not stops or not any(stop in decode(token_ids) for stop in stops):
        return None
    low, high = 1, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if any(stop in decode(token_ids[:middle]) for stop in stops):
            high = middle
        else:
            low = middle + 1
    return low


def cpu_threads(threads: int | None = None) -> int:
    """Set torch's CPU threads per operation when `threads` is given; returns the number in use."""
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def release_memory(device: torch.device) -> None:
    """Hand freed memory back: collect garbage, empty the CUDA cache, and on glibc trim the heap
    (without it a CPU process keeps the peak of its largest batch)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def _padded_width(request: GenerationRequest) -> int:
    return len(request.prompt_ids) + request.sampling.max_new_tokens


def _compatible_groups(pending: list[Waiting[GenerationRequest, Generation]]) -> list[list[Waiting[GenerationRequest, Generation]]]:
    """Split requests, in arrival order, into groups that one `generate` call can serve."""
    groups: dict[tuple[float, float, int, int | None, str], list[Waiting[GenerationRequest, Generation]]] = {}
    for item in pending:
        groups.setdefault(_sampling_key(item.request.sampling), []).append(item)
    return list(groups.values())


def _sampling_key(sampling: SamplingParams) -> tuple[float, float, int, int | None, str]:
    if sampling.temperature == 0:
        return (0.0, 1.0, 0, None, "raw")  # greedy: processed log-probs are the raw ones
    return (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed, sampling.logprobs_mode)


def _left_padded(prompts: list[Sequence[int]], *, pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids.to(device), attention_mask.to(device)


@contextmanager
def _seeded(seed: int | None, *, device: torch.device) -> Iterator[None]:
    """Seed the RNGs `generate` samples from, restoring the caller's RNG state afterwards."""
    if seed is None:
        yield
        return
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index], device_type="cuda"), torch.cuda.device(index):
            torch.default_generator.manual_seed(seed)
            torch.cuda.manual_seed(seed)
            yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


class _Generates(Protocol):
    """A causal LM's `generate` (GenerationMixin's): transformers types a loaded model as `PreTrainedModel`,
    which has none, and GenerationMixin's own `generate` takes `self` as a private Protocol."""

    def generate(self, **kwargs: Any) -> Any: ...


def template_tokenizer(tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
    """`tokenizer` as `ChatTemplate` takes it: transformers types `decode` as returning `str | list[str]`
    (a list only for a batch of id lists, which gym_bridge never passes)."""
    return cast(Tokenizer, tokenizer)


def _vocab_size(model: PreTrainedModel) -> int:
    size = model.get_input_embeddings().num_embeddings  # an nn.Module attribute: typed Tensor | Module
    if not isinstance(size, int):
        raise TypeError(f"{type(model).__name__}'s input embeddings have no integer num_embeddings")
    return size


def _checkpoints_activations(model: PreTrainedModel) -> bool:
    """Whether a layer recomputes activations in training; such layers drop the KV cache."""
    return any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules())


def _eos_token_ids(*, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(int(token) for token in configured)
    return frozenset(ids)


def _pad_token_id(*, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, eos_token_ids: frozenset[int]) -> int:
    """Any id works for padding (the attention mask hides it); prefer the declared one."""
    for candidate in (tokenizer.pad_token_id, getattr(model.generation_config, "pad_token_id", None)):
        if isinstance(candidate, int):
            return candidate
    return min(eos_token_ids, default=0)


class _RawLogprobRecorder(LogitsProcessor):
    """Records the log-softmax of the raw logits (divided by `temperature` for processed log-probs) at each sampled id.

    `generate` hands custom processors the raw logits before any sampling warper runs (and the
    policy leaves no built-in processor active). The id sampled at one step is only known at the
    next call, so each call gathers the previous step; `logprobs` gathers the last one. Holding
    one step instead of all steps' logits (as `output_logits=True` would) keeps memory at
    batch x vocab.
    """

    def __init__(self, *, prompt_length: int, temperature: float = 1.0) -> None:
        self._prompt_length = prompt_length
        self._temperature = temperature
        self._gathered: list[torch.Tensor] = []
        self._latest: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._latest is not None and input_ids.shape[1] > self._prompt_length:
            self._gathered.append(self._latest.gather(1, input_ids[:, -1:]).squeeze(1))
        logits = scores.float() if self._temperature == 1.0 else scores.float() / self._temperature
        self._latest = torch.log_softmax(logits, dim=-1)
        return scores

    def logprobs(self, sequences: torch.Tensor) -> torch.Tensor:
        """Return a (batch, generated) tensor of log-probs for `sequences` (prompt plus generated ids)."""
        generated = sequences.shape[1] - self._prompt_length
        steps = list(self._gathered[:generated])
        if len(steps) < generated and self._latest is not None:
            steps.append(self._latest.gather(1, sequences[:, -1:]).squeeze(1))
        if len(steps) != generated:
            raise RuntimeError(f"recorded {len(steps)} log-prob steps for {generated} generated tokens")
        if not steps:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(steps, dim=1)


class _RowStopper(StoppingCriteria):
    """Ends each row at its own `max_new_tokens`, stop string, or when its caller gave up, so a
    batch stops when all rows are done.

    Stop strings are looked for in the decoded tail of each row, wide enough to hold the longest
    stop string even at one byte per token; a hit is confirmed on the whole row. This only saves
    compute: the policy cuts every row exactly afterwards.
    """

    def __init__(
        self,
        *,
        prompt_length: int,
        max_new_tokens: list[int],
        stops: list[tuple[str, ...]],
        eos_token_ids: frozenset[int],
        decode: Callable[[Sequence[int]], str],
        device: torch.device,
        abandoned: Sequence[asyncio.Future[Generation]] = (),
    ) -> None:
        self._abandoned = abandoned
        """The rows' futures: a row whose caller gave up (cancelled, a disconnected client) is done."""
        self._prompt_length = prompt_length
        self._max_new_tokens = max_new_tokens
        self._limits = torch.tensor(max_new_tokens, device=device)
        self._stops = stops
        self._eos_token_ids = eos_token_ids
        self._decode = decode
        longest = max((len(stop) for row in stops for stop in row), default=0)
        self._tail_tokens = UTF8_MAX_BYTES_PER_CHAR * longest + 2
        self._watching = [bool(row) for row in stops]
        self._stopped = [False] * len(stops)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None, **kwargs: object) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self._prompt_length
        done = generated >= self._limits
        if any(self._watching):
            self._scan(input_ids[:, self._prompt_length :].tolist())
        for row, future in enumerate(self._abandoned):
            if not self._stopped[row] and future.done():  # read across threads: done() only reads a flag
                self._stopped[row] = True
        # transformers annotates StoppingCriteria.__call__ with the legacy BoolTensor type, which no operation returns
        return cast(torch.BoolTensor, done | torch.tensor(self._stopped, device=done.device))

    def _scan(self, rows: list[list[int]]) -> None:
        for row, (token_ids, stops) in enumerate(zip(rows, self._stops, strict=True)):
            if not self._watching[row]:
                continue
            if token_ids[-1] in self._eos_token_ids or len(token_ids) >= self._max_new_tokens[row]:
                self._watching[row] = False
            if any(stop in self._decode(token_ids[-self._tail_tokens :]) for stop in stops):
                if stop_string_end(token_ids, stops=stops, decode=self._decode) is not None:
                    self._stopped[row] = True
                    self._watching[row] = False
