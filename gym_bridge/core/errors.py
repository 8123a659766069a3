"""gym_bridge's one error tree, and the one boundary that turns a rollout's exceptions into failure kinds.

Every error derives from `GymBridgeError`, on one of three branches, and only leaves are raised.
`UserError`: the user's mistake (bad data, options, setup, a missing extra), raised before any generation;
the CLI exits 2 with its message. `RolloutError`: a rollout failed for a reason that is not the policy's;
it carries a `failure_kind` and ends as a masked record. `ErrorAnswer`: an HTTP error one of gym_bridge's
servers answers its client with. `classify` turns whatever escapes a step of a rollout into a `FailRollout`.
"""

from __future__ import annotations

import typing
from typing import Literal

FailureKind = Literal["infra", "env", "verifier", "timeout", "context_overflow"]
"""Why a rollout failed: `infra` (generation backend, transport, gym_bridge itself), `env` (setup, a
tool, close), `verifier`, `timeout` (the rollout's deadline), `context_overflow` (the prompt did not fit)."""
FAILURE_KINDS: tuple[FailureKind, ...] = typing.get_args(FailureKind)


class GymBridgeError(Exception):
    """The root of gym_bridge's errors; never raised itself: raise a leaf of `UserError`, `RolloutError`
    or `ErrorAnswer` (tests/core/test_errors.py pins it). The CLI reports any it sees as a user error."""


# -- the user's mistakes: reported before anything runs, the CLI exits 2 --------------------


class UserError(GymBridgeError):
    """Something the user must fix (data, setup, an extra to install, a template); the message says what."""


class ConfigError(UserError, ValueError):
    """An option, flag, setting or argument is missing or invalid (a CLI flag, a trainer config, an
    environment's class attribute); a `ValueError` too, so older `except ValueError` still catch it."""


class SetupError(UserError):
    """Something the run needs around it is not there or not what the options name: no server at a URL,
    a port in use, a Ray cluster that does not answer, a first batch whose every rollout failed."""


class DataError(UserError, ValueError):
    """A task row is malformed; the message names the source (file:line) and the field."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.source = source
        self.field = field
        self.message = message
        """The problem alone, without source and field."""
        where = ": ".join(part for part in (source, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


class UnknownEnvironmentError(UserError, LookupError):
    """A row names an environment that is not registered."""


class TemplateError(UserError):
    """The chat template cannot be used token-in/token-out for the conversation shapes needed."""


class MissingDependencyError(UserError, ImportError):
    """An optional dependency is missing; the message carries the exact install command."""


class MissingExtraError(MissingDependencyError):
    """An optional package is not installed; the message is the install command (usually of a gym-bridge extra)."""


class UnknownParserError(UserError, LookupError):
    """A tool-call or reasoning parser name that gym_bridge does not know; the message lists the known ones."""


class TokenPolicyRequiredError(UserError, TypeError):
    """Training was given a policy that cannot return token ids and log-probs."""


# -- a rollout's failures: each becomes a failure kind on its record --------------------------


class RolloutError(GymBridgeError):
    """A rollout failed for a reason that is not the policy's; it ends as a masked record of `failure_kind`."""

    failure_kind: FailureKind = "infra"
    """The kind its rollout's record gets when this escapes the agent loop (see `classify`)."""

    @property
    def reason(self) -> str:
        """The record's `failure_reason`."""
        return str(self)


class FailRollout(RolloutError):
    """`raise FailRollout(kind, reason)`: a rollout ended on purpose with its kind (by a loop, an environment, the
    engine); kept as it is wherever in the rollout it is raised, and the rollout is recorded with `kind` and masked.
    (`RolloutError` is the family of a rollout's failures; this is the one raised with the kind named.)"""

    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.failure_kind = kind

    @property
    def kind(self) -> FailureKind:
        """Its `failure_kind`."""
        return self.failure_kind



