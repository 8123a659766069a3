"""Templating is layers, each importing only the ones below it: render, profile, the three parts the template is made of
(codec: text and ids; messages: turns read back; delta: environment deltas), the template, check.

Read from the source with `ast`, so a cycle hidden behind `TYPE_CHECKING` or in a function-level
import fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gym_bridge.core.template

LAYERS = ("render", "profile", "codec", "messages", "delta", "chat_template", "check")
"""Bottom first."""
CORE = Path(gym_bridge.core.template.__file__).parent


def _imports(tree: ast.Module) -> list[tuple[ast.stmt, str]]:
    """(statement, module) for every import anywhere in the module; `from a import b` also counts as `a.b`."""
    found: list[tuple[ast.stmt, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node, node.module))
            found += [(node, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _layers_imported(tree: ast.Module) -> set[str]:
    return {module.removeprefix("gym_bridge.core.template.") for _, module in _imports(tree)} & set(LAYERS)


def _hidden_imports(tree: ast.Module) -> list[str]:
    """gym_bridge modules imported anywhere but at the top level (in a function, under `if TYPE_CHECKING`)."""
    top_level = {id(node) for node in tree.body}
    return [module for node, module in _imports(tree) if id(node) not in top_level and module.startswith("gym_bridge")]


def _tree(name: str) -> ast.Module:
    return ast.parse((CORE / f"{name}.py").read_text())


def test_each_layer_imports_only_the_layers_below_it():
    for position, name in enumerate(LAYERS):
        assert _layers_imported(_tree(name)) <= set(LAYERS[:position]), f"{name} imports a layer above it"


def test_the_order_is_the_real_dependency_order():
    assert _layers_imported(_tree("chat_template")) == {"render", "profile", "codec", "messages", "delta"}
    assert _layers_imported(_tree("delta")) == {"profile"}
    assert _layers_imported(_tree("check")) >= {"profile", "chat_template"}


def test_no_layer_hides_an_import_in_a_function_or_behind_type_checking():
    for name in LAYERS:
        tree = _tree(name)
        assert _hidden_imports(tree) == [], name
        assert "TYPE_CHECKING" not in {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}, name


def test_the_checks_see_what_the_layering_removed():
    # what template.py did before: a lazy import of the check, and the check's type behind TYPE_CHECKING
    before = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gym_bridge.core.template.check import TemplateReport\n"
        "def report(self):\n    from gym_bridge.core.template.check import check_template\n"
    )
    assert _layers_imported(before) == {"check"}
    assert sorted(set(_hidden_imports(before))) == [
        "gym_bridge.core.template.check", "gym_bridge.core.template.check.TemplateReport",
        "gym_bridge.core.template.check.check_template",
    ]


def test_the_template_s_parts_live_in_their_own_modules():
    """Issue 29: chat_template.py held four concepts; `Tokenizer` and `ToolOutput` moved with theirs (issue 37: users
    import them from there, pinned by tests/test_imports_lint.py), and a template's deltas and tool messages are those
    of the moved functions."""
    from gym_bridge.core.template import chat_template, codec, delta, messages

    assert codec.Tokenizer.__module__ == "gym_bridge.core.template.codec" and messages.ToolOutput.__module__ == "gym_bridge.core.template.messages"
    assert chat_template.ChatTemplate.__module__ == "gym_bridge.core.template.chat_template"
    assert {"DeltaPlanner", "DeltaPlan"} <= set(vars(delta)) and "_DeltaPlan" not in vars(chat_template)
    assert [name for name in ("_plan", "_render_delta", "_transform", "_previous_turn") if hasattr(chat_template.ChatTemplate, name)] == []
