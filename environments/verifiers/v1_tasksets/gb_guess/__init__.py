"""gb_guess: a multi-turn verifiers v1 game (guess the number) whose `Env` plays the user, as v1's textarena taskset does.

The player guesses a number from 1 to 100 in square brackets; the env answers `higher`, `lower` or ends the game
when the guess is right, for at most `max_guesses` guesses. The `found` reward is 1.0 when the number was found,
0.0 otherwise (an invalid move, without a bracketed number, ends the game). Runs offline; written against
`verifiers.v1`'s public API.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf

TARGETS = (42, 7, 93, 50)
SYSTEM_PROMPT = "Guess the secret number from 1 to 100. Reply with your guess in square brackets, e.g. [50]."


class GuessConfig(vf.TasksetConfig):
    max_guesses: int = 6
    """Guesses before the game is lost."""


class GuessData(vf.TaskData):
    target: int
    """The secret number."""
    max_guesses: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    pass


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


def read_guess(reply: str) -> int | None:
    """The first bracketed whole number of `reply`, or None (an invalid move)."""
    match = re.search(r"\[(\d+)\]", reply)
    return int(match.group(1)) if match else None


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task: Any, agents: Any) -> None:
        found, outcome = False, "out of guesses"
        async with agents.player.interaction(task) as interaction:
            turn = await interaction.turn()
            for guess_number in range(1, task.data.max_guesses + 1):
                if turn.terminated:
                    outcome = "the player stopped"
                    break
                guess = read_guess(turn.last_reply)
                if guess is None:
                    outcome = "invalid move: no bracketed number"
                    break
                if guess == task.data.target:
                    found, outcome = True, f"found in {guess_number} guesses"
                    break
                if guess_number < task.data.max_guesses:
                    turn = await interaction.turn("higher" if guess < task.data.target else "lower")
        interaction.trace.record_reward("found", float(found))
        interaction.trace.info["outcome"] = outcome


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterator[GuessTask]:
        for target in TARGETS:
            data = GuessData(name=f"guess#{target}", prompt="I picked a number from 1 to 100. Your guess?", system_prompt=SYSTEM_PROMPT,
                             target=target, max_guesses=self.config.max_guesses)
            yield GuessTask(data, self.config.task)


__all__ = ["GuessEnv", "GuessTaskset"]
