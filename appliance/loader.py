"""From command line to a configured plugin manager: the order every command shares.

1. Resolve the configuration source: ``--config FILE`` (must exist), else
   the default path if it exists, else the standalone development defaults.
2. Read ``plugins.disabled`` and load every other plugin.
3. Validate the whole document against every declared section.
4. Call ``rackboot_configure`` on every plugin.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from appliance.config import DEFAULT_CONFIG_PATH, Config, disabled_plugins, read_document, validate
from appliance.pluginmanager import (
    RackbootPluginManager,
    build_plugin_manager,
    call_each,
    collect_sections,
)


@dataclass(frozen=True)
class ConfigSource:
    path: str | None  # None: no file, defaults only
    dev: bool


def resolve_source(config_path: str | None, dev: bool) -> ConfigSource:
    if config_path is not None:
        return ConfigSource(config_path, dev)
    default = os.environ.get("RACKBOOT_CONFIG") or str(DEFAULT_CONFIG_PATH)
    if os.path.exists(default):
        return ConfigSource(default, dev)
    return ConfigSource(None, True)  # fresh machine: the safe standalone node


def load(
    source: ConfigSource, extra_disabled: Iterable[str] = ()
) -> tuple[Config, RackbootPluginManager]:
    if source.path is None:
        origin, document = "<defaults>", {}
    else:
        origin, document = read_document(source.path)
    disabled = tuple(dict.fromkeys([*disabled_plugins(origin, document), *extra_disabled]))
    pm = build_plugin_manager(disabled)
    sections = collect_sections(pm)
    config = validate(
        origin, document, sections, dev=source.dev, ignored_sections=frozenset(disabled)
    )
    call_each(pm, "rackboot_configure", config=config)
    return config, pm
