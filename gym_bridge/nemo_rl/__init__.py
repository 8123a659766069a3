"""`gym_bridge.nemo_rl`: the NeMo RL adapter as one package (`from gym_bridge.nemo_rl import register`).

Importing this package imports nothing but itself. The first name used imports
`gym_bridge.nemo_rl._environment` (gym_bridge's core; NeMo RL's interface classes when NeMo RL is
installed, no torch); `GymBridgeEnvironmentActor` also imports ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_bridge._lazy import lazy_names

if TYPE_CHECKING:  # the names, for type checkers and linters; at run time `__getattr__` imports them
    from gym_bridge.nemo_rl._environment import (  # noqa: F401
        ENV_NAME, EnvironmentReturn, GymBridgeEnvironment, TurnFeed, datum_from_row, register,
    )

__all__ = ["ENV_NAME", "EnvironmentReturn", "GymBridgeEnvironment", "TurnFeed", "datum_from_row", "register"]
_ACTOR = "GymBridgeEnvironmentActor"
"""The Ray actor class NeMo RL's `create_env` starts (imports ray); not in `__all__`, so `import *` stays light."""
_ADAPTER = "gym_bridge.nemo_rl._environment"

__getattr__, __dir__ = lazy_names(globals(), _ADAPTER, (*__all__, _ACTOR), listed=__all__)
