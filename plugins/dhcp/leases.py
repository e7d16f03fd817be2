"""The lease table: who holds which address until when (sans-IO).

Times are wall-clock seconds since the epoch, passed in as ``now``: leases
outlive the process, so they cannot be measured on a monotonic clock.

The table keeps one record per address, including released, expired and
declined ones, so a returning client gets its previous address back as long
as nobody else took it, and a declined address stays quarantined until its
record expires.

Two layers (docs/dhcp.md, "Storage"):

* :class:`LeaseTable` is the **committed** table: it changes only when a
  record of the replicated state log commits (namespace :data:`NAMESPACE`,
  key the address as text, value :func:`lease_value`), applied in log order
  by the shell's changefeed, on the active and on the standby alike;
* :class:`LeaseView` is what the server reads: the committed table with the
  server's own decisions laid over it while their records are in flight
  (decided, appended, not committed yet), so an address is never offered or
  acknowledged to a second client in that window. An entry leaves the
  overlay once the committed table has its record, or at once when its
  commit is abandoned (the lease was lost first: nothing was acknowledged).

:func:`encode_lease` and :func:`decode_lease_untrusted` read and write the
journal of releases before the state log (``<data_dir>/dhcp/leases.journal``),
which a node imports once (plugins/dhcp/store.py).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import msgpack

NAMESPACE = "dhcp.leases"  # in the state log: address text -> lease_value(lease)
RECORD_VERSION = 1
VALUE_VERSION = 1
MAX_RECORD_BYTES = 4096
MAX_CLIENT = 255  # option 61 is at most 255 bytes
MAX_TEXT = 255


class LeaseState(enum.IntEnum):
    BOUND = 1
    RELEASED = 2
    EXPIRED = 3
    DECLINED = 4  # someone else uses the address: quarantined until ``expires``


_BOUND, _RELEASED, _DECLINED = LeaseState.BOUND, LeaseState.RELEASED, LeaseState.DECLINED


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
    """A record whose payload does not decode to a lease."""


class LeaseTable:
    """The committed leases by address and by client. Not thread-safe; owned by one task.

    ``epoch`` and ``lsn`` say which record of the state log it was last brought to
    (0, 0 for a table built otherwise)."""

    def __init__(self) -> None:
        self._by_address: dict[int, Lease] = {}
        self._by_client: dict[bytes, int] = {}  # client -> address of its latest lease
        self.epoch = 0
        self.lsn = 0

    def __len__(self) -> int:
        return len(self._by_address)

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._by_address.values())

    def addresses(self) -> Iterable[int]:
        return self._by_address.keys()

    def get(self, address: int) -> Lease | None:
        return self._by_address.get(address)

    def of_client(self, client: bytes) -> Lease | None:
        address = self._by_client.get(client)
        return None if address is None else self._by_address[address]

    def is_free_for(self, address: int, client: bytes, now: float) -> bool:
        """Nobody else holds ``address`` (and it is not quarantined)."""
        return _free_for(self._by_address.get(address), client, now)

    def apply(self, lease: Lease) -> None:
        """Record ``lease`` as the latest state of its address (a committed record)."""
        previous = self._by_address.get(lease.address)
        if (
            previous is not None
            and previous.client != lease.client
            and self._by_client.get(previous.client) == lease.address
        ):
            del self._by_client[previous.client]
        old_address = self._by_client.get(lease.client)
        if (
            old_address is not None
            and old_address != lease.address
            and lease.state is not LeaseState.DECLINED
        ):
            # A client holds one address: moving it releases the other (a DECLINE of
            # another address is no move).
            old = self._by_address[old_address]
            if old.state is LeaseState.BOUND:
                self._by_address[old_address] = replace(old, state=LeaseState.RELEASED)
        self._by_address[lease.address] = lease
        if lease.state is not LeaseState.DECLINED:
            self._by_client[lease.client] = lease.address

    def remove(self, address: int) -> None:
        """The address's record was deleted (an operator's doing; the server never deletes)."""
        lease = self._by_address.pop(address, None)
        if lease is not None and self._by_client.get(lease.client) == address:
            del self._by_client[lease.client]

    def reset(self, leases: Iterable[Lease]) -> None:
        """Start over from a whole table (a changefeed's Reset), applied in the given order."""
        self._by_address.clear()
        self._by_client.clear()
        for lease in leases:
            self.apply(lease)

    def expired(self, now: float) -> list[Lease]:
        """Bound leases past their end, as the EXPIRED records that would say so. Nothing
        changes here: the records are committed like any other, then applied."""
        return [
            replace(lease, state=LeaseState.EXPIRED)
            for lease in self._by_address.values()
            if lease.state is LeaseState.BOUND and lease.expires <= now
        ]

    def count_active(self, addresses: Iterable[int], now: float) -> int:
        return sum(1 for a in addresses if (lease := self._by_address.get(a)) and lease.active(now))


def _free_for(lease: Lease | None, client: bytes, now: float) -> bool:
    if lease is None or not lease.active(now):
        return True
    return lease.client == client and lease.state is _BOUND


class LeaseView:
    """The committed table with the server's decisions in flight laid over it.

    Reads answer as if every pending record had been applied to the table in the
    order it was decided (which is the order of its records in the log): the latest
    pending record of an address hides the committed one, and a client that wrote a
    record for another address since no longer holds a bound lease on the old one.
    The committed table itself is never touched here.
    """

    def __init__(self, table: LeaseTable | None = None) -> None:
        self.table = table if table is not None else LeaseTable()
        # address -> (sequence, record) in flight, in the order decided; committed ones come
        # before every sequence number
        self._pending: dict[int, list[tuple[int, Lease]]] = {}
        self._clients: dict[bytes, list[tuple[int, Lease]]] = {}  # its non-DECLINED ones
        self._settling: deque[tuple[int, Lease]] = deque()  # committed, not yet in the table
        self._seq = 0

    # -- the overlay --------------------------------------------------------------------

    def add(self, lease: Lease) -> None:
        """A decision whose record is about to be appended."""
        self._seq += 1
        entry = (self._seq, lease)
        self._pending.setdefault(lease.address, []).append(entry)
        if lease.state is not _DECLINED:
            self._clients.setdefault(lease.client, []).append(entry)

    def committed(self, lease: Lease, lsn: int) -> None:
        """``lease``'s record committed as record ``lsn``: it leaves the overlay once the
        committed table has been brought to that record."""
        if self.table.lsn >= lsn:
            self._drop(lease)
        else:
            self._settling.append((lsn, lease))

    def abandon(self, lease: Lease) -> None:
        """``lease``'s record will not commit under this node's lease (or was never
        appended): nobody was told of it."""
        self._drop(lease)

    def caught_up(self) -> None:
        """The committed table moved on (the changefeed applied records up to its lsn)."""
        settling, lsn = self._settling, self.table.lsn
        while settling and settling[0][0] <= lsn:
            self._drop(settling.popleft()[1])

    def pending(self) -> int:
        return sum(len(stack) for stack in self._pending.values())

    def _drop(self, lease: Lease) -> None:
        stack = self._pending.get(lease.address)
        if stack is not None:
            _remove_identical(stack, lease)
            if not stack:
                del self._pending[lease.address]
        mine = self._clients.get(lease.client)
        if mine is not None:
            _remove_identical(mine, lease)
            if not mine:
                del self._clients[lease.client]

    # -- reads ----------------------------------------------------------------------------

    def __len__(self) -> int:
        if not self._pending:
            return len(self.table)
        return len(self.table) + sum(1 for a in self._pending if self.table.get(a) is None)

    def __iter__(self) -> Iterator[Lease]:
        if not self._pending:
            yield from self.table
            return
        for address in self.table.addresses():
            lease = self.get(address)
            if lease is not None:
                yield lease
        for address in self._pending:
            if self.table.get(address) is None:
                lease = self.get(address)
                if lease is not None:
                    yield lease

    def get(self, address: int) -> Lease | None:
        if not self._pending:
            return self.table.get(address)
        stack = self._pending.get(address)
        seq, lease = stack[-1] if stack else (0, self.table.get(address))
        if lease is not None and lease.state is _BOUND:
            mine = self._clients.get(lease.client)
            if mine is not None:
                # A record of this client for another address since moved it: as apply()
                # would, that released this one.
                for later, other in reversed(mine):
                    if later <= seq:
                        break
                    if other.address != address:
                        return replace(lease, state=_RELEASED)
        return lease

    def of_client(self, client: bytes) -> Lease | None:
        mine = self._clients.get(client)
        if mine is not None:  # its latest record that points it at an address
            seq, lease = mine[-1]
        else:
            seq, held = 0, self.table.of_client(client)
            if held is None or not self._pending:
                return held
            lease = held
        stack = self._pending.get(lease.address)
        if not stack:
            return lease
        for later, other in reversed(stack):
            if later <= seq:
                break
            if other.client != client:
                return None  # another client's record there since took it (as apply() does)
        return stack[-1][1]  # the latest record there: its own (a DECLINE leaves it pointing)

    def is_free_for(self, address: int, client: bytes, now: float) -> bool:
        if not self._pending:
            return self.table.is_free_for(address, client, now)
        return _free_for(self.get(address), client, now)

    def expired(self, now: float, limit: int) -> list[Lease]:
        """At most ``limit`` bound leases past their end as EXPIRED records, as the view
        sees them (a lease renewed in flight is not expired, one expired in flight is not
        listed again)."""
        out: list[Lease] = []
        for lease in self:
            if lease.state is _BOUND and lease.expires <= now:
                out.append(replace(lease, state=LeaseState.EXPIRED))
                if len(out) >= limit:
                    break
        return out

    def count_active(self, addresses: Iterable[int], now: float) -> int:
        return sum(1 for a in addresses if (lease := self.get(a)) and lease.active(now))


def _remove_identical(stack: list[tuple[int, Lease]], lease: Lease) -> None:
    for i, (_, entry) in enumerate(stack):
        if entry is lease:
            del stack[i]
            return


# -- the state log's value of a lease ------------------------------------------------------


def address_text(address: int) -> str:
    """The state key of an address: its dotted quad (``str(IPv4Address)`` costs ~1 µs)."""
    return f"{address >> 24}.{(address >> 16) & 255}.{(address >> 8) & 255}.{address & 255}"


def address_of(text: str) -> int:
    parts = text.split(".")
    if len(parts) != 4 or not all(p.isdigit() and len(p) <= 3 and int(p) < 256 for p in parts):
        raise CorruptRecord(f"not an address: {text[:32]!r}")
    a, b, c, d = map(int, parts)
    return a << 24 | b << 16 | c << 8 | d


def lease_value(lease: Lease) -> tuple[Any, ...]:
    """The value of ``lease``'s record in the state log (the key is its address)."""
    return (
        VALUE_VERSION, lease.client, lease.hwaddr, lease.subnet, int(lease.state),
        lease.starts, lease.expires, lease.hostname,
    )  # fmt: skip


def lease_from_state_untrusted(key: str, value: Any) -> Lease:
    """A lease from a state record (written by this plugin, on this node or another one);
    :class:`CorruptRecord` on anything unexpected, so a bad record costs one lease."""
    if not isinstance(value, list | tuple) or len(value) != 8 or value[0] != VALUE_VERSION:
        raise CorruptRecord("state value of unknown shape or version")
    _, client, hwaddr, subnet, state, starts, expires, hostname = value
    if not (
        isinstance(client, bytes)
        and len(client) <= MAX_CLIENT
        and isinstance(hwaddr, bytes)
        and len(hwaddr) <= 16
        and isinstance(subnet, str)
        and len(subnet) <= MAX_TEXT
        and isinstance(state, int)
        and state in LeaseState._value2member_map_
        and isinstance(starts, int | float)
        and isinstance(expires, int | float)
        and isinstance(hostname, str)
        and len(hostname) <= MAX_TEXT
    ):
        raise CorruptRecord("state value with fields of the wrong type")
    return Lease(
        address_of(key), client, hwaddr, subnet, LeaseState(state), float(starts),
        float(expires), hostname,
    )  # fmt: skip


# -- the journal of earlier releases (read once, for the import) ---------------------------


def encode_lease(lease: Lease) -> bytes:
    """The msgpack payload of one record of the old journal."""
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
