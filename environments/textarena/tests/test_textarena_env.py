"""textarena through the real engine with scripted players, against TextArena's own loop on the same lines.

TextArena's loop (its README's): `make`, `reset(num_players, seed)`, then `get_observation` / `step(action)` until
done, then `close()` for the rewards. Each scripted line (the model's moves and the opponent's) must score in
gym_bridge exactly what that loop gives it: wins, losses, and invalid moves under TextArena's own rules.
"""

from __future__ import annotations

import asyncio

import pytest

from environments.textarena import TextArenaEnvironment, TextArenaRow, check_game, offline_games
from gym_bridge import ConfigError, Engine, EngineConfig, SamplingParams, ScriptedChatPolicy, ScriptedPolicy, TextModel
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.task import parse_task
from tests.support.invariants import assert_token_invariants

textarena = pytest.importorskip("textarena", reason="needs textarena: pip install 'gym-bridge[textarena]' (make install)")


def target(seed: int) -> int:
    """GuessTheNumber-v0's number for `seed` (read from TextArena's own state after its reset)."""
    env = textarena.make("GuessTheNumber-v0")
    env.reset(num_players=1, seed=seed)
    return int(env.state.game_state["game_number"])


def textarena_loop(game: str, seed: int, model_moves: list[str], opponent_moves: list[str], players: int) -> float:
    """TextArena's own loop on a scripted line: player 0's reward."""
    env = textarena.make(game)
    env.reset(num_players=players, seed=seed)
    moves = {0: list(model_moves), 1: list(opponent_moves)}
    done = False
    while not done:
        player, _ = env.get_observation()
        done, _ = env.step(action=moves[player].pop(0) if moves[player] else "")
    rewards, _ = env.close()
    return float(rewards[0])


def run(cases: list[tuple[TextArenaRow, list[str]]], smol_template, turn, env_class=TextArenaEnvironment) -> list:
    rows = [TextArenaEnvironment._row(row) for row, _ in cases]
    policy = ScriptedPolicy({f"{i}-0": [turn(move) for move in moves] for i, (_, moves) in enumerate(cases)})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=32), limits=Limits(max_turns=12)))
    tasks = [parse_task(row, index=i) for i, row in enumerate(rows)]

    async def go() -> list:
        return await asyncio.gather(*(engine.rollout(task, 0, env_class=env_class) for task in tasks))

    return asyncio.run(go())


def lines() -> dict[str, tuple[TextArenaRow, list[str], float]]:
    number = target(5)
    low = 1 if number != 1 else 2
    return {
        # (row, the model's moves, the reward expected)
        "guess: binary search to the number": (TextArenaRow(game="GuessTheNumber-v0", seed=5), [f"[{low}]", f"I guess [{number}]"], 1.0),
        "guess: an invalid move, then the number": (TextArenaRow(game="GuessTheNumber-v0", seed=5), ["ten", f"[{number}]"], 1.0),
        "tictactoe: the top row wins": (TextArenaRow(game="TicTacToe-v0", opponent_moves=["[4]", "[8]"]), ["[0]", "[1]", "[2]"], 1.0),
        "tictactoe: the opponent's diagonal wins": (TextArenaRow(game="TicTacToe-v0", opponent_moves=["[4]", "[0]", "[8]"]),
                                                     ["[1]", "[2]", "[3]"], -1.0),
        "tictactoe: two invalid moves lose": (TextArenaRow(game="TicTacToe-v0", opponent_moves=["[4]"]), ["[9]", "[12]"], -1.0),
    }


def test_scripted_lines_score_what_textarenas_own_loop_gives(smol_template, turn) -> None:
    cases = lines()
    records = run([(row, moves) for row, moves, _ in cases.values()], smol_template, turn)
    for (name, (row, moves, expected)), record in zip(cases.items(), records):
        assert record.failure_kind is None, (name, record.failure_reason)
        players = check_game(row.game)
        assert record.reward == expected == textarena_loop(row.game, row.seed, moves, row.opponent_moves, players), name
        assert record.verify_metrics["game_done"] is True, name
        assert_token_invariants(record.to_dict())
    invalid = records[1]
    users = [item["content"][0]["text"] for item in invalid.output if item["type"] == "message" and item["role"] == "user"]
    assert "You attempted an invalid move" in users[0] and "[GAME] You are Player 0" not in users[0]   # only what is new
    assert records[4].verify_metrics["invalid_move"] is True and "Must be between 0 and 8" in records[4].verify_metrics["game_reason"]


