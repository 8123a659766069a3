"""An OpenEnv environment server written with openenv's own framework: guess a number from 1 to 16.

It runs in OpenEnv's virtualenv (`make openenv-venv`), not in gym_bridge's: `python -m uvicorn
environments.openenv.example_server:app`. The target comes from the reset seed (`seed % 16 + 1`), each
guess is answered `higher`, `lower` or `correct`; a correct guess ends the episode with reward 1.0, the
fourth wrong one ends it with reward 0.0. Rewards are OpenEnv's: on the step observation that ends it.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

MAX_GUESSES = 4


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int = Field(..., ge=1, le=16, description="Your guess, a whole number from 1 to 16.")


class GuessObservation(Observation):
    message: str = ""
    guesses_left: int = MAX_GUESSES


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._target = 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._target = (seed or 0) % 16 + 1
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(message="Guess my number from 1 to 16.", guesses_left=MAX_GUESSES)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        left = MAX_GUESSES - self._state.step_count
        if action.guess == self._target:
            return GuessObservation(message="correct", guesses_left=left, done=True, reward=1.0)
        hint = "higher" if action.guess < self._target else "lower"
        return GuessObservation(message=hint, guesses_left=left, done=left <= 0, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess_number", max_concurrent_envs=64)
