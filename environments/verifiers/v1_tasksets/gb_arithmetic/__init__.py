"""gb_arithmetic: a small verifiers v1 taskset (written against `verifiers.v1`'s public API) that runs offline.

Each task asks for the result of one arithmetic expression; the `correct` reward is 1.0 when the last number
in the agent's final reply equals the answer. It is loaded by verifiers' own loader (`--env.taskset.id
gb_arithmetic`) in the `.venv-verifiers` virtualenv, so it imports only verifiers, never gym_bridge.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import verifiers.v1 as vf

PROBLEMS = (("12 + 30", 42), ("7 * 6", 42), ("19 + 23", 19 + 23), ("9 * 9", 81), ("100 - 58", 42), ("6 * 7 + 1", 43))
SYSTEM_PROMPT = "Solve the arithmetic problem. End your reply with the number alone."


class ArithmeticData(vf.TaskData):
    answer: int
    """The expression's value."""


class ArithmeticTask(vf.Task[ArithmeticData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: ArithmeticData, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(numbers) and int(numbers[-1]) == task.answer)


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, vf.TasksetConfig]):
    def load(self) -> Iterator[ArithmeticTask]:
        for index, (expression, answer) in enumerate(PROBLEMS):
            data = ArithmeticData(name=f"arithmetic#{index}", prompt=f"What is {expression}?", system_prompt=SYSTEM_PROMPT,
                                  answer=answer)
            yield ArithmeticTask(data, self.config.task)


__all__ = ["ArithmeticTaskset"]
