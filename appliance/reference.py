"""The generated references: hooks from the hookspec docstrings, configuration from the schemas.

    python -m appliance.reference hooks > docs/hooks.md
    python -m appliance.reference config > docs/configuration.md

Both are written from what is loaded, so they cannot say what the code does not:
by default Rackboot's own plugins only (the committed references, checked by
tests/unit/test_reference.py); ``--installed`` adds every installed plugin (a site's
own reference, third-party plugins included).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from appliance import api
from appliance.pluginmanager import RackbootPluginManager, build_plugin_manager, collect_sections
from appliance.schema import REQUIRED, Field, Section, Table, TableList

OWN_DISTRIBUTION = "rackboot"
HOOKS_HEADER = """\
# Hook reference

Generated from the hookspec docstrings by `python -m appliance.reference hooks`
(do not edit: change the docstrings, then run it again; a test fails while this file
is stale). How to write a plugin: [plugin-authoring.md](plugin-authoring.md); the
rules: [plugins.md](plugins.md).
"""
CONFIG_HEADER = """\
# Configuration reference

Generated from every plugin's schema by `python -m appliance.reference config`
(do not edit: change the `Field` declarations, then run it again; a test fails while
this file is stale). `rackboot config example` prints the same keys as a commented
TOML file, `rackboot config check FILE` validates one; a site's own reference, with
its third-party plugins: `python -m appliance.reference config --installed`.

*Default* is what a configuration file gets; *development* is what the no-config
standalone node (`rackboot run` without a file, or `--dev`) gets instead, where it
differs.
"""


def plugin_manager(installed: bool = False) -> RackbootPluginManager:
    """The core and Rackboot's own plugins (every installed plugin with ``installed``)."""
    found = importlib.metadata.entry_points(group=api.ENTRY_POINT_GROUP)
    return build_plugin_manager(
        entry_points=[ep for ep in found if installed or _distribution(ep) == OWN_DISTRIBUTION]
    )


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else ""


# -- hooks ------------------------------------------------------------------------


def hookspec_modules(pm: RackbootPluginManager) -> dict[ModuleType, list[Callable[..., Any]]]:
    """Each module that declares hookspecs, core first, with its hook functions in
    source order."""
    found: dict[ModuleType, list[Callable[..., Any]]] = {}
    for name in dir(pm.hook):
        caller = getattr(pm.hook, name)
        spec = getattr(caller, "spec", None)
        if spec is not None and isinstance(spec.namespace, ModuleType):
            found.setdefault(spec.namespace, []).append(spec.function)
    ordered = sorted(found, key=lambda m: (m.__name__ != "appliance.hookspecs", m.__name__))
    return {
        module: sorted(found[module], key=lambda f: f.__code__.co_firstlineno) for module in ordered
    }


def hookspec_problems(pm: RackbootPluginManager) -> list[str]:
    """What a hookspec's docstring lacks: the docstring itself, a ``:param NAME:`` for
    each parameter, a ``:return:`` when the hook returns something."""
    problems = []
    for module, functions in hookspec_modules(pm).items():
        for function in functions:
            where = f"{module.__name__}.{function.__name__}"
            doc = inspect.getdoc(function) or ""
            if not doc.strip():
                problems.append(f"{where}: no docstring")
                continue
            for param in inspect.signature(function).parameters:
                if not re.search(rf":param {param}:", doc):
                    problems.append(
                        f"{where}: parameter {param!r} not documented (:param {param}:)"
                    )
            returns = function.__annotations__.get("return", "None")
            if returns not in ("None", None) and ":return:" not in doc:
                problems.append(f"{where}: returns {returns} but has no ':return:'")
    return problems


def hooks_markdown(pm: RackbootPluginManager) -> str:
    owners = _hookspec_owners(pm)
    out = [HOOKS_HEADER]
    for module, functions in hookspec_modules(pm).items():
        owner = owners.get(module.__name__, "")
        title = "Core hooks" if module.__name__ == "appliance.hookspecs" else (
            f"Hooks of the `{owner}` plugin" if owner else "Hooks")  # fmt: skip
        out.append(f"## {title} (`{module.__name__}`)\n")
        out.append(rest_to_markdown(inspect.getdoc(module) or "") + "\n")
        groups = _banner_groups(module)
        current = None
        for function in functions:
            group = groups.get(function.__name__)
            if group and group != current:
                out.append(f"### {group}\n")
                current = group
            out.append(_hook_markdown(pm, function))
    out.append(api_markdown())
    return "\n".join(out).rstrip() + "\n"


