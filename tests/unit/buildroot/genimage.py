"""A reader for genimage's configuration syntax (libconfuse): enough to check
the partition layouts without genimage."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

TOKEN = re.compile(r'\s+|#[^\n]*|"((?:[^"\\]|\\.)*)"|([{}=])|([^\s{}="#]+)')
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclass
class Section:
    kind: str
    title: str = ""
    options: dict[str, str] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)

    def children(self, kind: str) -> list[Section]:
        return [s for s in self.sections if s.kind == kind]


def parse(path: Path) -> Section:
    tokens = []
    text = path.read_text()
    position = 0
    while position < len(text):
        match = TOKEN.match(text, position)
        if not match:
            raise ValueError(f"{path}: cannot read {text[position : position + 20]!r}")
        position = match.end()
        quoted, punctuation, word = match.groups()
        if quoted is not None:
            tokens.append(("word", quoted))
        elif punctuation:
            tokens.append((punctuation, punctuation))
        elif word:
            tokens.append(("word", word))
    root = Section("root")
    stack = [root]
    index = 0
    while index < len(tokens):
        kind, value = tokens[index]
        if kind == "}":
            stack.pop()
            if not stack:
                raise ValueError(f"{path}: '}}' without a section")
            index += 1
        elif index + 1 < len(tokens) and tokens[index + 1][0] == "=":
            stack[-1].options[value] = tokens[index + 2][1]
            index += 3
        elif index + 1 < len(tokens) and tokens[index + 1][0] == "{":
            section = Section(value)
            stack[-1].sections.append(section)
            stack.append(section)
            index += 2
        elif index + 2 < len(tokens) and tokens[index + 2][0] == "{":
            section = Section(value, tokens[index + 1][1])
            stack[-1].sections.append(section)
            stack.append(section)
            index += 3
        else:
            raise ValueError(f"{path}: unexpected {value!r}")
    if len(stack) != 1:
        raise ValueError(f"{path}: a section is not closed")
    return root


def size_bytes(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([kKmMgG]?)", text)
    if not match:
        raise ValueError(f"not a genimage size: {text!r}")
    return int(match[1]) * UNITS[match[2].lower()]