def test_a_game_cut_off_by_the_turn_limit_gets_what_close_gives(smol_template, turn) -> None:
    rows = [TextArenaEnvironment._row(TextArenaRow(game="GuessTheNumber-v0", seed=5))]
    wrong = [f"[{n}]" for n in (1, 2, 3, 4) if n != target(5)][:3]     # three different wrong guesses of ten allowed
    engine = Engine(ScriptedPolicy({"0-0": [turn(move) for move in wrong]}), smol_template,
                    EngineConfig(sampling=SamplingParams(max_new_tokens=16), limits=Limits(max_turns=3)))
    record = asyncio.run(engine.rollout(parse_task(rows[0], index=0), 0, env_class=TextArenaEnvironment))
    assert (record.failure_kind, record.finish_reason, record.reward) == (None, "max_turns", 0.0)
    assert record.verify_metrics["game_done"] is False


def test_unknown_and_offline_refused_games_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="unknown TextArena game 'TicTacToe-v9'.*TicTacToe-v0"):
        check_game("TicTacToe-v9")
    with pytest.raises(ConfigError, match="Wordle-v0' does not run here: needs the nltk corpus 'words'"):
        check_game("Wordle-v0")
    problems = TextArenaEnvironment.validate_row({"textarena": {"game": "Hangman-v0"}})
    assert problems and problems[0].field == "textarena.game" and "nltk" in problems[0].message
    table = offline_games()
    assert table["TicTacToe-v0"] == {"offline": True, "players": 2} and table["GuessTheNumber-v0"]["players"] == 1


def test_a_model_opponent_gets_its_observation_and_its_reply_is_its_move(smol_template, turn) -> None:
    opponent = ScriptedChatPolicy({"": ["I take the centre: [4]", "[8]"]})
    env_class = type("WithOpponent", (TextArenaEnvironment,), {"opponent": TextModel(policy=opponent), "__module__": __name__})
    row = TextArenaRow(game="TicTacToe-v0", opponent="model")
    [record] = run([(row, ["[0]", "[1]", "[2]"])], smol_template, turn, env_class=env_class)
    assert (record.failure_kind, record.reward) == (None, 1.0)
    assert record.reward == textarena_loop("TicTacToe-v0", 0, ["[0]", "[1]", "[2]"], ["I take the centre: [4]", "[8]"], 2)
    seen = opponent.requests[0].messages[-1]["content"]
    assert "You are Player 1" in seen and "[Player 0] [0]" in seen     # TextArena's observation for the opponent's player


def test_concurrent_games_each_draw_from_their_own_random_stream() -> None:
    import random

    from environments.textarena import Game

    moves = ["[Up]", "[Left]", "[Down]", "[Right]"] * 3

    def start(seed: int) -> tuple[Game, list[str | None]]:
        game = Game(TextArenaRow(game="2048-v0", seed=seed), None)
        return game, [asyncio.run(game.first_observation())]

    alone = {}
    for seed in (3, 4):
        game, shown = start(seed)
        shown += [asyncio.run(game.play(move)) for move in moves]
        alone[seed] = shown
    random.seed(99)
    outside = random.getstate()
    (first, seen_first), (second, seen_second) = start(3), start(4)
    for move in moves:  # interleaved, as two rollouts on one event loop: each step of one between the other's
        seen_first.append(asyncio.run(first.play(move)))
        seen_second.append(asyncio.run(second.play(move)))
    assert sum(shown is not None for shown in alone[3]) > 4      # the games went on, spawning random tiles
    assert (seen_first, seen_second) == (alone[3], alone[4])
    assert random.getstate() == outside                           # the caller's generator left as it was
