"""`gym_bridge.trl`: the TRL adapter (`from gym_bridge.trl import rollout`), sync and async, in one package.

Importing this package imports nothing but itself: each name resolves on first use from the private
module that defines it (`_rollout`, `_dataset`, `_rewards`, `_options`, `_async`: gym_bridge's core, no torch, no trl); torch, transformers and trl are
imported when a rollout first runs against a trainer. The async recipe's parts (`async_seams`,
`cpu_async_grpo_trainer`, `FileWeightTransfer`, `worker_checkpoint_callback`, `restore_async_worker`, and `FileWeightReceiver` for vLLM's
`--worker-extension-cls gym_bridge.trl.FileWeightReceiver`) resolve here too, outside `__all__`, and so do the
recipes' shared parts (`load_recipe_config`, `compact_log_line`, `use_compact_log`, `quiet_vllm_version_warning`,
`line_buffered_output`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_bridge._lazy import lazy_homes

if TYPE_CHECKING:  # the names, for type checkers and linters; at run time `__getattr__` imports them
    from gym_bridge.trl._async.seams import async_seams  # noqa: F401
    from gym_bridge.trl._async.checkpoint import restore_async_worker, worker_checkpoint_callback  # noqa: F401
    from gym_bridge.trl._async.cpu import cpu_async_grpo_trainer  # noqa: F401
    from gym_bridge.trl._async.weights import FileWeightReceiver, FileWeightTransfer  # noqa: F401
    from gym_bridge.trl._async.settings import AsyncWorkerSettings  # noqa: F401
    from gym_bridge.trl._async.worker import AsyncRolloutWorker  # noqa: F401
    from gym_bridge.trl._dataset import example_data_paths, load_dataset  # noqa: F401
    from gym_bridge.trl._options import RolloutOptions  # noqa: F401
    from gym_bridge.trl._rewards import env_reward, reward_metrics  # noqa: F401
    from gym_bridge.trl._rollout import TRLRollout, make_rollout, rollout, to_trl_batch  # noqa: F401
    from gym_bridge.trl._recipe import (  # noqa: F401
        compact_log_line, line_buffered_output, load_recipe_config, quiet_vllm_version_warning, use_compact_log,
    )

__all__ = [
    "AsyncRolloutWorker", "AsyncWorkerSettings", "RolloutOptions", "TRLRollout", "env_reward", "example_data_paths", "load_dataset", "make_rollout",
    "reward_metrics", "rollout", "to_trl_batch",
]
_HOMES = {
    **dict.fromkeys(("TRLRollout", "make_rollout", "rollout", "to_trl_batch"), "gym_bridge.trl._rollout"),
    "AsyncRolloutWorker": "gym_bridge.trl._async.worker", "AsyncWorkerSettings": "gym_bridge.trl._async.settings",
    "RolloutOptions": "gym_bridge.trl._options", "env_reward": "gym_bridge.trl._rewards", "reward_metrics": "gym_bridge.trl._rewards",
    "example_data_paths": "gym_bridge.trl._dataset", "load_dataset": "gym_bridge.trl._dataset",
}
"""Each public name's home module."""
_ASYNC_PARTS = {
    "async_seams": "gym_bridge.trl._async.seams",
    "restore_async_worker": "gym_bridge.trl._async.checkpoint",
    "worker_checkpoint_callback": "gym_bridge.trl._async.checkpoint",
    "cpu_async_grpo_trainer": "gym_bridge.trl._async.cpu",
    "FileWeightTransfer": "gym_bridge.trl._async.weights",
    "FileWeightReceiver": "gym_bridge.trl._async.weights",
}
"""What the async recipe and a vLLM server's worker extension name; not in `__all__`, so `import *` stays as it was."""
_RECIPE_PARTS = dict.fromkeys(["load_recipe_config", "compact_log_line", "use_compact_log", "quiet_vllm_version_warning",
                               "line_buffered_output"], "gym_bridge.trl._recipe")
"""What both TRL recipes share (their config and console); not in `__all__` either."""

__getattr__, __dir__ = lazy_homes(globals(), {**_HOMES, **_ASYNC_PARTS, **_RECIPE_PARTS})
