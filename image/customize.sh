#!/bin/sh
# mmdebstrap's customize hook (image/build.py): Rackboot into the Debian root
# at $1. Environment: RACKBOOT_WHEELS (a directory: this checkout's wheel and its
# dependencies'),
# RACKBOOT_RELEASE_KEY (the public release key), RACKBOOT_VERSION,
# RACKBOOT_ROOT_PASSWORD (optional: a console login for test builds),
# RACKBOOT_OVERLAY (buildroot's rootfs overlay: the same units), RACKBOOT_IMAGE_DIR.
set -eu
root=${1:?customize.sh: the root directory}

# Rackboot in its own virtual environment, offline from the wheels image/build.py made
cp -r "$RACKBOOT_WHEELS" "$root/tmp/wheels"
chroot "$root" python3 -m venv /opt/rackboot
chroot "$root" /opt/rackboot/bin/pip install --quiet --no-cache-dir --disable-pip-version-check \
	--no-index --find-links /tmp/wheels rackboot
rm -r "$root/tmp/wheels"
ln -sf /opt/rackboot/bin/rackboot "$root/usr/bin/rackboot"

# The units shared with the Buildroot image (data.mount, rackboot.service with its
# capabilities, the first-boot setup on the serial console), then this image's own
cp -r "$RACKBOOT_OVERLAY/." "$root/"
cp -r "$RACKBOOT_IMAGE_DIR/rootfs/." "$root/"
mkdir -p "$root/data" "$root/boot/efi" "$root/usr/lib/rackboot/health.d"
# fstab mounts /data and /boot/efi; Buildroot's mount units would mount them again
rm -f "$root/usr/lib/systemd/system/data.mount" "$root/usr/lib/systemd/system/boot-efi.mount"
sed -i '/^enable data.mount$/d; /^enable boot-efi.mount$/d' \
	"$root/usr/lib/systemd/system-preset/80-rackboot.preset"
rm -rf "$root/etc/rackboot" "$root/srv/rackboot" "$root/etc/systemd/network"
ln -s /data/etc/rackboot "$root/etc/rackboot"
ln -s /data/srv/rackboot "$root/srv/rackboot"
# `rackboot setup` writes the network's files beside rackboot.toml (docs/setup.md)
ln -s /etc/rackboot/network "$root/etc/systemd/network"
printf '%s\n' "$RACKBOOT_RELEASE_KEY" >"$root/usr/lib/rackboot/release-keys"
printf '%s\n' "$RACKBOOT_VERSION" >"$root/usr/lib/rackboot/firmware-version"
echo rackboot >"$root/etc/hostname"
: >"$root/etc/machine-id"
# systemd-bless-boot would bless any boot that reaches boot-complete.target:
# `rackboot firmware health` decides instead, on both loaders' counters
ln -sf /dev/null "$root/etc/systemd/system/systemd-bless-boot.service"
chroot "$root" systemctl preset-all >/dev/null 2>&1 || true
chroot "$root" systemctl enable systemd-networkd rackboot.service rackboot-firmware-health.service
if [ -n "${RACKBOOT_ROOT_PASSWORD:-}" ]; then
	echo "root:$RACKBOOT_ROOT_PASSWORD" | chroot "$root" chpasswd
fi

# The initrd must mount a squashfs root
echo squashfs >>"$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all >/dev/null
