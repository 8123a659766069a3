"""gym_bridge: reinforcement-learning environments for language models, inside your trainer.

The core (`gym_bridge.core`) runs multi-turn, tool-calling rollouts token-in/token-out and scores
them; adapters hand the exact tokens, masks, log-probs and rewards to a trainer. Importing this
package loads no torch, trainer, vLLM or Ray: `gym_bridge.trl`, `gym_bridge.verl` and
`gym_bridge.nemo_rl` are real modules (`from gym_bridge.trl import rollout`) whose names resolve on
first use, like the model backends.
`__all__` is the public API: what environments may import (ruff enforces it in
environments/ruff.toml) and what users of the engine, the policies and the errors need.
"""

from __future__ import annotations

from gym_bridge._lazy import lazy_homes
from gym_bridge.core.answer import last_boxed, last_tagged
from gym_bridge.core.agent_loop import AgentLoop, Limits, RolloutContext, ToolCallingLoop, generate_turn
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, RowProblem, ToolError, Toolset, VerifyResult, schema_problems, tool, without_titles
from gym_bridge.core.errors import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    DataError,
    FailRollout,
    FailureKind,
    GymBridgeError,
    MissingDependencyError,
    MissingExtraError,
    RolloutError,
    SetupError,
    TemplateError,
    UnknownEnvironmentError,
    UserError,
)
from gym_bridge.core.text_model import TextModel
from gym_bridge.core.trajectory import final_text, output_text
from gym_bridge.core.items import TOKEN_FIELDS, Item
from gym_bridge.core.metrics import summarize
from gym_bridge.core.bounded.offload import run_in_process
from gym_bridge.core.policy import (
    ChatPolicy,
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
    ScriptedChatPolicy,
    ScriptedPolicy,
)
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import configure, get_environment, known_environments, register, remote_url
from gym_bridge.core.split import draw_split
from gym_bridge.core.task import Task, load_tasks, parse_task
from gym_bridge.core.template.chat_template import ChatTemplate

__version__ = "0.1.0"

__all__ = [
    # writing an environment
    "Environment", "FailureKind", "Item", "RowProblem", "TOKEN_FIELDS", "Task", "ToolError", "Toolset", "VerifyResult",
    "draw_split", "final_text", "last_boxed", "last_tagged", "output_text", "remote_url", "run_in_process",
    "schema_problems", "tool", "without_titles",
    # an environment's own agent loop, text models
    "AgentLoop", "FailRollout", "Limits", "RolloutContext", "TextModel", "ToolCallingLoop", "generate_turn",
    # routing and running
    "ChatTemplate", "Engine", "EngineConfig", "RolloutRecord", "configure", "get_environment", "known_environments",
    "load_tasks", "parse_task", "register", "summarize",
    # policies
    "ChatPolicy", "Generation", "GenerationRequest", "Policy", "SamplingParams", "ScriptedChatPolicy", "ScriptedPolicy",
    # errors
    "BackendError", "ConfigError", "ContextOverflowError", "DataError", "GymBridgeError", "MissingDependencyError", "MissingExtraError",
    "RolloutError", "SetupError", "TemplateError", "UnknownEnvironmentError", "UserError",
]

# Public too, but resolved on first use (so not in `__all__`: a star import stays light).
_LAZY = {
    "trl": "gym_bridge.trl", "verl": "gym_bridge.verl", "nemo_rl": "gym_bridge.nemo_rl",
    "TransformersPolicy": "gym_bridge.policies.transformers",
    "load_text_model": "gym_bridge.policies.text_model",
    "HarnessEnvironment": "gym_bridge.capture",
}

__getattr__ = lazy_homes(globals(), _LAZY)[0]
