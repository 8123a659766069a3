"""Chat templates rendered as transformers' `apply_chat_template` renders them, without transformers.

The same sandboxed jinja2 environment (extensions, filters, globals), special tokens as template
variables, None-valued message keys dropped and reasoning fields aliased, as transformers 5 does
before rendering. `gym_bridge.policies.tokenizer.LightTokenizer` renders with it (no torch import),
and `ChatTemplate` renders with it where it gives transformers' text for the template (checked when
the template is built), which skips transformers' per-call input conversion.
tests/policies/test_tokenizer.py pins the equality on every template in ../shared/templates.
The bottom layer of templating (then `template_profile`, `template`, `template_check`): it imports
no gym_bridge module.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat(template: str, conversation: Sequence[Mapping[str, Any]], *, tools: Any = None, documents: Any = None,
                add_generation_prompt: bool = False, variables: Mapping[str, Any] | None = None) -> str:
    """`conversation` (dicts) rendered by `template`; `variables`: special tokens and template arguments."""
    rendered: str = compiled_template(template).render(messages=prepared_messages(conversation), tools=tools, documents=documents,
                                                       add_generation_prompt=add_generation_prompt, **(variables or {}))
    return rendered


def prepared_messages(conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a template is given them: None-valued keys dropped and the reasoning under each
    of its field names, as recent transformers releases do before rendering (5.24 does; 5.19, which vLLM's
    CPU build needs, passes None through, so `content: None` reaches the template). gym_bridge prepares
    them itself, for its own renderer and for the tokenizer's, so a prompt does not depend on the
    installed transformers. A message that needs neither is passed as it is (templates render in a sandbox
    that cannot change it)."""
    messages = []
    for message in conversation:
        if not isinstance(message, dict):
            raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
        if any(value is None for value in message.values()):
            message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        messages.append(message)
    return messages


@lru_cache(maxsize=64)
def compiled_template(template: str) -> Any:
    """The template compiled in the environment transformers renders chat templates in."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (assistant-mask markers) renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            body: str = caller()
            return body

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # `self` in args: jinja's own signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}")

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    return environment.from_string(template)
