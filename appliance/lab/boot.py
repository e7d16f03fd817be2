"""What every netbooting VM of the lab, the tests and the benchmarks is told to boot: the kernel
command line and the TFTP script that chains a BIOS iPXE to its HTTP script."""

# panic=-1 (+ QEMU's -no-reboot where nothing powers the VM): a dying installer ends QEMU.
CMDLINE = "console=ttyS0 panic=-1 quiet"

# BIOS: the ROM's iPXE gets this script by TFTP; it chains to the machine's HTTP script.
TFTP_SCRIPT = """#!ipxe
echo RACKBOOT-TEST boot.ipxe over TFTP on ${platform}
chain http://${next-server}/boot/${net0/mac:hexhyp}.ipxe
"""


def boot_sections(http_root: str, tftp_root: str, *, address: str = "",
                  cmdline: str = CMDLINE) -> str:  # fmt: skip
    """``[tftp]`` and ``[httpboot]`` of a node such VMs boot from: the roots, ``address``
    to listen on ('': each section's default) and the default profile (``vmlinuz``,
    ``initrd.img``, ``cmdline``)."""
    listen = f'addresses = ["{address}"]\n' if address else ""
    return (
        f'[tftp]\n{listen}root = "{tftp_root}"\n'
        f'[httpboot]\n{listen}root = "{http_root}"\n'
        '[[httpboot.profiles]]\nname = "default"\nkernel = "vmlinuz"\n'
        f'initrd = ["initrd.img"]\ncmdline = "{cmdline}"\n'
    )
