"""The registry of environments, and routing of task rows to them.

Environments are found by name or alias: the bundled ones and third-party packages register
through the `gym_bridge.environments` entry point group; any other can be named by module path
(`package.module:Class`, or `package.module` exposing `ENVIRONMENT`), which imports, and so runs,
that module: the run's `TrustSettings` (`gym_bridge.core.trust`) limits which. An unknown name fails before any generation
with the list of known environments. Rows whose `agent_ref` carries a `remote` URL run on the
NeMo Gym HTTP environment instead; `configure` changes an environment's settings for a run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Iterable, Mapping

from gym_bridge.core.environment import Environment
from gym_bridge.core.errors import ConfigError, UnknownEnvironmentError
from gym_bridge.core.task import Task, routing_field
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings

ENTRY_POINT_GROUP = "gym_bridge.environments"
REMOTE_ENVIRONMENT = "nemo_gym_remote"
"""Rows with `agent_ref.remote` (a NeMo Gym resources server's URL) run on this environment."""

_registry: dict[str, type[Environment]] = {}
_aliases: dict[str, str] = {}
_broken: dict[str, str] = {}
_paths: dict[str, str] = {}
"""Module paths loaded (`package.module:Class`) -> the name their class registered under."""
_entry_points_loaded = False


def register(env_class: type[Environment], *, aliases: Iterable[str] | None = None) -> type[Environment]:
    """Register an environment class under its `name` and `aliases` (or the `aliases` given); usable as a decorator."""
    if not (isinstance(env_class, type) and issubclass(env_class, Environment)):
        raise TypeError(f"{env_class!r} is not a gym_bridge Environment subclass")
    if not env_class.name:
        raise ValueError(f"{env_class.__qualname__} has no `name`")
    env_class.tool_specs()  # derive schemas now: a bad tool signature fails at registration
    _registry[env_class.name] = env_class
    _aliases.pop(env_class.name, None)  # a name registered in its own right beats another's alias
    for alias in env_class.aliases if aliases is None else aliases:
        _aliases[alias] = env_class.name
    return env_class


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in _registry:
            continue
        try:
            register(entry.load())
        except Exception as error:  # one broken plug-in must not hide the others
            _broken[entry.name] = f"entry point {entry.value!r} failed to load: {type(error).__name__}: {error}"


def _check_module_name(module_name: str, path: str) -> None:
    """Refuse a module part that is not a dotted Python name (`../units`, `envs/units.py`): a file path is not imported."""
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise UnknownEnvironmentError(
            f"environment {path!r}: {module_name!r} is not a module name; write `module:Class` (`package.module:Class`) "
            "with the module importable from the current folder or PYTHONPATH, not a file path (run from the module's "
            "folder, or put that folder on PYTHONPATH)")


def load_environment_module(path: str, trust: TrustSettings = DEFAULT_TRUST) -> type[Environment]:
    """Import `package.module:Class` (or a module exposing `ENVIRONMENT`) and register it.

    The class must set its own `name`: a subclass that inherits its parent's would take the parent's
    place for every row naming it, so it is refused with the fix (`name = "..."` on the subclass).
    Only the aliases the class declares itself are registered; those it inherits stay its parent's.
    Raises UnknownEnvironmentError when `trust` does not allow the module, cannot
    be imported, or does not hold an Environment subclass under that name, or for an inherited name.
    """
    module_name, _, attr = path.partition(":")
    _check_module_name(module_name, path)
    trust.check_module(module_name, path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UnknownEnvironmentError(f"cannot import environment module {module_name!r}: {error}") from None
    except (Exception, SystemExit) as error:
        raise UnknownEnvironmentError(f"importing environment module {module_name!r} raised {type(error).__name__}: {error}") from None
    target: object = module
    for part in (attr or "ENVIRONMENT").split("."):
        target = getattr(target, part, None)
        if target is None:
            raise UnknownEnvironmentError(f"module {module_name!r} has no {attr or 'ENVIRONMENT'!r}")
    if not (isinstance(target, type) and issubclass(target, Environment)):
        raise UnknownEnvironmentError(f"{path!r} names {target!r} ({type(target).__name__}), not a gym_bridge Environment subclass")
    _check_own_name(target, path)
    try:
        registered = register(target, aliases=vars(target).get("aliases", ()))
    except (TypeError, ValueError) as error:
        raise UnknownEnvironmentError(f"{path!r} cannot be registered: {error}") from None
    _paths[path] = registered.name
    return registered


def _check_own_name(env_class: type[Environment], path: str) -> None:
    if "name" in vars(env_class) or not env_class.name:
        return
    owner = next(base for base in env_class.__mro__ if "name" in vars(base))
    raise UnknownEnvironmentError(
        f"{path!r}: {env_class.__name__} inherits `name = {env_class.name!r}` from {owner.__name__}, so registering it would "
        f"replace {owner.__name__} for every row naming {env_class.name!r}; set `name = \"...\"` on {env_class.__name__} "
        f"(its own routing name), or the same name to replace {owner.__name__} on purpose"
    )


def known_environments() -> dict[str, type[Environment]]:
    """All registered environments by name (entry points loaded; broken ones in `broken_environments`)."""
    _load_entry_points()
    return dict(sorted(_registry.items()))


def broken_environments() -> dict[str, str]:
    """Entry points that failed to load, with the reason."""
    _load_entry_points()
    return dict(_broken)


def get_environment(name: str, trust: TrustSettings = DEFAULT_TRUST) -> type[Environment]:
    """The environment class for a routing name, a module path only where `trust` allows it; raises
    UnknownEnvironmentError listing the known ones."""
    _load_entry_points()
    canonical = _aliases.get(name, name)
    if canonical in _registry:
        return _registry[canonical]
    if canonical in _broken:
        raise UnknownEnvironmentError(f"environment {name!r} is installed but broken: {_broken[canonical]}")
    if ":" in name or "." in name:
        registered = _registry.get(_paths.get(name, ""))
        if registered is not None:  # loaded before: what is registered now (`configure` may have replaced it)
            trust.check_module(name.partition(":")[0], name)  # this run's limits hold for it too
            return registered
        return load_environment_module(name, trust)
    known = ", ".join(sorted(_registry)) or "(none)"
    raise UnknownEnvironmentError(f"unknown environment {name!r}; known environments: {known}")


def routing_names(env_class: type[Environment]) -> frozenset[str]:
    """Every name that routes to `env_class` now without importing anything: its name, the aliases registered
    for it and the module paths (`package.module:Class`) it was loaded by; empty when it is not registered."""
    _load_entry_points()
    name = env_class.name
    if _registry.get(name) is not env_class:
        return frozenset()
    aliases = {alias for alias, target in _aliases.items() if target == name}
    return frozenset({name, *aliases, *(path for path, target in _paths.items() if target == name)})


def configure(name: str, trust: TrustSettings = DEFAULT_TRUST, /, **settings: Any) -> type[Environment]:
    """Change settings of a registered environment for this process (`name` a module path only where `trust` allows
    it); returns the configured class.

    A subclass carrying the new values is registered in the original's place (names and aliases
    route to it). Only the class's `settings`, its timeouts and `ray_resources` (what a Ray worker running it
    asks for, see `gym_bridge.scale`) may be set; raises
    UnknownEnvironmentError, or GymBridgeError naming the settings that exist.
    """
    env_class = get_environment(name, trust)
    allowed = {"tool_timeout_s", "verify_timeout_s", "ray_resources", *env_class.settings}
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ConfigError(f"environment {env_class.name!r} has no setting {', '.join(map(repr, unknown))}; its settings: {', '.join(sorted(allowed))}")
    configured = type(env_class.__name__, (env_class,), {"__module__": env_class.__module__, **settings})
    return register(configured)


def remote_url(row: dict[str, Any]) -> str | None:
    """The resources server URL a row's routing names (`agent_ref.remote`), or None."""
    ref = row.get("agent_ref")
    url = ref.get("remote") if isinstance(ref, dict) else None
    return url if isinstance(url, str) and url else None


def _route(task: Task, trust: TrustSettings) -> type[Environment]:
    if remote_url(task.row):
        return get_environment(REMOTE_ENVIRONMENT)
    return get_environment(task.env_name, trust)


@dataclass(frozen=True)
class TaskSet:
    """A run's tasks, checked once: every row routed to its environment class with its tools matched
    (`resolve_tasks`) and, when built by `engine.ready_tasks`, each class's `check_ready` passed. A run
    builds it once and passes it down, so nothing below resolves or checks the rows again."""

    tasks: tuple[Task, ...]
    env_classes: Mapping[str, type[Environment]] = field(default_factory=dict)
    """The environment class of each routing name (`task.env_name`)."""

    def __len__(self) -> int:
        return len(self.tasks)

    def ordered(self, tasks: Iterable[Task]) -> TaskSet:
        """The same checked set with its tasks in another order (e.g. interleaved by environment)."""
        reordered = tuple(tasks)
        if sorted(task.index for task in reordered) != sorted(task.index for task in self.tasks):
            raise ValueError("TaskSet.ordered takes the same tasks in another order")
        return TaskSet(reordered, self.env_classes)


def resolve_tasks(tasks: Iterable[Task], trust: TrustSettings = DEFAULT_TRUST) -> dict[str, type[Environment]]:
    """Check that every task routes to a known environment (a module path only where `trust` allows it) and that
    its tools match it.

    Returns the environment classes by routing name. Raises UnknownEnvironmentError or
    DataError (naming the task's source and field) before anything runs.
    """
    from gym_bridge.core.errors import DataError

    resolved: dict[str, type[Environment]] = {}
    for task in tasks:
        try:
            env_class = _route(task, trust)
        except UnknownEnvironmentError as error:
            where = ": ".join(part for part in (task.source, routing_field(task.row)) if part)
            raise UnknownEnvironmentError(f"{where}: {error}" if where else str(error)) from None
        if resolved.setdefault(task.env_name, env_class) is not env_class:
            raise DataError(
                f"rows named {task.env_name!r} go both to {resolved[task.env_name].name!r} and to {env_class.name!r}; "
                "give all of them agent_ref.remote, or none",
                source=task.source, field="agent_ref.remote",
            )
        if task.tools is not None and not env_class.tools_from_row:
            specs = resolved[task.env_name].tool_specs()
            for position, schema in enumerate(task.tools):
                field = f"responses_create_params.tools[{position}]"
                spec = specs.get(schema["name"])
                if spec is None:
                    raise DataError(
                        f"tool {schema['name']!r} is not a tool of environment {resolved[task.env_name].name!r} "
                        f"(its tools: {', '.join(sorted(specs)) or 'none'})",
                        source=task.source,
                        field=field,
                    )
                declared = set((schema.get("parameters") or {}).get("properties", {}))
                actual = set(spec.schema["parameters"]["properties"])
                if declared != actual:
                    raise DataError(
                        f"parameters {sorted(declared)} do not match tool {spec.name!r}'s parameters {sorted(actual)}",
                        source=task.source,
                        field=f"{field}.parameters",
                    )
    return resolved
