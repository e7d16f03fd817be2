"""buildroot/'s Config.in files parse, and the defconfigs mean what they say.

kconfiglib reads the tree under a wrapper that first sources upstream.Kconfig:
stubs of the upstream BR2_* symbols used here, each checked against upstream."""

from __future__ import annotations

import re

import pytest

from tests.unit.buildroot.tree import (
    EXTERNAL_PATH_VARIABLE,
    TREE,
    defconfig_assignments,
    defconfigs,
    kconfig,
    packages,
    upper,
)

kconfiglib = pytest.importorskip(
    "kconfiglib", reason="kconfiglib is in the dev extra (pip install -e .[dev])"
)


@pytest.fixture(scope="module")
def kconf():
    return kconfig()


def test_every_config_in_parses_without_warnings(kconf):
    assert kconf.warnings == []
    parsed = {node.filename for node in kconf.node_iter() if node.filename}
    for package in packages():
        assert any(f.endswith(f"{package.name}/Config.in") for f in parsed), package.name


def test_every_symbol_referenced_is_defined(kconf):
    """A select or depends on a misspelt or missing symbol is silently false
    in Kconfig; here it fails."""
    undefined = sorted(
        s.name for s in kconf.syms.values() if not s.nodes and s is not kconf.modules
    )
    assert undefined == []


def test_each_package_defines_its_own_symbol(kconf):
    for package in packages():
        symbol = f"BR2_PACKAGE_{upper(package.name)}"
        defined_here = {
            node.item.name
            for node in kconf.node_iter()
            if node.filename.endswith(f"/{package.name}/Config.in")
            and isinstance(node.item, kconfiglib.Symbol)
        }
        assert defined_here == {symbol}, package.name


@pytest.mark.parametrize("defconfig", defconfigs(), ids=lambda p: p.name)
def test_defconfig_loads_and_every_value_holds(kconf, defconfig):
    """Unknown symbols (ours or upstream's) are warnings; a value kconfig drops
    (an unmet dependency) differs after loading."""
    kconf.warnings.clear()
    kconf.load_config(str(defconfig))
    assert kconf.warnings == []
    wrong = {
        name: (value, kconf.syms[name].str_value)
        for name, value in defconfig_assignments(defconfig).items()
        if kconf.syms[name].str_value != value
    }
    assert wrong == {}, "defconfig value -> value after loading"
    assert kconf.syms["BR2_PACKAGE_PYTHON_RACKBOOT"].str_value == "y"


@pytest.mark.parametrize("defconfig", defconfigs(), ids=lambda p: p.name)
def test_defconfig_paths_exist_in_the_tree(defconfig):
    """Every $(BR2_EXTERNAL_RACKBOOT_PATH)/... the defconfig names is a file or
    directory of the tree (scripts, overlay, kernel fragments)."""
    text = defconfig.read_text()
    named = re.findall(rf"\$\({EXTERNAL_PATH_VARIABLE}\)/([^\s\"]+)", text)
    assert named, "a defconfig of this tree uses its overlay and scripts"
    missing = [path for path in named if not (TREE / path).exists()]
    assert missing == []
    others = set(re.findall(r"\$\((BR2_EXTERNAL_\w+_PATH)\)", text)) - {EXTERNAL_PATH_VARIABLE}
    assert others == set(), "another external tree's name"


def test_external_desc_names_the_tree():
    lines = (TREE / "external.desc").read_text().splitlines()
    assert "name: RACKBOOT" in lines
    for config_in in [TREE / "Config.in", *(p / "Config.in" for p in packages())]:
        for variable in re.findall(r"\$(BR2_EXTERNAL_\w+_PATH)", config_in.read_text()):
            assert variable == EXTERNAL_PATH_VARIABLE, config_in
