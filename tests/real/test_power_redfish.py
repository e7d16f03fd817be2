"""The Redfish power plugin against sushy-tools' Redfish emulator (its fake driver: no
libvirtd needed), with basic authentication, over plain HTTP and TLS, on loopback; and
against BMCs that misbehave (silent, endless, trickling), on loopback too.

The fake driver applies a power change 1 to 11 s after the request (as hardware does),
except a restart, whose "off" shows at once: the test powers three systems in parallel
and waits for all of them once.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import itertools
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from appliance.config import validate
from plugins.power.redfish import RedfishPlugin
from plugins.power.redfish_config import SECTION
from plugins.provisioning.lifecycle import Record
from tests.support.logs import captured_logs

pytest.importorskip("sushy_tools", reason="sushy-tools is not installed (pip install -e '.[dev]')")
bcrypt = pytest.importorskip("bcrypt", reason="bcrypt (a dependency of sushy-tools) is missing")

USER, PASSWORD = "rackboot", "s3cret-bmc"
# The fake driver's systems: name -> (uuid, power state at start).
SYSTEMS = {
    "to-on": ("0b4a9d1e-0000-4000-8000-000000000001", "Off"),
    "to-off": ("0b4a9d1e-0000-4000-8000-000000000002", "On"),
    "to-cycle": ("0b4a9d1e-0000-4000-8000-000000000003", "On"),
    "already-on": ("0b4a9d1e-0000-4000-8000-000000000004", "On"),
}
APPLIED_WITHIN = 14.0  # the fake driver's longest delay (11 s, whole seconds) and a margin
UNKNOWN = "0b4a9d1e-0000-4000-8000-0000000000ff"
SECRETS = itertools.count()  # one password file per plugin configured


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Emulator:
    port: int
    tls: bool
    log: Path

    def address(self, name: str) -> str:
        scheme = "redfish" if self.tls else "redfish+http"
        uuid = SYSTEMS[name][0] if name in SYSTEMS else name
        return f"{scheme}://127.0.0.1:{self.port}/redfish/v1/Systems/{uuid}"

    def power_state(self, name: str, context: ssl.SSLContext | None = None) -> str:
        """The system's PowerState, read by the test itself (not through the plugin)."""
        conn = (http.client.HTTPSConnection("127.0.0.1", self.port, timeout=5, context=context)
                if self.tls else http.client.HTTPConnection("127.0.0.1", self.port, timeout=5))  # fmt: skip
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        try:
            conn.request("GET", f"/redfish/v1/Systems/{SYSTEMS[name][0]}",
                         headers={"Authorization": f"Basic {token}"})  # fmt: skip
            response = conn.getresponse()
            assert response.status == 200, (response.status, response.read()[:200])
            return json.loads(response.read())["PowerState"]
        finally:
            conn.close()


