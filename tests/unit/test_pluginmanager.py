"""The plugin manager: entry-point loading, naming broken plugins, hookspecs of plugins."""

from __future__ import annotations

import importlib.metadata
import textwrap

import pytest

from appliance.api import ENTRY_POINT_GROUP, Field, Int, Section, hookimpl, hookspec
from appliance.errors import EXIT_PLUGIN, ConfigError, PluginError
from appliance.pluginmanager import build_plugin_manager, call_each, collect_sections


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """Write plugin modules to an importable directory; returns a writer."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(module: str, source: str) -> importlib.metadata.EntryPoint:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        return importlib.metadata.EntryPoint(module.removeprefix("rbt_"), module, ENTRY_POINT_GROUP)

    yield write
    import sys

    for name in [m for m in sys.modules if m.startswith("rbt_")]:
        del sys.modules[name]


GOOD = """
from appliance.api import hookimpl, Section, Field, Int

@hookimpl
def rackboot_config_schema():
    return Section("good", {"port": Field(Int(min=1), default=1234, doc="A port.")})

@hookimpl
def rackboot_status(node):
    return {"ok": True}
"""


def test_core_only():
    pm = build_plugin_manager(entry_points=[])
    assert list(pm.infos) == ["core"]
    assert pm.infos["core"].hooks == [
        "rackboot_cli_commands",
        "rackboot_config_schema",
        "rackboot_configure",
        "rackboot_control_commands",
        "rackboot_doctor_checks",
        "rackboot_role_changed",
        "rackboot_services",
        "rackboot_status",
    ]
    core = ["node", "plugins", "cluster", "ha", "firmware", "network"]
    assert [s.name for s in collect_sections(pm)] == core


def test_entry_point_plugin_is_loaded_and_described(plugin_dir):
    ep = plugin_dir("rbt_good", GOOD)
    pm = build_plugin_manager(entry_points=[ep])
    info = pm.infos["good"]
    assert info.module == "rbt_good"
    assert info.source == f"entry point {ENTRY_POINT_GROUP}: good = rbt_good"
    assert info.hooks == ["rackboot_config_schema", "rackboot_status"]
    sections = collect_sections(pm)
    assert [(s.name, s.owner) for s in sections] == [
        ("node", "core"),
        ("plugins", "core"),
        ("cluster", "core"),
        ("ha", "core"),
        ("firmware", "core"),
        ("network", "core"),
        ("good", "good"),
    ]


OBJECT_PLUGIN = """
from appliance.api import hookimpl

class ObjectPlugin:
    @hookimpl
    def rackboot_status(self, node):
        return {}

