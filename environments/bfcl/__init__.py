"""bfcl: BFCL v4 (the Berkeley Function-Calling Leaderboard) as two gym_bridge environments, scored by BFCL's own checkers.

`bfcl` holds the single-turn categories: the model answers once; its tool calls go to BFCL's AST checker (or, for
irrelevance and relevance entries, BFCL's rule: no call / some call). `bfcl_multi_turn` holds the multi-turn ones:
each BFCL user turn is a user message, the model calls tools (several per step, many steps) on BFCL's stateful
backends until it answers without a call, miss_func entries get their held-out functions at the turn BFCL says, and
BFCL's multi-turn state and response checkers give the verdict. BFCL runs in `.venv-bfcl` (`make install-bfcl`) as a
worker process (worker.py); rows come from the installed package: `gym-bridge data prepare bfcl --task CATEGORY`.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, ClassVar, Literal

from gym_bridge import ConfigError, Environment, FailRollout, Item, RolloutContext, Task, ToolError, VerifyResult, generate_turn

from environments.bfcl.bridge import INSTALL_HINT, Worker, WorkerError, require_worker_python, shared_worker, worker_python

MAX_STEPS_PER_TURN = 20
"""BFCL's MAXIMUM_STEP_LIMIT: model calls in one user turn beyond which BFCL force-quits the entry."""
_HINT = "" if worker_python() else " [not installed: make install-bfcl]"


def is_multi_turn(category: str) -> bool:
    return category.startswith("multi_turn")


def to_row(entry: dict[str, Any]) -> dict[str, Any]:
    """A gym_bridge task row of one BFCL entry as the worker describes it (id, category, turns, tools, ground truth)."""
    category = entry["category"]
    env = "bfcl_multi_turn" if is_multi_turn(category) else "bfcl"
    bfcl = {"id": entry["id"], "category": category}
    if is_multi_turn(category):
        bfcl["turns"] = entry["turns"][1:]
    row = {
        "agent_ref": {"type": "responses_api_agents", "name": env},
        "category": category,
        "responses_create_params": {"input": entry["turns"][0], "tools": entry["tools"], "parallel_tool_calls": True},
        "bfcl": bfcl,
    }
    if entry.get("ground_truth") is not None:
        row["ground_truth"] = entry["ground_truth"]
    return row


def prepare_bfcl_rows(*, size: int, task: str | None = None, worker: Worker | None = None) -> list[dict[str, Any]]:
    """The first `size` entries of BFCL category `task` (BFCL's order) as rows; ConfigError for an unknown or missing
    category (the message lists the known ones), MissingExtraError when `.venv-bfcl` is missing."""
    worker = worker or shared_worker()
    known = worker.request("hello")["categories"]
    if task not in known:
        raise ConfigError(f"unknown BFCL category {task!r} (pass --task CATEGORY); categories that run here: {', '.join(known)}")
    return [to_row(entry) for entry in worker.request("rows", category=task)[:size]]


def _bfcl_fields(task: Task) -> tuple[str, str]:
    spec = task.get("bfcl")
    if not isinstance(spec, dict) or not isinstance(spec.get("id"), str) or not isinstance(spec.get("category"), str):
        raise FailRollout("env", f"{task.source}: a BFCL row needs `bfcl: {{id, category}}` (build rows with `gym-bridge data prepare bfcl --task CATEGORY`)")
    return spec["id"], spec["category"]


def calls_of(items: list[Item]) -> list[dict[str, Any]]:
    """The tool calls among `items`, as `{name, arguments}`."""
    return [{"name": item["name"], "arguments": item["arguments"]} for item in items if item["type"] == "function_call"]


def turns_of(output: list[Item]) -> list[list[list[dict[str, Any]]]]:
    """A multi-turn trajectory as BFCL's result shape: per user turn, its steps (one per model call that called
    tools), each the calls of that step. A user message starts a turn; tool outputs end a step."""
    turns: list[list[list[dict[str, Any]]]] = [[]]
    step: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "function_call":
            step.append({"name": item["name"], "arguments": item["arguments"]})
            continue
        if step:
            turns[-1].append(step)
            step = []
        if item["type"] == "message" and item.get("role") == "user":
            turns.append([])
    if step:
        turns[-1].append(step)
    return turns


def verdict_result(category: str, verdict: dict[str, Any], **metrics: Any) -> VerifyResult:
    """BFCL's verdict as the reward (1.0 valid, else 0.0), with BFCL's category and error type in the metrics."""
    reward = 1.0 if verdict["valid"] else 0.0
    return VerifyResult(reward=reward, metrics={"bfcl_category": category, "bfcl_valid": bool(verdict["valid"]),
                                                "bfcl_error_type": verdict.get("error_type") or "", **metrics})


class _BfclBase(Environment):
    settings = ("request_timeout_s",)
    tools_from_row = True
    tool_timeout_s: ClassVar[float] = 240.0  # the first request of a new worker waits for BFCL's imports
    verify_timeout_s: ClassVar[float] = 240.0
    request_timeout_s: ClassVar[float] = 60.0
    """Bound on one worker request once the worker runs; past it the worker is stopped and the rollout fails."""

    @classmethod
    def check_ready(cls) -> None:
        require_worker_python()

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int, task: str | None = None) -> list[dict[str, Any]]:
        """The first `size` entries of BFCL category `task`. BFCL is one test set: `split` and `seed` change nothing."""
        return prepare_bfcl_rows(size=size, task=task)

    def request(self, op: str, kind: Literal["env", "verifier"], **fields: Any) -> Any:
        """A worker request whose failure fails the rollout as `kind`."""
        try:
            return shared_worker().request(op, timeout_s=self.request_timeout_s, **fields)
        except WorkerError as error:
            raise FailRollout(kind, f"BFCL worker, {op}: {error}") from None


