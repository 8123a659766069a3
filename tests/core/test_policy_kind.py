"""A policy's kind is told apart in one place (`core.policy.by_policy_kind`, issue 37 item 5): token-in/token-out
(`generate`) first, then chat (`chat`), and a TypeError naming anything else."""

from __future__ import annotations

import pytest

from gym_bridge.core.policy import ScriptedChatPolicy, ScriptedPolicy, by_policy_kind


class Both:
    """Has both methods: a token policy (what can train is preferred)."""

    async def generate(self, request):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    async def chat(self, request):  # type: ignore[no-untyped-def]
        raise NotImplementedError


@pytest.mark.parametrize("policy, kind", [(ScriptedPolicy({"": []}), "token"), (ScriptedChatPolicy({"": []}), "chat"), (Both(), "token")])
def test_each_kind_goes_to_its_own_branch_with_the_policy(policy: object, kind: str) -> None:
    assert by_policy_kind(policy, token=lambda p: ("token", p), chat=lambda p: ("chat", p)) == (kind, policy)


def test_an_object_of_neither_kind_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="dict is not a policy: it has neither generate"):
        by_policy_kind({}, token=lambda p: p, chat=lambda p: p)
