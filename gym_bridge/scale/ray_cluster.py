"""Reaching a Ray cluster: `RayOptions`, the fail-fast checks before a model loads, and `connect`.

Ray itself retries an unreachable head for a minute and more, and waits without end on a port that
is no Ray head; `check_reachable` asks the head for gRPC's HTTP/2 answer first, within a timeout.
Ray is imported here only, on first use (`import_ray`); without it the error says
`pip install 'gym-bridge[ray]'`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gym_bridge.core.errors import ConfigError, MissingExtraError, SetupError

INSTALL_HINT = "pip install 'gym-bridge[ray]'"


@dataclass(frozen=True)
class RayOptions:
    """How rollouts are spread over a Ray cluster."""

    address: str | None = None
    """`host:port` of a running cluster's head (as `ray start --head` prints), `auto`, or None to start a local Ray."""
    num_workers: int = 2
    """Worker actors per kind of environment resources (each runs one engine)."""
    worker_concurrency: int | None = None
    """Rollouts in flight in one worker (None: the engine's `max_concurrency` divided over the workers)."""
    max_retries: int = 2
    """Times a group whose worker died is run again before its rollouts are recorded as `infra` failures."""
    max_worker_restarts: int = 8
    """Times Ray restarts one worker actor that died."""
    worker_num_cpus: float = 1.0
    """CPUs a worker asks for when its environment says nothing."""
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Passed to `ray.init` (e.g. `num_cpus`, `object_store_memory` for a local Ray)."""
    connect_timeout_s: float = 10.0
    """How long the head's address may take to accept a connection and answer as a Ray head before the run
    stops with an error naming it (`--ray-connect-timeout-s`)."""
    strict_admission: bool = False
    """Refuse to start (instead of a warning) when a hop caps below the concurrency asked."""


def import_ray() -> Any:
    """The `ray` module; raises MissingDependencyError with the install command when it is missing."""
    try:
        import ray
    except ImportError:
        raise MissingExtraError(f"running rollouts on Ray needs Ray: {INSTALL_HINT}") from None
    return ray


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""HTTP/2's client preface and an empty SETTINGS frame: a Ray head (its GCS, or the Ray Client server of a
`ray://` address) speaks gRPC over HTTP/2 and answers with a SETTINGS frame of its own."""
_SETTINGS_FRAME = 0x04
_CHECKS = ("check the address: `ray start --head` prints it (host:6379 by default; the dashboard's 8265 is not it), "
           "and `ray status --address ADDRESS` on a cluster machine must answer")


def check_reachable(address: str, *, timeout_s: float) -> None:
    """Raise GymBridgeError unless the head at `address` (`host:port`) accepts a connection and answers as a
    Ray head (gRPC's HTTP/2 SETTINGS frame) within `timeout_s`. Ray itself retries an unreachable head for
    a minute and more, and waits without end on a port that accepts connections but is no Ray head."""
    host, sep, port = address.rpartition(":")
    if address.startswith("ray://"):
        host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--ray takes the head's host:port (as `ray start --head` prints) or `auto`, got {address!r}")
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as connection:
            if os.environ.get("RAY_USE_TLS", "0") not in ("0", ""):
                return  # a TLS head answers only after a handshake this probe does not make
            answer = _first_frame_head(connection, deadline)
            if answer is not None and answer[3:4] != bytes([_SETTINGS_FRAME]):
                answer += _more(connection)
    except OSError as error:
        raise SetupError(f"cannot reach the Ray cluster at {address}: {error}; is `ray start --head` running there?") from None
    if answer is None:
        raise SetupError(f"{address} accepts connections but gave no Ray answer within {timeout_s:g} s "
                             f"(--ray-connect-timeout-s): it is not a Ray head; {_CHECKS}")
    if len(answer) < 9 or answer[3] != _SETTINGS_FRAME:
        raise SetupError(f"{address} answered, but not as a Ray head ({answer[:40]!r}...: not gRPC); {_CHECKS}")


def _more(connection: socket.socket) -> bytes:
    """Up to 31 more bytes the peer has sent, for the error message (nothing if none come in 0.2 s)."""
    connection.settimeout(0.2)
    try:
        return connection.recv(31)
    except OSError:
        return b""


def _first_frame_head(connection: socket.socket, deadline: float) -> bytes | None:
    """The first 9 bytes (an HTTP/2 frame header) the peer sends after our preface; what came before it
    closed, or None when nothing came before `deadline`."""
    connection.sendall(_HTTP2_PREFACE)
    answer = b""
    while len(answer) < 9:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return None if not answer else answer
        connection.settimeout(left_s)
        try:
            chunk = connection.recv(9 - len(answer))
        except TimeoutError:
            return None if not answer else answer
        if not chunk:
            return answer or b"(closed the connection)"
        answer += chunk
    return answer


def preflight(options: RayOptions) -> None:
    """Fail fast, before a model is loaded: Ray missing (with the install command), or a cluster address
    that cannot be reached."""
    import_ray()
    if options.address not in (None, "auto", "local"):
        check_reachable(options.address, timeout_s=options.connect_timeout_s)


def connect(options: RayOptions) -> Any:
    """Join the cluster at `options.address`, or start a local Ray; returns the `ray` module."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if options.address not in (None, "auto", "local"):
        check_reachable(options.address, timeout_s=options.connect_timeout_s)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, **options.init_kwargs}
    # None: a new local Ray, never whatever cluster /tmp/ray last pointed at (possibly another user's, or dead)
    kwargs["address"] = "local" if options.address is None else options.address
    kwargs.setdefault("runtime_env", {"env_vars": _forwarded_env()})
    try:
        ray.init(**kwargs)
    except ConnectionError as error:
        raise SetupError(f"cannot join the Ray cluster at {options.address}: {error}") from None
    return ray


def _forwarded_env() -> dict[str, str]:
    """Environment variables the workers need to import the same code (PYTHONPATH) and stay offline."""
    names = ("PYTHONPATH", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "HF_HOME")
    return {name: os.environ[name] for name in names if name in os.environ}
