"""iPXE scripts rendered from profiles."""

from __future__ import annotations

from plugins.httpboot.script import Machine, Profile, base_url, kernel_arguments, render_ipxe

DEBIAN = Profile("debian", "debian/vmlinuz", ("debian/initrd.gz", "extra/fw.cpio"), "console=ttyS0 url={base}/boot/preseed.cfg host={mac}")  # fmt: skip
MACHINE = Machine(
    "52:54:00:12:34:56", DEBIAN, "http://10.0.0.1", "0123456789abcdef" * 2, "10.0.0.50"
)


def test_script_loads_kernel_and_initrds_from_this_server():
    assert render_ipxe(MACHINE).splitlines() == [
        "#!ipxe",
        "# rackboot machine 52:54:00:12:34:56 profile debian",
        "kernel http://10.0.0.1/boot/debian/vmlinuz initrd=initrd.gz initrd=fw.cpio"
        " console=ttyS0 url=http://10.0.0.1/boot/preseed.cfg host=52:54:00:12:34:56"
        " rackboot.events=http://10.0.0.1/api/v1/machines/52-54-00-12-34-56/events"
        " rackboot.token=0123456789abcdef0123456789abcdef",
        "initrd http://10.0.0.1/boot/debian/initrd.gz",
        "initrd http://10.0.0.1/boot/extra/fw.cpio",
        "boot",
    ]


def test_absolute_urls_are_kept_and_names_are_quoted():
    profile = Profile("x", "http://mirror/linux", ("initrd+1%.img",), "")
    machine = Machine("52:54:00:12:34:56", profile, "http://10.0.0.1:8080", "t" * 32)
    script = render_ipxe(machine)
    assert "kernel http://mirror/linux initrd=initrd+1%.img rackboot.events=" in script
    assert "initrd http://10.0.0.1:8080/boot/initrd+1%25.img" in script
    assert kernel_arguments(machine).startswith("initrd=initrd+1%.img rackboot.events=")


def test_a_profile_without_kernel_boots_the_local_disk():
    local = Machine("52:54:00:12:34:56", Profile("local", ""), "http://10.0.0.1", "t" * 32)
    assert render_ipxe(local).splitlines()[-1] == "exit"
    assert "rackboot.token" not in render_ipxe(local)


def test_base_url_leaves_out_port_80():
    assert base_url("10.0.0.1", 80) == "http://10.0.0.1"
    assert base_url("10.0.0.1", 8080) == "http://10.0.0.1:8080"


def test_images_of_the_store_are_named_image_colon_name():
    profile = Profile("img", "image:debian-kernel", ("image:debian-initrd", "extra.cpio"), "")
    machine = Machine("52:54:00:12:34:56", profile, "http://10.0.0.1", "t" * 32)
    lines = render_ipxe(machine).splitlines()
    assert lines[2].startswith("kernel http://10.0.0.1/images/debian-kernel "
                               "initrd=debian-initrd initrd=extra.cpio ")  # fmt: skip
    assert lines[3:5] == ["initrd http://10.0.0.1/images/debian-initrd",
                          "initrd http://10.0.0.1/boot/extra.cpio"]  # fmt: skip
