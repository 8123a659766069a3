"""`RayRollouts` routes tasks given as a list with the run's trust, as the engine does, before it joins a cluster."""

from __future__ import annotations

import pytest

from gym_bridge.core.errors import UnknownEnvironmentError
from gym_bridge.core.task import parse_task
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings
from gym_bridge.scale.ray_cluster import RayOptions
from gym_bridge.scale.ray_runner import RayRollouts

MODULE_PATH = "tests.support.failing_env:AlwaysRight"


def _rollouts(trust: TrustSettings) -> RayRollouts:
    def build_engine():  # type: ignore[no-untyped-def]
        raise AssertionError("no worker starts: the tasks are refused first")

    return RayRollouts(build_engine, RayOptions(num_workers=1), report=lambda line: None, trust=trust)


def test_a_module_path_row_is_refused_under_limited_trust_before_any_worker_starts():
    task = parse_task({"prompt": "x", "agent_ref": {"name": MODULE_PATH}}, index=0)
    with pytest.raises(UnknownEnvironmentError, match="module paths"):
        _rollouts(TrustSettings.limited_to([])).start([task])
    unset = RayRollouts(lambda: None, RayOptions(num_workers=1))
    assert unset.trust is DEFAULT_TRUST  # not given: the library default, as `resolve_tasks`'s own
