#!/bin/sh
# Buildroot runs this on the finished target tree, before the root filesystem
# image is made (BR2_ROOTFS_POST_BUILD_SCRIPT): $1 is TARGET_DIR, $2 the board
# from BR2_ROOTFS_POST_SCRIPT_ARGS.
#
# The root filesystem becomes a read-only squashfs written to slot A and B
# alike: what must change at run time lives on the data partition, /data.
# The Debian image (image/customize.sh) makes the same links.
set -eu

TARGET_DIR=${1:?post-build.sh: TARGET_DIR expected as first argument}

# Mount points of the data partition (data.mount) and the ESP (boot-efi.mount).
mkdir -p "$TARGET_DIR/data" "$TARGET_DIR/boot/efi"

# `rackboot` reads and `rackboot setup` writes /etc/rackboot/rackboot.toml, and
# setup writes the network's files beside it (docs/setup.md), which
# systemd-networkd reads through /etc/systemd/network; TFTP and HTTP boot serve
# /srv/rackboot/{tftp,http}. All are links into the data partition (its
# directories made by tmpfiles.d).
rm -rf "$TARGET_DIR/etc/rackboot" "$TARGET_DIR/etc/systemd/network" "$TARGET_DIR/srv/rackboot"
mkdir -p "$TARGET_DIR/etc/systemd" "$TARGET_DIR/srv"
ln -s /data/etc/rackboot "$TARGET_DIR/etc/rackboot"
ln -s /etc/rackboot/network "$TARGET_DIR/etc/systemd/network"
ln -s /data/srv/rackboot "$TARGET_DIR/srv/rackboot"

# The firmware version `rackboot firmware` compares bundles with: Rackboot's
# own (python-rackboot), as its installed metadata says.
set -- "$TARGET_DIR"/usr/lib/python3*/site-packages/rackboot-*.dist-info/METADATA
version=$(sed -n 's/^Version: //p' "$1")
mkdir -p "$TARGET_DIR/usr/lib/rackboot/health.d"
printf '%s\n' "${version:?post-build.sh: no Version in $1}" >"$TARGET_DIR/usr/lib/rackboot/firmware-version"

# systemd-bless-boot would bless any boot that reaches boot-complete.target:
# `rackboot firmware health` (rackboot-firmware-health.service) decides instead.
mkdir -p "$TARGET_DIR/etc/systemd/system"
ln -sf /dev/null "$TARGET_DIR/etc/systemd/system/systemd-bless-boot.service"
