"""OpenAI Responses-format items: the wire format of trajectories.

A trajectory is a list of items (`message`, `reasoning`, `function_call`,
`function_call_output`) exactly as the Responses API and NeMo Gym write them, so records are
plain dicts that serialize without conversion. This module builds those dicts (a model turn's with
`turn_items`, its one converter from `Turn`) and reads their text (`item_text`; `content_text`, the one
reader of a content list); converting items to chat messages is `gym_bridge.core.dialects.responses`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

from gym_bridge.core.turn import Turn


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
(only where the backend knows it; see `Turn.policy_version`)."""

ModelItem = MessageItem | ReasoningItem | FunctionCallItem
"""An item a model turn writes (the kinds that carry a call's token fields)."""


def turn_items(turn: Turn, *, reasoning_id: str, message_id: str, call_item_ids: Sequence[str]) -> list[ModelItem]:
    """A model turn's items, in order: its reasoning (when it has some), its message (when it has text or calls
    nothing), one `function_call` per call (its `call_id` the call's id, its item id from `call_item_ids`); the last
    carries the call's token fields and policy version when the turn has them."""
    items: list[ModelItem] = []
    if turn.reasoning:
        items.append(reasoning_item(turn.reasoning, item_id=reasoning_id))
    if turn.text or not turn.calls:
        items.append(message_item(turn.text, item_id=message_id))
    for call, item_id in zip(turn.calls, call_item_ids):
        items.append(function_call_item(call.name, call.arguments, call_id=call.id or "", item_id=item_id))
    tokens, last = turn.tokens, items[-1]
    if tokens is not None:
        last["prompt_token_ids"] = tokens.prompt_token_ids
        last["generation_token_ids"] = tokens.generation_token_ids
        last["generation_log_probs"] = tokens.generation_log_probs
    if turn.policy_version is not None:
        last["policy_version"] = turn.policy_version
    return items


def item_text(item: Mapping[str, Any]) -> str:
    """The text of a message or reasoning item: its content's (`content_text`; a reasoning item's summary parts'),
    '' for other items."""
    if item.get("type") == "reasoning":
        return content_text(item.get("summary"))
    return content_text(item.get("content"))


def content_text(content: str | Sequence[Mapping[str, Any]] | None) -> str:
    """The text of a message's content: a string as it is, the `text` of every part of a content list joined
    (parts of any type: `output_text`, `input_text`, `text`), '' for None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text") or "") for part in content if isinstance(part, Mapping))


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

