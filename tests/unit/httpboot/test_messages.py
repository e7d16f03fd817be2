"""Responses: JSON bodies are strict (RFC 8259), whatever floats the document holds."""

from __future__ import annotations

import json
import math

import pytest

from plugins.httpboot.messages import Response


def strict(body: bytes):
    def refuse(constant: str):
        raise AssertionError(f"not strict JSON: {constant}")

    return json.loads(body, parse_constant=refuse)


def test_floats_that_are_not_finite_are_null():
    document = {"until": math.inf, "nested": [{"x": -math.inf}, (math.nan, 1.5)], "n": 2}
    reply = Response.json(document)
    assert strict(reply.body) == {"until": None, "nested": [{"x": None}, [None, 1.5]], "n": 2}
    assert document["until"] == math.inf  # the caller's document is left as it was


@pytest.mark.parametrize("document", [{"a": 1.5, "b": [1, "x", None, True]}, [], "text"])
def test_finite_documents_are_written_as_they_are(document):
    assert Response.json(document).body == (
        json.dumps(document, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    )
