"""What the verl tests stand in for: verl's vLLM server actor, and the worker's config.

The agent loop talks to a real `verl.workers.rollout.llm_server.LLMServerClient` whose server
acquisition (a Ray actor in verl) is replaced by `ScriptedVerlServer`. Its `generate` has the
signature of `vLLMHttpServer.generate` (`verl/workers/rollout/vllm_rollout/vllm_async_server.py`)
and answers like it: `max_tokens` clamped to what is left of `max_model_len` (a prompt with no room
left raises its ValueError), at most that many ids, log-probs when `logprobs` is asked for, a
`TokenOutput` with `stop_reason="completed"` whether the generation stopped or was cut, and
`global_steps` in `extra_fields`. `delay_s` keeps each call in flight a while (`peak` counts them).

An async trainer's pause is stood in for too (`abort_at`): the chosen calls end after a few tokens with
`stop_reason="aborted"` and what was sampled so far, as vLLM's `pause_generation` leaves them; the server then
parks every request at its closed gate (`vLLMHttpServer._park_until_admitted`) for `pause_s` (the train step),
takes the next weights version (`set_global_steps`) and opens again. A request whose prompt is an aborted
call's prompt plus its tokens continues that generation where it stopped, as vLLM would sample it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from gym_bridge.core.policy import Generation

NO_LOAD_BALANCER: Any = None
"""No Ray load balancer: `_OneServer` picks the one stand-in server itself."""


@dataclass
class Call:
    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    token_ids: list[int]
    log_probs: list[float] | None
    stop_reason: str = "completed"
    global_steps: int | None = None


@dataclass
class ScriptedVerlServer:
    """`answer(prompt_text)` gives each call's Generation (or an exception to raise); calls are kept."""

    tokenizer: Any
    answer: Callable[[str], Generation | BaseException]
    calls: list[Call] = field(default_factory=list)
    acquired: list[str] = field(default_factory=list)
    """The request ids the client asked the load balancer for (verl keeps one rollout on one server by it)."""
    max_model_len: int = 4096
    delay_s: float = 0.0
    global_steps: int = 3
    """The weights version it reports (verl's servers: the optimizer steps of the weights they were last sent)."""
    in_flight: int = 0
    peak: int = 0
    abort_at: dict[int, int] = field(default_factory=dict)
    """Request number (0-based, in arrival order, resumed requests counted) -> tokens it returns before the trainer aborts it."""
    arrivals: int = 0
    pause_s: float = 0.0
    """How long the gate stays closed after an abort (the train step and weight update)."""
    parked: int = 0
    """Requests that waited at the closed gate."""
    _partial: dict[tuple[int, ...], tuple[Generation, int]] = field(default_factory=dict)
    _gate: asyncio.Event | None = None

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        mm_processor_kwargs: Optional[dict[str, Any]] = None,
        priority: int = 0,
        kv_transfer_params: Optional[dict] = None,
    ) -> TokenOutput:
        sampling_params = dict(sampling_params)  # a Ray call gets a copy: popping below must not reach the caller's dict
        await self._park()
        started, self.arrivals = self.arrivals, self.arrivals + 1
        resumed = self._partial.pop(tuple(prompt_ids), None)
        generation, start = resumed if resumed else (self.answer(self.tokenizer.decode(prompt_ids, skip_special_tokens=False)), 0)
        if isinstance(generation, BaseException):
            raise generation
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"Prompt length ({len(prompt_ids)}) leaves no room to generate within the model's maximum context length "
                             f"({self.max_model_len}); need at least 1 token of headroom.")
        max_tokens = max(1, min(sampling_params.pop("max_tokens"), room))  # the real server pops and clamps it, too
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        ids = generation.token_ids[start:start + max_tokens]
        log_probs = generation.logprobs[start:start + max_tokens]
        stop_reason, cut = "completed", self.abort_at.pop(started, None)
        if cut is not None and cut < len(ids):  # the trainer pauses generation: this call ends here, aborted
            ids, log_probs, stop_reason = ids[:cut], log_probs[:cut], "aborted"
            self._partial[tuple(prompt_ids) + tuple(ids)] = (generation, start + cut)
            self._pause()
        returned_log_probs: list[float] | None = log_probs if sampling_params.pop("logprobs", False) else None
        self.calls.append(Call(request_id, list(prompt_ids), dict(sampling_params, max_tokens=max_tokens), ids, returned_log_probs,
                               stop_reason, self.global_steps))
        return TokenOutput(token_ids=ids, log_probs=returned_log_probs, stop_reason=stop_reason, extra_fields={"global_steps": self.global_steps})

    async def _park(self) -> None:
        while self._gate is not None and not self._gate.is_set():
            self.parked += 1
            await self._gate.wait()

    def _pause(self) -> None:
        """Close the gate; after `pause_s` the next weights are in (`global_steps` + 1) and it opens."""
        self._gate = gate = asyncio.Event()

        def weights_updated() -> None:
            self.global_steps += 1
            gate.set()

        asyncio.get_running_loop().call_later(self.pause_s, weights_updated)


class _OneServer:
    """The Ray load balancer of verl's clients replaced by one scripted server."""

    server: ScriptedVerlServer

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        self.server.acquired.append(request_id)
        return "scripted-0", _Handle(self.server)

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        pass


class _Handle:
    """What `LLMServerClient.generate` awaits: `server.generate.remote(...)`."""

    def __init__(self, server: ScriptedVerlServer) -> None:
        self.generate = type("RemoteMethod", (), {"remote": staticmethod(server.generate)})()


class ScriptedServerClient(_OneServer, LLMServerClient):
    """verl's real client (its `generate` runs as is) with the Ray load balancer replaced by one server."""

    def __init__(self, config: Any, server: ScriptedVerlServer) -> None:
        super().__init__(config, load_balancer_handle=NO_LOAD_BALANCER)
        self.server = server


class ScriptedFullyAsyncClient(_OneServer, FullyAsyncLLMServerClient):
    """verl's real `FullyAsyncLLMServerClient` (V1 `colocate_async` / `separate_async`, fully async): its
    `generate` resumes an aborted call by sending the prompt plus the tokens so far, as is."""

    def __init__(self, config: Any, server: ScriptedVerlServer) -> None:
        super().__init__(config, load_balancer_handle=NO_LOAD_BALANCER)
        self.server = server


def verl_config(model_path: str, agent_loop_config: str, *, config_dir: str | None = None, config_name: str = "ppo_trainer",
                **overrides: Any) -> Any:
    """verl 0.9.1's own `ppo_trainer` config (hydra compose; or `config_name` in `config_dir`, e.g. fully async's),
    with the rollout settings the tests need."""
    import os

    import verl
    from hydra import compose, initialize_config_dir

    values = {
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.prompt_length": 1024,
        "actor_rollout_ref.rollout.response_length": 256,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": agent_loop_config,
        "data.max_prompt_length": 1024,
        "data.max_response_length": 256,
        **overrides,
    }
    config_dir = config_dir or os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=config_name, overrides=[f"{key}={value}" for key, value in values.items()])