plugin = ObjectPlugin()
"""


def test_module_is_the_module_path_for_object_entry_points(plugin_dir):
    """`plugins list` names the module for 'module:object' entry points too, not the class."""
    plugin_dir("rbt_object", OBJECT_PLUGIN)
    ep = importlib.metadata.EntryPoint("object", "rbt_object:plugin", ENTRY_POINT_GROUP)
    pm = build_plugin_manager(entry_points=[ep])
    assert pm.infos["object"].module == "rbt_object"
    assert pm.infos["core"].module == "appliance.core_plugin"


def test_disabled_plugin_is_not_imported(plugin_dir):
    ep = plugin_dir("rbt_broken", "raise RuntimeError('boom')")
    pm = build_plugin_manager(disabled=["broken"], entry_points=[ep])
    assert "broken" not in pm.infos and pm.disabled == ("broken",)


def test_import_failure_names_entry_point_and_reason(plugin_dir):
    ep = plugin_dir("rbt_broken", "raise RuntimeError('boom at import')")
    with pytest.raises(PluginError) as info:
        build_plugin_manager(entry_points=[ep])
    assert info.value.exit_code == EXIT_PLUGIN
    assert str(info.value).startswith(
        "plugin 'broken' failed to import: entry point 'broken' (rbt_broken)"
    )
    assert str(info.value).endswith("RuntimeError: boom at import")


def test_unknown_hook_is_refused(plugin_dir):
    ep = plugin_dir(
        "rbt_typo",
        """
        from appliance.api import hookimpl

        @hookimpl
        def rackboot_servics(node):
            return []
        """,
    )
    with pytest.raises(
        PluginError, match="plugin 'typo' implements an unknown hook.*rackboot_servics"
    ):
        build_plugin_manager(entry_points=[ep])


def test_wrong_hook_arguments_are_refused(plugin_dir):
    ep = plugin_dir(
        "rbt_args",
        """
        from appliance.api import hookimpl

        @hookimpl
        def rackboot_status(node, extra):
            return {}
        """,
    )
    with pytest.raises(PluginError, match="plugin 'args' is invalid"):
        build_plugin_manager(entry_points=[ep])


def test_duplicate_names_clash(plugin_dir):
    ep = plugin_dir("rbt_good", GOOD)
    with pytest.raises(PluginError, match="clashes with"):
        build_plugin_manager(entry_points=[ep, ep])
    core = importlib.metadata.EntryPoint("core", "rbt_good", ENTRY_POINT_GROUP)
    with pytest.raises(PluginError, match="clashes with the core"):
        build_plugin_manager(entry_points=[core])


def test_two_plugins_declaring_one_section(plugin_dir):
    a = plugin_dir("rbt_good", GOOD)
    b = plugin_dir("rbt_again", GOOD)
    pm = build_plugin_manager(entry_points=[a, b])
    with pytest.raises(PluginError, match=r"both declare section \[good\]"):
        collect_sections(pm)


def test_plugin_hookspecs_added_through_addhooks(plugin_dir):
    """A protocol plugin adds its own hookspec; another plugin implements it.

    The implementer loads *before* the spec owner (sorted by name), which
    works because rackboot_addhooks is historic and check_pending runs last.
    """
    owner = plugin_dir(
        "rbt_owner",
        """
        from appliance.api import hookimpl, hookspec

        class Specs:
            @hookspec(firstresult=True)
            def owner_pick(self, choices):
                "Pick one of ``choices``."

        @hookimpl
        def rackboot_addhooks(pluginmanager):
            pluginmanager.add_hookspecs(Specs)
        """,
    )
    extender = plugin_dir(
        "rbt_extender",
        """
        from appliance.api import hookimpl

        @hookimpl
        def owner_pick(choices):
            return max(choices)
        """,
    )
    pm = build_plugin_manager(entry_points=[owner, extender])
    assert pm.hook.owner_pick(choices=[1, 3, 2]) == 3
    assert pm.infos["extender"].hooks == ["owner_pick"]


def test_raising_hook_is_named():
    class Bad:
        @hookimpl
        def rackboot_config_schema(self):
            raise KeyError("oops")

    pm = build_plugin_manager(entry_points=[])
    pm.register(Bad(), name="bad")
    with pytest.raises(
        PluginError, match="plugin 'bad' failed in rackboot_config_schema: KeyError: 'oops'"
    ):
        collect_sections(pm)


def test_config_errors_pass_through_unchanged():
    class Strict:
        @hookimpl
        def rackboot_configure(self, config):
            raise ConfigError("f", "strict.port", "a port above 1024", 80)

    pm = build_plugin_manager(entry_points=[])
    pm.register(Strict(), name="strict")
    with pytest.raises(
        ConfigError, match="f: strict.port: expected a port above 1024, found int 80"
    ):
        call_each(pm, "rackboot_configure", config=None)


def test_schema_returning_garbage_is_named():
    class Garbage:
        @hookimpl
        def rackboot_config_schema(self):
            return ["not a section"]

    pm = build_plugin_manager(entry_points=[])
    pm.register(Garbage(), name="garbage")
    with pytest.raises(PluginError, match="plugin 'garbage': rackboot_config_schema returned str"):
        collect_sections(pm)


def test_hookspec_marker_is_the_projects():
    # Plugin authors import both markers from appliance.api.
    assert hookspec.project_name == hookimpl.project_name == "rackboot"
    assert Section("x", {"a": Field(Int(), default=1)}).fields["a"].default == 1


def test_keep_broken_leaves_broken_plugins_out_and_names_them(plugin_dir):
    """`plugins list` and `status` must work with a broken plugin installed: it is kept
    aside with its error, the others load, and refuse_broken() raises it for `run`."""
    broken = plugin_dir("rbt_broken", "raise RuntimeError('boom at import')")
    typo = plugin_dir(
        "rbt_typo",
        """
        from appliance.api import hookimpl

        @hookimpl
        def rackboot_servics(node):
            return []
        """,
    )
    good = plugin_dir("rbt_good", GOOD)
    pm = build_plugin_manager(entry_points=[broken, typo, good], keep_broken=True)
    assert list(pm.infos) == ["core", "good"]
    assert pm.installed == ("broken", "good", "typo")
    assert sorted(pm.broken) == ["broken", "typo"]
    assert pm.broken["broken"].error.endswith("RuntimeError: boom at import")
    assert "implements an unknown hook" in pm.broken["typo"].error
    assert pm.get_plugin("typo") is None  # not half-registered
    assert [s.name for s in collect_sections(pm)][-1] == "good"
    with pytest.raises(PluginError) as info:
        pm.refuse_broken()
    assert str(info.value) == (
        f"{pm.broken['broken'].error} (disable it with --disable-plugin broken "
        "or [plugins] disabled = ['broken'])"
    )


def test_a_plugin_whose_addhooks_raises_is_not_left_registered(plugin_dir):
    ep = plugin_dir(
        "rbt_addhooks",
        """
        from appliance.api import hookimpl

        @hookimpl
        def rackboot_addhooks(pluginmanager):
            raise ValueError("no specs today")

        @hookimpl
        def rackboot_status(node):
            return {"should": "not answer"}
        """,
    )
    pm = build_plugin_manager(entry_points=[ep], keep_broken=True)
    assert "failed to register" in pm.broken["addhooks"].error
    assert pm.get_plugin("addhooks") is None
    implementers = [pm.get_name(i.plugin) for i in pm.hook.rackboot_status.get_hookimpls()]
    assert implementers == ["core"]
