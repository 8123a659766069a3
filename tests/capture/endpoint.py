"""The capture endpoint on loopback in front of a scripted token policy, with the real `openai` client."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import openai

from gym_bridge.capture.server import capture_server
from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.template.chat_template import ChatTemplate

Check = Callable[[CaptureSession, openai.AsyncOpenAI, str], Awaitable[None]]


def serve(template: ChatTemplate, script: dict[str, Any], check: Check) -> None:
    """Open a session answering with `script`, then run `check(session, client, base_url)` against it."""

    async def main() -> None:
        session = CaptureSession(policy=ScriptedPolicy(script), template=template,
                                 ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=64),
                                 limits=Limits(), model_name="policy", label="t"))
        async with capture_server().session(session) as base_url:
            async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
                await check(session, client, base_url)

    asyncio.run(main())
