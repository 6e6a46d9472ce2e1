"""EBNF grammars (the GBNF dialect xgrammar reads: `root ::= ...`) parsed into `patterns`
nodes, so the mock engine can emit text the grammar accepts.

Supported: rules `name ::= body` (a rule runs until the next `name ::=`), string literals with
escapes, character classes (`[a-z]`, `[^"\\\\]`), rule references, grouping, alternation,
quantifiers `* + ? {n} {n,} {n,m}`, `#` comments. The start rule is `root`. Anything else
(lookahead assertions `(= ...)`, an undefined rule, no `root`) raises PatternError, as the
engines' grammar compilers refuse a grammar they cannot build.
"""

from __future__ import annotations

import re

from switchyard.mock_engine.patterns import (
    Alternation,
    CharClass,
    Literal,
    Node,
    PatternError,
    RegexParser,
    Repeat,
    RuleRef,
    Sequence,
)

_RULE_START = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*::=", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


def _strip_comments(text: str) -> str:
    """Drop `#` comments outside string literals and classes."""
    out: list[str] = []
    quote = bracket = False
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and (quote or bracket):
            out.append(text[i : i + 2])
            i += 2
            continue
        if char == '"' and not bracket:
            quote = not quote
        elif char == "[" and not quote:
            bracket = True
        elif char == "]" and not quote:
            bracket = False
        elif char == "#" and not quote and not bracket:
            end = text.find("\n", i)
            i = len(text) if end == -1 else end
            continue
        out.append(char)
        i += 1
    return "".join(out)


class _BodyParser:
    def __init__(self, text: str, rule: str) -> None:
        self.text = text
        self.rule = rule
        self.pos = 0

    def fail(self, what: str) -> PatternError:
        return PatternError(f"EBNF rule {self.rule!r}: {what} at {self.pos}")

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def parse(self) -> Node:
        node = self._alternation()
        self._skip()
        if self.pos != len(self.text):
            raise self.fail(f"unexpected {self.text[self.pos]!r}")
        return node

    def _alternation(self) -> Node:
        options = [self._sequence()]
        while True:
            self._skip()
            if self.text.startswith("|", self.pos):
                self.pos += 1
                options.append(self._sequence())
            else:
                break
        return options[0] if len(options) == 1 else Alternation(tuple(options))

    def _sequence(self) -> Node:
        items: list[Node] = []
        while True:
            self._skip()
            if self.pos >= len(self.text) or self.text[self.pos] in "|)":
                break
            items.append(self._quantified(self._atom()))
        if len(items) == 1:
            return items[0]
        return Sequence(tuple(items))

    def _atom(self) -> Node:
        char = self.text[self.pos]
        if char == '"':
            return self._string()
        if char == "[":
            parser = RegexParser(self.text)
            parser.pos = self.pos + 1
            node = parser._class()
            self.pos = parser.pos
            return node
        if char == "(":
            if self.text.startswith("(=", self.pos):
                raise self.fail("lookahead assertions are not supported")
            self.pos += 1
            node = self._alternation()
            self._skip()
            if not self.text.startswith(")", self.pos):
                raise self.fail("missing ')'")
            self.pos += 1
            return node
        match = _NAME.match(self.text, self.pos)
        if match is None:
            raise self.fail(f"unexpected {char!r}")
        self.pos = match.end()
        return RuleRef(match.group(0))

    def _string(self) -> Node:
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.fail("unterminated string")
            char = self.text[self.pos]
            self.pos += 1
            if char == '"':
                return Literal("".join(out))
            if char == "\\":
                escaped = self.text[self.pos : self.pos + 1]
                self.pos += 1
                if escaped in ("x", "u"):
                    width = 2 if escaped == "x" else 4
                    digits = self.text[self.pos : self.pos + width]
                    try:
                        out.append(chr(int(digits, 16)))
                    except ValueError:
                        raise self.fail(f"bad \\{escaped} escape") from None
                    self.pos += width
                else:
                    out.append(_STRING_ESCAPES.get(escaped, escaped))
            else:
                out.append(char)

    def _quantified(self, atom: Node) -> Node:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in "*+?":
                self.pos += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
                atom = Repeat(atom, low, high)
            elif char == "{":
                close = self.text.find("}", self.pos)
                body = self.text[self.pos + 1 : close] if close != -1 else ""
                low_text, comma, high_text = body.partition(",")
                if not low_text.strip().isdigit():
                    raise self.fail("bad repeat")
                low = int(low_text)
                high = int(high_text) if high_text.strip() else (None if comma else low)
                self.pos = close + 1
                atom = Repeat(atom, low, high)
            else:
                break
        return atom


def parse_ebnf(grammar: str) -> dict[str, Node]:
    """Rules by name; PatternError when the grammar cannot be built."""
    text = _strip_comments(grammar)
    starts = list(_RULE_START.finditer(text))
    if not starts:
        raise PatternError("EBNF grammar has no rules (`name ::= ...`)")
    if text[: starts[0].start()].strip():
        raise PatternError("EBNF grammar has text before its first rule")
    rules: dict[str, Node] = {}
    for i, start in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        name = start.group(1)
        if name in rules:
            raise PatternError(f"EBNF rule {name!r} is defined twice")
        rules[name] = _BodyParser(text[start.end() : end], name).parse()
    if "root" not in rules:
        raise PatternError('The root rule with name "root" is not found')
    for name, body in rules.items():
        _check_refs(body, rules, name)
    return rules


def _check_refs(node: Node, rules: dict[str, Node], rule: str) -> None:
    if isinstance(node, RuleRef):
        if node.name not in rules:
            raise PatternError(f"EBNF rule {rule!r} uses undefined rule {node.name!r}")
    elif isinstance(node, Sequence):
        for item in node.items:
            _check_refs(item, rules, rule)
    elif isinstance(node, Alternation):
        for option in node.options:
            _check_refs(option, rules, rule)
    elif isinstance(node, Repeat):
        _check_refs(node.item, rules, rule)
    elif not isinstance(node, Literal | CharClass):  # pragma: no cover
        raise TypeError(f"unknown node {node!r}")
