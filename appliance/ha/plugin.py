"""What the core plugin adds for HA: the [ha] section's checks, the service, the commands.

Kept here so :mod:`appliance.core_plugin` only forwards its hooks.
"""

from __future__ import annotations

from typing import Any

from appliance.api import CliCommand, Service
from appliance.ha.schema import check_settings


def configure(config: Any) -> None:
    check_settings(config["ha"], config.source)


def services(node: Any) -> list[Service]:
    from appliance.ha.service import HaService

    node.ha = HaService(node, node.config["ha"], node.config.source)
    return [Service("ha", node.ha.run)] if node.ha.elects else []


def render_status(status: dict[str, Any]) -> str:
    lines = [f"mode {status.get('mode')}  role {status.get('role')}  {_lease(status)}"]
    election = status.get("election") or {}
    if election:
        lines.append(
            f"  maintenance {'on' if election.get('maintenance') else 'off'}  "
            f"holder seen {election.get('holder_seen') or '-'}  "
            f"known epoch {election.get('known_epoch')}  "
            f"quorum {election.get('quorum')}/{election.get('acceptors')}  "
            f"last refusal {election.get('last_refusal') or '-'}"
        )
    membership = election.get("membership") or {}
    if membership.get("blocked"):
        lines.append(
            f"  membership {membership['digest']}: {membership['blocked']} ("
            + ", ".join(f"{peer} {digest or 'not seen'}"
                        for peer, digest in membership.get("peers", {}).items())
            + ")"
        )  # fmt: skip
    if status.get("vip"):
        vip = status["vip"]
        lines.append(f"  vip {vip['address']} on {vip['interface']}: "
                     f"{'held' if vip['held'] else 'not held'}")  # fmt: skip
    for node, peer in sorted(((status.get("transport") or {}).get("versions") or {}).items()):
        if peer.get("problem"):
            lines.append(f"  refused {node}: {peer['problem']}")
    handover = election.get("handover") or {}
    if handover.get("to"):
        lines.append(f"  handing over to {handover['to']} (waits {handover['left']:.1f}s more)")
    if handover.get("note"):
        lines.append(f"  {handover['note']}")
    if status.get("last_change"):
        lines.append(f"  last change: {status['last_change']}")
    return "\n".join(lines)


def _lease(status: dict[str, Any]) -> str:
    """The lease this node holds, in words: JSON carries an endless one as null."""
    valid_for, epoch = status.get("valid_for"), status.get("epoch")
    if valid_for is None:  # nothing elects: a standalone node's lease never ends
        return f"epoch {epoch}  valid without end"
    if epoch is None or valid_for <= 0:  # a standby, or a lease that ran out
        return "no lease held"
    return f"epoch {epoch}  valid for {valid_for:.3f}s"


CLI_COMMANDS = [
    CliCommand(("ha", "status"), "show this node's election state", "ha.status", render_status),
    CliCommand(
        ("ha", "promote"),
        "become active if allowed (asks the holder to hand over)",
        "ha.promote",
        render_status,
        arguments=(
            (
                ("--force",),
                {
                    "action": "store_true",
                    "help": "also when only restarted witnesses vouch for the epoch (an "
                    "unreachable appliance must really be down)",
                },
            ),
        ),
    ),
    CliCommand(
        ("ha", "demote"), "step down and leave the lease to the others", "ha.demote", render_status
    ),  # fmt: skip
    CliCommand(
        ("ha", "handover"),
        "hand the lease over gracefully: on the active, to a standby once it has caught up; "
        "on a standby, to this node",
        "ha.handover",
        render_status,
        arguments=(
            (
                ("--to",),
                {"metavar": "NODE_ID", "help": "the standby to hand over to (active only)"},
            ),
        ),
    ),
]


def _maintenance(on: bool) -> CliCommand:
    return CliCommand(
        ("ha", "maintenance", "on" if on else "off"),
        "never take the lease (hands it over if held)" if on else "take part again",
        "ha.maintenance",
        render_status,
        arguments=(
            (
                ("--on",),
                {"action": "store_const", "const": on, "default": on, "help": argparse_hidden()},
            ),
        ),  # fmt: skip
    )


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


CLI_COMMANDS += [_maintenance(True), _maintenance(False)]
