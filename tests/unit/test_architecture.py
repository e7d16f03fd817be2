"""Architecture rules that code review alone would let slip.

Sans-IO modules (protocol cores) take bytes and an explicit ``now``: they
must not reach the clock, the network, the event loop or the plugin manager,
directly or through another project module they import. That is what keeps
them testable with explicit time and the whole cluster simulable.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Every protocol core is listed here when it is written; a listed module that
# does not exist fails the test, so the list cannot rot silently.
SANS_IO = [
    "appliance.schema",
    "appliance.jsontext",
    "appliance.frames",
    "appliance.state.records",
    "appliance.state.tables",
    "appliance.state.signing",
    "appliance.state.replication",
    "appliance.state.commit",
    "appliance.errors",
    "appliance.compat",
    "appliance.rolling.plan",
    "appliance.confine",  # the filesystem only: no network, no clock
    "appliance.doctor.findings",
    "appliance.doctor.sockets",
    "appliance.doctor.nodechecks",
    "appliance.doctor.timechecks",
    "appliance.doctor.rackchecks",
    "appliance.doctor.report",
    "appliance.lab.census",
    "appliance.lab.view",
    "plugins.dhcp.options",
    "plugins.dhcp.codec",
    "plugins.dhcp.leases",
    "plugins.dhcp.model",
    "plugins.dhcp.boot",
    "plugins.dhcp.server",
    "plugins.dhcp.probe",
    "plugins.tftp.packets",
    "plugins.tftp.negotiate",
    "plugins.tftp.transfer",
    "plugins.tftp.admission",
    "plugins.tftp.confine",  # the filesystem only: no network, no clock
    "plugins.httpboot.identity",
    "plugins.httpboot.admission",
    "plugins.httpboot.urlpath",
    "plugins.httpboot.ranges",
    "plugins.httpboot.conditional",
    "plugins.httpboot.messages",
    "plugins.httpboot.router",
    "plugins.httpboot.files",
    "plugins.httpboot.head",
    "plugins.httpboot.responsehead",
    "plugins.httpboot.script",
    "plugins.httpboot.events",
    "plugins.images.manifest",
    "plugins.images.render",
    "plugins.images.plan",
    "plugins.images.patch",
    "plugins.images.doctor",
    "plugins.relay.agent",
    "plugins.relay.frames",
    "plugins.provisioning.lifecycle",
    "plugins.ra.ndp",
    "plugins.power.address",
    "plugins.power.redfish_core",
    "plugins.power.qmp",
    "appliance.cluster.pki",
    "appliance.cluster.jointoken",
    "appliance.cluster.wire",
    "appliance.cluster.session",
    "appliance.cluster.peers",
    "appliance.cluster.schema",
    "appliance.ha.schema",
    "appliance.ha.membership",
    "appliance.ha.messages",
    "appliance.ha.acceptor",
    "appliance.ha.proposer",
    "appliance.ha.election",
    "appliance.ha.fence",
    "appliance.ha.envelope",
    "appliance.ha.etcd_lease",
    "appliance.firmware.bundle",
    "appliance.firmware.slots",
    "appliance.setup.networkd",
]

FORBIDDEN = {
    "trio": "the event loop belongs to the shell",
    "asyncio": "the event loop belongs to the shell",
    "socket": "the network belongs to the shell",
    "select": "the network belongs to the shell",
    "selectors": "the network belongs to the shell",
    "time": "time is passed in as `now`",
    "threading": "concurrency belongs to the shell",
    "pluggy": "hooks are called by the shell",
    "appliance.pluginmanager": "hooks are called by the shell",
}

PROJECT_PACKAGES = ("appliance", "plugins")


def module_path(name: str, root: Path = ROOT) -> Path:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"module {name} listed as sans-IO does not exist")


def imports_of(name: str, root: Path = ROOT) -> set[str]:
    path = module_path(name, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            if base.startswith(PROJECT_PACKAGES):  # `from plugins.dhcp import codec` names a module
                found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def is_project_module(name: str, root: Path) -> bool:
    if not name.startswith(PROJECT_PACKAGES):
        return False
    try:
        module_path(name, root)
    except FileNotFoundError:
        return False
    return True


def forbidden_reason(imported: str) -> str | None:
    for banned, reason in FORBIDDEN.items():
        if imported == banned or imported.startswith(banned + "."):
            return reason
    return None


def violations(start: str, root: Path = ROOT) -> list[str]:
    """Forbidden imports reachable from ``start`` through project modules."""
    seen, stack, found = set(), [(start, start)], []
    while stack:
        module, chain = stack.pop()
        if module in seen:
            continue
        seen.add(module)
        for imported in sorted(imports_of(module, root)):
            reason = forbidden_reason(imported)
            if reason:
                found.append(f"{chain} imports {imported} ({reason})")
            elif is_project_module(imported, root):
                stack.append((imported, f"{chain} -> {imported}"))
    return found


@pytest.mark.parametrize("module", SANS_IO)
def test_sans_io_modules_do_no_io(module):
    assert violations(module) == []


def test_the_rule_catches_direct_and_indirect_imports(tmp_path):
    """The checker itself fails on a violating module (else the test above proves nothing)."""
    pkg = tmp_path / "plugins" / "fake"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("from . import helper\nimport struct\n")
    (pkg / "helper.py").write_text("from time import monotonic\n")
    (pkg / "direct.py").write_text("import trio.socket\n")
    assert violations("plugins.fake.core", tmp_path) == [
        "plugins.fake.core -> plugins.fake.helper imports time (time is passed in as `now`)"
    ]
    assert violations("plugins.fake.direct", tmp_path) == [
        "plugins.fake.direct imports trio.socket (the event loop belongs to the shell)"
    ]
    with pytest.raises(FileNotFoundError):
        module_path("plugins.fake.missing", tmp_path)


def test_core_does_not_know_protocols():
    """The core (appliance/) never imports a protocol plugin: plugins come through entry points."""
    offenders = []
    for path in sorted((ROOT / "appliance").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        offenders += [f"{name} imports {m}" for m in imports_of(name) if m.startswith("plugins")]
    assert offenders == []
