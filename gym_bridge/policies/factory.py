"""Build a policy from a small spec: the one place that turns plain settings into a policy object.

`PolicySpec(kind=...)` names what to build: `embedded` (the embedded SmolLM2 through transformers),
`transformers` (a local folder or hub id; none: the embedded model), `vllm` (a `vllm.LLM` built here
on that model), `remote` (an OpenAI-compatible server spoken token-in/token-out) or `chat` (a chat
API: evaluation only; over several servers, or with token ids for `gym-bridge serve`, routed per rollout). The CLI,
text models (`TextModel`), `gym-bridge serve` and TRL's server mode build through `build_policy`;
backends a trainer owns (its `vllm.LLM`, its training model) are wrapped where the trainer is.
A backend whose extra is not installed raises `MissingDependencyError` with the install command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gym_bridge._lazy import install_hint
from gym_bridge.core.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    from gym_bridge.core.policy import ChatPolicy, Policy

PolicyKind = Literal["embedded", "transformers", "remote", "vllm", "chat"]
POLICY_KINDS: tuple[PolicyKind, ...] = ("embedded", "transformers", "remote", "vllm", "chat")
TRANSFORMERS_HINT = install_hint("local")
"""torch and transformers (the embedded model, `--backend transformers`) come with the `local` extra."""


@dataclass(frozen=True)
class PolicySpec:
    """What policy to build. Unset options (None) keep the policy class's own default."""

    kind: PolicyKind
    model: str | None = None
    """A folder or hub id (`transformers`, `vllm`; None: the embedded model); the served model's name (`remote`, `chat`)."""
    base_urls: tuple[str, ...] = ()
    """The servers of `remote` and `chat` (one or more; several `chat` servers are routed per rollout)."""
    api: Literal["chat", "responses"] = "chat"
    """Which chat API `chat` speaks."""
    token_ids: bool = False
    """`chat`: ask for and require each call's token ids (NeMo RL's chat endpoint behind `gym-bridge serve`)."""
    api_key: str | None = None
    request_timeout_s: float | None = None
    max_retries: int | None = None
    vocab_size: int | None = None
    """`remote`: the size of the tokenizer prompts are rendered with; an answer holding other ids is unusable."""
    seed: int | None = None
    """`vllm`: the engine's seed."""
    logprobs_mode: Literal["raw", "processed"] = "raw"
    """`vllm`: which log-probs the engine returns."""
    gpu_memory_utilization: float = 0.9
    """`vllm`: the share of GPU memory the engine takes."""
    device: str | None = None
    """`embedded`, `transformers`: where the model runs (None: CUDA when available, else the CPU)."""
    max_batch_size: int | None = None
    batch_wait_s: float | None = None
    max_batch_tokens: int | None = None
    release_memory_above_tokens: int | None = None
    """`embedded`, `transformers`: the batching and memory settings of `TransformersPolicy`."""


def build_policy(spec: PolicySpec) -> Policy | ChatPolicy:
    """The policy `spec` describes. Raises GymBridgeError for settings that do not fit its kind and
    MissingDependencyError (with the install command) when the kind's extra is missing."""
    if spec.kind not in POLICY_KINDS:
        raise ConfigError(f"policy kind must be one of {', '.join(POLICY_KINDS)}, got {spec.kind!r}")
    if spec.kind in ("embedded", "transformers"):
        return _transformers(None if spec.kind == "embedded" else spec.model, spec)
    if spec.kind == "vllm":
        return _vllm(spec)
    if not spec.base_urls:
        raise ConfigError(f"a {spec.kind} policy needs at least one base URL")
    if spec.kind == "chat":
        return build_chat_policy(spec)
    options = _timeouts(spec)
    if not spec.model:
        raise ConfigError(f"a {spec.kind} policy at {spec.base_urls[0]} needs the served model's name")
    from gym_bridge.policies.remote import RemotePolicy

    return RemotePolicy(list(spec.base_urls), model=spec.model, api_key=spec.api_key, vocab_size=spec.vocab_size, **options)


def build_chat_policy(spec: PolicySpec) -> ChatPolicy:
    """The chat policy of a `chat` spec: over one server with a model name, a `ChatAPIPolicy`; over several, or with
    no name (the first server's model, asked on the first call), a `RoutedChatPolicy`. Raises ConfigError for
    another kind or no base URL."""
    if spec.kind != "chat" or not spec.base_urls:
        raise ConfigError(f"a chat policy needs kind 'chat' and at least one base URL, got {spec.kind!r} with {len(spec.base_urls)}")
    options = _timeouts(spec)
    if spec.token_ids:
        options["token_ids"] = True
    if len(spec.base_urls) == 1 and spec.model:
        from gym_bridge.policies.chat_api import ChatAPIPolicy

        return ChatAPIPolicy(model=spec.model, base_url=spec.base_urls[0], api=spec.api, api_key=spec.api_key, **options)
    from gym_bridge.policies.routed_chat import RoutedChatPolicy

    return RoutedChatPolicy(spec.base_urls, model=spec.model, api=spec.api, api_key=spec.api_key, **options)


def _timeouts(spec: PolicySpec) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if spec.request_timeout_s is not None:
        options["request_timeout_s"] = spec.request_timeout_s
    if spec.max_retries is not None:
        options["max_retries"] = spec.max_retries
    return options


def _transformers(model: str | None, spec: PolicySpec) -> Policy:
    try:
        from gym_bridge.policies.transformers import TransformersPolicy
    except ImportError as error:
        what = "the embedded model" if spec.kind == "embedded" else "a transformers policy"
        raise MissingExtraError(f"{what} needs torch and transformers ({error}): {TRANSFORMERS_HINT}") from None
    settings = {"max_batch_size": spec.max_batch_size, "batch_wait_s": spec.batch_wait_s}
    options: dict[str, Any] = {key: value for key, value in settings.items() if value is not None}
    return TransformersPolicy.from_pretrained(model, device=spec.device, max_batch_tokens=spec.max_batch_tokens,
                                              release_memory_above_tokens=spec.release_memory_above_tokens, **options)


def _vllm(spec: PolicySpec) -> Policy:
    from gym_bridge.policies.vllm_engine import VLLMEnginePolicy, load_vllm_engine

    path = spec.model
    if path is None:
        from gym_bridge.policies.embedded import embedded_model_path

        path = str(embedded_model_path())
    engine = load_vllm_engine(path, seed=spec.seed, logprobs_mode=spec.logprobs_mode, gpu_memory_utilization=spec.gpu_memory_utilization)
    return VLLMEnginePolicy(engine)
