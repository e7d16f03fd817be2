"""HTTP boot plugin: an HTTP/1.1 server (h11 on trio) for iPXE scripts, boot files and
the installers' events API.

``urlpath``, ``ranges``, ``conditional``, ``identity``, ``script``, ``events`` and
``messages`` are sans-IO (bytes, text and an explicit ``now`` in, decisions out);
``connection``, ``sendfile`` and ``server`` are the trio shell. See docs/httpboot.md.
"""
