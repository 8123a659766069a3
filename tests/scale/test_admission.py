"""Admission: every hop's bound is stated, the smallest wins, and a cap below what was asked names
its hop. No Ray needed: these are the numbers `RayRollouts` and `eval` print at start."""

from __future__ import annotations

import sys

import pytest

from gym_bridge.core.errors import GymBridgeError, MissingDependencyError
from gym_bridge.scale.admission import AdmissionError, check, plan
from gym_bridge.scale.ray_runner import placeable, resources_of
from gym_bridge.scale.ray_cluster import check_reachable, import_ray


def test_ray_s_default_actor_bound_would_cap_and_is_named():
    # 68 workers x 64 rollouts = 4352 >= 4096 asked, but 68 actors x 1000 calls x group 1 would be 68000: no cap;
    # with 2 workers of engine bound 4096 each and Ray's default 1000 calls per actor: 2 x 1000 x 1 = 2000 < 4096
    capped = plan(requested=4096, engine_concurrency=4096, workers=2, actor_max_concurrency=1000, group_size=1)
    assert capped.effective == 2000
    assert check(capped) == ("2 workers x actor max_concurrency x group size 1 caps rollouts in flight at 2000, "
                             "below the 4096 asked; raise it or ask for fewer")
    with pytest.raises(AdmissionError, match="actor max_concurrency"):
        check(capped, strict=True)
    fine = plan(requested=4096, engine_concurrency=64, workers=68, actor_max_concurrency=68, group_size=1)
    assert fine.effective == 4096 and check(fine) is None  # 68 x 64 = 4352 and 68 x 68 = 4624, both >= 4096


def test_connections_per_env_and_cluster_room_are_hops_and_zero_is_an_error():
    hops = plan(requested=512, engine_concurrency=256, workers=2, replica_connections=100, per_env_concurrency=50,
                environments=2, placeable_workers=1)
    # engine 2 x 256 = 512; room for 1 worker: 256; connections 2 x 100 = 200; per-env 50 x 2 envs x 2 workers = 200
    assert [hop.limit for hop in hops.hops] == [512, 256, 200, 200]
    assert hops.effective == 200 and "effective 200" in hops.describe()
    with pytest.raises(AdmissionError, match="engine concurrency caps rollouts in flight at 0"):
        check(plan(requested=8, engine_concurrency=0))


def test_environment_resources_become_actor_options_and_bad_ones_are_refused():
    from environments.weather import WeatherEnvironment

    class Sandboxed(WeatherEnvironment):
        ray_resources = {"num_cpus": 2, "memory": 2**30, "sandbox": 1}

    options = resources_of(Sandboxed, default_num_cpus=1.0)
    assert options == {"num_cpus": 2, "memory": 2**30, "resources": {"sandbox": 1.0}}
    assert placeable(options, {"CPU": 16, "memory": 64 * 2**30, "sandbox": 3}) == 3  # sandboxes: 3, CPUs: 8, memory: 64
    assert placeable(options, {"CPU": 16, "memory": 64 * 2**30}) == 0  # no node has a sandbox

    class Bad(WeatherEnvironment):
        ray_resources = {"sandbox": "one"}

    with pytest.raises(GymBridgeError, match=r"ray_resources\['sandbox'\] must be a non-negative number"):
        resources_of(Bad, default_num_cpus=1.0)


def test_env_setting_may_set_ray_resources():
    from gym_bridge.core.registry import configure, get_environment, register

    original = get_environment("weather")
    try:
        configured = configure("weather", ray_resources={"sandbox": 1})
        assert resources_of(configured, default_num_cpus=1.0)["resources"] == {"sandbox": 1.0}
    finally:
        register(original)


def test_missing_ray_and_a_closed_address_are_clear_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'gym-bridge\[ray\]'"):
        import_ray()
    with pytest.raises(GymBridgeError, match="cannot reach the Ray cluster at 127.0.0.1:9"):
        check_reachable("127.0.0.1:9", timeout_s=2)
    with pytest.raises(GymBridgeError, match="host:port"):
        check_reachable("head-node", timeout_s=2)


def test_the_ray_modules_hold_one_concept_each_and_the_old_imports_are_gone():
    """Issue 29: scale/ray_runner.py held three concepts. Reaching the cluster is ray_cluster's, the worker actor
    ray_worker's, the scheduler ray_runner's; issue 37: the names ray_runner does not use no longer import from it."""
    from gym_bridge.scale import ray_cluster, ray_runner, ray_worker

    moved = {"check_reachable": ray_cluster, "import_ray": ray_cluster, "preflight": ray_cluster, "INSTALL_HINT": ray_cluster,
             "RemoteEngineFactory": ray_worker}
    assert [name for name in moved if hasattr(ray_runner, name)] == []
    assert all(getattr(module, name).__module__ == module.__name__ for name, module in moved.items() if name != "INSTALL_HINT")
    assert ray_runner.RayRollouts.__module__ == "gym_bridge.scale.ray_runner"
