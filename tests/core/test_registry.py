import sys
import textwrap

import pytest

from gym_bridge.core.environment import Environment, tool
from gym_bridge.core.errors import DataError, UnknownEnvironmentError
from gym_bridge.core.registry import get_environment, known_environments, register, resolve_tasks
from gym_bridge.core.task import parse_task


@register
class Counter(Environment):
    name = "counter_for_registry_test"
    aliases = ("counter_alias_agent",)

    @tool
    def add(self, amount: int) -> int:
        """Add."""
        return amount


def test_bundled_environments_come_from_entry_points():
    assert {"weather", "multi_step", "math"} <= set(known_environments())


def test_alias_routes_to_the_environment():
    assert get_environment("counter_alias_agent") is Counter


def test_unknown_name_lists_the_known_environments():
    with pytest.raises(UnknownEnvironmentError) as error:
        get_environment("no_such_env")
    assert "unknown environment 'no_such_env'" in str(error.value)
    assert "counter_for_registry_test" in str(error.value) and "weather" in str(error.value)


def test_module_path_loading(tmp_path, monkeypatch):
    (tmp_path / "my_env_pkg.py").write_text(textwrap.dedent('''
        from gym_bridge import Environment
        class Echo(Environment):
            name = "echo_from_module"
            def verify(self, task, output):
                return 1.0
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_environment("my_env_pkg:Echo").name == "echo_from_module"
    assert get_environment("echo_from_module").__name__ == "Echo"
    sys.modules.pop("my_env_pkg", None)


def test_a_module_path_subclass_without_its_own_name_is_refused_and_leaves_its_parent_registered(tmp_path, monkeypatch):
    """A subclass of `math` loaded by module path that does not set `name` would be registered as `math`,
    replacing the bundled environment for every row that names it: refused, saying what to set."""
    bundled = get_environment("math")
    (tmp_path / "my_math_pkg.py").write_text(textwrap.dedent('''
        from environments.math import MathEnvironment
        class HarderMath(MathEnvironment):
            description = "math, harder"
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(UnknownEnvironmentError, match=r"HarderMath inherits `name = 'math'` from MathEnvironment.*"
                                                          r"set `name = \"\.\.\.\"` on HarderMath"):
            get_environment("my_math_pkg:HarderMath")
        assert get_environment("math") is bundled
    finally:
        sys.modules.pop("my_math_pkg", None)


def test_a_module_path_subclass_with_its_own_name_does_not_take_its_parent_s_aliases(tmp_path, monkeypatch):
    bundled = get_environment("math")
    (tmp_path / "my_named_math_pkg.py").write_text(textwrap.dedent('''
        from environments.math import MathEnvironment
        class NamedMath(MathEnvironment):
            name = "named_math"
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        loaded = get_environment("my_named_math_pkg:NamedMath")
        assert get_environment("named_math") is loaded and loaded is not bundled
        assert get_environment("math_with_judge") is bundled  # the aliases MathEnvironment declares stay its own
    finally:
        sys.modules.pop("my_named_math_pkg", None)


def test_resolve_checks_every_task_before_running():
    good = parse_task({"prompt": "x", "environment": "counter_for_registry_test"}, index=0, source="a.jsonl:1")
    unknown = parse_task({"prompt": "x", "environment": "nope"}, index=1, source="a.jsonl:2")
    with pytest.raises(UnknownEnvironmentError, match=r"^a.jsonl:2: environment: unknown environment 'nope'"):
        resolve_tasks([good, unknown])
    wrong_tool = parse_task(
        {"prompt": "x", "environment": "counter_for_registry_test",
         "responses_create_params": {"input": "x", "tools": [{"type": "function", "name": "subtract", "parameters": {}}]}},
        index=2, source="a.jsonl:3")
    with pytest.raises(DataError, match=r"a.jsonl:3: responses_create_params.tools\[0\]: tool 'subtract' is not a tool"):
        resolve_tasks([wrong_tool])
    wrong_params = parse_task(
        {"prompt": "x", "environment": "counter_for_registry_test",
         "responses_create_params": {"input": "x", "tools": [{"type": "function", "name": "add",
                                                              "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}]}},
        index=3, source="a.jsonl:4")
    with pytest.raises(DataError, match=r"tools\[0\].parameters: parameters \['n'\] do not match tool 'add'"):
        resolve_tasks([wrong_params])
    assert resolve_tasks([good]) == {"counter_for_registry_test": Counter}


class Tunable(Environment):
    name = "tunable_for_registry_test"
    aliases = ("tunable_alias",)
    settings = ("level",)
    level = 1


def test_configure_registers_a_configured_subclass_in_place():
    register(Tunable)
    from gym_bridge.core.errors import GymBridgeError
    from gym_bridge.core.registry import configure

    configured = configure("tunable_alias", level=3, verify_timeout_s=5.0)
    assert issubclass(configured, Tunable) and configured.level == 3 and Tunable.level == 1
    assert get_environment("tunable_for_registry_test") is configured is get_environment("tunable_alias")
    with pytest.raises(GymBridgeError, match="has no setting 'colour'; its settings: level, ray_resources, tool_timeout_s, verify_timeout_s"):
        configure("tunable_for_registry_test", colour="red")


def test_rows_with_a_remote_url_route_to_the_remote_environment():
    from gym_bridge.core.registry import REMOTE_ENVIRONMENT

    row = {"prompt": "hi", "agent_ref": {"name": "counter_alias_agent", "remote": "http://127.0.0.1:9"},
           "responses_create_params": {"input": "hi", "tools": [{"type": "function", "name": "anything", "parameters": {}}]}}
    resolved = resolve_tasks([parse_task(row, index=0)])
    assert resolved == {"counter_alias_agent": get_environment(REMOTE_ENVIRONMENT)}   # its tools are not checked locally


def test_a_module_path_keeps_routing_to_its_configured_class(tmp_path, monkeypatch):
    """`configure` after loading by module path registers a configured subclass; naming the path again
    must give that class, not import and register the original over it (its settings were lost)."""
    from gym_bridge.core.registry import configure

    (tmp_path / "my_tunable_pkg.py").write_text(textwrap.dedent('''
        from gym_bridge import Environment
        class Tunable(Environment):
            name = "tunable_from_module"
            settings = ("level",)
            level = 1
            def verify(self, task, output):
                return 1.0
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        original = get_environment("my_tunable_pkg:Tunable")
        configured = configure("my_tunable_pkg:Tunable", level=3)
        assert configured is not original and configured.level == 3
        assert get_environment("my_tunable_pkg:Tunable") is configured is get_environment("tunable_from_module")
    finally:
        sys.modules.pop("my_tunable_pkg", None)
