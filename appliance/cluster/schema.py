"""The ``[cluster]`` configuration section."""

from __future__ import annotations

from appliance.schema import (
    Bool,
    Choice,
    Field,
    Float,
    Int,
    IPv4Address,
    List,
    Listener,
    Section,
    Str,
)  # fmt: skip

DEFAULT_PORT = 7470
PEER_PATTERN = r"[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}"

SECTION = Section(
    "cluster",
    doc=(
        "Appliances of one site: identities, authenticated peer links, mDNS discovery.\n"
        "Nothing listens until `rackboot cluster init` or `join` has given this node an\n"
        "identity (see docs/cluster.md)."
    ),
    fields={
        "enabled": Field(
            Choice("auto", "on", "off"),
            default="auto",
            doc="'auto': on once this node has a cluster identity; 'off' never; 'on' requires one.",
        ),
        "listen": Field(
            IPv4Address(),
            default="0.0.0.0",
            dev_default="127.0.0.1",
            doc="Address the peer transport (TLS 1.3, TCP) listens on.",
        ),
        "port": Field(
            Int(min=0, max=65535),
            default=DEFAULT_PORT,
            doc="TCP port of the peer transport (0: any free port, announced by mDNS).",
        ),
        "advertise": Field(
            Str(f"({PEER_PATTERN})?", "'' or a 'host:port' address", max_len=260),
            default="",
            doc="host:port other members dial to reach us ('' = the listen address, or every address when listening on 0.0.0.0).",
        ),
        "peers": Field(
            List(Str(PEER_PATTERN, "a 'host:port' peer address", max_len=260), max_items=64),
            default=(),
            doc="Static peers ('host:port') for routed sites where mDNS does not reach.",
        ),
        "mdns": Field(
            Bool(),
            default=True,
            dev_default=False,
            doc="Announce and browse _rackboot._tcp by mDNS (loopback cannot multicast: off in development).",
        ),
        "keepalive": Field(
            Float(min=0.05, max=60.0), default=1.0, doc="Seconds between keepalives on a peer link."
        ),
        "dead_after": Field(
            Float(min=0.2, max=600.0),
            default=3.0,
            doc="A peer silent this many seconds is marked down and its link closed.",
        ),
        "connect_timeout": Field(
            Float(min=0.1, max=120.0),
            default=5.0,
            doc="Seconds to connect and finish the TLS handshake with a peer.",
        ),
        "backoff_max": Field(
            Float(min=0.1, max=3600.0),
            default=30.0,
            doc="Longest wait between reconnection attempts (exponential from 0.5 s, jittered).",
        ),
        "max_message": Field(
            Int(min=4096, max=64 * 1024 * 1024),
            default=1024 * 1024,
            doc="Largest peer message accepted, in bytes (checked before reading it).",
        ),
        "token_ttl": Field(
            Float(min=60.0, max=30 * 86400.0),
            default=3600.0,
            doc="Seconds a join token stays valid.",
        ),
    },
    # Declared whether or not this node has an identity yet: a clash would only show
    # once it joins, when nobody is at the console.
    listeners=(Listener("tcp", port="port", addresses="listen", enabled="enabled"),),
)
