"""workplace_assistant: office tasks over 27 tools, scored by the state they leave behind.

Each rollout gets a fresh copy of a seeded in-memory company (directory, mailbox, calendar, web
analytics, project tasks, customers; see `world.py`). The tools and their parameters are those
of NeMo Gym's `workplace_assistant` server, so its rows load as they are. Verification replays
the model's tool calls and the row's `ground_truth` calls, each on a fresh copy of the initial
world, and gives 1.0 iff the two resulting states are equal after normalisation (README.md).
"""

from __future__ import annotations

import base64
import os
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pydantic

from gym_bridge import Environment, Item, RowProblem, Task, ToolError, VerifyResult

from environments.workplace_assistant import world
from environments.workplace_assistant.toolsets import Analytics, Calendar, CustomerRelationshipManager, Directory, Email, ProjectManagement

CSV_FOLDER_VARIABLE = "GYM_BRIDGE_WORKPLACE_CSV_DIR"
"""Environment variable naming NeMo Gym's workplace `csv_data` folder, for NeMo Gym's own rows."""


@dataclass(frozen=True)
class ReplayResult:
    """The normalised state after replaying tool calls, and how many of them failed."""

    state: dict[str, list[tuple[Any, ...]]]
    failed_calls: int


class GroundTruthCall(pydantic.BaseModel):
    name: str
    arguments: str | dict[str, Any]
    """A JSON object, as text (NeMo Gym's rows) or as an object."""


class WorkplaceRow(pydantic.BaseModel):
    """The verifier fields of a workplace row (other fields are allowed and ignored)."""

    model_config = pydantic.ConfigDict(extra="allow")
    ground_truth: list[GroundTruthCall]
    world_seed: int | None = None
    """Seed of the generated world; absent in NeMo Gym's rows, which use its CSV data."""


class WorkplaceAssistantEnvironment(Environment):
    name = "workplace_assistant"
    aliases = ("workplace_assistant_simple_agent",)
    description = "Office tasks with 27 tools (email, calendar, analytics, projects, CRM); reward 1 if the final state matches the ground truth's."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    inline_sync_tools = True  # quick queries on an in-memory database
    resume = "snapshot"  # the database at each turn boundary (about 20 kB compressed); committed tool calls never run twice
    row_schema = WorkplaceRow
    toolsets = (Directory, Email, Calendar, Analytics, ProjectManagement, CustomerRelationshipManager)
    csv_folder: ClassVar[str | None] = None
    """NeMo Gym's `csv_data` folder for rows without `world_seed` (default: $GYM_BRIDGE_WORKPLACE_CSV_DIR)."""

    db: sqlite3.Connection

    @classmethod
    def world_source(cls, row: dict[str, Any]) -> tuple[int | None, str | None]:
        """(seed, CSV folder) of the world a row plays in; raises ValueError for a NeMo Gym row
        (no `world_seed`) when no CSV folder is configured."""
        if row.get("world_seed") is not None:
            return int(row["world_seed"]), None
        folder = cls.csv_folder or os.environ.get(CSV_FOLDER_VARIABLE)
        if not folder:
            raise ValueError(
                f"this row has no world_seed, so it is a NeMo Gym row, which plays in NeMo Gym's data: set "
                f"{CSV_FOLDER_VARIABLE} to NeMo Gym's resources_servers/workplace_assistant/csv_data folder, or add world_seed"
            )
        return None, str(Path(folder).resolve())

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        problems = super().validate_row(row)
        if problems:
            return problems
        try:
            cls.world_source(row)
        except ValueError as error:
            problems.append(RowProblem("world_seed", str(error)))
        for position, call in enumerate(row["ground_truth"]):
            field = f"ground_truth[{position}]"
            if call["name"] not in cls.tool_specs():
                problems.append(RowProblem(f"{field}.name", f"unknown tool {call['name']!r}"))
                continue
            try:
                cls.tool_arguments(call["name"], call["arguments"])
            except ToolError as error:
                problems.append(RowProblem(f"{field}.arguments", str(error).splitlines()[0]))
        return problems

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int) -> list[dict[str, Any]]:
        """`size` generated tasks over all domains; `train` plays in world 0, `validation` in world 1,
        so the two splits share no records."""
        from environments.workplace_assistant.generate_tasks import TEMPLATES, generate_rows

        per_category = -(-size // len(TEMPLATES))
        return generate_rows(per_category=per_category, seed=seed, world_seed=0 if split == "train" else 1)[:size]

    def setup(self, task: Task) -> None:
        seed, folder = self.world_source(task.row)
        self.db = world.open_world(seed, folder)
        self.now = self.db.execute("SELECT value FROM meta WHERE key = 'now'").fetchone()[0]

    def snapshot(self) -> dict[str, str]:
        """The session's database, compressed, as base64 text (its open transaction committed first: `serialize`
        leaves out what is not committed)."""
        self.db.commit()
        return {"db": base64.b64encode(zlib.compress(self.db.serialize(), 1)).decode("ascii"), "now": self.now}

    def restore(self, task: Task, state: dict[str, str]) -> None:
        self.db = world.open_bytes(zlib.decompress(base64.b64decode(state["db"])))
        self.now = state["now"]

    def close(self) -> None:
        if getattr(self, "db", None) is not None:
            self.db.close()

    # --- verification --------------------------------------------------------------------------

    @classmethod
    def replay(cls, task: Task, calls: list[tuple[str, str | dict[str, Any]]]) -> ReplayResult:
        """Run tool calls on a fresh copy of the task's initial world; calls that fail (unknown
        tool, bad arguments, a ToolError) change nothing and are counted, as in the rollout."""
        env = cls()
        env.setup(task)
        try:
            offered = {schema["name"] for schema in task.tools} if task.tools is not None else set(cls.tool_specs())
            failed = 0
            for name, arguments in calls:
                if name not in offered:
                    failed += 1
                    continue
                try:
                    env.call_tool(name, arguments)
                except ToolError:  # an unknown tool, invalid arguments, or the tool's own error
                    failed += 1
            return ReplayResult(state=world.snapshot(env.db), failed_calls=failed)
        finally:
            env.close()

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        try:
            truth = [(call.name, call.arguments) for call in WorkplaceRow.model_validate(task.row).ground_truth]
            self.world_source(task.row)
        except (pydantic.ValidationError, ValueError) as error:
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=f"bad row: {error}".splitlines()[0])
        calls: list[tuple[str, str | dict[str, Any]]] = [(item["name"], item["arguments"]) for item in output if item["type"] == "function_call"]
        predicted, expected = self.replay(task, calls), self.replay(task, truth)
        initial = self.replay(task, [])
        correct = predicted.state == expected.state
        return VerifyResult(
            reward=float(correct),
            reward_components={"state_match": float(correct)},
            metrics={
                "tool_calls": len(calls),
                "failed_tool_calls": predicted.failed_calls,
                "changed_state": predicted.state != initial.state,
                "tables_differing": sorted(t for t in world.COMPARED_TABLES if predicted.state[t] != expected.state[t]),
            },
        )
