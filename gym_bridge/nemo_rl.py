"""`gym_bridge.nemo_rl`: the NeMo RL adapter under its public name (`from gym_bridge.nemo_rl import register`).

Importing this module imports nothing but itself. The first name used imports
`gym_bridge.adapters.nemo_rl` (gym_bridge's core; NeMo RL's interface classes when NeMo RL is
installed, no torch); `GymBridgeEnvironmentActor` also imports ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and linters; at run time `__getattr__` imports them
    from gym_bridge.adapters.nemo_rl import (  # noqa: F401
        ENV_NAME, EnvironmentReturn, GymBridgeEnvironment, TurnFeed, datum_from_row, register,
    )

__all__ = ["ENV_NAME", "EnvironmentReturn", "GymBridgeEnvironment", "TurnFeed", "datum_from_row", "register"]
_ACTOR = "GymBridgeEnvironmentActor"
"""The Ray actor class NeMo RL's `create_env` starts (imports ray); not in `__all__`, so `import *` stays light."""
_ADAPTER = "gym_bridge.adapters.nemo_rl"


def __getattr__(name: str) -> Any:
    if name not in __all__ and name != _ACTOR:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_ADAPTER), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
