################################################################################
#
# python-h11-mypyc
#
################################################################################

PYTHON_H11_MYPYC_VERSION = 0.17.0
PYTHON_H11_MYPYC_SOURCE = h11_mypyc-$(PYTHON_H11_MYPYC_VERSION).tar.gz
PYTHON_H11_MYPYC_SITE = https://files.pythonhosted.org/packages/cd/c9/15e382e195a074dd81dbc4d13a53c0fd62dfd7ceda737793d667971bba90
# setup.py compiles with mypyc only when H11_MYPYC=1; Buildroot has no host
# mypy, so this installs the same module (h11_mypyc) as plain Python.
PYTHON_H11_MYPYC_SETUP_TYPE = setuptools
PYTHON_H11_MYPYC_LICENSE = MIT
PYTHON_H11_MYPYC_LICENSE_FILES = LICENSE.txt

$(eval $(python-package))
