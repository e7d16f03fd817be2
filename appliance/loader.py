"""From command line to a configured plugin manager: the order every command shares.

1. Resolve the configuration source: ``--config FILE`` or ``$RACKBOOT_CONFIG``
   (each must exist), else the default path if it exists, else the standalone
   development defaults.
2. Read ``plugins.disabled`` and load every other plugin; a name that is no
   installed plugin is refused (a typo would leave the plugin running).
3. Validate the whole document against every declared section, and the
   addresses and ports the sections declare they listen on against each other.
4. Call ``rackboot_configure`` on every plugin.

``run`` and ``config check`` add :func:`preflight`: what the node would refuse
at start-up on this machine, refused before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from appliance.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    disabled_plugins,
    read_document,
    validate,
)
from appliance.errors import ConfigError, UsageError
from appliance.nodesection import NODE
from appliance.schema import Section, Settings, validate_table

if TYPE_CHECKING:  # the plugins are imported by the commands that load them
    from appliance.pluginmanager import RackbootPluginManager

CONFIG_VARIABLE = "RACKBOOT_CONFIG"


@dataclass(frozen=True)
class ConfigSource:
    path: str | None  # None: no file, defaults only
    dev: bool
    named_by: str = ""  # "$RACKBOOT_CONFIG" when the environment chose the file


def resolve_source(config_path: str | None, dev: bool) -> ConfigSource:
    if config_path is not None:
        return ConfigSource(config_path, dev)
    named = os.environ.get(CONFIG_VARIABLE)
    if named:  # an operator's explicit choice: missing is an error, never the dev node
        return ConfigSource(named, dev, named_by=f"${CONFIG_VARIABLE}")
    # lexists: a dangling symlink at the default path is a broken configuration to
    # report, not a fresh machine.
    if os.path.lexists(DEFAULT_CONFIG_PATH):
        return ConfigSource(str(DEFAULT_CONFIG_PATH), dev)
    return ConfigSource(None, True)  # fresh machine: the safe standalone node


def load(
    source: ConfigSource, extra_disabled: Iterable[str] = (), *, keep_broken: bool = False
) -> tuple[Config, RackbootPluginManager]:
    """The validated configuration and its plugin manager.

    A plugin that fails to load stops every command (exit 3) unless
    ``keep_broken``: then it is left out, its section ignored, and described in
    ``pm.broken`` (for the commands that must work to find it: plugins list, status).
    """
    from appliance.pluginmanager import build_plugin_manager, call_each, collect_sections

    origin, document = _read(source)
    from_file = disabled_plugins(origin, document)
    disabled = tuple(dict.fromkeys([*from_file, *extra_disabled]))
    pm = build_plugin_manager(disabled, keep_broken=True)
    _check_disabled_names(pm, origin, from_file, extra_disabled)
    if not keep_broken:
        pm.refuse_broken()
    sections = collect_sections(pm)
    ignored = frozenset([*disabled, *pm.broken])
    config = validate(origin, document, sections, dev=source.dev, ignored_sections=ignored)
    call_each(pm, "rackboot_configure", config=config)
    return config, pm


def node_settings(source: ConfigSource) -> Settings:
    """The [node] section alone, validated, without loading a plugin: what a query
    command needs to find the control socket (the CLI answers at once). The other
    sections are the running node's business; ``config check`` validates them."""
    return section_settings(source, NODE)


def section_settings(source: ConfigSource, section: Section) -> Settings:
    """One core section alone, validated, without loading a plugin (``[node]``,
    ``[firmware]``)."""
    origin, document = _read(source)
    raw = document.get(section.name, {})
    if not isinstance(raw, dict):
        raise ConfigError(origin, section.name, "a table", raw)
    return validate_table(section.fields, raw, origin, section.name, source.dev)


def plugin_manager(disabled: Iterable[str]) -> RackbootPluginManager:
    """The plugins without a configuration (``config example``): names checked, none broken."""
    from appliance.pluginmanager import build_plugin_manager

    pm = build_plugin_manager(disabled, keep_broken=True)
    _check_disabled_names(pm, "", (), disabled)
    pm.refuse_broken()
    return pm


def _read(source: ConfigSource) -> tuple[str, dict]:
    if source.path is None:
        return "<defaults>", {}
    try:
        return read_document(source.path)
    except ConfigError as exc:
        if not source.named_by:
            raise
        where = f"{source.named_by}={source.path}"
        raise ConfigError(where, "", exc.expected, has_found=False) from None


def _check_disabled_names(
    pm: RackbootPluginManager, origin: str, from_file: Iterable[str], from_flags: Iterable[str]
) -> None:
    installed = ", ".join(pm.installed) or "none"
    for name in from_file:
        if name not in pm.installed:
            raise ConfigError(
                origin, "plugins.disabled", f"names of installed plugins ({installed})", name
            )
    for name in from_flags:
        if name not in pm.installed:
            raise UsageError(f"--disable-plugin {name!r}: no such plugin (installed: {installed})")


def preflight(config: Config) -> None:
    """Refuse what ``run`` would refuse on this machine once services start, so that
    ``config check`` says it first: the election and a required cluster need the
    cluster identity in the data directory."""
    from appliance.cluster.files import ClusterFiles

    ha, cluster = config.sections.get("ha"), config.sections.get("cluster")
    if ha is None or cluster is None:
        return
    files = ClusterFiles(config.node.data_dir)
    try:
        enrolled = files.enrolled()
    except PermissionError:  # a normal user checking root's file: this cannot be known
        return
    how = "run `rackboot cluster init` or `rackboot cluster join TOKEN` first"
    if cluster.enabled == "on" and not enrolled:
        raise ConfigError(
            config.source, "cluster.enabled",
            f"'auto' until this node has a cluster identity (none in {files.dir}: {how})", "on",
        )  # fmt: skip
    if ha.backend == "embedded" and (ha.peers or ha.witnesses):
        key = "ha.peers" if ha.peers else "ha.witnesses"
        if cluster.enabled == "off":
            raise ConfigError(
                config.source, key,
                "no peers or witnesses while cluster.enabled = 'off' "
                "(the election is signed with the cluster identity)", has_found=False,
            )  # fmt: skip
        if not enrolled:
            raise ConfigError(
                config.source, key,
                f"peers or witnesses only once this node has a cluster identity "
                f"(the election is signed with it; none in {files.dir}: {how})", has_found=False,
            )  # fmt: skip
