import asyncio
import json
from typing import Literal

import pydantic
import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, ToolError, Toolset, VerifyResult, tool, tool_spec
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task


class Shop(Environment):
    name = "shop_for_test"

    @tool
    def buy(self, item: str, count: int = 1, size: Literal["s", "m"] = "m", tags: list[str] | None = None) -> dict:
        """Buy an item.

        Longer explanation that is not part of the description.

        Args:
            item: What to buy.
            count: How many
                (continued on a second line).
        """
        return {"item": item, "count": count}

    def helper(self) -> None:
        """Not a tool."""


def test_schema_from_signature_and_docstring():
    specs = Shop.tool_specs()
    assert list(specs) == ["buy"]
    schema = specs["buy"].schema
    assert schema["type"] == "function" and schema["name"] == "buy"
    assert schema["description"] == "Buy an item."
    params = schema["parameters"]
    assert params["required"] == ["item"]
    assert params["properties"]["item"] == {"type": "string", "description": "What to buy."}
    assert params["properties"]["count"]["description"] == "How many (continued on a second line)."
    assert params["properties"]["size"]["enum"] == ["s", "m"]
    assert params["additionalProperties"] is False


def test_arguments_are_validated_against_the_schema():
    model = Shop.tool_specs()["buy"].arguments_model
    assert model.model_validate_json('{"item": "pen", "count": 2}').model_dump()["count"] == 2
    for bad in ('{"count": 2}', '{"item": "pen", "count": "many"}', '{"item": "pen", "colour": "red"}'):
        with pytest.raises(pydantic.ValidationError):
            model.model_validate_json(bad)


def test_a_parameter_without_type_hint_is_refused():
    def lookup(self, word):  # noqa: ANN001
        """Look up."""

    with pytest.raises(TypeError, match="'word' needs a type hint"):
        tool_spec(lookup, name="lookup")


def test_verify_result_components_must_sum_to_reward():
    assert VerifyResult(reward=1.0, reward_components={"format": 0.25, "correct": 0.75}).reward == 1.0
    with pytest.raises(ValueError, match="sum to 0.5"):
        VerifyResult(reward=1.0, reward_components={"format": 0.25, "correct": 0.25})
    with pytest.raises(ValueError, match="finite"):
        VerifyResult(reward=float("nan"))


def test_validate_row_checks_the_declared_row_schema_and_accepts_anything_by_default():
    import pydantic

    from gym_bridge.core.environment import Environment, RowProblem

    class Plain(Environment):
        name = "plain_for_row_schema_test"

    class Answer(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        expected_answer: str
        weights: list[int] = []

    class Typed(Environment):
        name = "typed_for_row_schema_test"
        row_schema = Answer

    assert Plain.validate_row({"anything": 1}) == []
    assert Typed.validate_row({"expected_answer": "4", "extra": True}) == []
    assert Typed.validate_row({"weights": [1, "x"]}) == [
        RowProblem("expected_answer", "Field required"),
        RowProblem("weights[1]", "Input should be a valid integer, unable to parse string as an integer"),
    ]


# -- call_tool: the one tool dispatch ----------------------------------------------------------


def test_call_tool_validates_then_runs_the_tool_on_the_session():
    shop = Shop()
    assert shop.call_tool("buy", '{"item": "pen", "count": 2}') == {"item": "pen", "count": 2}
    assert shop.call_tool("buy", {"item": "ink"}) == {"item": "ink", "count": 1}  # parsed arguments too
    with pytest.raises(ToolError, match=r"invalid arguments for buy: count: Input should be a valid integer"):
        shop.call_tool("buy", '{"item": "pen", "count": "many"}')
    with pytest.raises(ToolError, match=r"invalid arguments for buy: colour: Extra inputs are not permitted"):
        shop.call_tool("buy", {"item": "pen", "colour": "red"})
    with pytest.raises(ToolError, match=r"unknown tool 'helper'; available tools: \['buy'\]"):
        shop.call_tool("helper", "{}")  # a method that is not a tool is not callable by name


def test_call_tool_sends_row_tools_to_call_row_tool():
    class Remote(Environment):
        name = "remote_for_call_tool_test"
        tools_from_row = True

        def call_row_tool(self, tool_name, /, **arguments):
            return {"ran": tool_name, "with": arguments}

    assert Remote().call_tool("anything", '{"a": 1}') == {"ran": "anything", "with": {"a": 1}}
    assert Remote().call_tool("anything", "  ") == {"ran": "anything", "with": {}}
    with pytest.raises(ToolError, match="must be a JSON object"):
        Remote().call_tool("anything", "[1]")
    with pytest.raises(ToolError, match="not JSON"):
        Remote().call_tool("anything", "{")


def test_call_tool_returns_an_async_tools_awaitable():
    class Slow(Environment):
        name = "slow_for_call_tool_test"

        @tool
        async def wait(self, n: int) -> int:
            """Wait."""
            await asyncio.sleep(0)
            return n * 2

    assert Slow.tool_specs()["wait"].is_async
    assert asyncio.run(Slow().call_tool("wait", '{"n": 21}')) == 42


# -- toolsets ----------------------------------------------------------------------------------


class Counter(Toolset):
    """A toolset whose state lives on the session (set in its environment's setup)."""

    counts: dict[str, int]

    def _bump(self, key: str) -> int:
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]

    @tool
    def count(self, key: str) -> int:
        """Count one more of a key.

        Args:
            key: What to count.
        """
        return self._bump(key)


