"""NeMo RL's token-prefix rule for chat prompts (its vLLM server behind NeMo Gym), as serve-model keeps it.

An assistant message may carry the `prompt_token_ids` and `generation_token_ids` of its call; the prompt is then
those exact ids followed by the chat template's rendering of what came after that message, so a multi-turn
conversation is trained on the tokens the model sampled, not on their re-tokenized text.
"""

from __future__ import annotations

from typing import Any

from gym_bridge.core.conversation import TemplateMessage
from gym_bridge.core.dialects.chat import ApiError, ChatBody
from gym_bridge.core.template.chat_template import ChatTemplate


def required_prefix(body: ChatBody) -> list[int] | None:
    """The ids a chat prompt must start with: `required_prefix_token_ids`, else the
    `prompt_token_ids + generation_token_ids` of the last message that carries them (NeMo RL's rule)."""
    if body.required_prefix_token_ids is not None:
        return list(body.required_prefix_token_ids)
    for message in reversed(body.messages):
        if message.prompt_token_ids is not None:
            return list(message.prompt_token_ids) + list(message.generation_token_ids or [])
    return None


def splice_prefix(template: ChatTemplate, messages: list[TemplateMessage], tools: list[dict[str, Any]] | None,
                  prompt_ids: list[int], prefix: list[int]) -> list[int]:
    """`prefix` (the exact ids of the conversation up to the last assistant message, its end-of-turn
    token aside) followed by the rendered prompt from that message's end-of-turn token on.

    The cut is found by counting end-of-turn tokens: the conversation up to and including the last
    assistant message renders with N of them, and the prompt is cut at its N-th. Raises ApiError 400
    when the rendering has fewer.
    """
    eos = template.tokenizer.eos_token_id
    last = max((i for i, message in enumerate(messages) if message["role"] == "assistant"), default=None)
    head = messages if last is None else messages[: last + 1]
    count = template.conversation_ids(head, tools, add_generation_prompt=False).count(eos)
    positions = [i for i, token in enumerate(prompt_ids) if token == eos]
    if count == 0 or len(positions) < count:
        raise ApiError(400, f"cannot keep the token prefix: the rendered conversation has {len(positions)} end-of-turn "
                            f"tokens, the messages up to the last assistant one need {count}")
    model = prefix[:-1] if prefix and prefix[-1] == eos else prefix
    return model + prompt_ids[positions[count - 1]:]
