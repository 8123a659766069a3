"""OpenAI Responses-format items: the wire format of trajectories.

A trajectory is a list of items (`message`, `reasoning`, `function_call`,
`function_call_output`) exactly as the Responses API and NeMo Gym write them, so records are
plain dicts that serialize without conversion. This module builds those dicts; reading them and
converting them to chat messages is `gym_bridge.core.dialects.responses`.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class MessageItem(TypedDict):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: str
    content: list[OutputText]
    prompt_token_ids: NotRequired[list[int]]
    generation_token_ids: NotRequired[list[int]]
    generation_log_probs: NotRequired[list[float]]
    policy_version: NotRequired[int]


class InputText(TypedDict):
    type: Literal["input_text"]
    text: str


class UserMessageItem(TypedDict):
    """A user turn inside the trajectory (a simulated user's reply), as a Responses input message."""

    type: Literal["message"]
    id: str
    role: Literal["user"]
    status: str
    content: list[InputText]


class ReasoningItem(TypedDict):
    type: Literal["reasoning"]
    id: str
    summary: list[dict[str, str]]
    prompt_token_ids: NotRequired[list[int]]
    generation_token_ids: NotRequired[list[int]]
    generation_log_probs: NotRequired[list[float]]
    policy_version: NotRequired[int]


class FunctionCallItem(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str
    prompt_token_ids: NotRequired[list[int]]
    generation_token_ids: NotRequired[list[int]]
    generation_log_probs: NotRequired[list[float]]
    policy_version: NotRequired[int]


class FunctionCallOutputItem(TypedDict):
    type: Literal["function_call_output"]
    call_id: str
    output: str


Item = MessageItem | UserMessageItem | ReasoningItem | FunctionCallItem | FunctionCallOutputItem

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
POLICY_VERSION_FIELD = "policy_version"
"""On the last item of a model call, beside its token ids: the policy version its oldest token was sampled under
(only where the backend knows it; see `Generation.policy_version`)."""


def message_item(text: str, *, item_id: str) -> MessageItem:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def user_message_item(text: str, *, item_id: str) -> UserMessageItem:
    return {"type": "message", "id": item_id, "role": "user", "status": "completed", "content": [{"type": "input_text", "text": text}]}


def reasoning_item(text: str, *, item_id: str) -> ReasoningItem:
    return {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}]}


def function_call_item(name: str, arguments: str, *, call_id: str, item_id: str) -> FunctionCallItem:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def function_call_output_item(output: str, *, call_id: str) -> FunctionCallOutputItem:
    return {"type": "function_call_output", "call_id": call_id, "output": output}