def _hookspec_owners(pm: RackbootPluginManager) -> dict[str, str]:
    """Hookspec module -> the plugin whose package declares it (``plugins.dhcp.hookspecs``
    -> ``dhcp``)."""
    owners = {}
    for name, info in pm.infos.items():
        package = info.module.rpartition(".")[0] or info.module
        owners[f"{package}.hookspecs"] = name
    return owners


def _banner_groups(module: ModuleType) -> dict[str, str]:
    """Function name -> the title of the ``# ----`` banner above it in the source."""
    try:
        lines = inspect.getsource(module).splitlines()
    except (OSError, TypeError):
        return {}
    groups, title = {}, ""
    for n, line in enumerate(lines):
        rule = line.startswith("# ---")
        if rule and n + 2 < len(lines) and lines[n + 2].startswith("# ---"):
            title = lines[n + 1].removeprefix("#").strip()
        match = re.match(r"def (\w+)\(", line)
        if match and title:
            groups[match[1]] = title
    return groups


def _hook_markdown(pm: RackbootPluginManager, function: Callable[..., Any]) -> str:
    name = function.__name__
    opts = getattr(pm.hook, name).spec.opts
    kinds = [k for k in ("firstresult", "historic") if opts.get(k)]
    lines = [f"#### `{name}`" + (f" ({', '.join(kinds)})" if kinds else "") + "\n"]
    lines.append(f"```python\ndef {name}{signature_text(function)}\n```\n")
    lines.append(rest_to_markdown(inspect.getdoc(function) or "") + "\n")
    return "\n".join(lines)


def signature_text(function: Callable[..., Any]) -> str:
    """``(a: int, b: str = 'x') -> None`` from the annotations as written (they are
    strings: ``from __future__ import annotations``), ``self`` left out."""
    params = []
    for p in inspect.signature(function).parameters.values():
        if p.name == "self":
            continue
        text = p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {p.annotation}"
        if p.default is not inspect.Parameter.empty:
            text += f" = {p.default!r}"
        params.append(text)
    return f"({', '.join(params)}) -> {function.__annotations__.get('return', 'None')}"


_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc):`(~?)([^`]+)`")


def rest_to_markdown(text: str) -> str:
    """The docstrings' reST, as far as they use it: literals, cross-references,
    ``:param x:`` and ``:return:`` fields as a list."""
    text = _ROLE.sub(lambda m: f"`{m[2].rpartition('.')[2] if m[1] else m[2]}`", text)
    text = text.replace("``", "`")
    text = re.sub(r"^:param (\w+):", r"* `\1`:", text, flags=re.M)
    text = re.sub(r"^:returns?:", "* returns:", text, flags=re.M)
    return text


# -- the plugin API: the node, Service, CliCommand, Role -----------------------------


def api_markdown() -> str:
    out = [
        "## The plugin API (`appliance.api`)\n",
        rest_to_markdown(inspect.getdoc(api) or "") + "\n",
        "### The node (`PluginNode`)\n",
        rest_to_markdown(inspect.getdoc(api.PluginNode) or "") + "\n",
        "| attribute or method | what it is |",
        "|---|---|",
    ]
    for name, signature, doc in members_of(api.PluginNode):
        flat = " ".join(rest_to_markdown(doc).split()).replace("|", "\\|")
        out.append(f"| `{name}{signature}` | {flat} |")
    out.append("")
    for cls in (api.Service, api.CliCommand, api.Role):
        out.append(f"### `{cls.__name__}`\n")
        out.append(rest_to_markdown(inspect.getdoc(cls) or "") + "\n")
        fields = getattr(cls, "__dataclass_fields__", {})
        if fields:
            out.append("```python")
            out.extend(
                f"{name}: {spec.type}" + _field_default(spec) for name, spec in fields.items()
            )
            out.append("```\n")
    out.append("### Also exported\n")
    others = sorted(set(api.__all__) - {"PluginNode", "Service", "CliCommand", "Role"})
    out.append(", ".join(f"`{name}`" for name in others) + "\n")
    return "\n".join(out)


