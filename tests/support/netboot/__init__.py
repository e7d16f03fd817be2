"""A real VM netbooting from a Rackboot node in a namespace lab (tests/real/test_netboot.py).

The kernel, the installer, the boot script and the VM are the product's, shared with
``rackboot lab`` (appliance/lab/: debs, initrd, boot, vm); here only :mod:`.node`, the
single node the netboot tests boot from.

docs/netboot-test.md describes the chain and the timings.
"""
