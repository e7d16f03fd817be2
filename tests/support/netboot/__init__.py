"""A real VM netbooting from a Rackboot node in a namespace lab (tests/real/test_netboot.py).

* :mod:`.debs`: Debian's kernel and static busybox, fetched with ``apt-get download``
  and unpacked into a test cache directory (never installed system-wide).
* :mod:`.initrd`: the installer the VM boots: busybox, the NIC's kernel modules
  and a short ``/init`` that posts the ``installed`` event and powers off,
  packed as a gzipped ``newc`` cpio archive in Python.
* :mod:`.boot`: the kernel command line and the TFTP script every VM boots.
* :mod:`.vm`: QEMU (BIOS with the iPXE ROM of ``ipxe-qemu``, or OVMF) on a tap
  in a namespace of the lab, its serial console in a file, stopped by its PID.

docs/netboot-test.md describes the chain and the timings.
"""
