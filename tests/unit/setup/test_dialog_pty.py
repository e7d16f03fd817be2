"""`rackboot setup` driven through a pseudo-terminal (pexpect) as an operator on the serial
console drives it: wrong answers re-asked with a reason, the file shown and confirmed,
a re-run that keeps every value but the one changed, and interrupted dialogs that leave
the old file byte for byte."""

from __future__ import annotations

import io
import os
import signal
import sys
import tomllib
from pathlib import Path

import pytest

from appliance.cli import main
from appliance.errors import EXIT_OK

from .conftest import FIRST_ANSWERS

pexpect = pytest.importorskip("pexpect", reason="pexpect is in the dev extras (pyproject.toml)")

REPO = Path(__file__).resolve().parents[3]


class Operator:
    """One `rackboot setup` on a pseudo-terminal; every wait is bounded."""

    def __init__(self, machine) -> None:
        self.transcript = io.StringIO()
        self.child = pexpect.spawn(
            sys.executable, ["-m", "appliance", "setup", "--config", str(machine.config),
                             "--no-start"],
            cwd=str(REPO), env=dict(os.environ), encoding="utf-8", timeout=60,  # a loaded CI machine took >30 s once
            dimensions=(24, 80),
            # SIGINT ignored, as a job started in the background by a non-interactive shell
            # inherits it (whatever the runner's): on a terminal Ctrl-C still stops the dialog.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )  # fmt: skip
        self.child.logfile_read = self.transcript

    def answer(self, prompt: str, text: str) -> None:
        self.child.expect_exact(prompt)
        self.child.sendline(text)

    def refused(self, reason: str, prompt: str, text: str) -> None:
        """The last answer is refused with a one-line reason, and the question asked again."""
        self.child.expect_exact(f"  ! expected {reason}")
        self.answer(prompt, text)

    def finish(self) -> int:
        self.child.expect(pexpect.EOF)
        self.child.close()
        assert "\x1b" not in self.transcript.getvalue()  # a dumb terminal: no escapes
        return (
            self.child.exitstatus if self.child.exitstatus is not None else -self.child.signalstatus
        )

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def operator(machine):
    made = []

    def start() -> Operator:
        made.append(Operator(machine))
        return made[-1]

    yield start
    for one in made:
        one.close()


def test_a_new_cluster_with_wrong_answers_re_asked(machine, operator):
    op = operator()
    op.child.expect_exact("eth0             up       52:54:00:12:34:56")
    op.child.expect_exact("eth1             down     52:54:00:ab:cd:ef")
    op.answer("Name of this appliance [", "rb-a")
    op.answer("Rack it serves: ", "r12")
    op.answer("Management interface: ", "eth0")
    op.answer("Management address/prefix (other appliances reach this one here): ", "10.0.0.5")
    op.refused("an address with its prefix length (1-30) such as 10.0.0.5/24",
               "Management address/prefix (other appliances reach this one here): ",
               "10.0.0.5/24")  # fmt: skip
    op.answer("Management gateway ('none') [none]: ", "10.0.0.1")
    op.answer("Provisioning interface(s), comma-separated: ", "eth3")
    op.refused("interfaces of this machine (eth0, eth1); there is no 'eth3'",
               "Provisioning interface(s), comma-separated: ", "eth1")  # fmt: skip
    op.answer("Subnet on eth1 (CIDR): ", "10.1.0.0/33")
    op.refused("a subnet in CIDR notation such as 192.0.2.0/24", "Subnet on eth1 (CIDR): ",
               "10.1.0.0/24")  # fmt: skip
    op.answer("This appliance's address on eth1: ", "10.1.1.5")
    op.refused("an address inside 10.1.0.0/24 (10.1.1.5 is not)",
               "This appliance's address on eth1: ", "10.1.0.5")  # fmt: skip
    op.answer("DHCP pool(s) in 10.1.0.0/24, 'first-last': ", "10.1.0.100-10.1.0.199")
    op.answer("Router for machines on 10.1.0.0/24 ('none') [none]: ", "10.1.9.1")
    op.refused("a router inside 10.1.0.0/24 (10.1.9.1 is not)",
               "Router for machines on 10.1.0.0/24 ('none') [none]: ", "10.1.0.1")  # fmt: skip
    vip = "The rack's virtual IP (held by the active appliance; 'none'): "
    op.answer(vip, "10.1.0.150")
    op.refused("a virtual IP outside the pools of 10.1.0.0/24 (DHCP would lease it)", vip,
               "10.1.0.2")  # fmt: skip
    op.answer("Cluster: 'new' to create one, 'join' to paste a join token [new]: ", "")
    op.child.expect_exact('vip = "10.1.0.2/24"')
    assert not machine.data.exists()  # nothing done before the operator says yes
    op.answer(f"Write it to {machine.config}? [y/n]: ", "y")
    op.child.expect_exact("join token, valid once until")
    op.child.expect(r"rbj1\.[A-Za-z0-9_-]+")
    op.child.expect_exact(f"To run it: rackboot run --config {machine.config}")
    assert op.finish() == EXIT_OK
    doc = tomllib.loads(machine.config.read_text())
    assert doc["node"]["name"] == "rb-a" and doc["node"]["shutdown_grace"] == 2.5
    assert doc["dhcp"]["subnets"] == [{"network": "10.1.0.0/24", "interface": "eth1",
                                       "pools": ["10.1.0.100-10.1.0.199"], "router": "10.1.0.1"}]  # fmt: skip
    assert doc["network"]["provisioning"] == [{"interface": "eth1", "address": "10.1.0.5/24"}]
    assert main(["config", "check", str(machine.config)]) == EXIT_OK


def first_setup(machine) -> bytes:
    answers = machine.root / "answers.toml"
    answers.write_text(FIRST_ANSWERS)
    argv = ["setup", "--config", str(machine.config), "--answers", str(answers), "--no-start"]
    assert main(argv) == EXIT_OK
    return machine.config.read_bytes()


def test_a_rerun_changing_one_answer_keeps_everything_else(machine, operator, capsys):
    before = tomllib.loads(first_setup(machine).decode())
    capsys.readouterr()
    op = operator()
    rest = ("Management interface [eth0]: ",
            "Management address/prefix (other appliances reach this one here) [10.0.0.5/24]: ",
            "Management gateway ('none') [10.0.0.1]: ",
            "Provisioning interface(s), comma-separated [eth1]: ",
            "Subnet on eth1 (CIDR) [10.1.0.0/24]: ",
            "This appliance's address on eth1 [10.1.0.5]: ",
            "DHCP pool(s) in 10.1.0.0/24, 'first-last' [10.1.0.100-10.1.0.199]: ",
            "Router for machines on 10.1.0.0/24 ('none') [10.1.0.1]: ",
            "The rack's virtual IP (held by the active appliance; 'none') [10.1.0.2]: ",
            "Cluster: this node already belongs to one; 'keep' [keep]: ")  # fmt: skip
    op.answer("Name of this appliance [rb-a]: ", "")
    op.answer("Rack it serves [r12]: ", "r13")
    for prompt in rest:
        op.answer(prompt, "")
    op.answer("? [y/n]: ", "n")  # not yet: asked again, the answers given as the defaults
    op.answer("Name of this appliance [rb-a]: ", "")
    op.answer("Rack it serves [r13]: ", "")
    for prompt in rest:
        op.answer(prompt, "")
    op.answer("? [y/n]: ", "yes")
    assert op.finish() == EXIT_OK
    before["node"]["rack"] = "r13"
    assert tomllib.loads(machine.config.read_text()) == before


@pytest.mark.parametrize("how", ["ctrl-c at the confirmation", "ctrl-c at a question", "eof"])
def test_an_interrupted_dialog_leaves_the_old_file_byte_identical(machine, operator, how):
    machine.config.write_text(machine.config.read_text() + "# a comment setup would drop\n")
    before = machine.config.read_bytes()
    op = operator()
    op.answer("Name of this appliance [", "rb-b")
    op.answer("Rack it serves: ", "r1")
    if how == "ctrl-c at a question":
        op.child.expect_exact("Management interface")
        op.child.sendintr()
    elif how == "eof":
        op.child.expect_exact("Management interface")
        op.child.sendeof()
    else:
        op.answer("Management interface: ", "eth0")
        op.answer("Management address/prefix (other appliances reach this one here): ",
                  "10.0.0.5/24")  # fmt: skip
        op.answer("[none]: ", "")
        op.answer("Provisioning interface(s), comma-separated: ", "eth0")
        op.answer("Subnet on eth0 (CIDR): ", "10.1.0.0/24")
        op.answer("This appliance's address on eth0: ", "10.1.0.5")
        op.answer("DHCP pool(s) in 10.1.0.0/24, 'first-last': ", "10.1.0.100-10.1.0.199")
        op.answer("[none]: ", "")
        op.answer("'none'): ", "none")
        op.answer("[new]: ", "")
        op.child.expect_exact("? [y/n]: ")
        op.child.sendintr()
    why = "end of input" if how == "eof" else "interrupted"
    op.child.expect_exact(f"rackboot: setup stopped ({why}): {machine.config} unchanged")
    assert op.finish() == (1 if how == "eof" else 130)
    assert machine.config.read_bytes() == before
    assert sorted(os.listdir(machine.config.parent)) == ["rackboot.toml"]  # no temporary file
    assert not machine.data.exists()
