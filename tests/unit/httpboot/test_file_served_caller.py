"""httpboot_file_served called directly does what pluggy's call does: the same order,
the arguments each implementation names, an exception stopping the rest; wrappers and no
implementation at all left as they were."""

from __future__ import annotations

import pluggy
import pytest

from appliance.api import PROJECT, hookimpl
from plugins.httpboot import hookspecs
from plugins.httpboot.plugin import file_served_caller


class Seeing:
    def __init__(self, seen: list) -> None:
        self.seen = seen


class Both(Seeing):
    @hookimpl
    def httpboot_file_served(self, path, client):
        self.seen.append(("both", path, client))


class PathOnly(Seeing):
    @hookimpl(tryfirst=True)
    def httpboot_file_served(self, path):
        self.seen.append(("path", path))


class Reordered(Seeing):
    @hookimpl
    def httpboot_file_served(self, client, path):
        self.seen.append(("reordered", path, client))


class Broken:
    @hookimpl
    def httpboot_file_served(self, path, client):
        raise RuntimeError("observer failed")


class Wrapper(Seeing):
    @hookimpl(wrapper=True)
    def httpboot_file_served(self, path, client):
        self.seen.append(("wrapper", path))
        return (yield)


def manager(*plugins) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


@pytest.mark.parametrize("kinds", [(Both,), (Both, PathOnly, Reordered), (Reordered, Both),
                                   (PathOnly, Wrapper, Both)])  # fmt: skip
def test_called_directly_as_pluggy_calls_them(kinds):
    direct, through_pluggy = [], []
    caller = file_served_caller(
        manager(*[kind(direct) for kind in kinds]).hook.httpboot_file_served
    )
    pm = manager(*[kind(through_pluggy) for kind in kinds])
    assert caller is not None
    caller("debian/vmlinuz", "10.0.0.5")
    pm.hook.httpboot_file_served(path="debian/vmlinuz", client="10.0.0.5")
    assert direct == through_pluggy and len(direct) == len(kinds)


def test_an_exception_stops_the_rest_as_in_pluggy():
    seen: list = []
    caller = file_served_caller(manager(Both(seen), Broken()).hook.httpboot_file_served)
    assert caller is not None
    with pytest.raises(RuntimeError):
        caller("x", "10.0.0.5")
    assert seen == []  # Broken, registered last, runs first


def test_nobody_listening_is_none():
    assert file_served_caller(manager().hook.httpboot_file_served) is None
