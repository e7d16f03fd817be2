################################################################################
#
# python-pyfastcdc
#
################################################################################

PYTHON_PYFASTCDC_VERSION = 0.3.1
PYTHON_PYFASTCDC_SOURCE = pyfastcdc-$(PYTHON_PYFASTCDC_VERSION).tar.gz
PYTHON_PYFASTCDC_SITE = https://files.pythonhosted.org/packages/a8/85/e5e1bfd48172cc17b3c7dcc5453364aee234442dd9810c8baff3d3cac791
PYTHON_PYFASTCDC_SETUP_TYPE = setuptools
PYTHON_PYFASTCDC_LICENSE = MIT
PYTHON_PYFASTCDC_LICENSE_FILES = LICENSE
PYTHON_PYFASTCDC_DEPENDENCIES = host-python-cython
# setup.py silently falls back to the pure-Python chunker, far slower, when
# the Cython extension fails to build: fail the build instead, so a broken
# cross-compile never ships an image whose chunking is slow.
PYTHON_PYFASTCDC_ENV = PYFASTCDC_REQUIRE_CYTHON=1

$(eval $(python-package))
