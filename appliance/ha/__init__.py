"""Active/standby for a rack: the lease-backed election, fencing, the virtual IP.

Sans-IO cores (explicit ``now``, messages in and out, a next deadline):
``schema`` (the ``[ha]`` section and timing rules), ``messages`` (the
election's wire format), ``envelope`` (signed datagrams), ``acceptor`` and
``proposer`` (PaxosLease-style majority lease), ``election`` (one node's
proposer and acceptor together), ``fence`` (the guard before outward effects).
Trio shells: ``runner`` (drives an election over a transport), ``udp``,
``vip``, ``service`` (roles, control commands, signals), ``witness``,
``etcd`` (the same interface on etcd). See docs/ha.md.
"""
