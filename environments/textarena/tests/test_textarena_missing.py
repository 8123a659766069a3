"""Without textarena installed, the environment is still listed, and a run fails before any generation with the install command."""

from __future__ import annotations

import sys

import pytest

from environments.textarena import TextArenaEnvironment
from gym_bridge import MissingExtraError, known_environments


def test_a_missing_textarena_is_refused_with_the_install_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "textarena", None)   # `import textarena` now raises ImportError
    assert "textarena" in known_environments()                  # registered without importing textarena
    with pytest.raises(MissingExtraError, match=r"pip install 'gym-bridge\[textarena\]'"):
        TextArenaEnvironment.check_ready()
