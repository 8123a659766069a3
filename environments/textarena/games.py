"""Which TextArena games run offline here, and with how many players: `python -m environments.textarena.games`.

Each registered game id (the default variants; `-train` and `-raw` differ only in wrappers) is made and reset with
seed 0 for 1, 2, 3 then 4 players, one at a time under a time bound; the first count that resets is the game's.
A game that needs data from the network (an nltk corpus: `nltk.download` fails offline) or fails otherwise is
recorded with the reason. The table is written to `data/games.json`, which the environment reads to refuse a game
with that reason before any generation.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

GAMES_FILE = Path(__file__).parent / "data" / "games.json"
PLAYER_COUNTS = (1, 2, 3, 4)
BOUND_S = 20


def _reset(game_id: str, players: int) -> None:
    import textarena

    env = textarena.make(game_id)
    env.reset(num_players=players, seed=0)
    env.get_observation()


def _bounded(seconds: int) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def bound() -> Any:
        def expire(*_: Any) -> None:
            raise TimeoutError(f"did not reset within {seconds} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    return bound()


def probe(game_id: str) -> dict[str, Any]:
    """`{"players": n}` for a game that resets offline, else `{"offline": false, "reason": ...}`."""
    reasons = []
    for players in PLAYER_COUNTS:
        try:
            with _bounded(BOUND_S), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                _reset(game_id, players)
            return {"players": players, "offline": True}
        except (Exception, SystemExit) as error:  # any failure of foreign code is a finding
            reasons.append(_reason(error))
            if reasons[-1].startswith("needs"):
                return {"offline": False, "reason": reasons[-1]}
    return {"offline": False, "reason": f"no player count in {PLAYER_COUNTS} resets: {reasons[-1]}"}


def _reason(error: BaseException) -> str:
    """The first line of the error, or what it needs: an nltk corpus, a hosted model, Python >= 3.12."""
    text = re.sub(r"\S*/site-packages/", "", re.sub(r"\x1b\[[0-9;]*m", "", str(error)))  # no ANSI colours, no local paths
    corpus = re.search(r"Resource (\S+) not found", text)
    if corpus:
        return f"needs the nltk corpus {corpus.group(1).strip(chr(39))!r}, which nltk downloads from the network"
    if "API key" in text:
        return f"needs a hosted model: {text.strip().splitlines()[0]}"
    if isinstance(error, SyntaxError) and "f-string" in text:
        return f"its code needs Python >= 3.12 ({type(error).__name__}: {text.strip().splitlines()[0]})"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first}"[:300]


def main() -> int:
    import textarena
    from textarena.envs.registration import ENV_REGISTRY

    ids = sorted(game_id for game_id in ENV_REGISTRY if not game_id.endswith(("-train", "-raw")))
    table = {game_id: probe(game_id) for game_id in ids}
    GAMES_FILE.write_text(json.dumps({"textarena": getattr(textarena, "__version__", "0.7.4"), "games": table}, indent=1, sort_keys=True) + "\n")
    offline = sum(entry["offline"] for entry in table.values())
    print(f"{offline} of {len(table)} games reset offline; wrote {GAMES_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
