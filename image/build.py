"""Build the flashable appliance image and its signed update bundle (root only).

    python -m image.build --out DIR [--version 1.0] [--key release.pem] [--slot-mib 1024]

Steps: a wheel of this checkout; a Debian root with mmdebstrap (minbase,
systemd, the kernel, Python) into which image/customize.sh installs Rackboot
and its units; the root as a squashfs (the slot image); the ESP (systemd-boot,
GRUB's config and environment block, each slot's kernel and initrd and boot
entry: image/layout.py) made with mkfs.vfat and mtools; the data partition
with mke2fs; the GPT with sfdisk; GRUB's BIOS boot code (image/biosboot.py);
and the bundle of the slot image signed with the release key. DIR gets
``disk.img`` (write it to the appliance's disk), ``rackboot-VERSION.bundle``,
and the pieces (``rootfs.squashfs``, ``vmlinuz``, ``initrd.img``). Without
``--key`` a new release key is made in DIR (a development key: keep a real
one offline). docs/updates.md, image/README.md.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from appliance.firmware.keys import keygen, load_private, public_text, write_bundle
from image import biosboot, layout

REPO = Path(__file__).resolve().parents[1]
IMAGE_DIR = REPO / "image"
OVERLAY = REPO / "buildroot/board/rackboot/rootfs-overlay"
PACKAGES = ["systemd", "systemd-sysv", "udev", "dbus", "linux-image-amd64", "initramfs-tools",
            "python3", "python3-venv", "kmod", "iproute2", "procps", "ca-certificates",
            "login", "passwd"]  # fmt: skip
SYSTEMD_BOOT = Path("/usr/lib/systemd/boot/efi/systemd-bootx64.efi")
GRUB_PC = Path("/usr/lib/grub/i386-pc")
GRUB_MODULES = ["biosdisk", "part_gpt", "fat", "normal", "configfile", "loadenv", "test", "linux",
                "echo", "serial", "terminal", "search", "halt", "reboot"]  # fmt: skip
TOOLS = {"mmdebstrap": "mmdebstrap", "mksquashfs": "squashfs-tools", "mkfs.vfat": "dosfstools",
         "mcopy": "mtools", "mke2fs": "e2fsprogs", "sfdisk": "fdisk",
         "grub-mkimage": "grub-common"}  # fmt: skip


class BuildError(RuntimeError):
    pass


def step(name: str):
    print(f"image.build: {name}", file=sys.stderr, flush=True)
    return time.monotonic()


def run(*argv: str | Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], check=True, **kw)


def check_host() -> None:
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if not SYSTEMD_BOOT.exists():
        missing.append("systemd-boot-efi")
    if not (GRUB_PC / "boot.img").exists():
        missing.append("grub-pc-bin")
    if missing:
        raise BuildError(f"missing Debian packages: apt-get install {' '.join(missing)}")
    if os.geteuid() != 0:
        raise BuildError("mmdebstrap and chroot need root")


def wheels(out: Path) -> Path:
    """This checkout's wheel and its dependencies' (built or fetched here, where the
    package index is set up; the root then installs them offline). The build
    host runs Debian's Python minor version, so the wheels fit the image."""
    target = out / "wheels"
    shutil.rmtree(target, ignore_errors=True)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "-w", target, REPO)
    return target


def debian_root(out: Path, whl: Path, release_key: str, version: str, suite: str,
                root_password: str | None) -> Path:  # fmt: skip
    root = out / "root"
    if root.exists():
        shutil.rmtree(root)
    env = {**os.environ, "RACKBOOT_WHEELS": str(whl), "RACKBOOT_RELEASE_KEY": release_key,
           "RACKBOOT_VERSION": version, "RACKBOOT_OVERLAY": str(OVERLAY),
           "RACKBOOT_IMAGE_DIR": str(IMAGE_DIR), "RACKBOOT_ROOT_PASSWORD": root_password or ""}  # fmt: skip
    run("mmdebstrap", "--quiet", "--variant=minbase", "--include=" + ",".join(PACKAGES),
        f"--customize-hook={IMAGE_DIR / 'customize.sh'} \"$1\"", suite, root, env=env)  # fmt: skip
    return root


def boot_files(root: Path, out: Path) -> tuple[Path, Path]:
    kernels = sorted(glob.glob(str(root / "boot/vmlinuz-*")))
    initrds = sorted(glob.glob(str(root / "boot/initrd.img-*")))
    if not kernels or not initrds:
        raise BuildError(f"{root}/boot: no vmlinuz-* or initrd.img-* (linux-image-amd64?)")
    shutil.copy(kernels[-1], out / "vmlinuz")
    shutil.copy(initrds[-1], out / "initrd.img")
    return out / "vmlinuz", out / "initrd.img"


def squashfs(root: Path, target: Path, extra: dict[str, str] | None = None) -> Path:
    """The slot image; ``extra`` adds files (path in the root -> text, mode 0755), for
    a test bundle that fails its health check; they and the directories made for
    them are removed again afterwards."""
    made: list[Path] = []
    try:
        for path, script in (extra or {}).items():
            missing = [p for p in (root / path).parents if not p.exists()]
            made += sorted(missing, key=lambda p: len(p.parts))
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            made.append(root / path)
            (root / path).write_text(script)
            (root / path).chmod(0o755)
        target.unlink(missing_ok=True)
        run("mksquashfs", root, target, "-comp", "zstd", "-noappend", "-no-progress", "-wildcards",
            "-e", "boot/vmlinuz*", "boot/initrd.img*", "boot/System.map*", "boot/config-*")  # fmt: skip
    finally:
        for path in reversed(made):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
    return target


