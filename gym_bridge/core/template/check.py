"""The append-only check: does streaming give what the template renders for the whole conversation?

Owns `check_template`, its `TemplateReport` and `check_append_only`; the top layer of templating
(above `chat_render`, `template_profile` and `template`), run once before a run.

For a few conversation shapes (a call and its output, parallel calls, a chain, a new user message
after an answer), with reasoning where the family reasons and each turn as the template renders it,
each model call's streamed prompt is compared with the template's rendering of the conversation so
far. The report says per shape: append-only, rewrites history (and how), or not renderable.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from gym_bridge.core.errors import TemplateError
from gym_bridge.core.conversation import TemplateMessage
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.profile import PROBE_ANSWER, PROBE_REASONING, PROBE_TOOLS, canonical_turn, strip_end
from gym_bridge.core.turn import ToolCall, Turn

TemplateCheck = Literal["error", "warn", "off"]
"""What to do with a template that is not append-only: refuse it, warn and go on, or not check."""
Shape = Literal["tool call, tool output, answer", "same without a system message", "two calls in one turn",
                "two tool-call turns in a row", "new user message after an answer"]
"""The conversation shapes a template is checked on."""
Verdict = Literal["append-only", "rewrites history", "not supported by the template"]
APPEND_ONLY: Verdict = "append-only"
REWRITES: Verdict = "rewrites history"
UNSUPPORTED: Verdict = "not supported by the template"
WARN_CHOICE = (
    "gym_bridge trains on exactly the tokens the model saw while sampling (the first prompt, the sampled turns and the "
    "environment's deltas, appended). A chat server renders the whole conversation again for every turn, so on later "
    "turns it would show this model a different history than the one gym_bridge samples and trains on. Pass "
    "template_check='warn' to accept the streamed rendering: that is the documented choice for templates that rewrite "
    "history (Qwen3 in thinking mode, QwQ, DeepSeek-R1, gpt-oss)"
)
_ALTERNATIVES = ({"enable_thinking": False}, {"preserve_thinking": True}, {"thinking": False}, {"thinking": True})


@dataclass(frozen=True)
class ShapeResult:
    shape: Shape
    verdict: Verdict
    detail: str = ""


@dataclass(frozen=True)
class TemplateReport:
    """What the check found for one chat template."""

    tool_parser: str
    reasoning_parser: str
    style: str
    """How assistant turns are given to the template (TurnStyle.describe())."""
    end_of_turn: str
    prompt_opens_reasoning: bool
    shapes: tuple[ShapeResult, ...]
    alternatives: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """chat_template_kwargs with which the template is append-only for every shape."""

    @property
    def append_only(self) -> bool:
        """No shape rewrites history (shapes the template cannot render at all do not count)."""
        return all(result.verdict != REWRITES for result in self.shapes)

    def summary(self) -> str:
        """One line per shape."""
        return "\n".join(f"  - {r.shape}: {r.verdict}" + (f" ({r.detail})" if r.detail else "") for r in self.shapes)

    def message(self) -> str:
        rewriting = [r for r in self.shapes if r.verdict == REWRITES]
        text = (f"chat template is not append-only for {len(rewriting)} of {len(self.shapes)} conversation shapes "
                f"(tool parser {self.tool_parser}, reasoning parser {self.reasoning_parser}, assistant turns as "
                f"{self.style}):\n{self.summary()}\n{WARN_CHOICE}")
        if self.alternatives:
            text += "; or pass " + " or ".join(f"chat_template_kwargs={kwargs}" for kwargs in self.alternatives) + \
                ", with which this template is append-only"
        return text + "."


@dataclass(frozen=True)
class _Step:
    turn: Turn | None = None
    tool_outputs: tuple[tuple[str, str], ...] = ()
    """(call name, output) per call of the previous turn."""
    user: str = ""


def _call(word: str) -> ToolCall:
    return ToolCall(name="lookup", arguments=f'{{"word": "{word}"}}')


def _shapes(reasoning: str) -> dict[Shape, tuple[list[TemplateMessage], list[_Step]]]:
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "What is a?"}
    call_a = _Step(turn=Turn(reasoning=reasoning, calls=(_call("a"),)))
    call_b = _Step(turn=Turn(reasoning=reasoning, calls=(_call("b"),)))
    out_a, out_b = ("lookup", '{"value": 4}'), ("lookup", '{"value": 5}')
    answer = _Step(turn=Turn(reasoning=reasoning, text=PROBE_ANSWER))
    return {
        "tool call, tool output, answer": ([system, user], [call_a, _Step(tool_outputs=(out_a,)), answer]),
        "same without a system message": ([user], [call_a, _Step(tool_outputs=(out_a,)), answer]),
        "two calls in one turn": ([system, user], [
            _Step(turn=Turn(reasoning=reasoning, calls=(_call("a"), _call("b")))), _Step(tool_outputs=(out_a, out_b)), answer]),
        "two tool-call turns in a row": ([system, user], [
            call_a, _Step(tool_outputs=(out_a,)), call_b, _Step(tool_outputs=(out_b,)), answer]),
        "new user message after an answer": ([system, user], [
            call_a, _Step(tool_outputs=(out_a,)), answer, _Step(user="And b?"), answer]),
    }


def _difference(streamed: str, full: str) -> str:
    at = len(os.path.commonprefix([streamed, full]))
    if streamed.count(PROBE_REASONING) > full.count(PROBE_REASONING):
        how = "the template drops the reasoning of earlier turns"
    else:
        how = "the template renders earlier parts of the conversation differently"
    return (f"{how}; first difference at character {at}: whole={full[max(0, at - 40):at + 40]!r} "
            f"vs streamed={streamed[max(0, at - 40):at + 40]!r}")


def _run_shape(template: ChatTemplate, shape: Shape, messages: list[TemplateMessage], steps: Sequence[_Step]) -> ShapeResult:
    """Stream the shape and compare each model call's prompt with the whole rendering.
    Raises TemplateError when the template cannot render the shape."""
    profile, tools = template.profile, list(PROBE_TOOLS)
    streamed = template.prompt_text(messages, tools)
    conversation = list(messages)
    closing, calls_seen = "", 0
    turn_ids: list[str] = []
    for step in steps:
        if step.turn is not None:
            full = template.render(conversation, tools=tools, add_generation_prompt=True)
            if streamed != full:
                return ShapeResult(shape=shape, verdict=REWRITES, detail=_difference(streamed, full))
            turn_ids = []
            for _ in step.turn.calls:
                calls_seen += 1
                turn_ids.append(template.call_id(f"check_{calls_seen}"))
            turn = Turn(reasoning=step.turn.reasoning, text=step.turn.text, calls=tuple(
                ToolCall(name=c.name, arguments=c.arguments, id=i) for c, i in zip(step.turn.calls, turn_ids)))
            sampled = canonical_turn(template, profile, turn)
            raw = strip_end(sampled, template.end_texts)
            closing = sampled[len(raw):]
            streamed += sampled
            parsed = template.parse(raw, prompt_ids=template.encode(streamed[: len(streamed) - len(sampled)]), tools=tools)
            if len(parsed.calls) != len(turn.calls):
                return ShapeResult(shape=shape, verdict=UNSUPPORTED,
                                   detail=f"the template renders {len(parsed.calls)} of the {len(turn.calls)} calls of one turn")
            conversation.append(template.template_message(parsed, call_ids=turn_ids, raw_text=raw))
        elif step.tool_outputs:
            new = [{"role": "tool", "name": name, "content": output, "tool_call_id": call_id}
                   for (name, output), call_id in zip(step.tool_outputs, turn_ids)]
            streamed += template.delta_text(new, closing_sampled=closing)
            conversation.extend(new)
        else:
            new = [{"role": "user", "content": step.user}]
            streamed += template.delta_text(new, closing_sampled=closing)
            conversation.extend(new)
    return ShapeResult(shape=shape, verdict=APPEND_ONLY)


def check_template(template: ChatTemplate, *, alternatives: bool = True) -> TemplateReport:
    """Run every shape on `template`. Raises TemplateError only when the template cannot render a
    one-question prompt at all or no end-of-turn token ends its turns."""
    profile = template.profile
    head = template.render([{"role": "user", "content": "What is a?"}], tools=list(PROBE_TOOLS), add_generation_prompt=True)
    reasoning = PROBE_REASONING if profile.parser.reasoning is not None and not head.rstrip().endswith("</think>") else ""
    results = []
    for shape, (messages, steps) in _shapes(reasoning).items():
        try:
            results.append(_run_shape(template, shape, messages, steps))
        except TemplateError as error:
            cause = error.__cause__ or error
            results.append(ShapeResult(shape=shape, verdict=UNSUPPORTED, detail=f"{type(cause).__name__}: {cause}"[:300]))
    report = TemplateReport(
        tool_parser=profile.tool_parser, reasoning_parser=profile.reasoning_parser, style=profile.style.describe(),
        end_of_turn=profile.end_of_turn, prompt_opens_reasoning=bool(profile.opener), shapes=tuple(results),
    )
    if alternatives and not report.append_only:
        found = []
        for kwargs in _ALTERNATIVES:
            key = next(iter(kwargs))
            if key not in template.template_text or template.chat_template_kwargs.get(key) == kwargs[key]:
                continue
            try:
                other = template.with_options(chat_template_kwargs={**template.chat_template_kwargs, **kwargs})
                if check_template(other, alternatives=False).append_only:
                    found.append(kwargs)
            except TemplateError:
                continue
        report = TemplateReport(**{**report.__dict__, "alternatives": tuple(found)})
    return report


_REPORTS: weakref.WeakKeyDictionary[ChatTemplate, TemplateReport] = weakref.WeakKeyDictionary()


def template_report(template: ChatTemplate) -> TemplateReport:
    """Per conversation shape, whether streaming equals rendering the whole conversation
    (`check_template`, cached per template)."""
    report = _REPORTS.get(template)
    if report is None:
        report = _REPORTS[template] = check_template(template)
    return report


def check_append_only(template: ChatTemplate) -> None:
    """Raise TemplateError, naming each shape that differs and why, unless `template` is
    append-only for every conversation shape it supports."""
    report = template_report(template)
    if not report.append_only:
        raise TemplateError(report.message())
