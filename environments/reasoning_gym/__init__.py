"""reasoning_gym: procedurally generated reasoning tasks scored by the `reasoning-gym` package itself.

Rows follow NeMo Gym's `reasoning_gym` server: `question`, `answer` and `metadata` (whose
`source_dataset` names the reasoning-gym task). The answer is taken from the last
`<answer>...</answer>` of the assistant's text, else its last `\\boxed{...}`, else the whole text,
and scored by the task's own `score_answer` (partial credit allowed), in a worker process with a
timeout. `gym-bridge data prepare reasoning_gym --task NAME` generates rows with the package.
"""

from __future__ import annotations

import importlib.util
import json
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import Any, ClassVar

import pydantic

from gym_bridge import (Environment, Item, MissingExtraError, RowProblem, Task, VerifyResult, last_boxed, last_tagged,
                        output_text, run_in_process)

INSTALL_HINT = "the reasoning_gym environment needs the reasoning-gym package: pip install 'gym-bridge[environments]'"
SYSTEM_PROMPT = ("Think about the problem step by step. Then give only the final answer inside answer tags, like this: "
                 "<answer>your answer</answer>. Follow the format of any example the question gives.")


class Metadata(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    source_dataset: str
    """The reasoning-gym task, e.g. `chain_sum`."""


class ReasoningGymRow(pydantic.BaseModel):
    """The verifier fields of a row (other fields are allowed and ignored)."""

    model_config = pydantic.ConfigDict(extra="allow")
    question: str
    answer: str | None
    metadata: Metadata


def require_package() -> Any:
    """The imported `reasoning_gym` package; MissingExtraError with the install command if absent."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise MissingExtraError(INSTALL_HINT)
    import reasoning_gym

    return reasoning_gym


def task_names() -> list[str]:
    """Every task the installed reasoning-gym can generate and score."""
    return sorted(require_package().factory.DATASETS)


def extract_answer(text: str) -> str:
    r"""The model's answer: the last `<answer>` tag's content, else the last `\boxed{}`'s, else the stripped text."""
    tagged = last_tagged(text, "answer")
    if tagged is not None:
        return tagged
    boxed = last_boxed(text)
    return boxed if boxed is not None else text.strip()


def score_answer(task_name: str, answer: str, entry: dict[str, Any]) -> float:
    """The task's own score of `answer` for `entry` (runs in a worker process).

    Raises ValueError for an unknown task. An error inside the scorer is a 0.0, as in NeMo Gym:
    it is how some scorers meet answers they cannot parse.
    """
    reasoning_gym = require_package()
    if task_name not in reasoning_gym.factory.DATASETS:
        raise ValueError(f"unknown reasoning-gym task {task_name!r}")
    scorer = reasoning_gym.get_score_answer_fn(task_name)
    try:
        return float(scorer(answer=answer, entry=entry))
    except Exception:  # noqa: BLE001  (the scorer's own failure on this answer)
        return 0.0


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


def make_rows(task_names_csv: str, *, size: int, seed: int, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`size` rows from one or more reasoning-gym tasks (comma-separated, equal shares), in NeMo
    Gym's format with a system prompt asking for `<answer>` tags. Equal arguments give equal rows."""
    reasoning_gym = require_package()
    names = [name.strip() for name in task_names_csv.split(",") if name.strip()]
    unknown = [name for name in names if name not in reasoning_gym.factory.DATASETS]
    if not names or unknown:
        raise ValueError(f"unknown reasoning-gym task(s) {unknown or task_names_csv!r}; known: {', '.join(sorted(reasoning_gym.factory.DATASETS))}")
    rows = []
    for position, name in enumerate(names):
        share = size // len(names) + (1 if position < size % len(names) else 0)
        if share == 0:
            continue
        dataset = reasoning_gym.create_dataset(name, size=share, seed=seed + position, **(config or {}))
        for entry in dataset:
            entry = json.loads(json.dumps({key: entry[key] for key in ("question", "answer", "metadata")}, default=_jsonable))
            rows.append({
                "responses_create_params": {"input": [{"role": "system", "content": SYSTEM_PROMPT},
                                                      {"role": "user", "content": entry["question"]}]},
                **entry,
                "agent_ref": {"type": "responses_api_agents", "name": "reasoning_gym"},
            })
    return rows


class ReasoningGymEnvironment(Environment):
    name = "reasoning_gym"
    aliases = ("reasoning_gym_simple_agent",)
    description = "Procedural reasoning tasks from the reasoning-gym package; scored by the task's own scorer (partial credit allowed)."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # no tools: only its committed model calls are replayed
    row_schema = ReasoningGymRow
    check_timeout_s: ClassVar[float] = 20.0
    VALIDATION_SEED_OFFSET: ClassVar[int] = 1_000_003
    """Added to the seed for the validation split, so it draws other puzzles than train."""

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        problems = super().validate_row(row)
        if problems:
            return problems
        try:
            known = task_names()
        except MissingExtraError as error:
            return [RowProblem("metadata.source_dataset", str(error))]
        if row["metadata"]["source_dataset"] not in known:
            problems.append(RowProblem("metadata.source_dataset", f"unknown reasoning-gym task {row['metadata']['source_dataset']!r}"))
        return problems

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int, task: str | None = None, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of reasoning-gym task(s) `task` (comma-separated); `config` goes to the task's
        dataset (e.g. {"min_terms": 2}). Raises ValueError naming the known tasks."""
        if not task:
            raise ValueError("reasoning_gym needs --task NAME (or NAME,NAME,...), e.g. --task chain_sum")
        offset = 0 if split == "train" else cls.VALIDATION_SEED_OFFSET
        return make_rows(task, size=size, seed=seed + offset, config=config)

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        problems = self.validate_row(task.row)
        if problems:
            reason = "; ".join(f"{p.field}: {p.message}" for p in problems)
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=f"row cannot be scored: {reason}")
        answer = extract_answer(output_text(output))
        entry = {"question": task.row["question"], "answer": task.row["answer"], "metadata": task.row["metadata"]}
        task_name = entry["metadata"]["source_dataset"]
        metrics: dict[str, Any] = {"task_name": task_name, "extracted_answer": answer}
        try:
            score = await run_in_process(score_answer, task_name, answer, entry, timeout_s=self.check_timeout_s)
        except (TimeoutError, BrokenExecutor) as error:
            reason = f"scorer timed out after {self.check_timeout_s:g} s" if isinstance(error, TimeoutError) else f"scorer crashed: {error}"
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=reason, metrics=metrics)
        return VerifyResult(reward=score, reward_components={"score": score}, metrics=metrics)
