"""A bounded flood of junk on the election's port, from a lab namespace (tests and bench).

    python -m tests.support.ha_flood --targets 10.0.0.2:7471,10.0.0.3:7471 \\
        --rate 5000 --seconds 5 --ca PATH/ca.crt [--spoof 10.0.0.0/24]

What an outsider on the management network can send, mixed: random bytes,
msgpack lists shaped like envelopes, envelopes signed by certificates of a
forged CA that carries the real CA's name (so a receiver spends a signature
check on each one it has not seen before: the costliest junk), a new such
certificate for every datagram, and those with bytes flipped. With
``--spoof`` every datagram comes from a random address of that network (raw
socket, IP_HDRINCL), which defeats any per-source limit. It stops after
``--seconds`` and prints how many datagrams it sent, as JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import random
import socket
import struct
import time

import msgpack
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from appliance.cluster import pki
from appliance.ha.envelope import seal
from appliance.ha.messages import Prepare

POOL = 400  # distinct forged certificates; each also appears mutated


def forged_ca(real_ca: x509.Certificate) -> tuple[Ed25519PrivateKey, x509.Certificate]:
    """A CA of the attacker's own with the real CA's name: issuer names match."""
    key = pki.new_key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(real_ca.subject).issuer_name(real_ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, None)
    )  # fmt: skip
    return key, cert


def junk(rng: random.Random, real_ca: x509.Certificate, count: int = POOL) -> list[bytes]:
    ca_key, ca = forged_ca(real_ca)
    now = dt.datetime.now(dt.UTC)
    out: list[bytes] = []
    for n in range(count):
        key = pki.new_key()
        cert, _ = pki.issue_node_cert(ca, ca_key, pki.make_csr(key, f"x{n}"), f"x{n}", now,
                                      x509.random_serial_number())  # fmt: skip
        message = Prepare(group="rack1", req=n, ballot=n, members="", appliances=[])
        datagram = seal(message, key, pki.cert_der(cert))
        out.append(datagram)
        flipped = bytearray(datagram)
        for _ in range(rng.randint(1, 3)):
            flipped[rng.randrange(len(flipped))] ^= rng.randrange(1, 256)
        out.append(bytes(flipped))
        out.append(rng.randbytes(rng.randint(1, 1400)))
        out.append(msgpack.packb([1, rng.randbytes(300), rng.randbytes(60), rng.randbytes(64)]))
    rng.shuffle(out)
    return out


def udp_packet(src: str, dst: str, dport: int, payload: bytes, sport: int) -> bytes:
    """IPv4 + UDP, UDP checksum 0 (none, legal on IPv4); the kernel fills the IP checksum."""
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP,
                         0, socket.inet_aton(src), socket.inet_aton(dst))  # fmt: skip
    return header + udp


def flood(targets: list[tuple[str, int]], datagrams: list[bytes], rate: float, seconds: float,
          spoof: ipaddress.IPv4Network | None, rng: random.Random) -> int:  # fmt: skip
    if spoof is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        hosts = [str(a) for a in spoof.hosts()]
    sent, start = 0, time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        due = int((now - start) * rate)
        if sent >= due:
            time.sleep(min(0.001, end - now))
            continue
        for _ in range(min(due - sent, 256)):
            host, port = targets[sent % len(targets)]
            payload = datagrams[sent % len(datagrams)]
            try:
                if spoof is None:
                    sock.sendto(payload, (host, port))
                else:
                    packet = udp_packet(rng.choice(hosts), host, port, payload,
                                        rng.randrange(1024, 65535))  # fmt: skip
                    sock.sendto(packet, (host, 0))
            except OSError:
                pass  # a full buffer or a refused port: junk needs no delivery
            sent += 1
    sock.close()
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", required=True, help="HOST:PORT,HOST:PORT,...")
    parser.add_argument("--rate", type=float, default=5000.0, help="datagrams per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--ca", required=True, help="the cluster's ca.crt (PEM): its name")
    parser.add_argument("--spoof", help="random source addresses from this network")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with open(args.ca, "rb") as f:
        real_ca = x509.load_pem_x509_certificate(f.read())
    targets = [(h, int(p)) for h, _, p in (t.rpartition(":") for t in args.targets.split(","))]
    datagrams = junk(rng, real_ca)
    spoof = ipaddress.IPv4Network(args.spoof) if args.spoof else None
    sent = flood(targets, datagrams, args.rate, args.seconds, spoof, rng)
    print(json.dumps({"sent": sent, "seconds": args.seconds, "distinct": len(datagrams)}))


if __name__ == "__main__":
    main()
