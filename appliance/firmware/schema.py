"""The [firmware] section: trusted release keys and where the slots are (docs/updates.md)."""

from __future__ import annotations

from appliance.schema import Choice, Field, Float, List, Section, Str

# A release key as `rackboot firmware keygen` prints it: the raw Ed25519 key, base64.
PUBLIC_KEY_PATTERN = r"ed25519:[A-Za-z0-9+/]{43}="

FIRMWARE = Section(
    "firmware",
    doc="A/B firmware updates: which release keys sign bundles, where the slots are.",
    fields={
        "trusted_keys": Field(
            List(Str(PUBLIC_KEY_PATTERN, "a release key 'ed25519:' + 44 base64 characters")),
            default=(),
            doc="Release keys whose bundles `rackboot firmware update` installs "
            "(`rackboot firmware keygen` prints one), besides those of release_keys_file.",
        ),
        "release_keys_file": Field(
            Str(hint="an absolute path", pattern=r"/.*"),
            default="/usr/lib/rackboot/release-keys",
            doc="Release keys the image itself trusts, one a line (written by image/).",
        ),
        "board": Field(Choice("x86_64"), default="x86_64", doc="The board bundles must be for."),
        "esp": Field(
            Str(hint="an absolute directory path", pattern=r"/.*"),
            default="/boot/efi",
            doc="Where the EFI system partition (boot entries, kernels) is mounted.",
        ),
        "slot_a": Field(
            Str(hint="an absolute path", pattern=r"/.*"),
            default="/dev/disk/by-partlabel/rackboot-a",
            doc="Root slot A's partition (a file works too, for tests).",
        ),
        "slot_b": Field(
            Str(hint="an absolute path", pattern=r"/.*"),
            default="/dev/disk/by-partlabel/rackboot-b",
            doc="Root slot B's partition.",
        ),
        "loader": Field(
            Choice("auto", "systemd-boot", "grub"),
            default="auto",
            doc="Whose boot counter to read: systemd-boot's (UEFI) or GRUB's environment "
            "block (BIOS); auto: systemd-boot when /sys/firmware/efi exists. Updates write both.",
        ),
        "health_timeout": Field(
            Float(min=1.0, max=3600.0),
            default=300.0,
            doc="Seconds a slot on trial has to pass its health check after boot.",
        ),
        "health_dir": Field(
            Str(hint="an absolute directory path", pattern=r"/.*"),
            default="/usr/lib/rackboot/health.d",
            doc="Executables here must each exit 0 for a slot on trial to be marked good.",
        ),
        "reboot_command": Field(
            List(Str()),
            default=("systemctl", "reboot"),
            doc="How the appliance reboots into a new slot or back to the old one.",
        ),
    },
)
