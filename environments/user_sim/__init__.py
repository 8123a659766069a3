"""user_sim: a multi-turn conversation with a simulated user, and an environment that brings its own loop.

The model plays a front desk (hotel, restaurant, clinic, taxi) that must learn a request's
details from a user who reveals them only when asked, then file them with `submit_request`.
`UserSimulationLoop` drives the episode: a model turn that calls tools gets the tool outputs;
a turn that talks to the user gets the user's reply as a new user message; it ends when a
submission matches the row's `expected_request` (the goal), the user leaves, or turns run out.
The user is scripted (each fact has keywords that make the user say it) or, with
`user_sim.simulator = "policy"`, a text model role-playing the row's persona.
Reward 1.0 iff the last submission equals `expected_request` (case and spacing ignored).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, ClassVar

from gym_bridge import Environment, TextModel, Item, RolloutContext, FailRollout, Task, ToolError, VerifyResult, tool

from environments.user_sim.generate import prepare_user_sim_rows

DONE = "[[DONE]]"
USER_SYSTEM = """You are role-playing a USER talking to an assistant. Stay in character:
{persona}
Reply with one short message as the user, in the first person, and share a detail only when the assistant asks
for it. If the assistant has finished your request, or you have nothing to add, reply with exactly {done}."""


class UserSimulationLoop:
    """Model turn, then tool outputs or the simulated user's reply, until the goal, the user or the turns end it.

    Finish reasons: `answer` (goal met, or the user ended the conversation), `max_turns`,
    `length`, `budget`. `metrics.ended_by` in the verify result says which.
    """

    async def run(self, ctx: RolloutContext) -> str:
        env = ctx.env
        assert isinstance(env, UserSimEnvironment)
        for turn in range(ctx.limits.max_turns):
            step = await ctx.generate()
            if step is None:
                return env.end("budget")
            if step.finish_reason == "length":
                return env.end("length")
            last = turn == ctx.limits.max_turns - 1
            if step.calls:
                outputs = [await ctx.call_tool(call) for call in step.calls]
                if env.goal_met:
                    return env.end("goal", "answer")
                if last:
                    return env.end("turns", "max_turns")
                if not await ctx.append_tool_outputs_async(outputs):
                    return env.end("budget")
                continue
            if last:
                return env.end("turns", "max_turns")
            reply = await env.user_reply(ctx, step.text)
            if reply is None:
                return env.end("user", "answer")
            if not await ctx.append_user_message_async(reply):
                return env.end("budget")
        return env.end("turns", "max_turns")


class UserSimEnvironment(Environment):
    name = "user_sim"
    description = "Talk with a simulated user to learn a request's details, then submit it; reward 1 if the submission matches."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # tool calls and user replies replayed in a fresh session and checked (a sampled `policy` user may differ: then turn 0)
    inline_sync_tools = True  # submit_request only records its arguments
    agent_loop = UserSimulationLoop()
    settings = ("simulator", "user", "user_model", "user_base_url", "user_api", "user_tokenizer", "user_request_timeout_s",
                "user_max_retries", "max_user_turns")
    simulator: ClassVar[str | None] = None
    """`scripted` or `policy` for every row; None lets each row choose (`user_sim.simulator`, default scripted)."""
    user: ClassVar[TextModel | None] = None
    """The policy-driven user; when None it is built from the settings below (default: the embedded model)."""
    user_model: ClassVar[str | None] = None
    user_base_url: ClassVar[str | None] = None
    user_api: ClassVar[str] = "completions"
    user_tokenizer: ClassVar[str | None] = None
    user_request_timeout_s: ClassVar[float] = 60.0
    """With `user_base_url`: the bound on one attempt of one user reply."""
    user_max_retries: ClassVar[int] = 2
    max_user_turns: ClassVar[int] = 6
    """User replies at most (a row's `user_sim.max_user_turns` may lower it); then the user leaves."""

    def setup(self, task: Task) -> None:
        spec = task.get("user_sim")
        expected = task.get("expected_request")
        if not isinstance(spec, dict) or not isinstance(expected, dict) or not expected:
            raise FailRollout("env", f"{task.source}: a user_sim row needs a `user_sim` object and a non-empty `expected_request` object")
        self.task = task
        self.spec = spec
        self.expected = {str(key): str(value) for key, value in expected.items()}
        self.revealed: list[int] = []
        self.transcript: list[tuple[str, str]] = []
        """What was said after the prompt: ("assistant", text) and ("user", text), in order."""
        self.user_turns = 0
        self.submissions = 0
        self.goal_met = False
        self.ended_by = ""
        self.simulator_kind: str = self.simulator or spec.get("simulator") or "scripted"
        if self.simulator_kind not in ("scripted", "policy"):
            raise FailRollout("env", f"{task.source}: user_sim.simulator must be 'scripted' or 'policy', got {self.simulator_kind!r}")

    @tool
    def submit_request(self, fields: dict[str, str | int | float]) -> dict[str, Any]:
        """File the user's request once you know every detail.

        Args:
            fields: Each detail of the request by its field name, e.g. {"guest_name": "Ada Lovelace"}.
        """
        missing = sorted(set(self.expected) - set(fields))
        if missing:
            raise ToolError(f"missing fields: {', '.join(missing)}")
        self.submissions += 1
        self.goal_met = matches(fields, self.expected)
        return {"status": "submitted", "reference": f"REQ-{self.task.index:04d}-{self.submissions}"}

    def end(self, ended_by: str, finish: str | None = None) -> str:
        self.ended_by = ended_by
        return finish or ended_by

    async def user_reply(self, ctx: RolloutContext, assistant_text: str) -> str | None:
        """The user's next message, or None when the user leaves the conversation."""
        limit = min(self.max_user_turns, int(self.spec.get("max_user_turns") or self.max_user_turns))
        if self.user_turns >= limit:
            return None
        self.user_turns += 1
        self.transcript.append(("assistant", assistant_text))
        if self.simulator_kind == "scripted":
            reply: str | None = self.scripted_reply(assistant_text)
        else:
            try:
                helper = await self.user_model_instance()
                reply = await helper.complete(self.user_view(), max_new_tokens=128, session_id=f"user-{ctx.session_id}-{self.user_turns}")
            except Exception as error:  # the simulated user is part of the environment
                raise FailRollout("env", f"simulated user failed: {type(error).__name__}: {error}") from None
            if not reply or DONE in reply:
                reply = None
        if reply is not None:
            self.transcript.append(("user", reply))
        return reply

    def scripted_reply(self, assistant_text: str) -> str:
        """The facts whose keywords the assistant mentioned (not told yet), else a nudge or a closing line."""
        facts = self.spec.get("facts") or []
        text = assistant_text.lower()
        said = [
            position for position, fact in enumerate(facts)
            if position not in self.revealed and any(str(keyword).lower() in text for keyword in fact.get("keywords", []))
        ]
        self.revealed.extend(said)
        if said:
            return " ".join(str(facts[position]["reply"]) for position in said)
        if len(self.revealed) == len(facts):
            return str(self.spec.get("done_reply") or "That is everything. Please go ahead and submit my request.")
        return str(self.spec.get("fallback") or "Sorry, what do you need to know?")

    def user_view(self) -> list[dict[str, str]]:
        """The conversation from the user's side: the assistant's words as `user`, the user's as `assistant`."""
        persona = str(self.spec.get("persona") or "A customer with a request.")
        view = [{"role": "system", "content": USER_SYSTEM.format(persona=persona, done=DONE)}]
        view += [{"role": "assistant", "content": str(message["content"])} for message in self.task.messages if message["role"] == "user"]
        view += [{"role": "user" if role == "assistant" else "assistant", "content": text} for role, text in self.transcript]
        return view

    async def user_model_instance(self) -> TextModel:
        if self.user is not None:
            return self.user
        from gym_bridge import load_text_model

        return await asyncio.to_thread(
            load_text_model, self.user_model, base_url=self.user_base_url, api=self.user_api, tokenizer=self.user_tokenizer,
            request_timeout_s=self.user_request_timeout_s, max_retries=self.user_max_retries,
        )

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        expected = {str(key): str(value) for key, value in (task.get("expected_request") or {}).items()}
        submission = last_submission(output)
        goal = submission is not None and bool(expected) and matches(submission, expected)
        metrics = {
            "goal_met": goal,
            "submitted": submission is not None,
            "user_turns": getattr(self, "user_turns", None),
            "facts_revealed": len(getattr(self, "revealed", [])),
            "ended_by": getattr(self, "ended_by", ""),
        }
        return VerifyResult(reward=float(goal), reward_components={"goal": float(goal)}, metrics=metrics)

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int) -> list[dict[str, Any]]:
        """`size` generated scenarios (see generate.py); splits never share one."""
        return prepare_user_sim_rows(split=split, size=size, seed=seed)


def normalize(value: Any) -> str:
    """Case-folded, with runs of whitespace collapsed and the ends stripped."""
    return re.sub(r"\s+", " ", str(value)).strip().casefold()


def matches(fields: dict[str, Any], expected: dict[str, str]) -> bool:
    """Every expected field present with an equal value after `normalize`; extra fields are ignored."""
    return all(key in fields and normalize(fields[key]) == normalize(value) for key, value in expected.items())


def last_submission(output: list[Item]) -> dict[str, Any] | None:
    """The `fields` of the last `submit_request` call (None if none, or malformed)."""
    for item in reversed(output):
        if item["type"] == "function_call" and item["name"] == "submit_request":
            try:
                fields = json.loads(item["arguments"]).get("fields")
            except (json.JSONDecodeError, AttributeError):
                return None
            return fields if isinstance(fields, dict) else None
    return None
