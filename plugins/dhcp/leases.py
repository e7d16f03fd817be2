"""The lease table: who holds which address until when (sans-IO).

Times are wall-clock seconds since the epoch, passed in as ``now``: leases
outlive the process, so they cannot be measured on a monotonic clock.

The table keeps one record per address, including released, expired and
declined ones, so a returning client gets its previous address back as long
as nobody else took it, and a declined address stays quarantined until its
record expires. Every change is a :class:`Lease` record that the journal
appends as is; replaying the records rebuilds the same table.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import msgpack

RECORD_VERSION = 1
MAX_RECORD_BYTES = 4096


class LeaseState(enum.IntEnum):
    BOUND = 1
    RELEASED = 2
    EXPIRED = 3
    DECLINED = 4  # someone else uses the address: quarantined until ``expires``


@dataclass(frozen=True, slots=True)
class Lease:
    address: int  # IPv4 address as an integer
    client: bytes  # client identifier (option 61), else htype + chaddr
    hwaddr: bytes  # chaddr[:hlen], for display and ARP
    subnet: str  # the subnet's network, e.g. "192.0.2.0/24"
    state: LeaseState
    starts: float
    expires: float
    hostname: str = ""

    def active(self, now: float) -> bool:
        """The address is taken: bound and unexpired, or quarantined after a DECLINE."""
        return self.state in (LeaseState.BOUND, LeaseState.DECLINED) and now < self.expires


class CorruptRecord(ValueError):
    """A journal record whose payload does not decode to a lease."""


class LeaseTable:
    """Leases by address and by client. Not thread-safe; owned by one task."""

    def __init__(self) -> None:
        self._by_address: dict[int, Lease] = {}
        self._by_client: dict[bytes, int] = {}  # client -> address of its latest lease

    def __len__(self) -> int:
        return len(self._by_address)

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._by_address.values())

    def get(self, address: int) -> Lease | None:
        return self._by_address.get(address)

    def of_client(self, client: bytes) -> Lease | None:
        address = self._by_client.get(client)
        return None if address is None else self._by_address[address]

    def is_free_for(self, address: int, client: bytes, now: float) -> bool:
        """Nobody else holds ``address`` (and it is not quarantined)."""
        lease = self._by_address.get(address)
        if lease is None or not lease.active(now):
            return True
        return lease.client == client and lease.state is LeaseState.BOUND

    def apply(self, lease: Lease) -> None:
        """Record ``lease`` as the latest state of its address (live change or replay)."""
        previous = self._by_address.get(lease.address)
        if (
            previous is not None
            and previous.client != lease.client
            and self._by_client.get(previous.client) == lease.address
        ):
            del self._by_client[previous.client]
        old_address = self._by_client.get(lease.client)
        if old_address is not None and old_address != lease.address:
            # A client holds one address: moving it releases the other.
            old = self._by_address[old_address]
            if old.state is LeaseState.BOUND:
                self._by_address[old_address] = replace(old, state=LeaseState.RELEASED)
        self._by_address[lease.address] = lease
        if lease.state is not LeaseState.DECLINED:
            self._by_client[lease.client] = lease.address

    def expire(self, now: float) -> list[Lease]:
        """Mark bound leases past their end as expired; returns the changed records."""
        changed = [
            replace(lease, state=LeaseState.EXPIRED)
            for lease in self._by_address.values()
            if lease.state is LeaseState.BOUND and lease.expires <= now
        ]
        for lease in changed:
            self.apply(lease)
        return changed

    def count_active(self, addresses: Iterable[int], now: float) -> int:
        return sum(1 for a in addresses if (lease := self._by_address.get(a)) and lease.active(now))


def encode_lease(lease: Lease) -> bytes:
    """The msgpack payload of one journal record."""
    return msgpack.packb(
        [
            RECORD_VERSION,
            lease.address,
            lease.client,
            lease.hwaddr,
            lease.subnet,
            int(lease.state),
            lease.starts,
            lease.expires,
            lease.hostname,
        ],
        use_bin_type=True,
    )


def decode_lease_untrusted(payload: bytes) -> Lease:
    """Decode one record's payload; :class:`CorruptRecord` on anything unexpected."""
    try:
        fields = msgpack.unpackb(
            payload, use_list=True, raw=False, strict_map_key=True, max_bin_len=MAX_RECORD_BYTES
        )
    except Exception as exc:  # msgpack raises several types on garbage
        raise CorruptRecord(f"undecodable record: {type(exc).__name__}") from None
    if not isinstance(fields, list) or len(fields) != 9 or fields[0] != RECORD_VERSION:
        raise CorruptRecord("record of unknown shape or version")
    _, address, client, hwaddr, subnet, state, starts, expires, hostname = fields
    if not (
        isinstance(address, int)
        and 0 <= address < 2**32
        and isinstance(client, bytes)
        and isinstance(hwaddr, bytes)
        and isinstance(subnet, str)
        and state in LeaseState._value2member_map_
        and isinstance(starts, int | float)
        and isinstance(expires, int | float)
        and isinstance(hostname, str)
    ):
        raise CorruptRecord("record with fields of the wrong type")
    return Lease(
        address, client, hwaddr, subnet, LeaseState(state), float(starts), float(expires), hostname
    )
