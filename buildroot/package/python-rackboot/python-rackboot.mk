################################################################################
#
# python-rackboot
#
################################################################################

# Must equal appliance.__version__ (tests/unit/buildroot checks it).
PYTHON_RACKBOOT_VERSION = 0.1.0
# This tree lives in Rackboot's repository: the package is its parent directory.
PYTHON_RACKBOOT_SITE = $(BR2_EXTERNAL_RACKBOOT_PATH)/..
PYTHON_RACKBOOT_SITE_METHOD = local
# Only what the wheel is built from is copied into the build directory: not a
# developer's virtualenv, the tests, benchmarks or this Buildroot tree.
PYTHON_RACKBOOT_OVERRIDE_SRCDIR_RSYNC_EXCLUSIONS = \
	--exclude /.venv --exclude /tests --exclude /bench --exclude /docs \
	--exclude /buildroot --exclude /image --exclude '*.egg-info' \
	--exclude __pycache__ --exclude /build --exclude /dist
# pyproject.toml: build-backend = "setuptools.build_meta"
PYTHON_RACKBOOT_SETUP_TYPE = setuptools
PYTHON_RACKBOOT_LICENSE = Apache-2.0
PYTHON_RACKBOOT_LICENSE_FILES = LICENSE

$(eval $(python-package))
