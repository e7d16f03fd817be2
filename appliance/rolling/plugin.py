"""What the core plugin adds for the rolling update: the service, its commands, status."""

from __future__ import annotations

from typing import Any

from appliance.api import Service


def services(node: Any) -> list[Service]:
    """On an appliance of a rack with [ha] peers (the embedded election): the roll's
    service, with the updater a plugin provides or the appliance's A/B slots."""
    from appliance.rolling.service import Rolling
    from appliance.rolling.updater import default_updater

    node.rolling = None
    ha = node.ha
    if ha is None or not ha.elects or ha.backend != "embedded" or not ha.settings.peers:
        return []
    updater = node.pm.hook.rackboot_firmware_updater(node=node) or default_updater(node)
    node.rolling = Rolling(node, updater)
    return [Service("rolling", node.rolling.run)]


def control_commands(node: Any) -> dict[str, Any]:
    rolling = getattr(node, "rolling", None)
    if rolling is None:
        return {"roll.status": lambda args: status(node), "roll.start": _no_roll}
    return {"roll.status": lambda args: rolling.status(), "roll.start": rolling.start}


def _no_roll(args: dict[str, Any]) -> None:
    from appliance.control import ControlRequestError

    raise ControlRequestError(
        "this node rolls nothing: a rolling update needs a rack of appliances ([ha] peers, "
        "the embedded election)"
    )


def status(node: Any) -> dict[str, Any] | None:
    rolling = getattr(node, "rolling", None)
    return None if rolling is None else rolling.status()
