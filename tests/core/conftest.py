"""Fixtures of the core tests: rollout files made for real by the engine (tests/support/rollout_files.py), for test_health.py."""

from tests.support.rollout_files import mixed_file, multi_step_file  # noqa: F401