def esp_image(out: Path, size: int, version: str, kernel: Path, initrd: Path) -> Path:
    image = out / "esp.img"
    image.unlink(missing_ok=True)
    run("mkfs.vfat", "-F", "32", "-n", "RACKBOOT", "-C", image, str(size // 1024),
        stdout=subprocess.DEVNULL)  # fmt: skip
    staging = out / "esp"
    shutil.rmtree(staging, ignore_errors=True)
    for name, data in layout.esp_files(version).items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data)
    (staging / "EFI/BOOT").mkdir(parents=True)
    shutil.copy(SYSTEMD_BOOT, staging / "EFI/BOOT/BOOTX64.EFI")
    for slot in layout.FACTORY:
        shutil.copy(kernel, staging / f"rackboot/{slot}/vmlinuz")
        shutil.copy(initrd, staging / f"rackboot/{slot}/initrd.img")
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
    run("mcopy", "-s", "-i", image, *sorted(staging.iterdir()), "::/", env=env)
    return image


def data_image(out: Path, size: int) -> Path:
    staging = out / "data"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "etc/rackboot").mkdir(parents=True)
    (staging / "rackboot").mkdir(mode=0o700)
    image = out / "data.img"
    image.unlink(missing_ok=True)
    run("mke2fs", "-q", "-t", "ext4", "-L", "rackboot-data", "-d", staging, image,
        f"{size // 1024}k")  # fmt: skip
    return image


def assemble(disk: Path, parts: list[layout.Partition], images: dict[str, Path]) -> None:
    """The GPT, each partition's image at its place, GRUB's BIOS boot code."""
    disk.unlink(missing_ok=True)
    with open(disk, "wb") as fh:
        fh.truncate(layout.disk_size(parts))
    run("sfdisk", "--quiet", disk, input=layout.sfdisk_script(parts).encode())
    by_name = {p.name: p for p in parts}
    with open(disk, "r+b") as fh:
        for name, source in images.items():
            partition = by_name[name]
            if source.stat().st_size > partition.size:
                raise BuildError(f"{source} ({source.stat().st_size} bytes) does not fit "
                                 f"partition {name} ({partition.size}): raise its size")  # fmt: skip
            fh.seek(partition.start)
            with open(source, "rb") as src:
                shutil.copyfileobj(src, fh, 4 << 20)
    core = disk.with_name("core.img")
    run("grub-mkimage", "-O", "i386-pc", "-o", core, "-p", "(hd0,gpt2)/grub", *GRUB_MODULES)
    boot = by_name["bios-boot"]
    biosboot.install(str(disk), core.read_bytes(), (GRUB_PC / "boot.img").read_bytes(),
                     boot.start, boot.size)  # fmt: skip


def build(args: argparse.Namespace) -> None:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    check_host()
    key_path = Path(args.key) if args.key else out / "release-key.pem"
    key = load_private(key_path) if key_path.exists() else keygen(key_path)
    started = time.monotonic()
    root = out / "root"
    if not (args.reuse_root and root.is_dir()):
        step("wheels")
        whl = wheels(out)
        step(f"Debian {args.suite} root with mmdebstrap")
        root = debian_root(out, whl, public_text(key.public_key()), args.version, args.suite,
                           args.root_password)  # fmt: skip
    kernel, initrd = boot_files(root, out)
    step("slot image (squashfs)")
    rootfs = squashfs(root, out / "rootfs.squashfs")
    parts = layout.partitions(slot_mib=args.slot_mib)
    by_name = {p.name: p for p in parts}
    step("ESP, data partition, disk")
    images = {"esp": esp_image(out, by_name["esp"].size, args.version, kernel, initrd),
              "rackboot-a": rootfs, "rackboot-b": rootfs,
              "rackboot-data": data_image(out, by_name["rackboot-data"].size)}  # fmt: skip
    assemble(out / "disk.img", parts, images)
    step("bundle")
    files = {"rootfs": rootfs, "kernel": kernel, "initrd": initrd}
    write_bundle(out / f"rackboot-{args.version}.bundle", files, version=args.version,
                 board="x86_64", key=key)  # fmt: skip
    print(f"image.build: {out / 'disk.img'} and {out / f'rackboot-{args.version}.bundle'} "
          f"in {time.monotonic() - started:.0f} s", file=sys.stderr)  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m image.build", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--version", default="1.0", help="the firmware version (default 1.0)")
    p.add_argument("--key", help="release key (PEM; default: DIR/release-key.pem, made if missing)")
    p.add_argument("--suite", default="bookworm", help="Debian suite (default bookworm)")
    p.add_argument("--slot-mib", type=int, default=1024, help="root slot size (default 1024)")
    p.add_argument("--root-password", help="a root password for the console (test builds)")
    p.add_argument("--reuse-root", action="store_true",
                   help="keep DIR/root from an earlier build (the disk and bundle only)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        build(parser().parse_args(argv))
    except (BuildError, subprocess.CalledProcessError) as exc:
        print(f"image.build: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
