"""textarena: TextArena's text games, single-player or against a fixed opponent, scored by TextArena itself.

A row names a game id and a seed; its prompt is the game's first observation. Each model answer is one move passed to
`env.step` as TextArena's own loop passes an agent's reply; the opponent (a script or a TextModel) moves until it is
the model's turn; the observation's new part is the next user message. Invalid moves follow TextArena's rules; the
reward is the model's entry of `env.close()`'s rewards (README.md has the details).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import random
from pathlib import Path
from typing import Any, ClassVar, Iterator, Literal

import pydantic

from gym_bridge import (
    ConfigError,
    Environment,
    FailRollout,
    Item,
    MissingExtraError,
    RolloutContext,
    RowProblem,
    Task,
    TextModel,
    VerifyResult,
    generate_turn,
)

HERE = Path(__file__).resolve().parent
GAMES_FILE = HERE / "data" / "games.json"
INSTALL = "pip install 'gym-bridge[textarena]'"


class TextArenaRow(pydantic.BaseModel):
    """The `textarena` field of a row."""

    model_config = pydantic.ConfigDict(extra="forbid")
    game: str
    seed: int = 0
    player: int = 0
    """The model's player id; 1 (the opponent moves first) only with a scripted opponent."""
    num_players: int | None = None
    """Default: the count the game resets with (`data/games.json`)."""
    opponent: Literal["scripted", "model"] = "scripted"
    opponent_moves: list[str] = []


class RowSchema(pydantic.BaseModel):
    textarena: TextArenaRow


def offline_games() -> dict[str, dict[str, Any]]:
    """The table `games.py` wrote: each registered game id -> `{"players", "offline"}` or `{"offline": false, "reason"}`."""
    table: dict[str, dict[str, Any]] = json.loads(GAMES_FILE.read_text())["games"]
    return table


def check_game(game: str) -> int:
    """The player count of `game`; raises ConfigError for an unknown game or one that does not run offline here."""
    entry = offline_games().get(game)
    if entry is None:
        known = sorted(name for name, value in offline_games().items() if value["offline"])
        close = [name for name in known if name.lower().startswith(game.lower().split("-")[0][:4])][:8]
        raise ConfigError(f"unknown TextArena game {game!r}; games that run here include {close or known[:12]} "
                          f"({len(known)} in environments/textarena/data/games.json)")
    if not entry["offline"]:
        raise ConfigError(f"TextArena game {game!r} does not run here: {entry['reason']}")
    players: int = entry["players"]
    return players


def import_textarena() -> Any:
    try:
        import textarena
    except ImportError as error:
        raise MissingExtraError(f"the textarena environment needs textarena ({error}): {INSTALL}") from None
    return textarena


def new_text(shown: str, current: str) -> str:
    """What `current` adds to `shown` (TextArena's observation wrappers mostly repeat the history), else all of it."""
    return current[len(shown):].strip() if current.startswith(shown) else current.strip()


class Game:
    """One TextArena game in progress: the model's moves in, the opponent's moves played, the rewards out."""

    def __init__(self, row: TextArenaRow, opponent: TextModel | None) -> None:
        textarena = import_textarena()
        self.row = row
        self.opponent = opponent
        self.moves = list(row.opponent_moves)
        self.env = textarena.make(row.game)
        self.random_state = random.getstate()
        with self._own_random():
            self.env.reset(num_players=row.num_players or check_game(row.game), seed=row.seed)
        self.done = False
        self.shown = ""

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """TextArena draws from Python's global `random` (and seeds it at reset): each game call runs on the game's own
        state of it, and leaves the caller's as it was, so concurrent rollouts never draw from each other's stream."""
        outside = random.getstate()
        random.setstate(self.random_state)
        try:
            yield
        finally:
            self.random_state = random.getstate()
            random.setstate(outside)

    def _step(self, move: str) -> bool:
        with self._own_random():
            done, _ = self.env.step(action=move)
        return bool(done)

    async def first_observation(self) -> str:
        """The observation the model starts from (the opponent's first moves played when it moves first)."""
        return await self._until_model_turn() or ""

    async def play(self, move: str) -> str | None:
        """Play the model's move; returns what the game shows the model next, or None once the game is over."""
        self.done = self._step(move)
        return None if self.done else await self._until_model_turn()

    async def _until_model_turn(self) -> str | None:
        while True:
            with self._own_random():
                player, observation = self.env.get_observation()
            if player == self.row.player:
                text = new_text(self.shown, observation)
                self.shown = observation
                return text
            self.done = self._step(await self._opponent_move(observation))
            if self.done:
                return None

    async def _opponent_move(self, observation: str) -> str:
        if self.row.opponent == "model":
            assert self.opponent is not None
            return await self.opponent.complete([{"role": "user", "content": observation}])
        return self.moves.pop(0) if self.moves else ""

    def close(self) -> tuple[dict[int, float] | None, dict[int, Any]]:
        with self._own_random():
            rewards, info = self.env.close()
        return rewards, info or {}


