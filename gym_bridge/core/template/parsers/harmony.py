"""gpt-oss's harmony format: a turn is a sequence of messages `<|channel|>NAME<|message|>BODY`,
joined by `<|end|><|start|>assistant`. The `analysis` channel is reasoning (vLLM's
`openai_gptoss` reasoning parser); a message addressed `to=functions.NAME` (in the role or the
channel header) is a tool call whose body is its JSON arguments (vLLM's `openai` tool parser); as
in vLLM, a bare `to=NAME` is a call too, except to gpt-oss's built-in tools (`python`, `browser.*`,
`container.*`), which gym_bridge does not run: such a message is kept as text and the turn is
flagged as holding an unparsed call. `final`, and `commentary` without a recipient, are the answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gym_bridge.core.template.parsers.call import arguments_object, call_from_arguments, to_json
from gym_bridge.core.turn import ToolCall, Turn

START, MESSAGE, END, CALL, RETURN, CHANNEL = "<|start|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|channel|>"
_RECIPIENT = re.compile(r"to=([^\s<]+)")
BUILTIN_TOOLS = ("python", "browser", "container")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"(\w+)")


@dataclass(frozen=True)
class HarmonyMessage:
    channel: str
    recipient: str
    """Whom the message is addressed to, as written (`functions.NAME`, `NAME`, `browser.search`; '' for nobody)."""
    body: str

    @property
    def function(self) -> str:
        """The function a tool call is addressed to ('' when the message is no function call)."""
        if self.recipient.startswith("functions."):
            return self.recipient.removeprefix("functions.")
        if self.recipient in ("", "assistant") or self.recipient.split(".", 1)[0] in BUILTIN_TOOLS:
            return ""
        return self.recipient


def split_messages(text: str) -> list[HarmonyMessage]:
    """The messages of a sampled turn (the text after the `<|start|>assistant` prompt)."""
    messages = []
    for chunk in text.split(START):
        if not chunk.strip():
            continue
        header, found, body = chunk.partition(MESSAGE)
        if not found:
            messages.append(HarmonyMessage(channel="", recipient="", body=chunk.removeprefix("assistant")))
            continue
        for marker in (END, CALL, RETURN):
            body = body.split(marker, 1)[0]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        messages.append(HarmonyMessage(channel=channel.group(1) if channel else "", recipient=recipient.group(1) if recipient else "", body=body))
    return messages


def _join(messages: list[HarmonyMessage]) -> str:
    parts = []
    for message in messages:
        header = f" to={message.recipient}" if message.recipient else ""
        parts.append(f"{header}{CHANNEL}{message.channel}{MESSAGE}{message.body}")
    return f"{END}{START}assistant".join(parts)


class HarmonyReasoningParser:
    name = "openai_gptoss"
    opener = None

    def split(self, text: str, *, opened: bool = False) -> tuple[str, str]:
        if MESSAGE not in text:
            return "", text
        messages = split_messages(text)
        reasoning = "\n".join(m.body for m in messages if m.channel == "analysis" and not m.recipient)
        rest = [m for m in messages if not (m.channel == "analysis" and not m.recipient)]
        return reasoning, _join(rest)

    def format(self, reasoning: str, *, opened: bool = False) -> str:
        return f"{CHANNEL}analysis{MESSAGE}{reasoning}{END}{START}assistant"


class HarmonyToolParser:
    name = "openai"
    markers = ("to=functions.",)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        if MESSAGE not in text:
            return Turn(reasoning="", text=text.strip())
        reasoning, content, calls, builtin = [], [], [], False
        for message in split_messages(text):
            if message.function:
                calls.append(call_from_arguments(message.function, message.body))
            elif message.channel == "analysis":
                reasoning.append(message.body)
            else:
                content.append(message.body)
            builtin = builtin or bool(message.recipient and not message.function)
        return Turn(reasoning="\n".join(reasoning), text="\n".join(content).strip(), calls=tuple(calls),
                          unparsed_tool_call=builtin and not calls)

    def format(self, calls: Sequence[ToolCall]) -> str:
        return f"{CALL}{START}assistant".join(
            f" to=functions.{call.name}{CHANNEL}commentary json{MESSAGE}{to_json(arguments_object(call))}" for call in calls
        )
