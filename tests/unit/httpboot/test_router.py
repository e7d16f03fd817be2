"""Routes: patterns, order, HEAD for GET, 405 with Allow, conflicts."""

from __future__ import annotations

import pytest

from plugins.httpboot.messages import Route
from plugins.httpboot.router import RouteConflict, Router, compile_pattern


def handler(request):
    return None


ROUTER = Router(
    [
        Route("GET", "/boot/{mac}.ipxe", handler, name="script"),
        Route("POST", "/api/v1/machines/{mac}/events", handler, name="post"),
        Route("DELETE", "/api/v1/machines/{mac}/events", handler, name="delete"),
        Route("GET", "/boot/{path:path}", handler, name="static"),
    ]
)


@pytest.mark.parametrize(
    ("method", "path", "name", "params"),
    [
        ("GET", "/boot/52-54-00-12-34-56.ipxe", "script", {"mac": "52-54-00-12-34-56"}),
        ("HEAD", "/boot/52-54-00-12-34-56.ipxe", "script", {"mac": "52-54-00-12-34-56"}),
        ("GET", "/boot/a/b.ipxe", "static", {"path": "a/b.ipxe"}),  # {mac} spans no slash
        ("GET", "/boot/ipxe.efi", "static", {"path": "ipxe.efi"}),
        ("POST", "/api/v1/machines/x/events", "post", {"mac": "x"}),
        ("DELETE", "/api/v1/machines/x/events", "delete", {"mac": "x"}),
    ],
)
def test_matches(method, path, name, params):
    match = ROUTER.match(method, path)
    assert match.route is not None and match.route.name == name and match.params == params


def test_other_method_is_405_with_allow_and_unknown_path_404():
    assert ROUTER.match("PUT", "/api/v1/machines/x/events").allowed == ("POST", "DELETE")
    assert ROUTER.match("POST", "/boot/x").allowed == ("GET", "HEAD")
    nothing = ROUTER.match("GET", "/nothing")
    assert nothing.route is None and nothing.allowed == ()


def test_literal_parts_are_not_regexes():
    assert compile_pattern("/a.b/{x}").fullmatch("/a.b/1")
    assert not compile_pattern("/a.b/{x}").fullmatch("/aXb/1")


def test_conflicts_and_bad_routes_are_refused():
    with pytest.raises(RouteConflict, match="GET /x is routed twice"):
        Router([Route("GET", "/x", handler), Route("GET", "/x", handler)])
    with pytest.raises(ValueError, match="must start with '/'"):
        Router([Route("GET", "x", handler)])
    with pytest.raises(ValueError, match="unknown method"):
        Router([Route("FETCH", "/x", handler)])


def test_a_remembered_match_gives_each_request_its_own_params():
    router = Router([Route("GET", "/boot/{mac}.ipxe", handler), Route("GET", "/x", handler)])
    first = router.match("GET", "/boot/aa.ipxe")
    first.params["path"] = "changed by a handler"  # as the script route does
    assert router.match("GET", "/boot/aa.ipxe").params == {"mac": "aa"}
    router.match("GET", "/x").params["added"] = "y"
    assert router.match("GET", "/x").params == {}
    assert router.match("POST", "/x").allowed == ("GET", "HEAD")