class BackendError(RolloutError):
    """The generation backend failed (transport, server error, crash); the rollout fails as `infra`."""

    @property
    def reason(self) -> str:
        return f"generation backend: {self}"


class BackendAnswerError(BackendError):
    """The backend answered an error, or something gym_bridge cannot use (malformed, inconsistent, no
    answer for the request)."""


class BackendClosedError(BackendError):
    """The policy was closed before this call."""


class GenerationAbortedError(BackendError):
    """The trainer's generation server aborted the request (rollouts paused, e.g. for a weight update)."""


class WeightSyncError(BackendError):
    """Pushing new weights to the generation server failed."""


class ContextOverflowError(RolloutError):
    """The prompt plus requested tokens do not fit the model's context window."""

    failure_kind = "context_overflow"


class AbortedCall(RolloutError):
    """The called code raised `SystemExit`, `KeyboardInterrupt` or `CancelledError` of its own:
    it ends that call (and its rollout), not the run."""

    failure_kind = "env"

    def __init__(self, original: BaseException) -> None:
        self.original = original
        detail = str(original)
        super().__init__(f"{type(original).__name__}({detail})" if detail else type(original).__name__)


# -- an HTTP error answer: the server that raises it answers its client and serves on -----------


class ErrorAnswer(GymBridgeError):
    """An error answer one of gym_bridge's HTTP servers sends its client (4xx: the client's request,
    5xx: the server's failure): not the user's mistake (nothing exits), not a rollout's failure (no record)."""


def describe_error(error: BaseException) -> str:
    """`Type: message` for a failure reason; an AbortedCall is described by what the code raised."""
    if isinstance(error, AbortedCall):
        return f"{type(error.original).__name__}: {error.original}" if str(error.original) else type(error.original).__name__
    return f"{type(error).__name__}: {error}"


# -- the boundary -------------------------------------------------------------------------------

Step = Literal["rollout", "setup", "tool", "verify", "close"]
"""Where an exception escaped: environment code (`setup`, a `tool`, `verify`, `close`), each called under
its own timeout, or the rest of the `rollout` (the agent loop, model calls) under the rollout's deadline."""

STEP_KINDS: dict[Step, FailureKind] = {"setup": "env", "tool": "env", "verify": "verifier", "close": "env"}
"""The kind of whatever escapes environment code, whatever its type (a judge model that is down fails
`verify`, so it is the verifier's failure)."""


def classify(error: BaseException, *, step: Step = "rollout", what: str = "", timeout_s: float | None = None) -> FailRollout:
    """The failure a rollout's record gets for `error`, which escaped `step` (`what` names the call in
    the reason, default the step; `timeout_s` is the step's bound, the deadline for `rollout`).

    | escaped                | `rollout`                                  | `setup`, `tool`, `close` / `verify`         |
    |------------------------|--------------------------------------------|---------------------------------------------|
    | FailRollout            | itself                                     | itself                                      |
    | other RolloutError     | its `failure_kind`, its `reason`           | env / verifier: "<what> raised Type: ..."  |
    | TimeoutError           | timeout: "rollout exceeded its deadline"   | env / verifier: "<what> did not return ..." |
    | any other Exception    | infra: "Type: message"                     | env / verifier: "<what> raised Type: ..."  |
    """
    if isinstance(error, FailRollout):
        return error
    if step == "rollout":
        if isinstance(error, RolloutError):
            return FailRollout(error.failure_kind, error.reason)
        if isinstance(error, TimeoutError):
            return FailRollout("timeout", f"rollout exceeded its deadline of {timeout_s or 0:g} s")
        return FailRollout("infra", f"{type(error).__name__}: {error}")
    what = what or step
    if isinstance(error, TimeoutError):
        within = f"within {timeout_s:g} s" if timeout_s is not None else "in time"
        return FailRollout(STEP_KINDS[step], f"{what} did not return {within}")
    return FailRollout(STEP_KINDS[step], f"{what} raised {describe_error(error)}")
