"""TFTP server plugin: packet codec, option negotiation, read transfers, confinement.

``packets``, ``negotiate`` and ``transfer`` are sans-IO cores (bytes and an explicit
``now`` in, datagrams, events and timers out); ``confine`` resolves client-requested
names against the served root on the filesystem. A trio shell binds the sockets,
feeds the cores and arms their timers.
"""
