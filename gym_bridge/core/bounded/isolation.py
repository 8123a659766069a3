"""Environments that may take their process down (`isolate_tools = True`) run their code in a worker process.

Each call of `setup`, a tool, `verify` or `close` ships the session (the environment instance) to
a worker of `run_in_process`'s pool and back, so its state must pickle. A call that exits,
segfaults or hangs takes down or stalls only its worker: that call fails, the worker is replaced.
"""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import BrokenExecutor
from typing import TYPE_CHECKING, Any

from gym_bridge.core.errors import RolloutError
from gym_bridge.core.bounded.offload import run_in_process

if TYPE_CHECKING:
    from gym_bridge.core.environment import Environment


class WorkerCrashed(RolloutError, RuntimeError):
    """The worker process running an isolated environment's code died (os._exit, a signal, a segfault)."""

    failure_kind = "env"


async def call_isolated(env: "Environment", method: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, timeout_s: float) -> Any:
    """Run `env.<method>(*args, **kwargs)` in a worker process and return its result; the
    session's attributes are updated from the worker's copy afterwards.

    Raises TimeoutError (the worker is killed), WorkerCrashed, TypeError when the session or
    the arguments cannot be pickled, or what the method raised.
    """
    try:
        result, state = await run_in_process(_run_method, env, method, args, kwargs, timeout_s=timeout_s)
    except BrokenExecutor as error:
        called = args[0] if method == "call_tool" and args else method  # a tool call names its tool
        raise WorkerCrashed(
            f"the worker process running {type(env).__name__}.{called} died ({error}); "
            "the environment's code exited or crashed its process"
        ) from None
    env.__dict__.clear()
    env.__dict__.update(state)
    return result


def _run_method(env: "Environment", method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Worker side: the method's result (awaited if it is a coroutine) and the session's state after it."""
    value = getattr(env, method)(*args, **kwargs)
    if inspect.isawaitable(value):
        value = asyncio.run(_awaited(value))
    return value, env.__dict__


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
