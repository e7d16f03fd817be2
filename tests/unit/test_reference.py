"""The generated references stay true: every hookspec documented, docs/hooks.md and
docs/configuration.md as the code writes them now, the node as the API describes it."""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import pytest

from appliance import api, reference
from appliance.api import hookspec
from appliance.node import Node
from appliance.pluginmanager import build_plugin_manager, collect_sections
from tests.support.plugins import configured

DOCS = Path(__file__).resolve().parents[2] / "docs"
REGENERATE = "regenerate it: .venv/bin/python -m appliance.reference {what} > docs/{file}"


@pytest.fixture(scope="module")
def pm():
    return reference.plugin_manager()


def test_every_hookspec_is_documented(pm):
    assert reference.hookspec_problems(pm) == []


def test_the_check_names_what_a_hookspec_lacks():
    """A hookspec without docs, or with a parameter or a result left out, is named."""
    specs = types.ModuleType("fake_hookspecs")

    def fake_silent(node): ...

    def fake_half(node, peer) -> str | None:
        """Choose something.

        :param node: The node.
        """

    def fake_whole(node) -> int:
        """Count.

        :param node: The node.
        :return: How many.
        """

    for function in (fake_silent, fake_half, fake_whole):
        function.__module__ = specs.__name__
        setattr(specs, function.__name__, hookspec(function))
    manager = build_plugin_manager(entry_points=[])
    manager.add_hookspecs(specs)
    problems = [p for p in reference.hookspec_problems(manager) if p.startswith("fake_")]
    assert problems == [
        "fake_hookspecs.fake_silent: no docstring",
        "fake_hookspecs.fake_half: parameter 'peer' not documented (:param peer:)",
        "fake_hookspecs.fake_half: returns str | None but has no ':return:'",
    ]


def test_the_hook_reference_is_current(pm):
    committed = (DOCS / "hooks.md").read_text()
    assert committed == reference.hooks_markdown(pm), REGENERATE.format(
        what="hooks", file="hooks.md"
    )


def test_the_configuration_reference_is_current(pm):
    committed = (DOCS / "configuration.md").read_text()
    assert committed == reference.config_markdown(collect_sections(pm)), REGENERATE.format(
        what="config", file="configuration.md"
    )


def test_the_configuration_reference_has_every_key(pm):
    """Each key of each section (nested tables too) has its row, and a computed default
    is described, not this machine's value."""
    text = reference.config_markdown(collect_sections(pm))
    for section in collect_sections(pm):
        assert f"## `[{section.name}]`" in text
        for key in section.fields:
            assert f"| `{key}` |" in text or f"[{section.name}.{key}]" in text, key
    assert "computed: The machine's host name" in text
    assert "/home/" not in text and "/root/" not in text


def test_the_node_has_everything_plugin_node_describes(tmp_path):
    config, manager = configured(tmp_path)
    node = Node(config, manager)
    members = reference.members_of(api.PluginNode)
    assert {name for name, _, _ in members} >= {
        "config", "pm", "data_dir", "role", "fence", "state", "metrics", "shutdown_grace",
        "plugin_dir",
    }  # fmt: skip
    for name, signature, doc in members:
        assert doc, f"PluginNode.{name} has no description"
        assert hasattr(node, name), f"Node has no {name!r}, which PluginNode promises"
        if signature:
            wanted = list(inspect.signature(getattr(api.PluginNode, name)).parameters)[1:]
            assert list(inspect.signature(getattr(node, name)).parameters) == wanted, name
