r"""arithmetic: short integer sums, differences and products answered in \boxed{}.

Made for the CPU training demo: the embedded SmolLM2-135M-Instruct gets some of these right from the
start (a low but non-zero reward), so GRPO has groups whose rewards differ and something to learn.

Reward: 1.0 when the last `\boxed{}` of the final answer holds the right integer; `format_reward`
(default 0.1) when it holds some other integer; 0.0 without a boxed integer. The components are
`correct` (0 or 1) and `format` (the rest), so accuracy can be read apart from format.

`prepare_rows(split=..., size=..., seed=...)` generates tasks; a problem belongs to `train` or
`validation` by a hash of the problem itself, so the two splits never share a problem whatever the
seeds and sizes.
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path
from typing import Any, ClassVar

import pydantic

from gym_bridge import Environment, Item, RowProblem, Task, VerifyResult, final_text, last_boxed

__all__ = ["ArithmeticEnvironment", "SYSTEM_PROMPT", "WORKED_EXAMPLES", "make_row", "parse_integer", "problem_split"]

SYSTEM_PROMPT = "You solve arithmetic problems. Answer in one short line that ends with the result in \\boxed{}."
INSTRUCTION = "Put the result in \\boxed{}."
WORKED_EXAMPLES = (("What is 14 + 9?", "14 + 9 = 23. \\boxed{23}"), ("What is 7 × 6?", "7 × 6 = 42. \\boxed{42}"))
"""Earlier turns of every prompt: a small model copies the form of a worked exchange far more
reliably than it follows an instruction."""
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
VALIDATION_SHARE = 5
"""One problem in this many belongs to the validation split."""
_INTEGER = re.compile(r"^[+-]?\d{1,3}(,\d{3})*$|^[+-]?\d+$")


class ArithmeticRow(pydantic.BaseModel):
    """The verifier field of an arithmetic row (other fields are allowed and ignored)."""

    model_config = pydantic.ConfigDict(extra="allow")
    expected_answer: str


def parse_integer(text: str | None) -> int | None:
    """The integer a boxed answer holds (`1,234`, `-7`, `+3`, `$12$` accepted), else None."""
    if text is None:
        return None
    cleaned = text.strip().strip("$").replace(" ", "")
    if not _INTEGER.match(cleaned):
        return None
    return int(cleaned.replace(",", ""))


def problem_split(a: int, op: str, b: int) -> str:
    """`validation` or `train`, fixed per problem."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return "validation" if digest[0] % VALIDATION_SHARE == 0 else "train"


def make_row(a: int, op: str, b: int, *, worked_examples: int = 1, system: bool = True) -> dict[str, Any]:
    """A row asking for `a op b`, after `worked_examples` of WORKED_EXAMPLES as earlier turns."""
    symbol = "×" if op == "*" else op
    question = f"What is {a} {symbol} {b}?"
    examples = [{"role": role, "content": text} for pair in WORKED_EXAMPLES[:worked_examples] for role, text in zip(("user", "assistant"), pair)]
    first = [{"role": "system", "content": SYSTEM_PROMPT}] if system else []
    return {
        "responses_create_params": {"input": [*first, *examples, {"role": "user", "content": question if system else f"{question} {INSTRUCTION}"}]},
        "expected_answer": str(OPERATIONS[op](a, b)),
        "question": question,
        "agent_ref": {"name": "arithmetic"},
    }


class ArithmeticEnvironment(Environment):
    name = "arithmetic"
    description = r"Short integer arithmetic answered in \boxed{}; 1 if right, format_reward for another boxed integer."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # no tools: only its committed model calls are replayed
    row_schema = ArithmeticRow
    settings = ("format_reward",)
    format_reward: ClassVar[float] = 0.1
    """Reward of a boxed integer that is wrong (0 turns the reward into plain accuracy)."""

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        problems = super().validate_row(row)
        if not problems and parse_integer(row["expected_answer"]) is None:
            problems.append(RowProblem("expected_answer", f"{row['expected_answer']!r} is not an integer"))
        return problems

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int, worked_examples: int = 1, system: bool = True) -> list[dict[str, Any]]:
        """`size` distinct problems of `split` (`train` or `validation`): sums and differences of
        numbers up to 50, products of a one-digit and a number up to 12."""
        if split not in ("train", "validation"):
            raise ValueError(f"split must be train or validation, got {split!r}")
        rng = random.Random(f"arithmetic-{seed}")
        seen: set[tuple[int, str, int]] = set()
        rows = []
        for _ in range(size * 200):
            op = rng.choice("++-*")
            a, b = (rng.randint(2, 9), rng.randint(2, 12)) if op == "*" else (rng.randint(1, 50), rng.randint(1, 50))
            if op == "-" and b > a:
                a, b = b, a
            if (a, op, b) in seen or problem_split(a, op, b) != split:
                continue
            seen.add((a, op, b))
            rows.append(make_row(a, op, b, worked_examples=worked_examples, system=system))
            if len(rows) == size:
                return rows
        raise ValueError(f"cannot draw {size} distinct {split} problems")

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        expected = parse_integer(task.get("expected_answer"))
        if expected is None:
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier",
                                failure_reason=f"expected_answer {task.get('expected_answer')!r} is not an integer")
        boxed = last_boxed(final_text(output))
        answer = parse_integer(boxed)
        correct = answer == expected
        reward = 1.0 if correct else (self.format_reward if answer is not None else 0.0)
        return VerifyResult(
            reward=reward,
            reward_components={"correct": float(correct), "format": reward - float(correct)},
            metrics={"extracted_answer": boxed, "correct": correct, "boxed_integer": answer is not None},
        )
