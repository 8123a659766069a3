"""`TextModel`'s errors name the class as it is called since issue 29 (they said "a helper model")."""

from __future__ import annotations

import asyncio

import pytest

from gym_bridge import ScriptedChatPolicy
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.text_model import TextModel


def test_a_message_of_another_role_is_refused_naming_text_model() -> None:
    model = TextModel(ScriptedChatPolicy({"": ["fine"]}))
    assert asyncio.run(model.complete([{"role": "user", "content": "hi"}])) == "fine"
    with pytest.raises(ConfigError, match=r"^a TextModel is asked with system, user and assistant messages, not 'tool'$"):
        asyncio.run(model.complete([{"role": "tool", "content": "42"}]))