class GameLoop:
    """Model answer -> one move; the game's next observation -> the next user message; until the game ends."""

    async def run(self, ctx: RolloutContext) -> str:
        env = ctx.env
        assert isinstance(env, TextArenaEnvironment)
        for turn in range(ctx.limits.max_turns):
            step = await generate_turn(ctx)
            if isinstance(step, str):
                return step  # a cut answer is not played, as a cut turn's calls are not run
            observation = await env.game.play(step.text)
            if observation is None:
                return "answer"
            if turn == ctx.limits.max_turns - 1:
                return "max_turns"
            if not await ctx.append_user_message_async(observation):
                return "budget"
        return "max_turns"


class TextArenaEnvironment(Environment):
    name = "textarena"
    description = "TextArena games (single-player, or against a scripted or model opponent); a move per answer, TextArena's reward."
    if importlib.util.find_spec("textarena") is None:
        description += f" Needs textarena: {INSTALL}."
    example_data = HERE / "data" / "example.jsonl"
    row_schema = RowSchema
    agent_loop = GameLoop()
    settings = ("opponent", "opponent_model", "opponent_base_url")
    opponent: ClassVar[TextModel | None] = None
    """The model opponent of rows with `opponent: "model"`; when None it is loaded from the settings below."""
    opponent_model: ClassVar[str | None] = None
    """A model folder or served model name (default: the embedded model)."""
    opponent_base_url: ClassVar[str | None] = None

    @classmethod
    def check_ready(cls) -> None:
        import_textarena()

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        problems = super().validate_row(row)
        if problems:
            return problems
        game = RowSchema.model_validate(row).textarena
        try:
            check_game(game.game)
        except ConfigError as error:
            return [RowProblem(field="textarena.game", message=str(error))]
        return []

    async def setup(self, task: Task) -> None:
        row = RowSchema.model_validate(task.row).textarena
        if row.player != 0 and row.opponent == "model":
            raise FailRollout("env", "textarena.player must be 0 with a model opponent (the first observation must not depend on its moves)")
        opponent = await self._opponent() if row.opponent == "model" else None
        self.game = Game(row, opponent)
        first = await self.game.first_observation()
        expected = task.messages[-1]["content"] if task.messages else ""
        if first.strip() != str(expected).strip():
            raise FailRollout("env", f"{row.game} with seed {row.seed} does not start with the row's prompt (TextArena's reset differs here): "
                                     "make the rows again with prepare_rows")

    async def _opponent(self) -> TextModel:
        if self.opponent is not None:
            return self.opponent
        from gym_bridge import load_text_model

        model: TextModel = await asyncio.to_thread(load_text_model, self.opponent_model, base_url=self.opponent_base_url)
        return model

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        rewards, info = self.game.close()
        player = self.game.row.player
        reward = float((rewards or {}).get(player, 0.0))
        mine = info.get(player, {})
        metrics = {"game_done": self.game.done, "invalid_move": bool(mine.get("invalid_move", False)),
                   "game_turns": mine.get("turn_count"), "game_reason": str(mine.get("reason", ""))}
        return VerifyResult(reward=reward, metrics=metrics)

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int, task: str = "GuessTheNumber-v0", opponent_moves: str = "",
                     **options: Any) -> list[dict[str, Any]]:
        """`size` rows of the game `task` (`--task TicTacToe-v0`), reset seeds `seed`, `seed + 1`, ... (plus 100,000 for the validation split); the prompt
        is the game's first observation. `opponent_moves`: comma-separated scripted moves for a two-player game."""
        if options:
            raise ConfigError(f"textarena rows take --task GAME and --set opponent_moves=..., not {sorted(options)}")
        check_game(task)
        moves = [move.strip() for move in opponent_moves.split(",") if move.strip()]
        base = seed + (100_000 if split == "validation" else 0)
        return [cls._row(TextArenaRow(game=task, seed=base + offset, opponent_moves=moves)) for offset in range(size)]

    @classmethod
    def _row(cls, row: TextArenaRow) -> dict[str, Any]:
        first = asyncio.run(Game(row, None).first_observation())
        return {"responses_create_params": {"input": [{"role": "user", "content": first}]},
                "agent_ref": {"type": "responses_api_agents", "name": cls.name}, "textarena": row.model_dump(exclude_defaults=True) | {"game": row.game}}