class SingleAnswerLoop:
    """One model call: its tool calls (parsed, never run) are the answer BFCL checks."""

    async def run(self, ctx: RolloutContext) -> str:
        step = await generate_turn(ctx)
        return step if isinstance(step, str) else "answer"


class BfclEnvironment(_BfclBase):
    name = "bfcl"
    description = "BFCL v4 single-turn categories (AST, irrelevance, live); reward 1 when BFCL's own checker accepts the calls." + _HINT
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    agent_loop = SingleAnswerLoop()

    def setup(self, task: Task) -> None:
        self.entry_id, self.category = _bfcl_fields(task)

    def call_row_tool(self, tool_name: str, /, **arguments: Any) -> Any:
        raise ToolError("BFCL single-turn entries are checked, not executed")

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        entry_id, category = _bfcl_fields(task)
        calls = calls_of(output)
        verdict = self.request("ast_check", "verifier", id=entry_id, calls=calls)
        return verdict_result(category, verdict, calls=len(calls))


class BfclTurnsLoop:
    """BFCL's multi-turn inference loop (`BaseHandler.inference_multi_turn_FC` in bfcl_eval's base handler): per
    user turn, model calls whose calls run on the backends until a model call gives none to run (an answer, a cut
    answer, calls that do not all parse), at most `MAX_STEPS_PER_TURN` + 1 calls that run calls (then BFCL
    force-quits); the next turn's user message follows. BFCL's runner reads the server's answer, never its finish
    reason: a server answers a turn whose calls do not all parse as text (serve-model's and vLLM's tool parsers), and
    BFCL's decoder then fails or finds no call, which ends the turn; a cut call whose calls parse runs like any other.
    A cut call is closed by the next message's rendering (the end-of-turn token it did not sample is an environment
    token). Finishes `answer`, or `length` when the episode's last model call was cut."""

    async def run(self, ctx: RolloutContext) -> str:
        env = ctx.env
        assert isinstance(env, BfclMultiTurnEnvironment)
        calls_left = ctx.limits.max_turns
        cut = False
        for index in range(len(env.turns)):
            if index > 0:
                ctx = env.begin_turn(ctx, index)
                if not await ctx.append_user_message_async(env.user_message(index)):
                    return "budget"
            for _ in range(MAX_STEPS_PER_TURN + 1):
                if calls_left == 0:
                    return "max_turns"
                calls_left -= 1
                step = await ctx.generate()
                if step is None:
                    return "budget"
                cut = step.finish_reason == "length"
                calls = () if any(call.error is not None for call in step.calls) else step.calls
                if not calls:
                    break
                outputs = [await ctx.call_tool(call) for call in calls]
                if not await ctx.append_tool_outputs_async(outputs):
                    return "budget"
            else:
                return "max_turns"  # BFCL's force quit: the entry fails its turn count
        return "length" if cut else "answer"


class BfclMultiTurnEnvironment(_BfclBase):
    name = "bfcl_multi_turn"
    description = "BFCL v4 multi-turn categories on BFCL's stateful backends; reward 1 when BFCL's state and response checkers pass." + _HINT
    example_data = Path(__file__).parent / "data" / "example_multi_turn.jsonl"
    agent_loop = BfclTurnsLoop()

    def setup(self, task: Task) -> None:
        self.entry_id, self.category = _bfcl_fields(task)
        later = task.get("bfcl").get("turns") or []
        self.turns: list[list[Any]] = [list(task.messages), *later]
        self.session = uuid.uuid4().hex
        self.added = self.request("open", "env", session=self.session, id=self.entry_id)["added"]

    def begin_turn(self, ctx: RolloutContext, index: int) -> RolloutContext:
        """Make the functions BFCL holds out until turn `index` callable and offered; returns the context to go on with."""
        added = self.added.get(str(index))
        if not added:
            return ctx
        self.request("add_functions", "env", session=self.session, turn=str(index))
        return ctx.with_tools(added["tools"])

    def user_message(self, index: int) -> str:
        """The user message of turn `index` (BFCL's turns hold one); a held-out-function turn has BFCL's message
        listing the new functions."""
        added = self.added.get(str(index))
        if added and not self.turns[index]:
            return str(added["message"])
        return "\n\n".join(str(message["content"]) for message in self.turns[index])

    def call_row_tool(self, tool_name: str, /, **arguments: Any) -> str:
        result: str = self.request("call", "env", session=self.session, call={"name": tool_name, "arguments": arguments})
        return result

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        entry_id, category = _bfcl_fields(task)
        verdict = self.request("multi_turn_check", "verifier", id=entry_id, turns=turns_of(output), check=uuid.uuid4().hex)
        return verdict_result(category, verdict, malformed_calls=verdict.get("malformed", 0))

    def close(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            self.request("close", "env", session=session)


__all__ = ["BfclEnvironment", "BfclMultiTurnEnvironment", "INSTALL_HINT", "prepare_bfcl_rows", "turns_of"]
