"""Environments that misbehave, loaded by module path in CLI tests."""

from gym_bridge import Environment


class AlwaysCrashes(Environment):
    name = "always_crashes"

    def verify(self, task, output):
        raise RuntimeError("verifier bug")


class AlwaysRight(Environment):
    """Reward 1 for any answer; named only by module path (no entry point), for `verify` tests."""

    name = "always_right"

    def verify(self, task, output):
        return 1.0


class HangsInVerify(Environment):
    """A sync verifier stuck for an hour: its thread must not keep `eval` alive after the summary."""

    name = "hangs_in_verify"
    verify_timeout_s = 0.2

    def verify(self, task, output):
        import time

        time.sleep(3600)


class HangsInSetup(Environment):
    """A setup stuck for an hour under a long timeout: Ctrl-C must still stop `eval`."""

    name = "hangs_in_setup"
    tool_timeout_s = 3600.0

    def setup(self, task):
        import time

        time.sleep(3600)

    def verify(self, task, output):
        return 1.0


class SegfaultsInSetup(Environment):
    """Crashes the whole process (not isolated): `eval` must say where."""

    name = "segfaults_in_setup"

    def setup(self, task):
        import ctypes

        ctypes.string_at(0)

    def verify(self, task, output):
        return 1.0


class RaisesOneInEight(Environment):
    """Raises in the setup of its first rollout and every eighth after it (a process-wide count, reset by tests):
    the flaky environment of the async training tests, whose failures must never stop training. Reward: the parity
    of the final answer's length, so the rewards of a group of sampled answers differ and the policy gets a gradient."""

    name = "raises_one_in_eight"
    setups = 0

    def setup(self, task):
        type(self).setups += 1
        if type(self).setups % 8 == 1:
            raise RuntimeError("flaky environment: the sandbox went away")

    def verify(self, task, output):
        from gym_bridge import final_text

        return float(len(final_text(output)) % 2)
