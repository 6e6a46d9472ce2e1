"""Text that matches a pattern: regular expressions (and the EBNF grammars of `grammars`,
which share these nodes), generated the way a constrained decoder's output would be.

Supported regex syntax: literals and escapes (\\d \\w \\s and their negations, \\n \\t \\r, \\xHH,
\\uHHHH, escaped metacharacters), `.`, character classes with ranges and negation, groups
(capturing, `(?:...)`, named), alternation, quantifiers `* + ? {n} {n,} {n,m}` (lazy and
possessive forms read alike), anchors `^ $` (which match the whole output anyway). What a
constrained decoder cannot run (lookaround, backreferences) raises PatternError, as the engines'
grammar compilers refuse it. Generation is driven by a `random.Random`, so one seed gives one
text; open-ended repeats stay short.
"""

from __future__ import annotations

import dataclasses
import random
import string

Node = object  # one of the dataclasses below

_MAX_OPEN_REPEAT = 3  # extra repetitions drawn for `*`, `+` and `{n,}`
# What a negated class or `.` draws from: printable, no newline (a decoder's usual output).
_PRINTABLE = string.ascii_letters + string.digits + " _-"


class PatternError(ValueError):
    """A pattern the mock engine cannot parse or run."""


@dataclasses.dataclass(frozen=True, slots=True)
class Literal:
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class CharClass:
    ranges: tuple[tuple[int, int], ...]  # inclusive code point ranges
    negated: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Sequence:
    items: tuple[Node, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Alternation:
    options: tuple[Node, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Repeat:
    item: Node
    low: int
    high: int | None  # None: unbounded


@dataclasses.dataclass(frozen=True, slots=True)
class RuleRef:
    """A grammar rule by name (EBNF only)."""

    name: str


ANY = CharClass((), negated=True)  # `.`: anything (drawn from _PRINTABLE)
_DIGIT = ((ord("0"), ord("9")),)
_WORD = ((ord("a"), ord("z")), (ord("A"), ord("Z")), (ord("0"), ord("9")), (ord("_"), ord("_")))
_SPACE = ((ord(" "), ord(" ")), (ord("\t"), ord("\t")), (ord("\n"), ord("\n")), (13, 13))
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


def _contains(cls: CharClass, char: str) -> bool:
    code = ord(char)
    inside = any(lo <= code <= hi for lo, hi in cls.ranges)
    return inside != cls.negated


def draw_char(cls: CharClass, rng: random.Random) -> str:
    if not cls.negated:
        if not cls.ranges:
            raise PatternError("an empty character class matches nothing")
        # Prefer printable ASCII inside the class (what a model writes), else any member.
        printable = [c for c in _PRINTABLE if _contains(cls, c)]
        if printable:
            return rng.choice(printable)
        lo, hi = rng.choice(cls.ranges)
        return chr(rng.randint(lo, hi))
    allowed = [c for c in _PRINTABLE if _contains(cls, c)]
    if not allowed:
        allowed = [chr(c) for c in range(33, 127) if _contains(cls, chr(c))]
    if not allowed:
        raise PatternError("the negated class excludes every printable character")
    return rng.choice(allowed)


class RegexParser:
    """A recursive-descent parser of one regular expression into nodes."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.pos = 0

    def parse(self) -> Node:
        node = self._alternation()
        if self.pos != len(self.text):
            raise PatternError(f"unbalanced ')' at {self.pos} in regex {self.text!r}")
        return node

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _alternation(self) -> Node:
        options = [self._sequence()]
        while self._peek() == "|":
            self.pos += 1
            options.append(self._sequence())
        return options[0] if len(options) == 1 else Alternation(tuple(options))

    def _sequence(self) -> Node:
        items: list[Node] = []
        while self.pos < len(self.text) and self._peek() not in "|)":
            atom = self._atom()
            if atom is None:
                continue
            items.append(self._quantified(atom))
        return items[0] if len(items) == 1 else Sequence(tuple(items))

    def _atom(self) -> Node | None:
        char = self.text[self.pos]
        self.pos += 1
        if char in "^$":
            return None
        if char == ".":
            return ANY
        if char == "(":
            return self._group()
        if char == "[":
            return self._class()
        if char == "\\":
            return self._escape(in_class=False)
        if char in "*+?":
            raise PatternError(f"nothing to repeat at {self.pos - 1} in regex {self.text!r}")
        return Literal(char)

    def _group(self) -> Node:
        if self.text.startswith("?", self.pos):
            rest = self.text[self.pos + 1 : self.pos + 3]
            if rest.startswith(":"):
                self.pos += 2
            elif rest.startswith(("P<", "<")) and not rest.startswith(("<=", "<!")):
                close = self.text.find(">", self.pos)
                if close == -1:
                    raise PatternError(f"unterminated group name in regex {self.text!r}")
                self.pos = close + 1
            else:
                raise PatternError(
                    f"regex feature (?{rest[:1]} is not supported (lookaround and inline flags "
                    "cannot be compiled to a grammar)"
                )
        node = self._alternation()
        if self._peek() != ")":
            raise PatternError(f"missing ')' in regex {self.text!r}")
        self.pos += 1
        return node

    def _class(self) -> Node:
        negated = self._peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.pos >= len(self.text):
                raise PatternError(f"unterminated character class in regex {self.text!r}")
            char = self.text[self.pos]
            if char == "]" and not first:
                self.pos += 1
                break
            first = False
            self.pos += 1
            if char == "\\":
                escaped = self._escape(in_class=True)
                if isinstance(escaped, CharClass):
                    if escaped.negated:
                        raise PatternError("negated escapes inside a class are not supported")
                    ranges.extend(escaped.ranges)
                    continue
                assert isinstance(escaped, Literal)
                low = escaped.text
            else:
                low = char
            if self._peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = self.text[self.pos]
                self.pos += 1
                if high == "\\":
                    escaped = self._escape(in_class=True)
                    if not isinstance(escaped, Literal):
                        raise PatternError(f"bad class range in regex {self.text!r}")
                    high = escaped.text
                if ord(high) < ord(low):
                    raise PatternError(f"bad class range {low}-{high} in regex {self.text!r}")
                ranges.append((ord(low), ord(high)))
            else:
                ranges.append((ord(low), ord(low)))
        return CharClass(tuple(ranges), negated)

    def _escape(self, *, in_class: bool) -> Node:
        if self.pos >= len(self.text):
            raise PatternError(f"trailing backslash in regex {self.text!r}")
        char = self.text[self.pos]
        self.pos += 1
        if char.lower() in _CLASS_ESCAPES:
            return CharClass(_CLASS_ESCAPES[char.lower()], negated=char.isupper())
        if char in _CHAR_ESCAPES:
            return Literal(_CHAR_ESCAPES[char])
        if char in "xu":
            width = 2 if char == "x" else 4
            digits = self.text[self.pos : self.pos + width]
            if len(digits) != width or any(d not in string.hexdigits for d in digits):
                raise PatternError(f"bad \\{char} escape in regex {self.text!r}")
            self.pos += width
            return Literal(chr(int(digits, 16)))
        if char.isdigit() or (char in "bBAZzk" and not in_class):
            raise PatternError(f"regex escape \\{char} is not supported (backreference/anchor)")
        return Literal(char)

    def _quantified(self, atom: Node) -> Node:
        while True:
            char = self._peek()
            if char == "*":
                low, high = 0, None
            elif char == "+":
                low, high = 1, None
            elif char == "?":
                low, high = 0, 1
            elif char == "{":
                bounds = self._braces()
                if bounds is None:
                    return atom
                low, high = bounds
                atom = Repeat(atom, low, high)
                self._skip_modifier()
                continue
            else:
                return atom
            self.pos += 1
            atom = Repeat(atom, low, high)
            self._skip_modifier()

    def _skip_modifier(self) -> None:
        if self._peek() in ("?", "+"):
            self.pos += 1

    def _braces(self) -> tuple[int, int | None] | None:
        close = self.text.find("}", self.pos)
        if close == -1:
            return None
        body = self.text[self.pos + 1 : close]
        low_text, comma, high_text = body.partition(",")
        if not low_text.strip().isdigit() or (
            high_text.strip() and not high_text.strip().isdigit()
        ):
            return None  # not a quantifier: `{` is a literal
        low = int(low_text)
        high = int(high_text) if high_text else (None if comma else low)
        if high is not None and high < low:
            raise PatternError(f"bad repeat {{{body}}} in regex {self.text!r}")
        self.pos = close + 1
        return low, high


def parse_regex(pattern: str) -> Node:
    return RegexParser(pattern).parse()


class Generator:
    """Expands nodes into text; `rules` resolves RuleRef (grammars), with `depth` bounding the
    expansion: past it, alternatives and repeats take their shortest way out."""

    MAX_DEPTH = 12

    def __init__(self, rng: random.Random, rules: dict[str, Node] | None = None) -> None:
        self.rng = rng
        self.rules = rules or {}
        self._heights = _heights(self.rules) if self.rules else {}

    def text(self, node: Node) -> str:
        out: list[str] = []
        self._emit(node, out, 0)
        return "".join(out)

    def _emit(self, node: Node, out: list[str], depth: int) -> None:
        if isinstance(node, Literal):
            out.append(node.text)
        elif isinstance(node, CharClass):
            out.append(draw_char(node, self.rng))
        elif isinstance(node, Sequence):
            for item in node.items:
                self._emit(item, out, depth)
        elif isinstance(node, Alternation):
            if depth > self.MAX_DEPTH:
                option = min(node.options, key=lambda o: _height(o, self._heights))
            else:
                option = self.rng.choice(node.options)
            self._emit(option, out, depth)
        elif isinstance(node, Repeat):
            if depth > self.MAX_DEPTH:
                count = node.low
            else:
                high = node.low + _MAX_OPEN_REPEAT if node.high is None else node.high
                count = self.rng.randint(node.low, min(high, node.low + _MAX_OPEN_REPEAT))
            for _ in range(count):
                self._emit(node.item, out, depth)
        elif isinstance(node, RuleRef):
            rule = self.rules.get(node.name)
            if rule is None:
                raise PatternError(f"grammar rule {node.name!r} is not defined")
            self._emit(rule, out, depth + 1)
        else:  # pragma: no cover - the parsers build only the nodes above
            raise TypeError(f"unknown pattern node {node!r}")


_UNREACHABLE = 10**9


def _height(node: Node, heights: dict[str, int]) -> int:
    """Rule expansions the shortest way through `node` needs (its escape from recursion)."""
    if isinstance(node, Literal | CharClass):
        return 0
    if isinstance(node, Sequence):
        return max((_height(i, heights) for i in node.items), default=0)
    if isinstance(node, Alternation):
        return min(_height(o, heights) for o in node.options)
    if isinstance(node, Repeat):
        return 0 if node.low == 0 else _height(node.item, heights)
    if isinstance(node, RuleRef):
        return heights.get(node.name, _UNREACHABLE) + 1
    return 0


def _heights(rules: dict[str, Node]) -> dict[str, int]:
    """Each rule's shortest expansion height, to a fixpoint (recursive rules converge)."""
    heights = {name: _UNREACHABLE for name in rules}
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            height = _height(body, heights)
            if height < heights[name]:
                heights[name] = height
                changed = True
    return heights
