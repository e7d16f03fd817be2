"""Strict JSON (RFC 8259) for everything Rackboot writes as JSON: control-socket answers,
``--json`` output, HTTP API documents and JSON log lines. Python's ``json`` writes
``Infinity`` and ``NaN``, which other readers refuse; here a float that is not finite
(an endless lease's inf, an unknown rate's NaN) becomes null, and a value JSON cannot
hold becomes its ``str()``."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(value: Any, **options: Any) -> str:
    try:  # the common case copies nothing
        return json.dumps(value, allow_nan=False, default=str, **options)
    except ValueError:  # a float out of range (a circular value fails again, as it should)
        return json.dumps(finite(value), allow_nan=False, default=str, **options)


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