def _field_default(spec: Any) -> str:
    from dataclasses import MISSING

    return "" if spec.default is MISSING else f" = {spec.default!r}"


def members_of(cls: type) -> list[tuple[str, str, str]]:
    """``(name, signature, doc)`` of a Protocol's annotated attributes (the docstring
    string right below each, as Sphinx reads them) and methods, in source order."""
    tree = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(tree, ast.ClassDef)
    members = []
    body = tree.body
    for n, item in enumerate(body):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            after = body[n + 1] if n + 1 < len(body) else None
            doc = ""
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                doc = inspect.cleandoc(str(after.value.value))
            members.append((item.target.id, "", doc))
        elif isinstance(item, ast.FunctionDef):
            signature = signature_text(getattr(cls, item.name))
            members.append((item.name, signature, inspect.getdoc(getattr(cls, item.name)) or ""))
    return members


# -- configuration ----------------------------------------------------------------


def config_markdown(sections: Iterable[Section]) -> str:
    out = [CONFIG_HEADER]
    for section in sections:
        owner = "the core" if section.owner == "core" else f"plugin `{section.owner}`"
        out.append(f"## `[{section.name}]`\n")
        out.append(f"Declared by {owner}. {section.doc}\n".rstrip() + "\n")
        out.extend(_table_markdown(section.name, section.fields, array=False))
    return "\n".join(out).rstrip() + "\n"


def _table_markdown(header: str, fields: Mapping[str, Field], *, array: bool) -> list[str]:
    rows = ["| key | expects | default | development | meaning |", "|---|---|---|---|---|"]
    nested: list[tuple[str, Field]] = []
    for name, spec in fields.items():
        if isinstance(spec.kind, Table | TableList):
            nested.append((name, spec))
            continue
        default = _value_text(spec, spec.default)
        dev = _value_text(spec, spec.dev_default) if spec.dev_default is not REQUIRED else ""
        cells = [f"`{name}`", spec.kind.expected, default, "" if dev == default else dev,
                 " ".join(spec.doc.split())]  # fmt: skip
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    out = []
    if len(rows) > 2:
        out.extend([*rows, ""])
    for name, spec in nested:
        array = isinstance(spec.kind, TableList)
        path = f"{header}.{name}"
        out.append(f"### `{'[[' if array else '['}{path}{']]' if array else ']'}`\n")
        if spec.doc:
            out.append(" ".join(spec.doc.split()) + "\n")
        out.extend(_table_markdown(path, spec.kind.fields, array=array))  # type: ignore[attr-defined]
    return out


def _value_text(spec: Field, value: Any) -> str:
    if value is REQUIRED:
        return "required"
    if callable(value):  # computed where the node starts: say how, not this machine's answer
        doc = inspect.getdoc(value)
        return f"computed: {doc.splitlines()[0]}" if doc else f"computed ({value.__name__})"
    if value is None:
        return "none"
    if isinstance(spec.kind, Table | TableList):
        return ""
    try:
        return f"`{spec.kind.to_toml(value)}`"
    except (TypeError, ValueError, AttributeError):
        return f"`{value!r}`"


# -- command line -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m appliance.reference", description=__doc__)
    parser.add_argument("what", choices=("hooks", "config"))
    parser.add_argument(
        "--installed", action="store_true", help="every installed plugin, not only Rackboot's"
    )
    args = parser.parse_args(argv)
    pm = plugin_manager(args.installed)
    if args.what == "hooks":
        problems = hookspec_problems(pm)
        if problems:
            print("\n".join(f"reference: {p}" for p in problems), file=sys.stderr)
            return 1
        sys.stdout.write(hooks_markdown(pm))
    else:
        sys.stdout.write(config_markdown(collect_sections(pm)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
