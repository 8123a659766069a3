"""Build a `TextModel` (a judge, a simulated user) from plain settings, once per process.

Environments name the model they ask with strings a user can pass on the command line: a local
model folder (none: the embedded SmolLM2), or an OpenAI-compatible server (`base_url`, spoken
token-in/token-out through `/v1/completions`, or as a chat API with `api="chat"|"responses"`).
Equal settings share one loaded model, so every rollout's judge calls batch together.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Literal

from gym_bridge.core.errors import ConfigError
from gym_bridge.core.text_model import TextModel
from gym_bridge.core.policy import SamplingParams
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.policies.factory import PolicySpec, build_policy

TEXT_MODEL_APIS = ("completions", "chat", "responses")
"""How a TextModel behind a server is spoken to (`load_text_model(api=...)`)."""
_loading = threading.Lock()


def load_text_model(
    model: str | None = None,
    *,
    base_url: str | None = None,
    api: str = "completions",
    tokenizer: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    temperature: float = 0.0,
    max_new_tokens: int = 512,
    request_timeout_s: float = 60.0,
    max_retries: int = 2,
) -> TextModel:
    """The TextModel for these settings (cached: equal settings give the same object).

    Without `base_url`: the transformers model in folder `model` (None: the embedded model).
    With `base_url`: `api="completions"` renders prompts with `tokenizer` (a folder; default the
    embedded tokenizer) and calls the server token-in/token-out; `chat`/`responses` need `model`,
    the served model's name. A server call is bounded by `request_timeout_s` per attempt and
    retried `max_retries` times. Raises GymBridgeError for an unknown `api` or a missing name.
    Thread-safe (environments call it with `asyncio.to_thread`); blocks while a model loads.
    """
    with _loading:
        return _load(model, base_url, api, tokenizer, api_key_env, temperature, max_new_tokens, request_timeout_s, max_retries)


@functools.lru_cache(maxsize=8)
def _load(
    model: str | None, base_url: str | None, api: str, tokenizer: str | None, api_key_env: str, temperature: float, max_new_tokens: int,
    request_timeout_s: float, max_retries: int,
) -> TextModel:
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    if api not in TEXT_MODEL_APIS:
        raise ConfigError(f"a TextModel's api must be one of {', '.join(TEXT_MODEL_APIS)}, got {api!r}")
    api_key = os.environ.get(api_key_env) or None
    if base_url is None:
        local = build_policy(PolicySpec(kind="transformers", model=model))
        from gym_bridge.policies.transformers import TransformersPolicy, template_tokenizer  # loaded by now

        assert isinstance(local, TransformersPolicy)
        return TextModel(local, ChatTemplate(template_tokenizer(local.tokenizer), eos_token_ids=sorted(local.eos_token_ids)), sampling)
    if api != "completions":
        if not model:
            raise ConfigError(f"a TextModel at {base_url} with api={api!r} needs the served model's name")
        chat_api: Literal["chat", "responses"] = "chat" if api == "chat" else "responses"  # checked against TEXT_MODEL_APIS above
        chat = build_policy(PolicySpec(kind="chat", model=model, base_urls=(base_url,), api=chat_api, api_key=api_key,
                                       request_timeout_s=request_timeout_s, max_retries=max_retries))
        return TextModel(chat, None, sampling)
    from gym_bridge.policies.tokenizer import load_tokenizer

    if tokenizer is None:
        from gym_bridge.policies.embedded import embedded_model_path

        tokenizer = str(embedded_model_path())
    loaded = load_tokenizer(tokenizer)
    if not model:
        raise ConfigError(f"a TextModel at {base_url} needs the served model's name")
    remote = build_policy(PolicySpec(kind="remote", model=model, base_urls=(base_url,), api_key=api_key,
                                     request_timeout_s=request_timeout_s, max_retries=max_retries,
                                     vocab_size=len(loaded.tokenizer)))
    return TextModel(remote, ChatTemplate(loaded.tokenizer, eos_token_ids=loaded.eos_token_ids), sampling)

