"""Admission: how many rollouts can really be in flight, hop by hop, stated before a run starts.

Each hop between the caller and the model servers bounds concurrency: the trainer's batch or
`--concurrency`, the number of Ray workers times each one's engine bound, each actor's
`max_concurrency` (Ray's async-actor default of 1000 once capped a 68-node run to zero progress
without a word), the HTTP connections to the replicas, per-environment limits, and how many workers
the cluster's resources can place. `plan` lists them; the effective concurrency is the smallest; a
chain that caps below what was asked names the hop that does it, as a warning or (where the run
could not progress at all, or `strict`) as an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from gym_bridge.core.errors import UserError


class AdmissionError(UserError):
    """A hop allows fewer rollouts in flight than asked (none at all, or `strict`)."""


@dataclass(frozen=True)
class Hop:
    """One bound on rollouts in flight."""

    name: str
    """What it is, in the words of the setting that changes it."""
    limit: int
    """Rollouts it lets through at once."""


@dataclass(frozen=True)
class AdmissionPlan:
    requested: int
    """Rollouts the caller asked to have in flight (`--concurrency`, the trainer's batch)."""
    hops: tuple[Hop, ...]

    @property
    def effective(self) -> int:
        return min([self.requested, *(hop.limit for hop in self.hops)])

    @property
    def bottleneck(self) -> Hop | None:
        """The first hop that caps below what was asked, or None."""
        capped = [hop for hop in self.hops if hop.limit < self.requested]
        return min(capped, key=lambda hop: hop.limit) if capped else None

    def describe(self) -> str:
        """One line: asked, each hop, effective."""
        hops = ", ".join(f"{hop.name} {hop.limit}" for hop in self.hops)
        return f"admission: asked {self.requested} rollouts in flight; {hops}; effective {self.effective}"

    def problem(self) -> str | None:
        """Why fewer than asked can be in flight, naming the hop; None when nothing caps."""
        hop = self.bottleneck
        if hop is None:
            return None
        return f"{hop.name} caps rollouts in flight at {hop.limit}, below the {self.requested} asked; raise it or ask for fewer"


def check(plan: AdmissionPlan, *, strict: bool = False) -> str | None:
    """The warning to print for `plan` (None when nothing caps). Raises AdmissionError when a hop lets
    nothing through, or when it caps and `strict`."""
    problem = plan.problem()
    if problem is not None and (strict or plan.effective < 1):
        raise AdmissionError(problem)
    return problem


def plan(
    *,
    requested: int,
    engine_concurrency: int,
    workers: int = 1,
    actor_max_concurrency: int | None = None,
    group_size: int = 1,
    placeable_workers: int | None = None,
    replica_connections: int | None = None,
    per_env_concurrency: int | None = None,
    environments: int = 1,
) -> AdmissionPlan:
    """The hops of a run. `workers`: processes running an engine (1 for a local run); the per-process
    bounds are multiplied by it. `actor_max_concurrency` counts calls into one Ray actor, each a group
    of `group_size` rollouts. `replica_connections`: one process's connection pool to the model servers.
    `placeable_workers`: how many workers the cluster's free resources can hold."""
    hops = [Hop("engine concurrency" if workers == 1 else f"{workers} workers x engine concurrency", workers * engine_concurrency)]
    if actor_max_concurrency is not None:
        hops.append(Hop(f"{workers} workers x actor max_concurrency x group size {group_size}", workers * actor_max_concurrency * group_size))
    if placeable_workers is not None and placeable_workers < workers:
        hops.append(Hop(f"cluster resources (room for {placeable_workers} of {workers} workers)", placeable_workers * engine_concurrency))
    if replica_connections is not None:
        hops.append(Hop("replica connections (max_connections)" if workers == 1 else f"{workers} workers x replica connections",
                        workers * replica_connections))
    if per_env_concurrency is not None:
        hops.append(Hop(f"per-environment concurrency x {environments} environments x {workers} workers",
                        per_env_concurrency * environments * workers))
    return AdmissionPlan(requested=requested, hops=tuple(hops))
