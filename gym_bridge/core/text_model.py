"""A model an environment asks for text: an LLM judge, a simulated user.

`TextModel` puts any generation backend behind one call, chat messages in and text out: a
token-in/token-out `Policy` with the chat template it renders prompts with (transformers, vLLM,
a remote server), or a `ChatPolicy` (hosted chat APIs). Its calls are not trained on, so a chat
API is fine here. `gym_bridge.policies.text_model.load_text_model` builds one from settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from gym_bridge.core.conversation import Message
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.policy import ChatPolicy, ChatRequest, GenerationRequest, Policy, SamplingParams, by_policy_kind, is_token_policy
from gym_bridge.core.template.chat_template import ChatTemplate


@dataclass(frozen=True)
class TextModel:
    """A policy used by an environment, not trained: `await complete(messages)` returns its reply."""

    policy: Policy | ChatPolicy
    template: ChatTemplate | None = None
    """Needed for a token-in/token-out policy; None for a chat policy."""
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_new_tokens=512))
    """Greedy by default, so the same question gets the same answer."""

    def __post_init__(self) -> None:
        if is_token_policy(self.policy) and self.template is None:
            raise ValueError("a token-in/token-out policy needs the ChatTemplate to render its prompts")

    async def complete(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int | None = None, session_id: str = "") -> str:
        """The model's reply to `messages` (`system`/`user`/`assistant` chat messages: `role` and `content`), stripped.

        Raises the policy's `BackendError` / `ContextOverflowError`, and ConfigError (a ValueError) for another role.
        """
        conversation = [_text_message(message) for message in messages]
        sampling = self.sampling
        if max_new_tokens is not None and max_new_tokens != sampling.max_new_tokens:
            sampling = replace(sampling, max_new_tokens=max_new_tokens)
        return await by_policy_kind(self.policy, token=lambda policy: self._generated_text(policy, conversation, sampling, session_id),
                                    chat=lambda policy: _chat_text(policy, conversation, sampling, session_id))

    async def _generated_text(self, policy: Policy, conversation: list[Message], sampling: SamplingParams, session_id: str) -> str:
        assert self.template is not None  # checked at construction for a token policy
        prompt_ids = self.template.prompt_ids(conversation, None)
        generation = await policy.generate(GenerationRequest(prompt_ids=prompt_ids, sampling=sampling, session_id=session_id))
        if generation.text is not None:
            return generation.text.strip()
        return self.template.tokenizer.decode(generation.token_ids, skip_special_tokens=True).strip()


async def _chat_text(policy: ChatPolicy, conversation: list[Message], sampling: SamplingParams, session_id: str) -> str:
    turn = await policy.chat(ChatRequest(messages=conversation, tools=(), sampling=sampling, session_id=session_id))
    return turn.text.strip()


def _text_message(message: Mapping[str, str]) -> Message:
    role, content = message["role"], message["content"]
    if role == "system":
        return {"role": "system", "content": content}
    if role == "user":
        return {"role": "user", "content": content}
    if role == "assistant":
        return {"role": "assistant", "content": content}
    raise ConfigError(f"a TextModel is asked with system, user and assistant messages, not {role!r}")

