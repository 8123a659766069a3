from typing import Literal

import pydantic
import pytest

from gym_bridge.core.environment import Environment, VerifyResult, tool, tool_spec


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