def make_certificates(work: Path) -> Path:
    """A CA and a certificate for 127.0.0.1 it signed (ECDSA P-256); returns the CA file."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def cert(subject, issuer, key, signer, ca: bool):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))  # fmt: skip
        if not ca:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test BMC CA")])
    bmc_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    pem = serialization.Encoding.PEM
    (work / "ca.pem").write_bytes(cert(ca_name, ca_name, ca_key, ca_key, True).public_bytes(pem))
    (work / "bmc.pem").write_bytes(cert(bmc_name, ca_name, key, ca_key, False).public_bytes(pem))
    (work / "bmc.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))  # fmt: skip
    return work / "ca.pem"


def start_emulator(work: Path, tls: bool) -> tuple[subprocess.Popen, Emulator]:
    work.mkdir()
    port = free_port()
    htpasswd = work / "htpasswd"
    htpasswd.write_bytes(USER.encode() + b":" + bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)))
    systems = [{"uuid": uuid, "name": name, "power_state": state, "external_notifier": False,
                "nics": [{"mac": f"52:54:00:00:00:0{i}", "ip": "192.0.2.10"}]}
               for i, (name, (uuid, state)) in enumerate(SYSTEMS.items())]  # fmt: skip
    lines = [
        "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
        f"SUSHY_EMULATOR_LISTEN_PORT = {port}",
        "SUSHY_EMULATOR_FAKE_DRIVER = True",
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}",
        f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}",
        f"SUSHY_EMULATOR_STATE_DIR = {str(work / 'state')!r}",
    ]
    if tls:
        make_certificates(work)
        lines += [f"SUSHY_EMULATOR_SSL_CERT = {str(work / 'bmc.pem')!r}",
                  f"SUSHY_EMULATOR_SSL_KEY = {str(work / 'bmc.key')!r}"]  # fmt: skip
    (work / "emulator.conf").write_text("\n".join(lines) + "\n")
    log = work / "emulator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sushy_tools.emulator.main", "--config", str(work / "emulator.conf")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work,
        )  # fmt: skip
    return proc, Emulator(port, tls, log)


def wait_serving(proc: subprocess.Popen, emulator: Emulator, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"emulator exited {proc.returncode}:\n{emulator.log.read_text()[-3000:]}"
            )
        try:
            with socket.create_connection(("127.0.0.1", emulator.port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(
        f"emulator not listening within {timeout} s:\n{emulator.log.read_text()[-3000:]}"
    )


@pytest.fixture(scope="module")
def emulators(tmp_path_factory) -> Iterator[tuple[Emulator, Emulator]]:
    """A plain-HTTP and a TLS emulator, started together (each takes ~1 s to import)."""
    work = tmp_path_factory.mktemp("sushy")
    started = [start_emulator(work / "http", tls=False), start_emulator(work / "https", tls=True)]
    try:
        for proc, emulator in started:
            wait_serving(proc, emulator)
        yield started[0][1], started[1][1]
    finally:
        for proc, _ in started:  # ours, by PID
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def plugin_for(tmp_path: Path, port: int, *, password: str = PASSWORD, extra: str = "",
               timeout: float = 5.0) -> RedfishPlugin:  # fmt: skip
    secret = tmp_path / f"password-{next(SECRETS)}"
    secret.write_text(password + "\n")
    text = (f"[redfish]\ntimeout = {timeout}\n[[redfish.bmcs]]\naddress = '127.0.0.1:{port}'\n"
            f"username = '{USER}'\npassword_file = '{secret}'\n{extra}")  # fmt: skip
    plugin = RedfishPlugin()
    plugin.rackboot_configure(validate("test.toml", tomllib.loads(text), [SECTION], dev=False))
    return plugin


def machine(power: str, name: str = "web1") -> Record:
    return Record(name=name, macs=("52:54:00:12:34:56",), profile="debian", power=power)


def failures(logs) -> list[tuple[str, str]]:
    return [(e["reason"], e["detail"]) for e in logs() if e["msg"] == "power action failed"]


def test_on_off_and_cycle_show_in_the_emulator(emulators, tmp_path):
    emulator, _ = emulators
    plugin = plugin_for(tmp_path, emulator.port, extra="plain_http = true\n")
    registry = CollectorRegistry()
    plugin.rackboot_services(SimpleNamespace(metrics=registry))  # the node's registry
    assert [emulator.power_state(n) for n in SYSTEMS] == ["Off", "On", "On", "On"]
    with captured_logs() as logs:
        for name, action in (("to-on", "on"), ("to-off", "off"), ("to-cycle", "cycle"),
                             ("already-on", "on")):  # fmt: skip
            assert plugin.provisioning_power(machine(emulator.address(name), name), action) is True
    taken = {
        e["machine"]: (e["was"], e["reset"]) for e in logs() if e["msg"] == "power action taken"
    }
    assert taken == {"to-on": ("Off", "On"), "to-off": ("On", "ForceOff"),
                     "to-cycle": ("On", "ForceRestart"), "already-on": ("On", None)}  # fmt: skip
    assert emulator.power_state("to-cycle") == "Off"  # a restart's first half shows at once
    counted = {(s.labels["action"], s.labels["result"]): s.value
               for m in registry.collect() if m.name == "rackboot_redfish_actions"
               for s in m.samples if s.name.endswith("_total")}  # fmt: skip
    assert counted == {("on", "reset"): 1, ("off", "reset"): 1, ("cycle", "reset"): 1,
                       ("on", "unchanged"): 1}  # fmt: skip
    deadline = time.monotonic() + APPLIED_WITHIN
    want = {"to-on": "On", "to-off": "Off", "to-cycle": "On", "already-on": "On"}
    while time.monotonic() < deadline:
        states = {name: emulator.power_state(name) for name in want}
        if states == want:
            break
        time.sleep(0.25)
    assert states == want


def test_a_wrong_password_and_an_unknown_system_fail(emulators, tmp_path):
    emulator, _ = emulators
    wrong = plugin_for(tmp_path, emulator.port, password="guess", extra="plain_http = true\n")
    right = plugin_for(tmp_path, emulator.port, extra="plain_http = true\n")
    with captured_logs() as logs:
        assert wrong.provisioning_power(machine(emulator.address("to-on")), "cycle") is False
        assert right.provisioning_power(machine(emulator.address(UNKNOWN)), "on") is False
    [auth, unknown] = failures(logs)
    assert auth[0] == "auth"
    assert auth[1].startswith("the BMC refused the credentials (HTTP 401) reading the system")
    assert unknown[0] == "not_found"
    assert unknown[1].startswith("not found on the BMC (HTTP 404) reading the system")


def test_tls_verified_against_the_ca_file(emulators, tmp_path):
    _, emulator = emulators
    ca = emulator.log.parent / "ca.pem"
    trusting = plugin_for(tmp_path, emulator.port, extra=f"ca_file = '{ca}'\n")
    untrusting = plugin_for(tmp_path, emulator.port)  # the system's CAs: not the test's
    plain = plugin_for(tmp_path, emulator.port, extra="plain_http = true\n")
    with captured_logs() as logs:
        assert (
            untrusting.provisioning_power(machine(emulator.address("to-cycle")), "cycle") is False
        )
        http_address = emulator.address("to-cycle").replace("redfish://", "redfish+http://")
        assert plain.provisioning_power(machine(http_address), "cycle") is False
        assert trusting.provisioning_power(machine(emulator.address("to-cycle")), "cycle") is True
    [(reason, detail), (plain_reason, _)] = failures(logs)
    assert (reason, detail) == (
        "tls",
        "the BMC's certificate is not trusted: unable to get local issuer certificate",
    )
    assert plain_reason in ("bad_reply", "unreachable")  # HTTP to a TLS port: never a success
    context = ssl.create_default_context(cafile=str(ca))
    assert emulator.power_state("to-cycle", context) == "Off"  # the restart's first half


# -- BMCs that misbehave -----------------------------------------------------------------


@contextmanager
def hostile_bmc(reply) -> Iterator[int]:
    """A loopback server that answers each connection with ``reply(conn)`` (in a thread);
    yields its port. Bounded: it serves at most 4 connections and stops at exit."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        for _ in range(4):
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                    break
                except TimeoutError:
                    continue
            else:
                return
            with conn:
                conn.settimeout(0.5)
                try:
                    conn.recv(65536)
                    reply(conn, stop)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def silent(conn, stop):
    stop.wait(10)


