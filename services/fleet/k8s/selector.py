"""Kubernetes label selectors: parsed (so a typo in `--k8s-selector` fails at startup, not as a
400 from the API server later) and matched (the test API server filters with this).

The grammar is the API server's (k8s.io/apimachinery labels.Parse), comma-separated
requirements that must all hold:

    key   !key   key=value   key==value   key!=value   key in (a,b)   key notin (a,b)

`!=` and `notin` also match objects without the label. Keys are `[prefix/]name` (prefix a DNS
subdomain, name up to 63 characters); values up to 63 characters, possibly empty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_VALUE = re.compile(rf"^({_NAME})?$")
_KEY_NAME = re.compile(rf"^{_NAME}$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|[^\s=!(),]+)")
_OPERATORS = ("exists", "!exists", "=", "!=", "in", "notin")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # one of _OPERATORS
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "exists":
            return present
        if self.operator == "!exists":
            return not present
        if self.operator in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # != and notin


@dataclass(frozen=True)
class Selector:
    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def check_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        raise ValueError(f"label key {key!r}: prefix must be a DNS subdomain")
    if not _KEY_NAME.match(name):
        raise ValueError(
            f"label key {key!r}: name must be 1-63 characters [A-Za-z0-9-_.], starting and "
            "ending with a letter or digit"
        )
    return key


def _check_value(value: str) -> str:
    if not _VALUE.match(value):
        raise ValueError(
            f"label value {value!r}: at most 63 characters [A-Za-z0-9-_.], starting and ending "
            "with a letter or digit"
        )
    return value


def parse_selector(text: str) -> Selector:
    """Raises ValueError naming what is wrong. An empty selector selects everything."""
    return Selector(text, _Parser(text).requirements())


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    def error(self, problem: str) -> ValueError:
        return ValueError(f"selector {self.text!r}: {problem}")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.error("ends early")
        self.pos += 1
        return token

    def requirements(self) -> tuple[Requirement, ...]:
        found: list[Requirement] = []
        while self.peek() is not None:
            found.append(self.requirement())
            if self.peek() is not None:
                if self.take() != ",":
                    raise self.error("requirements must be separated by commas")
                if self.peek() is None:
                    raise self.error("ends with a comma")
        return tuple(found)

    def requirement(self) -> Requirement:
        first = self.take()
        if first == "!":
            return Requirement(check_key(self.take()), "!exists")
        key = check_key(first)
        following = self.peek()
        if following in (None, ","):
            return Requirement(key, "exists")
        self.pos += 1
        if following in ("=", "==", "!="):
            value = "" if self.peek() in (None, ",") else self.take()
            operator = "!=" if following == "!=" else "="
            return Requirement(key, operator, frozenset([_check_value(value)]))
        if following in ("in", "notin"):
            return Requirement(key, following, self.value_set())
        raise self.error(f"unexpected {following!r} after {key!r}")

    def value_set(self) -> frozenset[str]:
        if self.take() != "(":
            raise self.error("`in`/`notin` take a parenthesized list")
        if self.peek() == ")":
            raise self.error("empty value list")
        values: list[str] = []
        while True:
            value = "" if self.peek() in (",", ")") else self.take()
            values.append(_check_value(value))
            token = self.take()
            if token == ")":
                return frozenset(values)
            if token != ",":
                raise self.error(f"expected , or ) in a value list, got {token!r}")


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        match = _TOKEN.match(stripped, pos)
        if match is None:  # pragma: no cover - the pattern matches any non-space character
            raise ValueError(f"selector {text!r}: cannot read at {pos}")
        tokens.append(match.group(1))
        pos = match.end()
    return tokens
