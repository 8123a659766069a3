"""Fixtures of the adapter tests: verl's trainer config, composed once per session (it takes seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def verl_trainer_config():
    """verl 0.9.1's `ppo_trainer` config for the embedded model with the shipped agent-loop YAML."""
    pytest.importorskip("verl.experimental.agent_loop", reason="needs the verl extra: pip install 'gym-bridge[verl]'")
    from gym_bridge.verl._data import AGENT_LOOP_CONFIG
    from gym_bridge.policies.embedded import embedded_model_path
    from tests.adapters.verl_stand_in import verl_config

    return verl_config(str(embedded_model_path()), str(AGENT_LOOP_CONFIG))
