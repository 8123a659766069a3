"""instruction_following: IFEval-style verifiable instructions (word counts, keywords, formats, case, ...).

Rows follow NeMo Gym's `instruction_following` server: `verifier_metadata` holds
`instruction_id_list` (IFEval ids such as `punctuation:no_comma`), `kwargs` (one object per
instruction, IFEval's argument names) and `grading_mode`: `binary` (1.0 iff every instruction is
followed) or `fraction` (the share followed). Older rows with these fields at the top level load
too. The last assistant message is checked by `checks.py`; a row this environment cannot check
(an unsupported id, a missing argument) is a masked `verifier` failure, never a score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic

from gym_bridge import Environment, Item, RowProblem, Task, VerifyResult, final_text, schema_problems

from environments.instruction_following.checks import INSTRUCTIONS, follows, kwargs_problems

METADATA_FIELDS = ("instruction_id_list", "kwargs", "grading_mode", "prompt")


class VerifierMetadata(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    instruction_id_list: list[str]
    kwargs: list[dict[str, Any] | None]
    grading_mode: Literal["binary", "fraction"] = "binary"
    prompt: str | None = None


class InstructionRow(pydantic.BaseModel):
    """The verifier fields of a row (other fields are allowed and ignored)."""

    model_config = pydantic.ConfigDict(extra="allow")
    verifier_metadata: VerifierMetadata


def verifier_metadata(row: dict[str, Any]) -> dict[str, Any]:
    """The row's `verifier_metadata`, completed with any of its fields found at the top level
    (older NeMo Gym rows); values inside `verifier_metadata` win."""
    metadata = dict(row.get("verifier_metadata") or {}) if isinstance(row.get("verifier_metadata"), dict) else {}
    for key in METADATA_FIELDS:
        if key not in metadata and key in row:
            metadata[key] = row[key]
    return metadata


def metadata_problems(row: dict[str, Any]) -> list[RowProblem]:
    """Everything that keeps a row from being checked, by field."""
    metadata = verifier_metadata(row)
    problems = schema_problems(InstructionRow, {"verifier_metadata": metadata})
    if problems:
        return problems
    ids, kwargs = metadata["instruction_id_list"], metadata["kwargs"]
    if len(ids) != len(kwargs):
        problems.append(RowProblem("verifier_metadata.kwargs", f"has {len(kwargs)} entries for {len(ids)} instructions"))
    if not ids:
        problems.append(RowProblem("verifier_metadata.instruction_id_list", "is empty"))
    for position, (instruction_id, arguments) in enumerate(zip(ids, kwargs)):
        for problem in kwargs_problems(instruction_id, arguments):
            field = "instruction_id_list" if problem.startswith("unsupported") else "kwargs"
            problems.append(RowProblem(f"verifier_metadata.{field}[{position}]", problem))
    return problems


class InstructionFollowingEnvironment(Environment):
    name = "instruction_following"
    aliases = ("instruction_following_simple_agent",)
    description = "Follow verifiable instructions (IFEval ids); reward 1 if all are followed (binary) or the share followed (fraction)."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # no tools: only its committed model calls are replayed

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        return metadata_problems(row)

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int) -> list[dict[str, Any]]:
        """`size` writing requests, each with 1-3 compatible instructions; `train` and
        `validation` draw from disjoint sets of requests."""
        from environments.instruction_following.generate import generate_rows

        return generate_rows(size=size, seed=seed, split=split)

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        problems = metadata_problems(task.row)
        if problems:
            reason = "; ".join(f"{p.field}: {p.message}" for p in problems)
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=f"row cannot be checked: {reason}")
        metadata = verifier_metadata(task.row)
        response = final_text(output)
        followed = [follows(i, k, response) for i, k in zip(metadata["instruction_id_list"], metadata["kwargs"])]
        share = sum(followed) / len(followed)
        reward = share if metadata.get("grading_mode", "binary") == "fraction" else float(all(followed))
        return VerifyResult(
            reward=reward,
            reward_components={"instructions": reward},
            metrics={"follow_all_instructions": all(followed), "follow_instruction_list": followed, "fraction_followed": share},
        )


def supported_instruction_ids() -> list[str]:
    """The IFEval instruction ids this environment checks."""
    return sorted(INSTRUCTIONS)

