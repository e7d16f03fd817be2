"""What the boot servers saw, as the workflow's observations (pure).

The HTTP and TFTP servers tell who fetched which file (``httpboot_file_served``,
``tftp_file_served``: a path and a client address); the lease table says which
machine holds that address; the machine's boot profile says what the file is to
it: its kernel, its N-th initrd, or anything else it fetched before them (a
loader: ``ipxe.efi``, ``undionly.kpxe``, a chained script).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from appliance.errors import ConfigError
from plugins.dhcp.leases import NAMESPACE as LEASES_NS
from plugins.dhcp.leases import CorruptRecord, LeaseState, lease_from_state_untrusted
from plugins.httpboot.script import IMAGE, Profile

LOCAL = Profile("local-disk", "")  # renders "exit": the firmware boots its next device


def profiles_of(httpboot: Any) -> tuple[dict[str, Profile], str]:
    """The ``[httpboot]`` section's profiles by name, and the default profile's name."""
    profiles = {p.name: Profile(p.name, p.kernel, tuple(p.initrd), p.cmdline)
                for p in httpboot.profiles}  # fmt: skip
    return profiles, httpboot.default_profile


def served_name(name: str) -> str:
    """A profile's file as the servers report it when they serve it: relative to
    their roots (``image:NAME`` as ``images/NAME``; a URL by its path)."""
    if name.startswith(IMAGE):
        return "images/" + name.removeprefix(IMAGE)
    if "://" in name:
        name = urlsplit(name).path
    return name.lstrip("/").removeprefix("boot/")


def classify(path: str, profile: Profile) -> str:
    """``"kernel"``, ``"initrd:N"`` or ``"loader"``: what fetching ``path`` means."""
    path = path.lstrip("/").removeprefix("boot/")
    if profile.kernel and path == served_name(profile.kernel):
        return "kernel"
    for i, name in enumerate(profile.initrd):
        if path == served_name(name):
            return f"initrd:{i}"
    return "loader"


def profile_for(
    record_profile: str, profiles: Mapping[str, Profile], default: str
) -> Profile | None:
    return profiles.get(record_profile or default)


def check_profiles(seeds: Sequence[Any], profiles: Mapping[str, Profile], source: str) -> None:
    """Every configured machine names a profile of ``[httpboot]`` (or none: the default)."""
    for i, record in enumerate(seeds):
        if record.profile and record.profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none defined"
            raise ConfigError(source, f"provisioning.machines[{i}].profile",
                              f"one of [httpboot] profiles ({known})", record.profile)  # fmt: skip


def mac_leased_at(state: Any, address: str) -> str | None:
    """The MAC whose bound lease holds ``address`` in the rack's lease table (the
    replicated one: a new active knows it too), else None."""
    try:
        lease = lease_from_state_untrusted(address, state.get(LEASES_NS, address))
    except (CorruptRecord, ValueError):
        return None
    return lease.hwaddr.hex(":") if lease.state is LeaseState.BOUND else None
