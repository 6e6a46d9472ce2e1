"""Text scanning shared by the parsers: partial markers, JSON value ends, call headers.

All of it works on the text a parser holds, resumes where the last call stopped, and jumps
between the characters that matter with compiled patterns (no per-character Python loop
over plain text).
"""

from __future__ import annotations

import json
import re

WHITESPACE = " \t\r\n"


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (else 0).

    That suffix may still become the marker, so a parser holds it back."""
    n = len(text)
    lo = n - len(marker) + 1
    if lo < 0:
        lo = 0
    first = marker[0]
    at = text.find(first, lo)
    while at != -1:
        if marker.startswith(text[at:]):
            return n - at
        at = text.find(first, at + 1)
    return 0


def partial_suffix_any(text: str, markers: tuple[str, ...]) -> int:
    best = 0
    for marker in markers:
        hold = partial_suffix(text, marker)
        if hold > best:
            best = hold
    return best


def find_first(text: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    """The earliest occurrence of any marker at or after `start`: (index, marker) or (-1, "")."""
    best, found = -1, ""
    for marker in markers:
        at = text.find(marker, start)
        if at != -1 and (best == -1 or at < best):
            best, found = at, marker
    return best, found


_OUTSIDE = re.compile(r'[{}\[\]"]')
_INSIDE = re.compile(r'["\\]')


class JsonEnd:
    """Finds where a JSON object or array that starts at `start` ends, fed incrementally.

    Tracks nesting and strings only (json.loads judges validity): `scan(text)` returns the
    index just past the closing bracket, or -1 while the value is still open; call it again
    with the same text grown at its end."""

    __slots__ = ("pos", "depth", "in_string")

    def __init__(self, start: int) -> None:
        self.pos = start
        self.depth = 0
        self.in_string = False

    def scan(self, text: str) -> int:
        pos, depth, in_string, n = self.pos, self.depth, self.in_string, len(text)
        while pos < n:
            if in_string:
                m = _INSIDE.search(text, pos)
                if m is None:
                    pos = n
                    break
                at = m.start()
                if text[at] == "\\":
                    if at + 1 >= n:  # the escaped character has not arrived yet
                        pos = at
                        break
                    pos = at + 2
                    continue
                in_string = False
                pos = at + 1
                continue
            m = _OUTSIDE.search(text, pos)
            if m is None:
                pos = n
                break
            at = m.start()
            char = text[at]
            pos = at + 1
            if char == '"':
                in_string = True
            elif char == "{" or char == "[":
                depth += 1
            else:
                depth -= 1
                if depth <= 0:
                    self.pos, self.depth, self.in_string = pos, 0, False
                    return pos
        self.pos, self.depth, self.in_string = pos, depth, in_string
        return -1


# A tool call written as JSON: {"name": "<name>", "arguments"|"parameters": <value>...}
_NAME = r'(?:[^"\\]|\\.)*'
_HEADER = re.compile(
    r'\s*\{\s*"name"\s*:\s*"(' + _NAME + r')"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)
MAX_HEADER = 512


def _any_prefix(parts: list[str]) -> str:
    """A pattern matching any prefix of the sequence `parts` (each part atomic)."""
    out = ""
    for part in reversed(parts):
        out = f"(?:{part}{out})?"
    return out


def _word_prefix(word: str) -> str:
    return _any_prefix([re.escape(c) for c in word])


_KEY = (
    r'"(?:(?:arguments|parameters)"\s*|'
    + _word_prefix("arguments")
    + "|"
    + _word_prefix("parameters")
    + ")"
)
_HEADER_PREFIX = re.compile(
    _any_prefix(
        [r"\s*", r"\{", r"\s*", '"']
        + list("name")
        + ['"', r"\s*", ":", r"\s*", '"', _NAME + r"\\?", '"', r"\s*", ",", r"\s*", _KEY]
    )
)


class Header:
    """The header of a JSON tool call, once known: the name and where its arguments start."""

    __slots__ = ("name", "args_start")

    def __init__(self, name: str, args_start: int) -> None:
        self.name = name
        self.args_start = args_start


def match_header(text: str, start: int = 0) -> Header | bool:
    """A `Header` when text[start:] opens a call the streaming way (name first, then the
    arguments); False when it cannot (other key order, not an object: the caller then
    awaits the whole object); True while it still might."""
    m = _HEADER.match(text, start)
    if m is not None:
        if m.end() == len(text):  # the arguments value has not begun yet
            return True
        try:
            name = json.loads('"' + m.group(1) + '"')
        except ValueError:
            return False
        return Header(name, m.end())
    if len(text) - start > MAX_HEADER:
        return False
    return _HEADER_PREFIX.fullmatch(text, start) is not None
