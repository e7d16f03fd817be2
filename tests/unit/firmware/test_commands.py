"""`rackboot firmware keygen|bundle|status|update` through the CLI's main."""

from __future__ import annotations

import json

from appliance.cli import main
from appliance.errors import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK
from image.layout import esp_files


def test_keygen_bundle_status_and_a_refused_update(tmp_path, capsys):
    key = tmp_path / "release.pem"
    assert main(["firmware", "keygen", "--out", str(key)]) == EXIT_OK
    public = capsys.readouterr().out.strip()
    assert public.startswith("ed25519:") and len(public) == 52
    assert key.stat().st_mode & 0o777 == 0o600
    assert main(["firmware", "keygen", "--out", str(key)]) == EXIT_FAILURE
    assert "a release key is never overwritten" in capsys.readouterr().err

    (tmp_path / "rootfs.img").write_bytes(b"R" * 10000)
    (tmp_path / "vmlinuz").write_bytes(b"K" * 100)
    bundle = tmp_path / "1.1.bundle"
    argv = ["firmware", "bundle", "--key", str(key), "--rootfs", str(tmp_path / "rootfs.img"),
            "--kernel", str(tmp_path / "vmlinuz"), "--out", str(bundle)]  # fmt: skip
    assert main([*argv, "--version", "1.1"]) == EXIT_OK
    assert main([*argv, "--version", "one"]) == EXIT_FAILURE
    assert "version 'one': expected digits and dots" in capsys.readouterr().err

    esp = tmp_path / "esp"
    for name, data in esp_files("1.0").items():
        (esp / name).parent.mkdir(parents=True, exist_ok=True)
        (esp / name).write_bytes(data)
    config = tmp_path / "rackboot.toml"
    config.write_text(f'[firmware]\nesp = "{esp}"\nloader = "systemd-boot"\n'
                      f'trusted_keys = ["{public}"]\nslot_a = "{tmp_path}/a"\n')  # fmt: skip
    capsys.readouterr()
    assert main(["firmware", "status", "--json", "--config", str(config)]) == EXIT_OK
    status = json.loads(capsys.readouterr().out)
    assert status["next_boot"] == "a" and status["slots"]["b"]["version"] == "1.0"
    assert main(["firmware", "status", "--config", str(config)]) == EXIT_OK
    assert "slot a: good      version 1.0  entry rackboot-2-a.conf" in capsys.readouterr().out
    # This test machine was not booted from a slot: the update says so and writes nothing
    assert main(["firmware", "update", str(bundle), "--config", str(config)]) == EXIT_FAILURE
    assert "not booted from a slot" in capsys.readouterr().err
    config.write_text('[firmware]\ntrusted_keys = ["ed25519:short"]\n')
    assert main(["firmware", "status", "--config", str(config)]) == EXIT_CONFIG
    assert "firmware.trusted_keys[0]: expected a release key" in capsys.readouterr().err
