"""The election's messages and their wire format (sans-IO).

A message is a frozen dataclass; on the wire it is one msgpack map with
``"t"`` naming the type and one key per field. :func:`decode_untrusted`
caps the size before decoding, refuses extension types and non-string
keys, and checks every declared field's type (extra keys are ignored: a
newer peer may add some). Who sent a message is never a field: the signed
envelope proves it (see :mod:`appliance.ha.envelope`).

Every message carries ``group`` (the rack: one witness may vote for several
racks) and ``req``, the proposer's number for the round, so a late or
duplicated answer to an older round is recognised and ignored.

The map may also carry ``"crl"``: the number of the sender's revocation list,
which the envelope states so a receiver with a newer list can send it (see
:mod:`appliance.ha.udp`). It is not a field of any message (the election
never sees it), and senders older than it leave it out: their decoders ignore
it like any extra key. Likewise ``"sv"`` and ``"ep"``: the sender's software
version and the range of election protocols it speaks ([lo, hi]), which the shell
judges (appliance/compat.py) before the election sees the message.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import msgpack

MAX_MESSAGE = 1024  # the largest message is ~200 bytes
MAX_TEXT = 64  # node ids, reasons, group names


@dataclass(frozen=True)
class Prepare:
    """Phase 1: may I (the sender) own the lease at ballot ``(ballot, sender)``?"""

    TYPE: ClassVar[str] = "prepare"
    group: str
    req: int
    ballot: int
    members: str  # digest of the proposer's membership (appliance/ha/membership.py)
    appliances: list[str]  # the proposer's appliances: a witness tells racks apart by them
    force: bool = False  # an operator's promote --force: ineligibility does not refuse it


@dataclass(frozen=True)
class Promise:
    """An acceptor's answer to :class:`Prepare`.

    ``ok`` false carries why: ``busy`` (``owner`` holds a live lease for ``left``
    more seconds), ``outbid`` (a higher ballot ``promised_n``/``promised_by`` was
    promised), ``restarting`` (no votes for ``left`` more seconds), ``mismatch`` (another
    membership digest than the acceptor's), ``stranger`` (the sender is not one of the
    rack's appliances).
    """

    TYPE: ClassVar[str] = "promise"
    group: str
    req: int
    ballot: int
    ok: bool
    why: str
    owner: str  # the live lease's owner ("" if none)
    owner_epoch: int
    left: float
    known_epoch: int  # the highest epoch this acceptor ever accepted
    amnesic: bool  # a diskless acceptor that restarted and has not learnt the epoch since
    promised_n: int
    promised_by: str
    members: str  # the membership digest the acceptor judged by
    # The appliances this acceptor holds ineligible (the last proposal or release it took
    # named them): a new holder keeps declaring them until they have caught up with it.
    ineligible: list[str] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Propose:
    """Phase 2: grant me a lease of ``lease`` seconds at ``ballot`` with fencing token ``epoch``."""

    TYPE: ClassVar[str] = "propose"
    group: str
    req: int
    ballot: int
    epoch: int
    lease: float
    members: str
    appliances: list[str]
    # Appliances the holder declares ineligible to take over (a standby that stopped
    # acknowledging the state log): acceptors that accept this refuse them until a later
    # proposal clears them (docs/ha.md, "Replication").
    ineligible: list[str] = dataclasses.field(default_factory=list)
    force: bool = False


@dataclass(frozen=True)
class Accepted:
    """An acceptor's answer to :class:`Propose` (``why`` as in :class:`Promise`)."""

    TYPE: ClassVar[str] = "accepted"
    group: str
    req: int
    ballot: int
    ok: bool
    why: str
    owner: str
    left: float
    known_epoch: int
    promised_n: int
    promised_by: str
    members: str
    # The answering appliance would take the lease if handed it (not in maintenance): a
    # graceful hand-over goes only to one that would. A witness always says so.
    available: bool = True


@dataclass(frozen=True)
class Release:
    """The holder gives its lease up (demote, maintenance, shutdown) after it stopped acting."""

    TYPE: ClassVar[str] = "release"
    group: str
    req: int
    epoch: int
    # The holder's ineligible appliances as it leaves (``stated``: an older sender says
    # nothing, which changes nothing), so one that caught up may take over at once.
    stated: bool = False
    ineligible: list[str] = dataclasses.field(default_factory=list)
    # A graceful hand-over names the successor: only it tries at once (others would race
    # it for the lease), with a ballot above ``ballot``, the highest the releasing holder
    # used (the acceptors promised it: a lower one would be outbid and retried later).
    to: str = ""
    ballot: int = 0


@dataclass(frozen=True)
class Handover:
    """An operator asked the sender to become active: the holder of ``epoch`` releases and
    holds back. Naming the epoch makes a replay stale once the lease changed hands."""

    TYPE: ClassVar[str] = "handover"
    group: str
    req: int
    epoch: int


Message = Prepare | Promise | Propose | Accepted | Release | Handover
TYPES: dict[str, type] = {
    cls.TYPE: cls for cls in (Prepare, Promise, Propose, Accepted, Release, Handover)
}
_PYTHON_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list[str]": list}
MAX_LIST = 17  # node ids of a rack's appliances (16 peers and the proposer)
MAX_SECONDS = 3600.0  # durations on the wire: a lease, what is left of one
CRL_KEY = "crl"  # the sender's revocation list number: the envelope's, not a message field
VERSION_KEY, PROTOCOLS_KEY = "sv", "ep"  # the sender's software version, election protocols
_FIELDS = {
    cls: [(f.name, _PYTHON_TYPES[str(f.type)]) for f in dataclasses.fields(cls)]
    for cls in TYPES.values()
}
# Fields with a default may be absent: an older sender (rolling update) does not send them.
OPTIONAL = {
    cls: {f.name for f in dataclasses.fields(cls)
          if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    for cls in TYPES.values()
}  # fmt: skip


class BadMessage(Exception):
    """Bytes that are not an election message; counted and dropped by the shell under
    ``kind``: ``malformed`` (not a signed datagram), ``certificate``, ``signature``,
    ``message`` (signed, but not a valid message), ``revocation-list`` (signed, carrying a
    list the CA did not sign), ``rate-limited``."""

    def __init__(self, text: str, kind: str = "message") -> None:
        super().__init__(text)
        self.kind = kind


class Stated(NamedTuple):
    """What the sender stated beside the message: its revocation list number (None: none),
    and, unchecked (None when absent), its software version and election protocols."""

    crl: int | None = None
    version: Any = None
    protocols: Any = None


def encode(message: Message, *, crl: int | None = None,
           speaks: tuple[str, list[int]] | None = None) -> bytes:  # fmt: skip
    """``crl``: the sender's revocation list number; ``speaks``: its software version and
    election protocol range; both stated beside the message's fields."""
    body = {"t": message.TYPE, **dataclasses.asdict(message)}
    if crl is not None:
        body[CRL_KEY] = crl
    if speaks is not None:
        body[VERSION_KEY], body[PROTOCOLS_KEY] = speaks
    return msgpack.packb(body, use_bin_type=True)


def _no_ext(code: int, data: bytes) -> Any:
    raise BadMessage(f"msgpack extension type {code} is not allowed")


def decode_untrusted(data: bytes) -> Message:
    return decode_with_crl_untrusted(data)[0]


def decode_with_crl_untrusted(data: bytes) -> tuple[Message, int | None]:
    """The message and the revocation list number its sender stated (None: not stated)."""
    message, stated = decode_stated_untrusted(data)
    return message, stated.crl


def decode_stated_untrusted(data: bytes) -> tuple[Message, Stated]:
    """The message and what its sender stated beside it."""
    if len(data) > MAX_MESSAGE:
        raise BadMessage(f"message of {len(data)} bytes exceeds the cap of {MAX_MESSAGE}")
    try:
        raw = msgpack.unpackb(
            data, raw=False, strict_map_key=True, ext_hook=_no_ext,
            max_array_len=MAX_LIST, max_map_len=32, max_str_len=256, max_bin_len=0,
        )  # fmt: skip
    except BadMessage:
        raise
    except Exception as exc:  # msgpack raises several types
        raise BadMessage(f"not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise BadMessage("message is not a map")
    cls = TYPES.get(raw.get("t")) if isinstance(raw.get("t"), str) else None
    if cls is None:
        raise BadMessage(f"unknown message type {str(raw.get('t'))[:MAX_TEXT]!r}")
    values = {}
    for name, kind in _FIELDS[cls]:
        if name in OPTIONAL.get(cls, ()) and name not in raw:
            continue  # a field newer than the sender: its default
        values[name] = _field(cls.TYPE, name, kind, raw.get(name))
    crl = raw.get(CRL_KEY)
    stated = Stated(
        None if crl is None else _field(raw["t"], CRL_KEY, int, crl),
        raw.get(VERSION_KEY), raw.get(PROTOCOLS_KEY),
    )  # fmt: skip
    return cls(**values), stated


def _field(message: str, name: str, kind: type, value: Any) -> Any:
    """One declared field, type- and range-checked; bool is never an int, and an int in a
    float field is converted and range-checked like a float."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadMessage(f"{message}: field {name!r} missing or of the wrong type")
    if kind is str and len(value) > MAX_TEXT:
        raise BadMessage(f"{message}: field {name!r} longer than {MAX_TEXT}")
    if kind is list and (
        len(value) > MAX_LIST or not all(isinstance(v, str) and len(v) <= MAX_TEXT for v in value)
    ):
        raise BadMessage(f"{message}: field {name!r} is not a list of up to {MAX_LIST} names")
    if kind is float and not (0.0 <= value <= MAX_SECONDS):  # NaN fails too
        raise BadMessage(f"{message}: field {name!r} out of range")
    if kind is int and not 0 <= value < 2**63:
        raise BadMessage(f"{message}: field {name!r} out of range")
    return value
