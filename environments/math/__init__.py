r"""math: a word problem answered in \boxed{} (the rule-based check of NeMo Gym's `math_with_judge`).

The last `\boxed{...}` of the final assistant message is compared with the row's
`expected_answer` by math-verify, so `\boxed{\frac{1}{2}}` matches "0.5". The comparison runs
in a worker process with a timeout, because sympy can hang on answers such as `9^{9^{9^{9}}}`;
a timeout (or a crash of the worker) masks the sample as a `verifier` failure instead of scoring it 0.
"""

from __future__ import annotations

import importlib.util
import logging
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import ClassVar

from gym_bridge import Environment, Item, MissingExtraError, Task, VerifyResult, final_text, last_boxed, run_in_process

__all__ = ["MathEnvironment", "is_equivalent", "last_boxed"]
INSTALL_HINT = "pip install 'gym-bridge[environments]'"


class MathEnvironment(Environment):
    name = "math"
    aliases = ("math_with_judge", "math_with_judge_simple_agent")
    description = r"Solve a math problem and answer in \boxed{}; reward 1 if math-verify finds it equal to the expected answer."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # no tools: only its committed model calls are replayed
    check_timeout_s: ClassVar[float] = 10.0

    @classmethod
    def check_ready(cls) -> None:
        """math-verify comes with the `environments` extra, not with `pip install gym-bridge`."""
        if importlib.util.find_spec("math_verify") is None:
            raise MissingExtraError(f"the {cls.name} environment checks answers with math-verify: {INSTALL_HINT}")

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        answer = last_boxed(final_text(output))
        metrics = {"extracted_answer": answer, "has_boxed": answer is not None}
        expected = task.get("expected_answer")
        if expected is None:
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason="row has no expected_answer")
        if answer is None:
            return VerifyResult(reward=0.0, reward_components={"correct": 0.0}, metrics=metrics)
        try:
            correct = await run_in_process(is_equivalent, str(expected), answer, timeout_s=self.check_timeout_s)
        except (TimeoutError, BrokenExecutor) as error:  # a hang, or a crash of its worker process
            timed_out = isinstance(error, TimeoutError)
            reason = f"math-verify timed out after {self.check_timeout_s:g} s" if timed_out else f"math-verify crashed: {error}"
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=reason, metrics=metrics)
        return VerifyResult(reward=float(correct), reward_components={"correct": float(correct)}, metrics=metrics)


def is_equivalent(expected: str, answer: str) -> bool:
    """Whether math-verify finds `answer` mathematically equal to `expected`. Runs in a worker process."""
    from math_verify import LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that our caller owns the timeout
    config = [LatexExtractionConfig()]
    gold = parse(f"\\boxed{{{expected}}}", extraction_config=config, parsing_timeout=None)
    guess = parse(f"\\boxed{{{answer}}}", extraction_config=config, parsing_timeout=None)
    return bool(gold and guess) and verify(gold, guess, timeout_seconds=None)
