"""Hypothesis strategies for DHCP messages and raw packets, shared by the codec tests."""

from __future__ import annotations

from ipaddress import IPv4Address

from hypothesis import strategies as st

from plugins.dhcp.codec import MAGIC_COOKIE, Message
from plugins.dhcp.options import VALUE_LENGTHS, Opt

u8, u16, u32 = st.integers(0, 255), st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1)
addresses = st.one_of(st.just(0), u32).map(IPv4Address)
# Known codes often, any settable code sometimes (52 belongs to the codec; 0 and 255 are framing).
codes = st.one_of(
    st.sampled_from([int(c) for c in Opt if c not in (Opt.PAD, Opt.END, Opt.OVERLOAD)]),
    st.integers(1, 254).filter(lambda c: c != Opt.OVERLOAD),
)


def sized(low: int, high: int, step: int = 1) -> st.SearchStrategy[bytes]:
    return st.integers(low // step, high // step).flatmap(
        lambda n: st.binary(min_size=n * step, max_size=n * step)
    )


def option_value(code: int, max_size: int = 300) -> st.SearchStrategy[bytes]:
    """A value parse_untrusted accepts for ``code``: accessor-decoded options get valid lengths."""
    if code == Opt.MESSAGE_TYPE:
        return st.integers(1, 18).map(lambda n: bytes([n]))
    if code in VALUE_LENGTHS:
        low, high, step = VALUE_LENGTHS[code]
        return sized(low, min(high, max(low, max_size)), step)
    return st.one_of(st.binary(max_size=24), st.binary(max_size=max_size))


def option_maps(max_options: int = 12, max_size: int = 300) -> st.SearchStrategy[dict]:
    return st.lists(codes, unique=True, max_size=max_options).flatmap(
        lambda cs: st.fixed_dictionaries({c: option_value(c, max_size) for c in cs})
    )


def big_option_maps(codes: st.SearchStrategy[int] = codes) -> st.SearchStrategy[dict]:
    """53 plus a few large opaque options: enough to need overload and RFC 3396 splitting."""
    big = st.integers(0, 400).flatmap(lambda n: st.binary(min_size=n, max_size=n))
    free = codes.filter(lambda c: c not in VALUE_LENGTHS)
    return st.lists(free, unique=True, min_size=1, max_size=6).flatmap(
        lambda cs: st.fixed_dictionaries(
            {Opt.MESSAGE_TYPE: option_value(Opt.MESSAGE_TYPE)} | {c: big for c in cs}
        )
    )


def text_field(size: int) -> st.SearchStrategy[bytes]:
    # parse strips trailing NULs (build pads with them), so a value never ends in one
    return st.binary(max_size=size).map(lambda b: b.rstrip(b"\0"))


def messages(options: st.SearchStrategy[dict] | None = None) -> st.SearchStrategy[Message]:
    return st.builds(
        Message,
        op=st.sampled_from([1, 2]),
        htype=u8,
        hlen=st.integers(0, 16),
        hops=u8,
        xid=u32,
        secs=u16,
        flags=u16,
        ciaddr=addresses,
        yiaddr=addresses,
        siaddr=addresses,
        giaddr=addresses,
        chaddr=st.binary(min_size=16, max_size=16),
        sname=st.one_of(st.just(b""), text_field(64)),
        file=st.one_of(st.just(b""), text_field(128)),
        options=options if options is not None else option_maps(),
    )


def tlv_lists() -> st.SearchStrategy[list[tuple[int, bytes]]]:
    """Options as (code, value) instances: free codes may repeat, accessor-decoded ones do not."""
    free = st.lists(
        st.tuples(codes.filter(lambda c: c not in VALUE_LENGTHS), st.binary(max_size=255)),
        max_size=10,
    )
    ruled = st.lists(st.sampled_from(sorted(VALUE_LENGTHS)), unique=True, max_size=3).map(
        lambda cs: [st.tuples(st.just(c), option_value(c, 255)) for c in cs]
    )
    ruled = ruled.flatmap(lambda items: st.tuples(*items).map(list))
    return st.tuples(free, ruled).flatmap(lambda pair: st.permutations(pair[0] + pair[1]))


@st.composite
def raw_packets(draw, tlvs: st.SearchStrategy[list[tuple[int, bytes]]] | None = None) -> bytes:
    """Valid packets crafted byte by byte, not by our build: PADs, repeats, END or none."""
    head = bytearray(draw(st.binary(min_size=236, max_size=236)))
    head[0], head[2] = draw(st.sampled_from([1, 2])), draw(st.integers(0, 16))  # op, hlen
    body = bytearray(MAGIC_COOKIE)
    for code, value in draw(tlvs if tlvs is not None else tlv_lists()):
        body += bytes(draw(st.integers(0, 2)))  # PADs
        body += bytes((code, len(value))) + value
    if draw(st.booleans()):  # END and padding, or neither (tolerated)
        body += b"\xff" + bytes(draw(st.integers(0, 64)))
    return bytes(head + body)
