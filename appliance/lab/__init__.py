"""``rackboot lab``: a virtual rack in network namespaces, built from this installation
(docs/lab.md). The pieces are shared with the real tests and the benchmarks: the
namespace lab (netns), ``rackboot run`` and ``rackboot witness`` processes (node, rack),
offline identities, and a QEMU VM that netboots Debian's kernel and a small installer
(debs, initrd, boot, vm)."""
