"""TFTP's confinement is the shared one (tests/unit/test_confine.py) with TFTP error codes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from appliance.confine import NotFound
from plugins.tftp.confine import Refused, open_confined, resolve_untrusted
from plugins.tftp.packets import ErrorCode
from tests.unit.test_confine import ALLOWED, REFUSED, reveals_nothing, tree  # noqa: F401 (fixture)


@pytest.mark.parametrize(("requested", "kind"), REFUSED)
def test_refusals_become_tftp_errors(tree, requested, kind):  # noqa: F811
    code = ErrorCode.FILE_NOT_FOUND if kind is NotFound else ErrorCode.ACCESS_VIOLATION
    reason = "file not found" if kind is NotFound else "access violation"
    for attempt in (resolve_untrusted, open_confined):
        with pytest.raises(Refused) as info:
            attempt(tree, requested)
        assert (info.value.code, info.value.message) == (code, f"{requested}: {reason}")
        assert reveals_nothing(info.value.message, requested, tree)


@pytest.mark.parametrize(("requested", "target"), ALLOWED[:3])
def test_allowed_names_open_with_their_size(tree, requested, target):  # noqa: F811
    assert resolve_untrusted(tree, requested) == Path(os.path.realpath(tree / target))
    handle, size = open_confined(tree, requested)
    with handle:
        assert size == len(handle.read()) == (tree / target).stat().st_size
