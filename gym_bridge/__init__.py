"""gym_bridge: reinforcement-learning environments for language models, inside your trainer.

The core (`gym_bridge.core`) runs multi-turn, tool-calling rollouts token-in/token-out and scores
them; adapters hand the exact tokens, masks, log-probs and rewards to a trainer. Importing this
package loads no torch, trainer, vLLM or Ray: `gym_bridge.trl`, `gym_bridge.verl` and
`gym_bridge.nemo_rl` are real modules (`from gym_bridge.trl import rollout`) whose names resolve on
first use, like the model backends.
"""

from __future__ import annotations

import importlib
from typing import Any

from gym_bridge.core.answer import last_boxed, last_tagged
from gym_bridge.core.agent_loop import AgentLoop, Limits, RolloutContext, RolloutFailure, ToolCallingLoop
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, FailureKind, RowProblem, ToolError, VerifyResult, tool
from gym_bridge.core.errors import DataError, GymBridgeError, MissingDependencyError, TemplateError, UnknownEnvironmentError
from gym_bridge.core.helper_model import HelperModel
from gym_bridge.core.items import Item, final_text, output_text
from gym_bridge.core.metrics import summarize
from gym_bridge.core.offload import run_in_process
from gym_bridge.core.policy import (
    BackendError,
    ContextOverflowError,
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
    ScriptedPolicy,
)
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import configure, get_environment, known_environments, register
from gym_bridge.core.task import Task, load_tasks, parse_task
from gym_bridge.core.template import ChatTemplate

__version__ = "0.1.0"

__all__ = [
    "AgentLoop", "BackendError", "ChatTemplate", "ContextOverflowError", "DataError", "Engine", "EngineConfig",
    "Environment", "FailureKind", "Generation", "GenerationRequest", "GymBridgeError", "HelperModel", "Item", "Limits",
    "MissingDependencyError", "Policy", "RolloutContext", "RolloutFailure", "RolloutRecord", "SamplingParams",
    "ScriptedPolicy", "Task", "TemplateError", "ToolCallingLoop", "ToolError", "UnknownEnvironmentError",
    "VerifyResult", "configure", "final_text", "get_environment", "known_environments", "load_tasks", "parse_task", "register",
    "run_in_process", "summarize", "tool",
    "RowProblem", "last_boxed", "last_tagged", "output_text",
]

_LAZY_MODULES = {"trl": "gym_bridge.trl", "verl": "gym_bridge.verl", "nemo_rl": "gym_bridge.nemo_rl"}
_LAZY_ATTRS = {
    "TransformersPolicy": "gym_bridge.policies.transformers",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        module = importlib.import_module(_LAZY_MODULES[name])
        globals()[name] = module
        return module
    if name in _LAZY_ATTRS:
        value = getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gym_bridge' has no attribute {name!r}")
