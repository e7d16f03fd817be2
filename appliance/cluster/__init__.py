"""The cluster: identities and enrolment, authenticated peer transport, discovery, site status.

Sans-IO cores (explicit ``now``, no sockets, no clock, no event loop):
:mod:`.pki` (certificates and revocation), :mod:`.jointoken` (join tokens),
:mod:`.wire` (framing and message validation), :mod:`.session` (the peer
protocol: version handshake, keepalives), :mod:`.peers` (the peer table,
liveness and reconnection backoff).

Trio shells: :mod:`.files` (identity files on disk), :mod:`.authority`
(enrolment decisions of a CA holder), :mod:`.transport` (TLS over trio),
:mod:`.discovery` (python-zeroconf, bridged from its thread),
:mod:`.service` (the cluster service of a node). See docs/cluster.md.
"""
