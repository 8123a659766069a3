"""Task rows for an OpenEnv server, made from the server itself (`OpenEnvEnvironment.prepare_rows`).

A row's prompt holds the observation `reset(seed)` gives, and its tools are what the server offers: in simulation
mode one `act` tool whose parameters are the action schema of `GET /schema` (OpenEnv's `metadata` field left out),
in MCP mode the server's `tools/list`. The rollout resets with the same seed, so the model sees that episode.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from gym_bridge import without_titles

from environments.openenv.session import OpenEnvError, OpenEnvSession

INSTRUCTIONS = ("You are acting in an environment. Take each action by calling a tool; its result shows the new observation, "
                "the reward and whether the episode is done. Keep acting until it is done.")


async def simulation_tool(url: str, *, name: str, timeout_s: float) -> dict[str, Any]:
    """The `act` tool: the action schema of the server's `/schema`; raises OpenEnvError when it has none."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            answer = (await client.get(url.rstrip("/") + "/schema")).json()
        action = dict(answer["action"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
        raise OpenEnvError(f"{url}/schema did not give an action schema: {type(error).__name__}: {error}") from None
    parameters = without_titles(action)
    parameters["properties"] = {key: value for key, value in parameters.get("properties", {}).items() if key != "metadata"}
    parameters["required"] = [key for key in parameters.get("required", []) if key != "metadata"]
    description = str(parameters.pop("description", "") or "Take one action in the environment.")
    return {"type": "function", "name": name, "description": description, "parameters": parameters, "strict": False}


def mcp_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """One tool of `tools/list` as a Responses function schema."""
    parameters = tool.get("inputSchema") or tool.get("input_schema") or {"type": "object", "properties": {}}
    return {"type": "function", "name": tool["name"], "description": tool.get("description") or "", "parameters": parameters, "strict": False}


async def build_rows(url: str, *, mode: str, seeds: list[int], env_name: str, tool_name: str, timeout_s: float) -> list[dict[str, Any]]:
    """One row per seed; raises OpenEnvError when the server cannot be reached or misbehaves."""
    shared = [await simulation_tool(url, name=tool_name, timeout_s=timeout_s)] if mode == "simulation" else None
    rows = []
    for seed in seeds:
        session = await OpenEnvSession.open(url, timeout_s=timeout_s)
        try:
            first = await session.reset(seed=seed)
            tools = shared or [mcp_tool(tool) for tool in (await session.mcp("tools/list") or {}).get("tools", [])]
        finally:
            await session.close()
        observation = {key: value for key, value in first.observation.items() if value or key != "metadata"}
        prompt = f"{INSTRUCTIONS}\nThe first observation: {json.dumps(observation, default=str)}"
        rows.append({
            "responses_create_params": {"input": [{"role": "user", "content": prompt}], "tools": tools},
            "agent_ref": {"type": "responses_api_agents", "name": env_name},
            "openenv": {"mode": mode, "reset": {"seed": seed}},
        })
    return rows
