"""Errors raised before any generation starts: bad data, unknown environments, bad templates.

A bad rollout is data, not an exception (see `gym_bridge.core.engine`); the errors here are for
input a user must fix, and each message names what to fix.
"""

from __future__ import annotations


class GymBridgeError(Exception):
    """Base class of gym_bridge's user-facing errors."""


class DataError(GymBridgeError, ValueError):
    """A task row is malformed; the message names the source (file:line) and the field."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.source = source
        self.field = field
        self.message = message
        """The problem alone, without source and field."""
        where = ": ".join(part for part in (source, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


class UnknownEnvironmentError(GymBridgeError, LookupError):
    """A row names an environment that is not registered."""


class TemplateError(GymBridgeError):
    """The chat template cannot be used token-in/token-out for the conversation shapes needed."""


class MissingDependencyError(GymBridgeError, ImportError):
    """An optional dependency is missing; the message carries the exact install command."""


class UnknownParserError(GymBridgeError, LookupError):
    """A tool-call or reasoning parser name that gym_bridge does not know; the message lists the known ones."""
