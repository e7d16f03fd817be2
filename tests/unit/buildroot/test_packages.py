"""Each package of buildroot/package follows Buildroot's rules, and
python-rackboot matches the repository it is built from."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.unit.buildroot.tree import (
    REPOSITORY,
    TREE,
    hash_entries,
    packages,
    read_makefile,
    upper,
)

BANNER = "#" * 80
# Setup types Buildroot's python-package infrastructure accepts for target packages.
SETUP_TYPES = {"setuptools", "setuptools-rust", "pep517", "flit", "hatch", "maturin", "poetry"}
# pyproject.toml build backends -> the setup type Buildroot builds them with.
BACKEND_SETUP_TYPES = {
    "setuptools.build_meta": "setuptools",
    "flit_core.buildapi": "flit",
    "hatchling.build": "hatch",
    "maturin": "maturin",
    "poetry.core.masonry.api": "poetry",
}
PYPI_SITE = re.compile(
    r"https://files\.pythonhosted\.org/packages/[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{60}"
)
PACKAGE_IDS = [p.name for p in packages()]


@pytest.mark.parametrize("package", packages(), ids=PACKAGE_IDS)
def test_package_has_config_in_mk_and_hash(package):
    expected = {"Config.in", f"{package.name}.mk", f"{package.name}.hash"}
    assert expected <= {p.name for p in package.iterdir()}


@pytest.mark.parametrize("package", packages(), ids=PACKAGE_IDS)
def test_mk_variables_are_prefixed_with_the_package_name(package):
    """Buildroot's rule (check-package): every variable of package/foo-bar/foo-bar.mk
    starts with FOO_BAR_, and the file ends with the infrastructure call."""
    mk = package / f"{package.name}.mk"
    makefile = read_makefile(mk)
    prefix = upper(package.name) + "_"
    strays = [name for name in makefile.variables if not name.startswith(prefix)]
    assert strays == [], f"{mk}: variables must start with {prefix}"
    for suffix in ("VERSION", "SITE", "SETUP_TYPE", "LICENSE"):
        assert makefile.variables.get(prefix + suffix), f"{mk}: {prefix}{suffix} missing"
    assert makefile.variables[prefix + "SETUP_TYPE"] in SETUP_TYPES
    assert makefile.lines[:5] == [BANNER, "#", f"# {package.name}", "#", BANNER]
    assert [line for line in makefile.lines if line.strip()][-1] == "$(eval $(python-package))"


@pytest.mark.parametrize("package", packages(), ids=PACKAGE_IDS)
def test_hash_names_the_source_and_license_files(package):
    """Lines are 'sha256  <64 hex>  <file>'; a downloaded package's hash covers
    the .mk's source tarball, and every package's its license files."""
    makefile = read_makefile(package / f"{package.name}.mk")
    prefix = upper(package.name) + "_"
    entries, malformed = hash_entries(package / f"{package.name}.hash")
    assert malformed == []
    if makefile.variables.get(prefix + "SITE_METHOD") == "local":
        assert prefix + "SOURCE" not in makefile.variables  # nothing is downloaded
    else:
        source = makefile.expand(makefile.variables[prefix + "SOURCE"])
        assert source in entries, f"{package.name}.hash lacks {source}"
        assert PYPI_SITE.fullmatch(makefile.variables[prefix + "SITE"]), "a PyPI sdist URL"
        assert makefile.expand(makefile.variables[prefix + "VERSION"]) in source
    for license_file in makefile.variables.get(prefix + "LICENSE_FILES", "").split():
        assert license_file in entries, f"{package.name}.hash lacks {license_file}"
    assert set(entries) <= {source_or_none(makefile, prefix)} | set(
        makefile.variables.get(prefix + "LICENSE_FILES", "").split()
    ), "a hash for a file the .mk does not name"


def source_or_none(makefile, prefix: str) -> str | None:
    source = makefile.variables.get(prefix + "SOURCE")
    return makefile.expand(source) if source else None


def test_rackboot_version_and_setup_type_follow_the_repository():
    makefile = read_makefile(TREE / "package/python-rackboot/python-rackboot.mk")
    init = (REPOSITORY / "appliance/__init__.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"', init, re.M)[1]
    assert makefile.variables["PYTHON_RACKBOOT_VERSION"] == version
    pyproject = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    backend = pyproject["build-system"]["build-backend"]
    assert makefile.variables["PYTHON_RACKBOOT_SETUP_TYPE"] == BACKEND_SETUP_TYPES[backend]
    assert makefile.variables["PYTHON_RACKBOOT_SITE_METHOD"] == "local"


def test_rackboot_selects_every_runtime_dependency():
    """A dependency added to pyproject.toml without its Buildroot package fails here."""
    pyproject = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    config_in = (TREE / "package/python-rackboot/Config.in").read_text()
    selected = set(re.findall(r"^\tselect (BR2_PACKAGE_\w+)", config_in, re.M))
    for requirement in pyproject["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)[0]
        assert f"BR2_PACKAGE_PYTHON_{upper(name)}" in selected, requirement


def test_external_mk_includes_every_package():
    text = (TREE / "external.mk").read_text()
    assert "include $(sort $(wildcard $(BR2_EXTERNAL_RACKBOOT_PATH)/package/*/*.mk))" in text
    config_in = (TREE / "Config.in").read_text()
    for package in packages():
        assert f'source "$BR2_EXTERNAL_RACKBOOT_PATH/package/{package.name}/Config.in"' in config_in