def endless(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    endless_body(conn, stop)


def endless_body(conn, stop):
    for _ in range(10_000):  # 640 MiB at most: the client cuts it at 256 KiB
        if stop.is_set():
            return
        conn.sendall(b" " * 65536)


def endless_refusal(conn, stop):
    conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: text/html\r\n\r\n")
    endless_body(conn, stop)


def trickle(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for _ in range(200):  # a header byte every 0.05 s: each read waits less than its timeout
        if stop.wait(0.05):
            return
        conn.sendall(b"X")


@pytest.mark.parametrize(
    ("reply", "reason"),
    [(silent, "timeout"), (endless, "bad_reply"), (endless_refusal, "auth"), (trickle, "timeout")],
)
def test_a_misbehaving_bmc_fails_within_the_timeout(tmp_path, reply, reason):
    with hostile_bmc(reply) as port:
        plugin = plugin_for(tmp_path, port, extra="plain_http = true\n", timeout=1.0)
        address = f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1"
        start = time.monotonic()
        with captured_logs() as logs:
            assert plugin.provisioning_power(machine(address), "on") is False
        took = time.monotonic() - start
    [(got, detail)] = failures(logs)
    assert got == reason, detail
    assert took < 2.0
    if reason == "bad_reply":
        assert "more than 262144 bytes" in detail
