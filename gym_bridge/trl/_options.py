"""The settings of TRL's rollout function (`make_rollout(**options)`), in one place that both the rollout
function (`gym_bridge.trl._rollout`) and its backend choice (`gym_bridge.trl._backend`) read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gym_bridge.core.health import HealthSettings
from gym_bridge.core.policy import Policy
from gym_bridge.core.record import RolloutRecord

if TYPE_CHECKING:
    from gym_bridge.scale.ray_cluster import RayOptions


@dataclass(frozen=True)
class RolloutOptions:
    """Settings of a TRL rollout function; sampling comes from the trainer's `GRPOConfig`."""

    max_turns: int = 8
    """Model calls per rollout at most."""
    max_concurrency: int = 1024
    """Rollouts in flight at once on one rank."""
    per_env_concurrency: int | None = None
    """Rollouts of one environment in flight at once (None: only `max_concurrency`)."""
    deadline_s: float = 600.0
    """Wall time of one rollout; past it the rollout fails as `timeout` and is masked."""
    template_check: Literal["error", "warn", "off"] = "error"
    """`error`: refuse a chat template that is not append-only; `warn`: use it with a warning; `off`: skip the check."""
    tool_format: Literal["native", "hermes_system"] | None = None
    """How tool schemas reach the model (None: native when the template supports tools)."""
    tool_parser: str | None = None
    """Tool-call parser by vLLM's `--tool-call-parser` name (`hermes`, `llama3_json`, `mistral`, `deepseek_v3`,
    `deepseek_v31`, `granite`, `phi4_mini_json`, `openai`, `qwen3_coder`); None: picked from the chat template."""
    reasoning_parser: str | None = None
    """Reasoning parser (`qwen3`, `deepseek_r1`, `openai_gptoss`, `none`); None: picked from the chat template."""
    chat_template_kwargs: Mapping[str, Any] | None = None
    """Extra arguments for every render of the chat template (e.g. `{"enable_thinking": False}`)."""
    policy: Policy | None = None
    """Generate with this policy instead of the trainer's backend (tests, custom servers)."""
    max_completion_length: int | None = None
    """Token budget of a rollout after its prompt, model and environment tokens together
    (None: the trainer's `max_completion_length`)."""
    max_new_tokens_per_turn: int | None = None
    """Cap of one model call (None: whatever is left of the budget)."""
    max_tool_output_chars: int = 100_000
    """Characters of one tool output the model reads at most; beyond them it reads a truncation note."""
    max_batch_size: int | None = None
    """Rows per `generate` call of the transformers backend (None: the rank's generation batch)."""
    server_base_urls: tuple[str, ...] | None = None
    """vLLM server mode: OpenAI-compatible base URLs (None: the trainer's `vllm_server_*` settings)."""
    server_model: str | None = None
    """vLLM server mode: the served model name (None: asked from the server's `/v1/models`)."""
    server_timeout_s: float = 30.0
    """vLLM server mode: how long to wait for `/v1/models` at start."""
    server_request_timeout_s: float = 120.0
    """vLLM server mode: how long one generation request may take before it is retried (then fails as `infra`)."""
    server_max_retries: int = 3
    """vLLM server mode: retries of a request after connection errors, timeouts, 429 and 5xx."""
    on_records: Callable[[list[RolloutRecord]], None] | None = None
    """Called with each batch's records (to write them out, inspect them in tests)."""
    records_path: str | None = None
    """Append every rollout's record to this JSONL file (rank N > 0: `<stem>.rankN.jsonl`), each with the
    trainer's step in `metrics.train_step`, for `gym-bridge show` / `view`."""
    journal_dir: str | None = None
    """Commit each finished turn of the batch in flight to `<journal_dir>/rank<N>` (`gym_bridge.trl._step_journal`): a
    trainer restarted from its checkpoint, generating the same step's batch again, continues each of its rollouts
    from its last turn instead of turn 0. Not with `ray`."""
    health: HealthSettings = HealthSettings()
    """When to warn that an environment's rollouts call no tool or write unparsable calls (once per trainer)."""
    ray: RayOptions | None = None
    """Run the rollouts (environments, tools, verifiers) on Ray workers instead of this process; generation
    then goes from the workers to the vLLM servers (needs `use_vllm=True, vllm_mode="server"`). See `gym_bridge.scale`."""
