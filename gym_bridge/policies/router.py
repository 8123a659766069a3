"""The replica router: which model server each call of a rollout goes to.

All calls of one episode (`GenerationRequest.session_id`) go to the replica that served its first
call, so that replica's prefix cache holds the conversation (affinity). A new episode goes to the
replica with the fewest calls in flight. A replica that fails to answer is skipped for `down_for_s`
and its episodes move to the next one (failover: the prompt ids carry the whole conversation, so any
replica can continue an episode; only its cache is lost). Which failed calls are retried is the
policy's rule (`RemotePolicy`: only those that never reached the replica, by default). The router counts, per replica, the calls,
errors, calls in flight and how often an episode's call found its replica (the affinity hit rate):
`stats()` is what the run's metrics report. It holds no network code; `RemotePolicy` asks it.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_STICKY_SESSIONS = 65_536
"""Episodes remembered at most (least recently used forgotten first)."""


@dataclass
class ReplicaCounters:
    """What one replica has seen in this process."""

    calls: int = 0
    """Calls sent to it (each attempt counts)."""
    errors: int = 0
    """Attempts that got no usable answer (transport errors, timeouts, 5xx, 429)."""
    in_flight: int = 0
    """Calls waiting for its answer now."""
    peak_in_flight: int = 0
    episodes: int = 0
    """Episodes whose first call it served, or that failed over to it."""
    down_until: float = 0.0
    """`time.monotonic()` until which it is skipped."""


class ReplicaRouter:
    """Chooses a replica per call: the episode's own while it is up, else the least busy one."""

    def __init__(self, urls: Sequence[str], *, down_for_s: float = 5.0, max_sessions: int = MAX_STICKY_SESSIONS) -> None:
        if not urls:
            raise ValueError("a router needs at least one replica URL")
        self.urls = list(urls)
        self.down_for_s = down_for_s
        self.max_sessions = max_sessions
        self.replicas = [ReplicaCounters() for _ in self.urls]
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self.affinity_hits = 0
        """Calls of a known episode that went to the episode's replica."""
        self.affinity_misses = 0
        """Calls of a known episode that went elsewhere (its replica was down or had already failed this call)."""

    def knows(self, session_id: str) -> bool:
        """True when the episode has a replica (its first call was answered there)."""
        return bool(session_id) and session_id in self._sticky

    def is_up(self, replica: int, now: float | None = None) -> bool:
        return self.replicas[replica].down_until <= (time.monotonic() if now is None else now)

    def choose(self, session_id: str, *, avoid: set[int] | frozenset[int] = frozenset()) -> int:
        """The episode's replica while it is up and not in `avoid` (those this call already tried);
        else the least busy replica that is up (ties broken by a hash of the episode, so concurrent
        new episodes spread), which becomes the episode's replica."""
        now = time.monotonic()
        current = self._sticky.get(session_id) if session_id else None
        if current is not None and current not in avoid and self.is_up(current, now):
            self._sticky.move_to_end(session_id)
            self.affinity_hits += 1
            return current
        everyone = range(len(self.urls))
        candidates = [i for i in everyone if i not in avoid] or list(everyone)
        up = [i for i in candidates if self.is_up(i, now)] or candidates
        if len(up) > 1:
            chosen = min(up, key=lambda i: (self.replicas[i].in_flight, zlib.crc32(f"{session_id}|{i}".encode())))
        else:
            chosen = up[0]
        if current is not None:
            if chosen == current:
                self.affinity_hits += 1
            else:
                self.affinity_misses += 1
        if session_id and chosen != current:
            self.replicas[chosen].episodes += 1
            self._sticky[session_id] = chosen
            self._sticky.move_to_end(session_id)
            if len(self._sticky) > self.max_sessions:
                self._sticky.popitem(last=False)
        return chosen

    def started(self, replica: int) -> None:
        counters = self.replicas[replica]
        counters.calls += 1
        counters.in_flight += 1
        counters.peak_in_flight = max(counters.peak_in_flight, counters.in_flight)

    def finished(self, replica: int, *, ok: bool, down: bool = False) -> None:
        """One call to `replica` ended; `ok=False` counts an error, `down=True` (the connection failed
        or broke: no answer at all) also takes the replica out for `down_for_s`."""
        counters = self.replicas[replica]
        counters.in_flight -= 1
        if not ok:
            counters.errors += 1
        if down:
            counters.down_until = time.monotonic() + self.down_for_s

    def stats(self) -> dict[str, Any]:
        """Per-replica load and errors, and the affinity hit rate (None before any episode's second call)."""
        return {
            "replicas": [
                {"url": url, "calls": counters.calls, "errors": counters.errors, "in_flight": counters.in_flight,
                 "peak_in_flight": counters.peak_in_flight, "episodes": counters.episodes}
                for url, counters in zip(self.urls, self.replicas)
            ],
            "affinity_hits": self.affinity_hits,
            "affinity_misses": self.affinity_misses,
            "affinity_hit_rate": affinity_hit_rate(self.affinity_hits, self.affinity_misses),
        }


def affinity_hit_rate(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 4) if hits + misses else None


def merge_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The stats of several routers over the same replicas (one per Ray worker) added together."""
    parts = [part for part in parts if part]
    if not parts:
        return {}
    by_url: dict[str, dict[str, Any]] = {}
    for part in parts:
        for entry in part["replicas"]:
            total = by_url.setdefault(entry["url"], {"url": entry["url"], "calls": 0, "errors": 0, "in_flight": 0,
                                                     "peak_in_flight": 0, "episodes": 0})
            for key in ("calls", "errors", "in_flight", "peak_in_flight", "episodes"):
                total[key] += entry[key]
    hits = sum(part["affinity_hits"] for part in parts)
    misses = sum(part["affinity_misses"] for part in parts)
    return {"replicas": list(by_url.values()), "affinity_hits": hits, "affinity_misses": misses,
            "affinity_hit_rate": affinity_hit_rate(hits, misses)}


async def live_replicas(urls: Sequence[str], probe: Any) -> tuple[list[str], dict[str, str]]:
    """The URLs whose `await probe(url)` succeeds, and why each other one failed (all probed at once).

    Used at start: a run whose replica list holds dead URLs starts on the live ones and says so.
    """
    import asyncio

    answers = await asyncio.gather(*(probe(url) for url in urls), return_exceptions=True)
    live = [url for url, answer in zip(urls, answers) if not isinstance(answer, BaseException)]
    dead = {url: str(answer) for url, answer in zip(urls, answers) if isinstance(answer, BaseException)}
    return live, dead
