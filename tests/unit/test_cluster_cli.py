"""`rackboot cluster ...` without a running node (on the files, under the node's lock), and
the site table of `rackboot status`."""

from __future__ import annotations

import json
import os

from appliance.cli import format_status, main
from appliance.cluster.files import ClusterFiles
from appliance.cluster.jointoken import decode_untrusted
from appliance.errors import EXIT_FAILURE, EXIT_OK


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def config(tmp_path, **cluster):
    path = tmp_path / "rack.toml"
    lines = [f'[node]\nname = "alpha"\ndata_dir = "{tmp_path / "data"}"\n[cluster]']
    lines += [f"{k} = {json.dumps(v)}" for k, v in cluster.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_offline_init_token_and_remove(capsys, tmp_path):
    cfg = config(tmp_path, advertise="192.0.2.10:7470")
    code, out, err = run(capsys, "cluster", "init", "--config", cfg)
    assert code == EXIT_OK, err
    assert "(CA holder)" in out and "valid once until" in out
    token = decode_untrusted(out.strip().splitlines()[-1], 0)
    assert token.addresses == ("192.0.2.10:7470",)
    files = ClusterFiles(tmp_path / "data")
    assert files.enrolled() and files.is_ca()
    for name in ("node.key", "ca.key", "tokens.json"):
        assert os.stat(files.path(name)).st_mode & 0o777 == 0o600
    assert os.stat(files.dir).st_mode & 0o777 == 0o700

    code, out, err = run(capsys, "cluster", "token", "--config", cfg, "--json")
    assert code == EXIT_OK and json.loads(out)["token"].startswith("rbj1.")

    code, out, err = run(capsys, "cluster", "init", "--config", cfg)
    assert code == EXIT_FAILURE and "already node" in err

    code, out, err = run(capsys, "cluster", "remove", "alpha", "--config", cfg)
    assert code == EXIT_FAILURE and "refusing to remove the CA holder" in err
    code, out, err = run(capsys, "cluster", "remove", "nobody", "--config", cfg)
    assert code == EXIT_FAILURE and "no member matches 'nobody'" in err


def test_offline_join_refuses_a_bad_token_before_any_io(capsys, tmp_path):
    code, _, err = run(capsys, "cluster", "join", "rbj1.AAAA", "--config", config(tmp_path))
    assert code == EXIT_FAILURE and "cannot use this token" in err
    assert not ClusterFiles(tmp_path / "data").enrolled()


def test_cluster_off_refuses(capsys, tmp_path):
    code, _, err = run(capsys, "cluster", "init", "--config", config(tmp_path, enabled="off"))
    assert code == EXIT_FAILURE and "enabled = 'off'" in err


def test_status_shows_every_appliance_of_the_site():
    row = {"rack": "r1", "role": "active", "version": "0.1.0", "sources": []}
    status = {
        "core": {
            "name": "alpha", "rack": "r1", "role": "active", "version": "0.1.0", "uptime": 1,
            "cluster": {
                "state": "member", "cluster_id": "c" * 16, "node_id": "a" * 16, "ca_holder": True,
                "listen": "192.0.2.1:7470", "mdns": True, "revoked": 0,
                "site": [
                    {**row, "name": "alpha", "address": "192.0.2.1:7470", "health": "online",
                     "self": True, "last_seen_ago": 0.0},
                    {**row, "name": "beta", "address": "192.0.2.2:7470", "health": "online",
                     "last_seen_ago": 0.2},
                    {**row, "name": "gamma", "address": "192.0.2.3:7470", "health": "offline",
                     "last_seen_ago": 42.0, "reason": "no keepalive from peer for 3 s"},
                ],
            },
        }
    }  # fmt: skip
    text = format_status(status)
    assert "cluster cccccccccccccccc" in text and "(CA holder)" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert "online (this node)" in lines["alpha"]
    assert "0.2s ago" in lines["beta"] and "online" in lines["beta"]
    assert "42.0s ago" in lines["gamma"] and "offline: no keepalive" in lines["gamma"]
    assert "cluster: not a member" in format_status(
        {"core": {"cluster": {"state": "not a member"}}}
    )
