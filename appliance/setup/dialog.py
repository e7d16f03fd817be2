"""``rackboot setup``: the questions of :mod:`appliance.setup.questions` asked on a plain
line-based console (a serial line at 115200 baud: no escapes, no full-screen library),
or answered from a file; then the configuration shown, checked, written atomically,
the cluster created or joined, and the service started. See docs/setup.md."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from appliance.config import (
    DEFAULT_CONFIG_PATH,
    _read_regular_file,
    default_node_name,
    read_document,
)
from appliance.errors import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK, ConfigError, RackbootError
from appliance.setup import netapply, system, tomlwrite
from appliance.setup.questions import Answers, Ask, Current, Invalid, apply, collect

MAX_LINE = 4096  # one answer; a token is about 200 characters
MAX_ATTEMPTS = 50  # wrong answers to one question before the dialog gives up
MAX_ROUNDS = 20  # "no, ask again" at the confirmation
HEADER = ("Rackboot configuration, written by `rackboot setup` (docs/setup.md).\n"
          "Comments are not kept when setup rewrites this file.")  # fmt: skip


class Aborted(RackbootError):
    exit_code = EXIT_FAILURE


class Refused(RackbootError):
    """The answers make a configuration `rackboot config check` refuses."""

    exit_code = EXIT_CONFIG


class Console:
    """Questions on a line-based terminal: a prompt, a line back, one line of reason
    when the answer is refused. The terminal's line discipline echoes and edits."""

    def __init__(self, stdin: TextIO, stdout: TextIO) -> None:
        self.stdin, self.stdout = stdin, stdout

    def say(self, text: str = "") -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def line(self, prompt: str) -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        text = self.stdin.readline(MAX_LINE + 1)
        if not text:
            raise Aborted("end of input")
        if len(text) > MAX_LINE:
            while text and not text.endswith("\n"):  # the rest of the line, dropped
                text = self.stdin.readline(MAX_LINE)
            raise Invalid(f"an answer of at most {MAX_LINE} characters")
        return text.strip()

    def ask(self, question: Ask) -> Any:
        default = f" [{question.default}]" if question.default is not None else ""
        for _ in range(MAX_ATTEMPTS):
            try:
                text = self.line(f"{question.prompt}{default}: ")
                if not text and question.default is None:
                    raise Invalid("an answer (there is no current value to keep)")
                return question.check(text or question.default)
            except Invalid as exc:
                self.say(f"  ! expected {exc.expected}")
        raise Aborted(f"{MAX_ATTEMPTS} refused answers to one question")

    def confirm(self, prompt: str) -> bool:
        for _ in range(MAX_ATTEMPTS):
            text = self.line(f"{prompt} [y/n]: ").lower()
            if text in ("y", "yes", "n", "no"):
                return text.startswith("y")
            self.say("  ! expected 'y' or 'n'")
        raise Aborted(f"{MAX_ATTEMPTS} refused answers to one question")


class AnswersFile:
    """The same questions answered by a TOML or JSON file (keys: docs/setup.md). A missing
    key keeps the current value; a wrong one is a configuration error naming it."""

    def __init__(self, source: str, doc: dict[str, Any], console: Console) -> None:
        self.source, self.doc, self.console = source, doc, console
        self.asked: set[tuple[str, ...]] = set()

    @classmethod
    def read(cls, path: str, console: Console) -> AnswersFile:
        if not path.endswith(".json"):
            return cls(*read_document(path), console)
        try:
            doc = json.loads(_read_regular_file(path))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(path, "", f"valid JSON ({exc})", has_found=False) from None
        if not isinstance(doc, dict):
            raise ConfigError(path, "", "a JSON object of answers", doc)
        return cls(path, doc, console)

    def say(self, text: str = "") -> None:
        self.console.say(text)

    def ask(self, question: Ask) -> Any:
        self.asked.add(question.key)
        where = _dotted(question.key)
        value = self._lookup(question.key)
        if value is None and question.default is None:
            raise ConfigError(self.source, where, f"{_expectation(question)} (this key is "
                              "required: there is no current value to keep)", has_found=False)  # fmt: skip
        if value is None:
            value = question.default
        text = ", ".join(value) if _is_strings(value) else value
        if not isinstance(text, str):
            raise ConfigError(self.source, where, "a string (or a list of strings)", value)
        try:
            return question.check(text.strip())
        except Invalid as exc:
            raise ConfigError(self.source, where, exc.expected, value) from None

    def check_every_key_asked(self) -> None:
        """A key no question read is a typo or a question that was not asked (token
        without cluster = 'join'): refused rather than silently ignored."""
        for key in _leaves(self.doc):
            if key not in self.asked:
                asked = ", ".join(sorted(_dotted(k) for k in self.asked))
                raise ConfigError(self.source, _dotted(key),
                                  f"a key the setup asks for here (asked: {asked})",
                                  has_found=False)  # fmt: skip

    def _lookup(self, key: tuple[str, ...]) -> Any:
        value: Any = self.doc
        for part in key:
            if not isinstance(value, dict):
                return None
            value = value.get(part)
        return value


def _is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _expectation(question: Ask) -> str:
    try:
        question.check("")
    except Invalid as exc:
        return exc.expected
    return "an answer"


def _leaves(doc: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, value in doc.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, name))
        else:
            yield (*path, name)


def _dotted(key: tuple[str, ...]) -> str:
    return ".".join(tomlwrite.key(part) for part in key)