class Report(Counter):
    @tool
    async def report(self) -> dict:
        """All counts so far."""
        return dict(self.counts)


class Tally(Environment):
    name = "tally_for_toolset_test"
    toolsets = (Counter, Report)

    def setup(self, task):
        self.counts = {}

    def verify(self, task, output):
        return VerifyResult(reward=float(self.counts.get("x", 0) == 2), metrics={"counts": dict(self.counts)})


def test_an_environment_includes_its_toolsets_tools_and_they_share_the_session():
    assert sorted(Tally.tool_specs()) == ["count", "report"]
    assert Tally.tool_specs()["count"].schema["parameters"]["properties"]["key"]["description"] == "What to count."
    session = Tally()
    session.setup(None)
    assert [session.call_tool("count", {"key": "x"}) for _ in range(2)] == [1, 2]
    assert asyncio.run(session.call_tool("report", "{}")) == {"x": 2}
    assert Tally().__dict__ == {}  # sessions share no state: it lives on each instance
    assert not issubclass(Tally, Counter)  # included, not inherited


def test_toolset_tools_run_through_the_engine(smol_template, turn):
    register(Tally)
    call = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    script = {"": [turn(call.format(name="count", args='{"key": "x"}')), turn(call.format(name="count", args='{"key": 1}')),
                   turn(call.format(name="count", args='{"key": "x"}')), turn(call.format(name="report", args="{}")), turn("done")]}
    engine = Engine(ScriptedPolicy(script), smol_template, EngineConfig())

    async def collect():
        return [record async for record in engine.stream([parse_task({"prompt": "Count.", "environment": Tally.name}, index=0)])]

    [record] = asyncio.run(collect())
    outputs = [item["output"] for item in record.output if item["type"] == "function_call_output"]
    # 1 (thread), invalid arguments (read by the model), 2, then the async report
    assert outputs[0] == "1" and outputs[2] == "2" and json.loads(outputs[3]) == {"x": 2}
    assert json.loads(outputs[1])["error"].startswith("invalid arguments for count: key: Input should be a valid string")
    assert (record.failure_kind, record.reward) == (None, 1.0)


def test_toolset_clashes_are_refused_when_the_class_is_made():
    class Other(Toolset):
        @tool
        def count(self, key: str) -> int:
            """Another count."""
            return 0

    with pytest.raises(TypeError, match="toolsets Counter and Other both define 'count'"):
        type("Clash", (Environment,), {"name": "clash", "toolsets": (Counter, Other)})

    class Sneaky(Toolset):
        def verify(self, task, output):
            return 1.0

    with pytest.raises(TypeError, match="toolset Sneaky defines 'verify', which the environment already has"):
        type("Override", (Environment,), {"name": "override", "toolsets": (Sneaky,)})
    with pytest.raises(TypeError, match="must hold Toolset classes"):
        type("NotToolset", (Environment,), {"name": "bad", "toolsets": (Shop,)})


def test_the_environments_own_method_overrides_a_toolset_tool():
    class Custom(Environment):
        name = "custom_for_toolset_test"
        toolsets = (Counter,)

        def setup(self, task):
            self.counts = {}

        @tool
        def count(self, key: str) -> int:
            """Always seven."""
            return 7

    assert Custom.tool_specs()["count"].schema["description"] == "Always seven."
    assert Custom().call_tool("count", {"key": "x"}) == 7
