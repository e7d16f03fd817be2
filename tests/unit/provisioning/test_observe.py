"""What a fetched file means to a machine: its kernel, its N-th initrd, or a loader."""

from __future__ import annotations

import pytest

from appliance.errors import ConfigError
from plugins.httpboot.script import Profile
from plugins.provisioning.lifecycle import Record
from plugins.provisioning.observe import check_profiles, classify, served_name

DEBIAN = Profile("debian", "debian/linux", ("debian/initrd.gz", "image:firmware"), "quiet")


@pytest.mark.parametrize(("path", "kind"), [
    ("debian/linux", "kernel"),
    ("/debian/linux", "kernel"),  # TFTP names may start with '/'
    ("boot/debian/linux", "kernel"),
    ("debian/initrd.gz", "initrd:0"),
    ("images/firmware", "initrd:1"),
    ("ipxe.efi", "loader"),
    ("undionly.kpxe", "loader"),
    ("debian/linux.old", "loader"),
    ("linux", "loader"),
])  # fmt: skip
def test_a_fetch_is_classified_by_the_machines_profile(path, kind):
    assert classify(path, DEBIAN) == kind


def test_urls_and_images_are_named_as_the_servers_report_them():
    assert served_name("http://10.0.0.1/boot/debian/linux") == "debian/linux"
    assert served_name("image:debian-13") == "images/debian-13"
    assert served_name("/vmlinuz") == "vmlinuz"


def test_a_local_disk_profile_has_no_kernel_to_fetch():
    assert classify("", Profile("local", "")) == "loader"


def test_a_configured_machine_must_name_a_known_profile():
    profiles = {"debian": DEBIAN}
    check_profiles([Record("web1", ("52:54:00:00:00:01",), "")], profiles, "rack.toml")
    with pytest.raises(ConfigError, match=r"provisioning\.machines\[1\]\.profile.*debian"):
        check_profiles(
            [Record("a", (), "debian"), Record("b", (), "fedora")], profiles, "rack.toml"
        )
