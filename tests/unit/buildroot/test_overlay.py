"""The root filesystem overlay's units agree with Rackboot: the configuration
path, the unit name setup starts, the first-boot dialog on the serial console."""

from __future__ import annotations

import configparser

from appliance.config import DEFAULT_CONFIG_PATH
from appliance.firmware.schema import FIRMWARE
from appliance.setup.system import UNIT
from tests.unit.buildroot.tree import REPOSITORY, TREE

UNITS = TREE / "board/rackboot/rootfs-overlay/usr/lib/systemd/system"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


def test_service_runs_rackboot_with_the_default_configuration():
    service = unit(f"{UNIT}.service")
    assert service["Service"]["ExecStart"].split() == [
        "/usr/bin/rackboot", "run", "--config", str(DEFAULT_CONFIG_PATH)
    ]  # fmt: skip
    assert service["Unit"]["ConditionPathExists"] == str(DEFAULT_CONFIG_PATH)
    assert "/data" in service["Unit"]["RequiresMountsFor"].split()
    assert "CAP_SYS_ADMIN" not in service["Service"]["CapabilityBoundingSet"]


def test_serial_getty_runs_setup_first_until_a_configuration_exists():
    dropin = unit("serial-getty@.service.d/rackboot-setup.conf")
    assert dropin["Unit"]["Wants"] == dropin["Unit"]["After"] == "rackboot-setup@%i.service"
    setup = unit("rackboot-setup@.service")
    assert setup["Unit"]["ConditionPathExists"] == f"!{DEFAULT_CONFIG_PATH}"
    command = setup["Service"]["ExecStart"].lstrip("-").split()
    assert command[:2] == ["/usr/bin/rackboot", "setup"]
    assert setup["Service"]["TTYPath"] == "/dev/%I"
    assert setup["Service"]["StandardInput"] == "tty"


def test_configuration_directory_lives_on_the_data_partition():
    post_build = (TREE / "board/rackboot/post-build.sh").read_text()
    directory = DEFAULT_CONFIG_PATH.parent
    assert f'ln -s /data{directory} "$TARGET_DIR{directory}"' in post_build
    tmpfiles = (TREE / "board/rackboot/rootfs-overlay/usr/lib/tmpfiles.d/rackboot.conf").read_text()
    assert f"d /data{directory} " in tmpfiles


def test_served_files_and_network_files_live_on_the_data_partition():
    """The TFTP and HTTP roots' defaults (/srv/rackboot/...) and the directory setup
    writes the network's files into must be writable: links into /data, as on the
    Debian image, with their directories made at boot."""
    post_build = (TREE / "board/rackboot/post-build.sh").read_text()
    customize = (REPOSITORY / "image/customize.sh").read_text()
    for link in ('ln -s /data/srv/rackboot "$TARGET_DIR/srv/rackboot"',
                 'ln -s /etc/rackboot/network "$TARGET_DIR/etc/systemd/network"'):  # fmt: skip
        assert link in post_build
        assert link.replace("$TARGET_DIR", "$root") in customize
    tmpfiles = (TREE / "board/rackboot/rootfs-overlay/usr/lib/tmpfiles.d/rackboot.conf").read_text()
    for served in ("tftp", "http"):
        assert f"d /data/srv/rackboot/{served} " in tmpfiles
    assert (
        "RequiresMountsFor=/data"
        in (UNITS / "systemd-networkd.service.d/rackboot.conf").read_text()
    )


def test_the_firmware_health_check_runs_and_the_esp_is_mounted():
    health = unit("rackboot-firmware-health.service")
    assert health["Service"]["ExecStart"].split() == ["/usr/bin/rackboot", "firmware", "health"]
    assert health["Unit"]["RequiresMountsFor"] == FIRMWARE.fields["esp"].default
    esp = unit("boot-efi.mount")
    assert esp["Mount"]["Where"] == FIRMWARE.fields["esp"].default
    assert esp["Mount"]["What"] == "/dev/disk/by-partlabel/esp"
    preset = TREE / "board/rackboot/rootfs-overlay/usr/lib/systemd/system-preset/80-rackboot.preset"
    enabled = preset.read_text().splitlines()
    for name in ("boot-efi.mount", "rackboot.service", "rackboot-firmware-health.service"):
        assert f"enable {name}" in enabled
    assert "systemd-bless-boot.service" in (TREE / "board/rackboot/post-build.sh").read_text()
