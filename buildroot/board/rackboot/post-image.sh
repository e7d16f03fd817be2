#!/bin/sh
# Buildroot runs this once the root filesystem image is made
# (BR2_ROOTFS_POST_IMAGE_SCRIPT): $1 is BINARIES_DIR, $2 the board from
# BR2_ROOTFS_POST_SCRIPT_ARGS (x86_64 or rpi4). It lays out the boot
# partition's files for both slots and runs genimage with the board's
# genimage.cfg, which writes the same rootfs.squashfs into slot A and slot B.
set -eu

BINARIES_DIR=${1:?post-image.sh: BINARIES_DIR expected as first argument}
BOARD=${2:-}
BOARD_DIR=$(dirname "$0")

# Kernel command line shared by both boards and slots: the slot is a
# read-only squashfs; rackboot.slot tells the running system which one it is.
ROOT_OPTIONS="ro rootwait rootfstype=squashfs"

# The GPT partition UUIDs of x86_64/genimage.cfg's root slots.
X86_64_SLOT_A_UUID=7261636b-626f-6f74-8000-00000000000a
X86_64_SLOT_B_UUID=7261636b-626f-6f74-8000-00000000000b
# rpi4/genimage.cfg's MBR disk signature: slot A is partition 2, B is 3.
RPI4_DISK_SIGNATURE=7261636b

# The boot entries, kernels and versions of both slots as `rackboot firmware`
# reads and changes them (appliance/firmware/slots.py, docs/updates.md; the
# Debian image's are image/layout.py's esp_files): an entry per slot named
# rackboot-GENERATION-SLOT.conf, the newest generation that is not bad boots
# (systemd-boot's own order under `default rackboot-*`), each slot's kernel in
# rackboot/SLOT/vmlinuz and its version in rackboot/SLOT/version. At first both
# slots hold the image, good; A has the newer generation, so A boots.
X86_64_FACTORY="a:2 b:1"

x86_64_boot_files() {
	esp="$BINARIES_DIR/efi-part"
	version=$(cat "${TARGET_DIR:?post-image.sh: run by Buildroot (TARGET_DIR unset)}/usr/lib/rackboot/firmware-version")
	# systemd-boot (BR2_PACKAGE_SYSTEMD_BOOT) installed EFI/BOOT/bootx64.efi
	# and a sample entry; the entries are ours, one per slot.
	rm -rf "$esp/loader/entries" "$esp/rackboot"
	mkdir -p "$esp/loader/entries"
	for factory in $X86_64_FACTORY; do
		slot=${factory%%:*}
		mkdir -p "$esp/rackboot/$slot"
		cp "$BINARIES_DIR/bzImage" "$esp/rackboot/$slot/vmlinuz"
		echo "$version" >"$esp/rackboot/$slot/version"
		x86_64_entry "$slot" "$version" >"$esp/loader/entries/rackboot-${factory#*:}-$slot.conf"
	done
	# No menu, no command line editing (it would give a root shell to anyone
	# at the console); the pattern matches both slots' entries, whose names
	# choose (a pattern naming one slot would boot it even when bad).
	cat >"$esp/loader/loader.conf" <<-CONF
		default rackboot-*
		timeout 0
		editor no
		console-mode keep
	CONF
}

x86_64_entry() {
	case "$1" in
	a) partuuid=$X86_64_SLOT_A_UUID ;;
	b) partuuid=$X86_64_SLOT_B_UUID ;;
	esac
	cat <<-ENTRY
		title   Rackboot $2 (slot $1)
		version $2
		linux   /rackboot/$1/vmlinuz
		options root=PARTUUID=$partuuid $ROOT_OPTIONS console=tty1 console=ttyS0,115200 rackboot.slot=$1
	ENTRY
}

rpi4_boot_files() {
	boot="$BINARIES_DIR/rackboot-boot"
	firmware="$BINARIES_DIR/rpi-firmware"
	rm -rf "$boot"
	mkdir -p "$boot"
	cp "$firmware/start4.elf" "$firmware/fixup4.dat" "$boot/"
	partition=2
	for slot in a b; do
		mkdir -p "$boot/slot-$slot"
		cp "$BINARIES_DIR/Image" "$BINARIES_DIR/bcm2711-rpi-4-b.dtb" "$boot/slot-$slot/"
		cp -r "$firmware/overlays" "$boot/slot-$slot/"
		echo "root=PARTUUID=$RPI4_DISK_SIGNATURE-0$partition $ROOT_OPTIONS console=tty1 console=ttyAMA0,115200 rackboot.slot=$slot" \
			>"$boot/slot-$slot/cmdline.txt"
		partition=$((partition + 1))
	done
	# config.txt boots slot A; tryboot.txt, read instead only on the one boot
	# after `reboot '0 tryboot'`, boots slot B. Any later reboot returns to
	# config.txt, so a slot that never commits itself is left automatically.
	cp "$BOARD_DIR/rpi4/config.txt" "$boot/config.txt"
	sed 's|^os_prefix=slot-a/$|os_prefix=slot-b/|' "$BOARD_DIR/rpi4/config.txt" >"$boot/tryboot.txt"
	if ! grep -qx 'os_prefix=slot-b/' "$boot/tryboot.txt"; then
		echo "post-image.sh: $BOARD_DIR/rpi4/config.txt lacks the line os_prefix=slot-a/" >&2
		exit 1
	fi
}

case "$BOARD" in
x86_64) x86_64_boot_files ;;
rpi4) rpi4_boot_files ;;
*)
	echo "post-image.sh: board '$BOARD' unknown: set BR2_ROOTFS_POST_SCRIPT_ARGS to x86_64 or rpi4" >&2
	exit 1
	;;
esac

GENIMAGE_TMP="${BUILD_DIR:?post-image.sh: run by Buildroot (BUILD_DIR unset)}/genimage.tmp"
rm -rf "$GENIMAGE_TMP"
genimage \
	--rootpath "${TARGET_DIR:?post-image.sh: run by Buildroot (TARGET_DIR unset)}" \
	--tmppath "$GENIMAGE_TMP" \
	--inputpath "$BINARIES_DIR" \
	--outputpath "$BINARIES_DIR" \
	--config "$BOARD_DIR/$BOARD/genimage.cfg"
