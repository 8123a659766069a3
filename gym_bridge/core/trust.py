"""What a run's data may run: the module paths rows may name as environments (importing a module runs its
code, so a data file naming module paths carries code, like a pickle) and whether harness rows may name their
own command. A run builds one `TrustSettings` from its options and passes it to what routes its rows and runs
its rollouts (`registry.get_environment`, `resolve_tasks`, `Engine`); the default is today's library default.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gym_bridge.core.errors import UnknownEnvironmentError


@dataclass(frozen=True)
class TrustSettings:
    """A run's trust in its data; frozen, so one run's settings can be handed to its workers and never leak into
    another run's in the same process."""

    module_prefixes: tuple[str, ...] | None = None
    """Packages rows may name environments from (`package.module:Class`); empty: none (only registered environments
    route, `--no-module-paths`); None: any importable module (module paths are not limited)."""
    row_commands: bool = False
    """True: rows of every harness environment may name their own command (`--allow-row-commands`); False: as each
    environment's `allow_row_commands` says. Never with limited module paths (the settings for shared data)."""

    @classmethod
    def limited_to(cls, prefixes: Iterable[str]) -> TrustSettings:
        """Module paths only under `prefixes` (empty: none), written as packages (`pkg.sub`; blanks and a trailing dot dropped)."""
        return cls(module_prefixes=tuple(prefix.strip().rstrip(".") for prefix in prefixes if prefix.strip()))

    @property
    def module_paths_limited(self) -> bool:
        """Whether module paths are limited (`--no-module-paths`, `--allow-module`): the setting for data not fully trusted."""
        return self.module_prefixes is not None

    def check_module(self, module_name: str, path: str) -> None:
        """Raise UnknownEnvironmentError, saying what would allow it, when rows may not name `module_name` (from `path`)."""
        allowed = self.module_prefixes
        if allowed is None or any(module_name == prefix or module_name.startswith(prefix + ".") for prefix in allowed):
            return
        if not allowed:
            raise UnknownEnvironmentError(
                f"environment {path!r} is a module path, and module paths are turned off (--no-module-paths): importing a "
                "module runs its code; register the environment (an entry point) or allow its package with --allow-module"
            )
        raise UnknownEnvironmentError(
            f"environment module {module_name!r} is not under an allowed prefix ({', '.join(allowed)}); importing a module "
            "runs its code: allow it with --allow-module PREFIX only if you trust the data"
        )


DEFAULT_TRUST = TrustSettings()
"""Any importable module path; row commands as each environment says (what library entry points use: TRL, verl, NeMo RL)."""
