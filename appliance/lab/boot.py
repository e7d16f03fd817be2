"""What every netbooting VM of the lab, the tests and the benchmarks is told to boot: the kernel
command line and the TFTP script that chains a BIOS iPXE to its HTTP script."""

# panic=-1 (+ QEMU's -no-reboot where nothing powers the VM): a dying installer ends QEMU.
CMDLINE = "console=ttyS0 panic=-1 quiet"

# BIOS: the ROM's iPXE gets this script by TFTP; it chains to the machine's HTTP script.
TFTP_SCRIPT = """#!ipxe
echo RACKBOOT-TEST boot.ipxe over TFTP on ${platform}
chain http://${next-server}/boot/${net0/mac:hexhyp}.ipxe
"""
