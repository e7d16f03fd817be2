"""Build a configured plugin manager from plugin objects defined in a test.

Production code loads plugins from entry points; tests register objects
directly, through the same manager and validation path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from appliance.config import Config, validate
from appliance.pluginmanager import (
    RackbootPluginManager,
    build_plugin_manager,
    call_each,
    collect_sections,
)


def configured(
    tmp_path: Path, document: dict[str, Any] | None = None, **plugins: Any
) -> tuple[Config, RackbootPluginManager]:
    """A plugin manager with the core plus ``plugins`` (name=object), and a config whose
    data directory (and control socket) live under ``tmp_path``."""
    pm = build_plugin_manager(entry_points=[])
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    document = dict(document or {})
    node = dict(document.get("node", {}))
    node.setdefault("data_dir", str(tmp_path / "data"))
    node.setdefault("name", "test-node")
    document["node"] = node
    config = validate("<test>", document, collect_sections(pm), dev=True)
    call_each(pm, "rackboot_configure", config=config)
    return config, pm
