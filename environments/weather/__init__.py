"""weather: one tool call (NeMo Gym's `example_single_tool_call`).

The model is asked about the weather somewhere and should call `get_weather`. As in NeMo Gym,
any call to `get_weather` earns reward 1.0; the final answer text is not checked.
"""

from __future__ import annotations

from pathlib import Path

from gym_bridge import Environment, Item, Task, VerifyResult, tool


class WeatherEnvironment(Environment):
    name = "weather"
    aliases = ("example_single_tool_call", "example_single_tool_call_simple_agent")
    description = "Answer a weather question by calling get_weather; reward 1 for calling it."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # a pure tool: replayed outputs always match
    inline_sync_tools = True  # the tools are quick pure functions

    @tool
    def get_weather(self, city: str) -> dict[str, str]:
        """Get the current weather in a city.

        Args:
            city: Name of the city, e.g. "San Francisco".
        """
        return {"city": city, "weather_description": f"The weather in {city} is cold."}

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        called = any(item["type"] == "function_call" and item["name"] == "get_weather" for item in output)
        return VerifyResult(reward=float(called), metrics={"called_get_weather": called})
