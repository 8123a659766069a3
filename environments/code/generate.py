"""Generated programming tasks for the code environment, with tests from reference solutions.

Nine task families (four read stdin, five define a function) take random parameters and test
inputs from a seeded generator; expected outputs come from the reference solution written here.
A hash of each task decides its split (`gym_bridge.core.split`: one in ten goes to
`validation`), so `train` and `validation` never share a task whatever the seeds. `python -m environments.code.generate`
rewrites data/example.jsonl.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_bridge import draw_split

FENCE_INSTRUCTIONS = "Write your solution in Python 3 and put the complete code in one ```python code block."


@dataclass(frozen=True)
class Generated:
    prompt: str
    inputs: list[str]
    outputs: list[str]
    fn_name: str | None
    family: str


def _stdin_task(family: str, statement: str, make_input: Callable[[random.Random], str], solve: Callable[[str], str]):  # type: ignore[no-untyped-def]
    def build(rng: random.Random) -> Generated:
        inputs = [make_input(rng) for _ in range(rng.randint(3, 5))]
        example = inputs[0]
        prompt = (
            f"{statement}\n\nRead the input from standard input and print the answer to standard output.\n\n"
            f"Example input:\n{example}\nExample output:\n{solve(example)}\n\n{FENCE_INSTRUCTIONS}"
        )
        return Generated(prompt, inputs, [solve(text) for text in inputs], None, family)

    return build


def _function_task(family: str, statement: str, fn_name: str, make_args: Callable[[random.Random], list[Any]], solve: Callable[..., Any]):  # type: ignore[no-untyped-def]
    def build(rng: random.Random) -> Generated:
        calls = [make_args(rng) for _ in range(rng.randint(3, 5))]
        example = ", ".join(json.dumps(argument) for argument in calls[0])
        prompt = (
            f"{statement}\n\nDefine the function `{fn_name}`; do not read input or print. "
            f"Example: {fn_name}({example}) returns {solve(*calls[0])!r}.\n\n{FENCE_INSTRUCTIONS}"
        )
        inputs = ["\n".join(json.dumps(argument) for argument in args) for args in calls]
        return Generated(prompt, inputs, [json.dumps(solve(*args)) for args in calls], fn_name, family)

    return build


def _words(rng: random.Random, count: int) -> list[str]:
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(count)]


def _numbers_input(rng: random.Random) -> str:
    numbers = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 8))]
    return f"{len(numbers)}\n{' '.join(map(str, numbers))}\n"


def _second_largest(numbers: list[int]) -> int:
    distinct = sorted(set(numbers))
    return distinct[-2] if len(distinct) > 1 else distinct[0]


def _run_length(text: str) -> str:
    out, position = [], 0
    while position < len(text):
        end = position
        while end < len(text) and text[end] == text[position]:
            end += 1
        out.append(f"{text[position]}{end - position}")
        position = end
    return "".join(out)


def _fizzbuzz(n: int) -> list[str]:
    return ["FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i) for i in range(1, n + 1)]


def _gcd_all(numbers: list[int]) -> int:
    from math import gcd

    result = 0
    for number in numbers:
        result = gcd(result, number)
    return result


FAMILIES: list[Callable[[random.Random], Generated]] = [
    _stdin_task(
        "sum_numbers", "The first line holds an integer n, the second line n integers. Print their sum.",
        _numbers_input, lambda text: str(sum(map(int, text.split("\n")[1].split()))),
    ),
    _stdin_task(
        "max_minus_min", "The first line holds an integer n, the second line n integers. Print the largest minus the smallest.",
        _numbers_input, lambda text: str(max(map(int, text.split("\n")[1].split())) - min(map(int, text.split("\n")[1].split()))),
    ),
    _stdin_task(
        "reverse_words", "One line of lowercase words separated by single spaces. Print the words in reverse order, separated by single spaces.",
        lambda rng: " ".join(_words(rng, rng.randint(1, 6))) + "\n", lambda text: " ".join(reversed(text.split())),
    ),
    _stdin_task(
        "count_vowels", "The first line holds t; each of the next t lines holds one lowercase word. For each word print how many vowels (a, e, i, o, u) it has, one number per line.",
        lambda rng: (lambda words: f"{len(words)}\n" + "\n".join(words) + "\n")(_words(rng, rng.randint(1, 5))),
        lambda text: "\n".join(str(sum(ch in "aeiou" for ch in word)) for word in text.split("\n")[1:] if word),
    ),
    _function_task(
        "fizzbuzz", "Return the FizzBuzz list for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for both, else the number as a string.",
        "fizzbuzz", lambda rng: [rng.randint(1, 30)], _fizzbuzz,
    ),
    _function_task(
        "is_palindrome", "Return True if the string reads the same forwards and backwards, ignoring case, else False.",
        "is_palindrome", lambda rng: [rng.choice([(lambda w: w + w[::-1])("".join(_words(rng, 1))), "".join(_words(rng, 2))]).capitalize()],
        lambda text: text.lower() == text.lower()[::-1],
    ),
    _function_task(
        "second_largest", "Return the second largest distinct value of a non-empty list of integers (the largest if all are equal).",
        "second_largest", lambda rng: [[rng.randint(-50, 50) for _ in range(rng.randint(1, 8))]], _second_largest,
    ),
    _function_task(
        "run_length", "Return the run-length encoding of a string: each run of equal characters becomes the character followed by the run's length, e.g. 'aaab' -> 'a3b1'.",
        "run_length", lambda rng: ["".join(rng.choice("aab") * rng.randint(1, 3) for _ in range(rng.randint(1, 5)))], _run_length,
    ),
    _function_task(
        "gcd_all", "Return the greatest common divisor of a non-empty list of positive integers.",
        "gcd_all", lambda rng: [[rng.randint(1, 12) * rng.choice([1, 2, 3, 6]) for _ in range(rng.randint(1, 5))]], _gcd_all,
    ),
]


def to_row(task: Generated, split: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": task.prompt}]},
        "verifier_metadata": {"unit_tests": {"inputs": task.inputs, "outputs": task.outputs, "fn_name": task.fn_name}},
        "agent_ref": {"type": "responses_api_agents", "name": "code"},
        "task_family": task.family,
        "split": split,
    }


def prepare_code_rows(*, split: str, size: int, seed: int) -> list[dict[str, Any]]:
    """`size` distinct rows of `split` (`train` or `validation`), the same for the same seed."""
    tasks = draw_split(
        lambda rng: FAMILIES[rng.randrange(len(FAMILIES))](rng),
        lambda task: json.dumps([task.prompt, task.inputs, task.fn_name]),
        split=split, size=size, seed=seed,
    )
    return [to_row(task, split) for task in tasks]


if __name__ == "__main__":
    path = Path(__file__).parent / "data" / "example.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for row in prepare_code_rows(split="validation", size=12, seed=0):
            handle.write(json.dumps(row) + "\n")
    print(f"wrote {path}")
