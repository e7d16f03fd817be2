"""Building the plugin manager: core hookspecs, entry-point plugins, one clear error each."""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from appliance import core_plugin, hookspecs
from appliance.api import ENTRY_POINT_GROUP, PROJECT, Section
from appliance.errors import ConfigError, PluginError


@dataclass
class PluginInfo:
    """Where a loaded plugin came from, for ``rackboot plugins list``."""

    name: str
    module: str
    distribution: str
    version: str
    source: str  # "core" or "entry point <group>: name = value"
    hooks: list[str] = field(default_factory=list)
    error: str = ""  # why it could not be loaded (then it is in ``broken``, not loaded)


class RackbootPluginManager(pluggy.PluginManager):
    def __init__(self) -> None:
        super().__init__(PROJECT)
        self.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.disabled: tuple[str, ...] = ()
        self.installed: tuple[str, ...] = ()  # every entry point's name, disabled ones too
        # Plugins that failed to import or register, kept (with keep_broken) so that
        # `plugins list` and `status` can still name them; `run` refuses them.
        self.broken: dict[str, PluginInfo] = {}

    def refuse_broken(self) -> None:
        """Raise the first broken plugin's error, with how to go on without it."""
        for name, info in self.broken.items():
            raise PluginError(
                f"{info.error} (disable it with --disable-plugin {name} "
                f"or [plugins] disabled = [{name!r}])"
            )


def build_plugin_manager(
    disabled: Iterable[str] = (),
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    *,
    keep_broken: bool = False,
) -> RackbootPluginManager:
    """Load the core plugin and every ``rackboot.plugins`` entry point not disabled.

    A plugin that fails to import or to register raises :class:`PluginError`
    naming the entry point and the reason; nothing is half-loaded. With
    ``keep_broken`` it is left out and described in ``pm.broken`` instead.
    """
    pm = RackbootPluginManager()
    pm.disabled = tuple(disabled)
    pm.hook.rackboot_addhooks.call_historic(kwargs={"pluginmanager": pm})
    _register(
        pm,
        core_plugin,
        "core",
        PluginInfo("core", core_plugin.__name__, "rackboot", _own_version(), "core"),
    )

    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    entry_points = sorted(entry_points, key=lambda e: e.name)
    pm.installed = tuple(dict.fromkeys(ep.name for ep in entry_points))
    seen: dict[str, str] = {}
    for ep in entry_points:
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else "?"
        where = f"entry point {ep.name!r} ({ep.value}) from distribution {dist_name!r}"
        if ep.name in pm.disabled:
            continue
        if ep.name in seen or ep.name == "core":
            raise PluginError(
                f"plugin {ep.name!r}: {where} clashes with {seen.get(ep.name, 'the core')}"
            )
        seen[ep.name] = where
        info = PluginInfo(
            name=ep.name,
            module=ep.module,  # the module path alone, also for 'module:object' entry points
            distribution=dist_name,
            version=dist.version if dist is not None else "?",
            source=f"entry point {ENTRY_POINT_GROUP}: {ep.name} = {ep.value}",
        )
        try:
            _load_entry_point(pm, ep, info, where)
        except PluginError as exc:
            if not keep_broken:
                raise
            info.error = str(exc)
            pm.broken[ep.name] = info
    _check_pending(pm, keep_broken)
    for name, info in pm.infos.items():
        plugin = pm.get_plugin(name)
        info.hooks = sorted(impl_name for impl_name in _hook_names(pm, plugin))
    return pm


def _load_entry_point(
    pm: RackbootPluginManager, ep: importlib.metadata.EntryPoint, info: PluginInfo, where: str
) -> None:
    try:
        plugin = ep.load()
    except Exception as exc:  # a broken plugin is named, not a traceback
        raise PluginError(f"plugin {ep.name!r} failed to import: {where}: {_reason(exc)}") from exc
    _register(pm, plugin, ep.name, info, where)


def _check_pending(pm: RackbootPluginManager, keep_broken: bool) -> None:
    """Refuse a hookimpl of an unknown hook, once every plugin has added its hookspecs
    (a plugin may implement the hooks of one loaded after it)."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin) or "?"
            error = PluginError(f"plugin {name!r} implements an unknown hook: {exc}")
            if not keep_broken or name not in pm.infos or name == "core":
                raise error from exc
            pm.unregister(exc.plugin)
            pm.broken[name] = pm.infos.pop(name)
            pm.broken[name].error = str(error)


def _register(
    pm: RackbootPluginManager, plugin: Any, name: str, info: PluginInfo, where: str = ""
) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r} is invalid ({where or info.source}): {exc}") from exc
    except Exception as exc:  # a plugin's own addhooks may raise
        if pm.get_plugin(name) is not None:
            pm.unregister(name=name)  # registered before its addhooks raised
        raise PluginError(
            f"plugin {name!r} failed to register ({where or info.source}): {_reason(exc)}"
        ) from exc
    pm.infos[name] = info


def _hook_names(pm: pluggy.PluginManager, plugin: Any) -> Iterable[str]:
    for caller in pm.get_hookcallers(plugin) or ():
        yield caller.name


def collect_sections(pm: RackbootPluginManager) -> list[Section]:
    """Every plugin's declared section, core first; duplicate names are an error."""
    sections: list[Section] = []
    owners: dict[str, str] = {}
    for impl in reversed(pm.hook.rackboot_config_schema.get_hookimpls()):
        plugin_name = pm.get_name(impl.plugin) or "?"
        declared = call_plugin(plugin_name, "rackboot_config_schema", impl.function)
        if declared is None:
            continue
        for section in [declared] if isinstance(declared, Section) else declared:
            if not isinstance(section, Section):
                raise PluginError(
                    f"plugin {plugin_name!r}: rackboot_config_schema returned "
                    f"{type(section).__name__}, expected a Section"
                )
            if section.name in owners:
                raise PluginError(
                    f"plugins {owners[section.name]!r} and {plugin_name!r} "
                    f"both declare section [{section.name}]"
                )
            owners[section.name] = plugin_name
            sections.append(dataclasses.replace(section, owner=plugin_name))
    sections.sort(key=lambda s: (s.owner != "core", s.owner))
    return sections


def call_plugin(plugin_name: str, hook: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call one hookimpl, turning an exception into a PluginError that names it."""
    try:
        return fn(*args, **kwargs)
    except (PluginError, ConfigError):
        raise
    except Exception as exc:
        raise PluginError(f"plugin {plugin_name!r} failed in {hook}: {_reason(exc)}") from exc


def call_each(
    pm: pluggy.PluginManager,
    hook: str,
    *,
    on_error: Callable[[PluginError], Any] | None = None,
    **kwargs: Any,
) -> list[tuple[str, Any]]:
    """Call every implementation of ``hook``, naming the plugin if one raises.

    Returns ``(plugin_name, result)`` pairs in pluggy's call order (registration
    order, adjusted by ``tryfirst``/``trylast``). A raising implementation
    raises its PluginError, or with ``on_error`` contributes ``on_error(err)``
    and the others still run.
    """
    results = []
    for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):
        name = pm.get_name(impl.plugin) or "?"
        args = {k: kwargs[k] for k in impl.argnames}
        try:
            result = call_plugin(name, hook, impl.function, **args)
        except PluginError as exc:
            if on_error is None:
                raise
            result = on_error(exc)
        results.append((name, result))
    return results


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _own_version() -> str:
    from appliance import __version__

    return __version__
