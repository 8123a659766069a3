"""Names a module resolves on first use from another module: what `gym_bridge.trl`, `gym_bridge.verl`
and `gym_bridge.nemo_rl` share, so that importing them imports nothing until a name is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import Any


def lazy_names(namespace: dict[str, Any], source: str, names: Collection[str], *,
               listed: Collection[str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of a module whose `names` come from `source` on first
    use (then kept in `namespace`, the module's globals); `listed`: what `dir()` adds (default `names`)."""
    module = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *(names if listed is None else listed)])

    return __getattr__, __dir__
