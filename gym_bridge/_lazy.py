"""gym_bridge's one lazy-import mechanism: names a module resolves on first use, and optional packages
imported with the install hint of the extra that brings them. `gym_bridge`, `gym_bridge.policies`,
`gym_bridge.trl`, `.verl` and `.nemo_rl` list their names' homes here, so that importing them imports
nothing heavy until a name is used; `require` turns a missing model stack (torch, transformers, ...) into
a `MissingExtraError` that names `pip install 'gym-bridge[local]'`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from types import ModuleType
from typing import Any

from gym_bridge.core.errors import MissingExtraError

EXTRAS: Mapping[str, str] = {
    "torch": "local", "transformers": "local", "safetensors": "local", "gguf": "local",
    "math_verify": "environments",
}
"""The extra of gym-bridge that installs each optional top-level module (`pip install 'gym-bridge[<extra>]'`)."""


def install_hint(extra: str) -> str:
    """The exact command that installs `extra`: `pip install 'gym-bridge[local]'`."""
    return f"pip install 'gym-bridge[{extra}]'"


def require(module: str, *, needed_by: str) -> ModuleType:
    """`module`, imported; raises `MissingExtraError` ("<needed_by> needs <package>: pip install
    'gym-bridge[<extra>]'") when it, or a package it imports, is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = (error.name or module).split(".")[0]
        extra = EXTRAS.get(missing) or EXTRAS.get(module.split(".")[0], "local")
        raise MissingExtraError(f"{needed_by} needs {missing}: {install_hint(extra)}") from None


def lazy_homes(namespace: dict[str, Any], homes: Mapping[str, str], *,
               listed: Collection[str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of a module whose names are imported on first use
    (then kept in `namespace`, the module's globals). `homes`: name -> the module it comes from (a name
    whose home is `<package>.<name>` is that module itself); `listed`: what `dir()` adds (default all)."""
    module = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        source = importlib.import_module(home)
        value = source if home.rpartition(".")[2] == name else getattr(source, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *(homes if listed is None else listed)})

    return __getattr__, __dir__


def lazy_names(namespace: dict[str, Any], source: str, names: Collection[str], *,
               listed: Collection[str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`lazy_homes` for a module whose `names` all come from one `source` module (the trainer modules)."""
    return lazy_homes(namespace, dict.fromkeys(names, source), listed=names if listed is None else listed)
