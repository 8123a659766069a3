"""`load_text_model`'s refusals name `TextModel` (they said "a helper model", the class's name before issue 29)."""

from __future__ import annotations

import pytest

from gym_bridge.core.errors import ConfigError
from gym_bridge.policies.text_model import load_text_model


@pytest.mark.parametrize("settings, message", [
    ({"api": "grpc"}, "a TextModel's api must be one of completions, chat, responses, got 'grpc'"),
    ({"base_url": "http://127.0.0.1:9/v1", "api": "chat"}, "a TextModel at http://127.0.0.1:9/v1 with api='chat' needs the served model's name"),
])
def test_refusals_name_text_model(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_text_model(**settings)
    assert str(raised.value) == message and "helper" not in str(raised.value)
