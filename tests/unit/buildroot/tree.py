"""Reading buildroot/ (Rackboot's BR2_EXTERNAL tree) the way Buildroot would, offline.

RACKBOOT_BUILDROOT_TREE points the tests at another copy of the tree (how the
checks were shown to fail on planted defects)."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[3]
TREE = Path(os.environ.get("RACKBOOT_BUILDROOT_TREE") or REPOSITORY / "buildroot")
EXTERNAL_NAME = "RACKBOOT"
EXTERNAL_PATH_VARIABLE = f"BR2_EXTERNAL_{EXTERNAL_NAME}_PATH"
UPSTREAM_STUBS = Path(__file__).with_name("upstream.Kconfig")


def packages() -> list[Path]:
    return sorted(p for p in (TREE / "package").iterdir() if p.is_dir())


def defconfigs() -> list[Path]:
    return sorted((TREE / "configs").glob("*_defconfig"))


def upper(package_name: str) -> str:
    """Buildroot's UPPERCASE: the prefix of a package's variables and symbol."""
    return package_name.upper().replace("-", "_").replace(".", "_")


@contextlib.contextmanager
def environment(settings: dict[str, str]):
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def kconfig():
    """kconfiglib over a wrapper like Buildroot's own: the upstream stubs, then
    the tree's Config.in under "External options" (as .br2-external.in does)."""
    import kconfiglib

    # Read while parsing only: Buildroot's symbols carry BR2_ themselves (no
    # CONFIG_ prefix), and its Config.in sources through $BR2_EXTERNAL_..._PATH.
    settings = {"CONFIG_": "", EXTERNAL_PATH_VARIABLE: str(TREE)}
    with environment(settings), tempfile.TemporaryDirectory() as directory:
        wrapper = Path(directory, "Config.in")
        wrapper.write_text(
            'mainmenu "Buildroot (stubs)"\n'
            f'source "{UPSTREAM_STUBS}"\n'
            'menu "External options"\n'
            f'source "${EXTERNAL_PATH_VARIABLE}/Config.in"\n'
            "endmenu\n"
        )
        return kconfiglib.Kconfig(str(wrapper), warn_to_stderr=False)


def defconfig_assignments(path: Path) -> dict[str, str]:
    """SYMBOL -> value ('n' for '# SYMBOL is not set'), quotes removed."""
    values = {}
    for line in path.read_text().splitlines():
        unset = re.fullmatch(r"# (BR2_\w+) is not set", line)
        if unset:
            values[unset[1]] = "n"
        elif line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value[1:-1] if value.startswith('"') else value
    return values


ASSIGNMENT = re.compile(r"([A-Za-z0-9_]+)\s*([+:?]?=)\s*(.*)")


@dataclass
class Makefile:
    """A package .mk: its variables (continuation lines joined) and its lines."""

    variables: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def expand(self, value: str) -> str:
        for _ in range(10):  # bounded: a .mk nests references a level or two
            value, count = re.subn(
                r"\$\(([A-Z0-9_]+)\)", lambda m: self.variables.get(m[1], m[0]), value
            )
            if not count:
                break
        return value


def read_makefile(path: Path) -> Makefile:
    text = re.sub(r"\\\n", " ", path.read_text())
    makefile = Makefile(lines=text.splitlines())
    in_define = False
    for line in makefile.lines:
        if in_define:
            in_define = line.strip() != "endef"
            continue
        define = re.match(r"define\s+(\w+)", line)
        if define:
            makefile.variables[define[1]] = ""
            in_define = True
            continue
        assignment = ASSIGNMENT.fullmatch(line.strip())
        if assignment and not line.startswith(("\t", "#")):
            name, operator, value = assignment.groups()
            previous = makefile.variables.get(name, "") if operator == "+=" else ""
            makefile.variables[name] = (previous + " " + value).strip()
    return makefile


HASH_LINE = re.compile(r"sha256  ([0-9a-f]{64})  (\S+)")


def hash_entries(path: Path) -> tuple[dict[str, str], list[str]]:
    """file -> sha256, and the lines that are neither that nor a comment."""
    entries, malformed = {}, []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = HASH_LINE.fullmatch(line)
        if match:
            entries[match[2]] = match[1]
        else:
            malformed.append(line)
    return entries, malformed
