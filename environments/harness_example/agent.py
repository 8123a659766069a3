"""An ordinary tool-calling agent over the `openai` package, unaware of gym_bridge.

It reads the task as JSON on stdin (`messages`, `tools`, `model`), talks to the server named by
OPENAI_BASE_URL / OPENAI_API_KEY, runs its own `add` and `multiply` tools, and prints the final
answer. Run by `HarnessExampleEnvironment`; it works the same against any OpenAI-compatible server.
"""

from __future__ import annotations

import json
import os
import sys

import openai

TOOLS = {"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}
MAX_STEPS = 6


def run_tool(name: str, arguments: str) -> str:
    try:
        values = json.loads(arguments)
        return json.dumps({"result": TOOLS[name](values["a"], values["b"])})
    except Exception as error:  # the model sees what went wrong
        return json.dumps({"error": f"{type(error).__name__}: {error}"})


def main() -> None:
    task = json.load(sys.stdin)
    client = openai.OpenAI(max_retries=0)
    messages = list(task["messages"])
    for _ in range(MAX_STEPS):
        reply = client.chat.completions.create(model=os.environ.get("OPENAI_MODEL", task["model"]), messages=messages,
                                               tools=task["tools"], max_tokens=256)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"reasoning_content"}))
        if not message.tool_calls:
            print(message.content or "")
            return
        for call in message.tool_calls:
            if call.type != "function":  # only function tools were offered
                sys.exit(f"the model made a {call.type} tool call; this agent offers function tools only")
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                             "content": run_tool(call.function.name, call.function.arguments)})
    print("no answer within the step limit")


if __name__ == "__main__":
    main()
