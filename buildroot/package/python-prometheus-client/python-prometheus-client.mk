################################################################################
#
# python-prometheus-client
#
################################################################################

PYTHON_PROMETHEUS_CLIENT_VERSION = 0.26.0
PYTHON_PROMETHEUS_CLIENT_SOURCE = prometheus_client-$(PYTHON_PROMETHEUS_CLIENT_VERSION).tar.gz
PYTHON_PROMETHEUS_CLIENT_SITE = https://files.pythonhosted.org/packages/52/73/f1334c29c2af4cd9dba6c7817e61b611bd0215e2eb5565c6064a4de18802
PYTHON_PROMETHEUS_CLIENT_SETUP_TYPE = setuptools
PYTHON_PROMETHEUS_CLIENT_LICENSE = Apache-2.0, BSD-2-Clause (decorator.py)
PYTHON_PROMETHEUS_CLIENT_LICENSE_FILES = LICENSE NOTICE

$(eval $(python-package))
