"""Names a module resolves on first use from another module: what the `gym_bridge.trl`, `gym_bridge.verl`
and `gym_bridge.nemo_rl` packages share, so that importing them imports nothing until a name is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from typing import Any


def lazy_names(namespace: dict[str, Any], source: str, names: Collection[str], *,
               listed: Collection[str] | None = None,
               elsewhere: Mapping[str, str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of a module whose `names` come from `source` on first
    use (then kept in `namespace`, the module's globals); `listed`: what `dir()` adds (default `names`);
    `elsewhere`: more names, each from the module it maps to (listed by `dir()` too)."""
    module = namespace["__name__"]
    others = dict(elsewhere or {})

    def __getattr__(name: str) -> Any:
        if name not in names and name not in others:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(others.get(name, source)), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        shown = names if listed is None else listed
        return sorted([*namespace, *shown, *(name for name in others if name not in shown)])

    return __getattr__, __dir__
