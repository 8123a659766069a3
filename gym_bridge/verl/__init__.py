"""`gym_bridge.verl`: the verl adapter (`from gym_bridge.verl import GymBridgeAgentLoop`) in one package.

Importing this package imports nothing but itself, so a config that only names
`gym_bridge.verl.GymBridgeAgentLoop` costs nothing until verl resolves it. The first name used
imports `gym_bridge.verl._agent_loop`, and with it verl 0.9.1, torch, transformers, datasets and ray
(a `MissingDependencyError` with the install hint when verl is missing); `AGENT_LOOP_CONFIG` (the
shipped agent_loop.yaml), `AGENT_NAME` and `ROW_COLUMN` come from `_data`, which imports no verl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_bridge._lazy import lazy_homes

if TYPE_CHECKING:  # the names, for type checkers and linters; at run time `__getattr__` imports them
    from gym_bridge.verl._agent_loop import (  # noqa: F401
        REWARD_EXTRA_KEYS, GymBridgeAgentLoop, GymBridgeDataset, RolloutSlots, VerlServerPolicy, repeat_index, to_agent_loop_output,
    )
    from gym_bridge.verl._data import AGENT_LOOP_CONFIG, AGENT_NAME, ROW_COLUMN  # noqa: F401

__all__ = [
    "AGENT_LOOP_CONFIG", "AGENT_NAME", "REWARD_EXTRA_KEYS", "ROW_COLUMN", "GymBridgeAgentLoop", "GymBridgeDataset", "RolloutSlots",
    "VerlServerPolicy", "repeat_index", "to_agent_loop_output",
]
_ADAPTER = "gym_bridge.verl._agent_loop"

_LIGHT = dict.fromkeys(("AGENT_LOOP_CONFIG", "AGENT_NAME", "ROW_COLUMN"), "gym_bridge.verl._data")
"""Names that need no verl (their home is `_data`): the recipe asks for the YAML's path before verl starts."""

__getattr__, __dir__ = lazy_homes(globals(), {**dict.fromkeys(__all__, _ADAPTER), **_LIGHT})
