#!/bin/sh
# Buildroot runs this on the finished target tree, before the root filesystem
# image is made (BR2_ROOTFS_POST_BUILD_SCRIPT): $1 is TARGET_DIR, $2 the board
# from BR2_ROOTFS_POST_SCRIPT_ARGS.
#
# The root filesystem becomes a read-only squashfs written to slot A and B
# alike: what must change at run time lives on the data partition, /data.
set -eu

TARGET_DIR=${1:?post-build.sh: TARGET_DIR expected as first argument}

# Mount point of the data partition (data.mount).
mkdir -p "$TARGET_DIR/data"

# `rackboot` reads and `rackboot setup` writes /etc/rackboot/rackboot.toml:
# the directory is a link into the data partition (made by tmpfiles.d).
rm -rf "$TARGET_DIR/etc/rackboot"
ln -s /data/etc/rackboot "$TARGET_DIR/etc/rackboot"