# -- the command ---------------------------------------------------------------------


def config_path(args: argparse.Namespace) -> Path:
    """Like the other commands, but never the development node: setup writes a real file."""
    from appliance.loader import CONFIG_VARIABLE

    return Path(args.config or os.environ.get(CONFIG_VARIABLE) or DEFAULT_CONFIG_PATH)


def cmd_setup(args: argparse.Namespace) -> int:
    path = config_path(args)
    if sys.stdin.isatty():  # Ctrl-C stops a dialog, even one started with SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    console = Console(sys.stdin, sys.stdout)
    written = []
    try:
        return _setup(args, path, console, written)
    except (KeyboardInterrupt, Aborted) as exc:
        what = f"{path} written before" if written else f"{path} unchanged"
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
        print(f"\nrackboot: setup stopped ({why}): {what}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else exc.exit_code


def _setup(args: argparse.Namespace, path: Path, console: Console, written: list) -> int:
    doc: dict[str, Any] = {}
    mode = 0o644
    if os.path.lexists(path):
        doc = read_document(path)[1]
        mode = path.stat().st_mode & 0o7777
    interfaces = system.interfaces()
    console.say(f"Rackboot setup: {path} ({'editing it' if doc else 'a new file'}; "
                "[Enter] keeps the value in brackets, Ctrl-C stops without writing)")  # fmt: skip
    console.say("Network interfaces:")
    for i in interfaces:
        console.say(f"  {i.name:<16} {i.state:<8} {i.mac}")
    asker = AnswersFile.read(args.answers, console) if args.answers else console
    enrolled = _enrolled(doc)
    current = Current.of(doc, default_node_name())
    for _ in range(MAX_ROUNDS):
        answers = collect(asker.ask, current, interfaces, enrolled=enrolled, now=time.time())
        if isinstance(asker, AnswersFile):
            asker.check_every_key_asked()
        written_doc = apply(doc, answers)
        text = tomlwrite.dumps(written_doc, HEADER)
        check_config(text, path, answers)
        console.say(f"\nThe configuration ({path}):\n")
        console.say(text)
        if args.answers or console.confirm(f"Write it to {path}?"):
            break
        current = Current.of(tomllib.loads(text), default_node_name())
        console.say("Asking again, with your answers as the values to keep.")
    else:
        raise Aborted(f"not confirmed after {MAX_ROUNDS} rounds")
    system.write_atomically(path, text, mode)
    written.append(path)
    console.say(f"Wrote {path}.")
    code = _cluster(path, answers, console)
    if code == EXIT_OK:
        network_dir = Path(args.network_dir) if args.network_dir else None
        code = netapply.step(path, written_doc.get("network", {}), network_dir, console.say)
    return _start(path, args.no_start, console) if code == EXIT_OK else code


def _enrolled(doc: dict[str, Any]) -> bool:
    from appliance.cluster.files import ClusterFiles

    node = doc.get("node") if isinstance(doc.get("node"), dict) else {}
    try:
        return ClusterFiles(str(node.get("data_dir", "/var/lib/rackboot"))).enrolled()
    except OSError:
        return False


# Refusals of `preflight` that the cluster step of this same setup answers.
_IDENTITY_KEYS = ("cluster.enabled", "ha.peers", "ha.witnesses")


def check_config(text: str, path: Path, answers: Answers) -> None:
    """What `rackboot config check` says of the text, before it replaces anything."""
    from appliance.loader import ConfigSource, load, preflight

    with tempfile.TemporaryDirectory(prefix="rackboot-setup-") as directory:
        candidate = os.path.join(directory, path.name)
        with open(candidate, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            config, _ = load(ConfigSource(candidate, dev=False))
            try:
                preflight(config)
            except ConfigError as exc:
                if answers.cluster == "keep" or exc.keypath not in _IDENTITY_KEYS:
                    raise
        except ConfigError as exc:
            message = str(exc).replace(candidate, str(path))
            raise Refused(f"the configuration would not pass `config check`: {message}") from None


def _cluster(path: Path, answers: Answers, console: Console) -> int:
    """`rackboot cluster init` or `join`, run as that command runs (through the node if
    one answers, else on the files), so that it prints what it prints."""
    if answers.cluster == "keep":
        return EXIT_OK
    from appliance.cli import cmd_cluster

    action = "init" if answers.cluster == "new" else "join"
    args = argparse.Namespace(cluster_command=action, token=answers.token, config=str(path),
                              dev=False, disable_plugin=[], socket=None, json=False)  # fmt: skip
    if action == "init":
        args.__dict__.pop("token")
    try:
        return cmd_cluster(args)
    except RackbootError as exc:
        console.say(f"rackboot: error: cluster {action} failed: {exc}")
        console.say(f"The configuration is written; once that is fixed, run `rackboot cluster "
                    f"{action}{' TOKEN' if action == 'join' else ''} --config {path}`.")  # fmt: skip
        return EXIT_FAILURE


def _start(path: Path, no_start: bool, console: Console) -> int:
    run_it = f"rackboot run --config {path}"
    systemctl = None if no_start else system.service_command()
    if systemctl is None:
        why = "--no-start" if no_start else "no systemd unit 'rackboot' on this machine"
        console.say(f"Not starting the service ({why}). To run it: {run_it}")
        return EXIT_OK
    ok, what = system.start_service(systemctl)
    console.say(("Done: " if ok else "rackboot: error: ") + what)
    return EXIT_OK if ok else EXIT_FAILURE
