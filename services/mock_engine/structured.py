"""Constrained output: each constraint kind compiled to a text generator, and the output plans
(constrained or scripted) the core emits token by token (`types.OutputPlan`).

Kinds (the servicers map their proto oneof to these): json_schema (an instance, `json_instances`),
json_object (a non-empty object), regex (`patterns`), ebnf (`grammars`), choice (one of them),
structural_tag (xgrammar's: the legacy `structures` form emits one structure; the `format`
tree supports const_string, json_schema, grammar, regex, any_text, sequence, or, tag,
triggered_tags and tags_with_separator, each tag list emitting one tag). `compile_constraint`
parses and test-runs the constraint once, raising ConstraintError (the servicers answer
INVALID_ARGUMENT, as the engines refuse a constraint their grammar compiler cannot build).
The text is tokenized with the engine's own tokenizer, so it arrives split at real token
boundaries; the seed (context and sample salt) picks among valid outputs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from switchyard.mock_engine.grammars import parse_ebnf
from switchyard.mock_engine.json_instances import InstanceGenerator, SchemaError
from switchyard.mock_engine.patterns import Generator, PatternError, parse_regex

JSON_SCHEMA = "json_schema"
JSON_OBJECT = "json_object"
REGEX = "regex"
EBNF = "ebnf"
CHOICE = "choice"
STRUCTURAL_TAG = "structural_tag"

TextGenerator = Callable[[random.Random], str]
Encode = Callable[[str], Sequence[int]]


class ConstraintError(ValueError):
    """A constraint the mock engine cannot build; `kind` names it."""

    def __init__(self, kind: str, detail: str, message: str | None = None) -> None:
        super().__init__(message or f"Invalid {kind} constraint: {detail}")
        self.kind = kind


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _schema_generator(schema: Any) -> TextGenerator:
    generator = InstanceGenerator(schema)
    return lambda rng: _json_text(generator.instance(rng))


def _regex_generator(pattern: str) -> TextGenerator:
    node = parse_regex(pattern)
    return lambda rng: Generator(rng).text(node)


def _ebnf_generator(grammar: str) -> TextGenerator:
    rules = parse_ebnf(grammar)
    return lambda rng: Generator(rng, rules).text(rules["root"])


def _tag_generator(tag: Any) -> TextGenerator:
    if not isinstance(tag, dict) or not isinstance(tag.get("begin"), str) or "content" not in tag:
        raise ConstraintError(STRUCTURAL_TAG, f"a tag needs begin, content and end: {tag!r}")
    end = tag.get("end")
    if isinstance(end, list) and end and all(isinstance(e, str) for e in end):
        end = end[0]
    if not isinstance(end, str):
        raise ConstraintError(STRUCTURAL_TAG, "a tag's end is a string or a list of strings")
    begin, content = tag["begin"], _format_generator(tag["content"])
    return lambda rng: begin + content(rng) + end


def _tags_generator(fmt: dict[str, Any]) -> TextGenerator:
    tags = fmt.get("tags")
    if not isinstance(tags, list) or not tags:
        raise ConstraintError(STRUCTURAL_TAG, f"{fmt.get('type')} needs a non-empty tags list")
    options = [_tag_generator(tag) for tag in tags]
    return lambda rng: rng.choice(options)(rng)  # one tag: valid with or without at_least_one


def _elements(fmt: dict[str, Any]) -> list[TextGenerator]:
    elements = fmt.get("elements")
    if not isinstance(elements, list) or not elements:
        raise ConstraintError(STRUCTURAL_TAG, f"{fmt.get('type')} needs a non-empty elements list")
    return [_format_generator(element) for element in elements]


def _format_generator(fmt: Any) -> TextGenerator:
    """One node of a structural tag's `format` tree."""
    if not isinstance(fmt, dict):
        raise ConstraintError(STRUCTURAL_TAG, f"a format is an object, got {fmt!r}")
    kind = fmt.get("type")
    if kind is None:  # xgrammar tries tag first, then the others by their fields
        if "begin" in fmt:
            kind = "tag"
        elif "value" in fmt:
            kind = "const_string"
        elif "json_schema" in fmt:
            kind = "json_schema"
    if kind == "const_string":
        value = fmt.get("value")
        if not isinstance(value, str) or not value:
            raise ConstraintError(STRUCTURAL_TAG, "const_string needs a non-empty value")
        return lambda rng: value
    if kind == "json_schema":
        return _schema_generator(fmt.get("json_schema"))
    if kind == "grammar":
        return _ebnf_generator(str(fmt.get("grammar") or ""))
    if kind == "regex":
        return _regex_generator(str(fmt.get("pattern") or ""))
    if kind == "any_text":
        excludes = [e for e in fmt.get("excludes") or [] if isinstance(e, str)]
        text = "ok" if not any(e and e in "ok" for e in excludes) else ""
        return lambda rng: text
    if kind == "sequence":
        parts = _elements(fmt)
        return lambda rng: "".join(part(rng) for part in parts)
    if kind == "or":
        options = _elements(fmt)
        return lambda rng: rng.choice(options)(rng)
    if kind == "tag":
        return _tag_generator(fmt)
    if kind in ("triggered_tags", "tags_with_separator"):
        return _tags_generator(fmt)
    raise ConstraintError(STRUCTURAL_TAG, f"format type {kind!r} is not supported by the mock")


def _structural_tag_generator(text: str) -> TextGenerator:
    try:
        tag = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(STRUCTURAL_TAG, f"not JSON: {exc}") from None
    if not isinstance(tag, dict):
        raise ConstraintError(STRUCTURAL_TAG, "a structural tag is a JSON object")
    if "format" in tag:
        return _format_generator(tag["format"])
    structures = tag.get("structures")
    if isinstance(structures, list) and structures:  # the legacy form
        options = [
            _tag_generator(
                {
                    "begin": s.get("begin"),
                    "content": {"type": "json_schema", "json_schema": s.get("schema", True)},
                    "end": s.get("end"),
                }
            )
            for s in structures
            if isinstance(s, dict)
        ]
        if not options:
            raise ConstraintError(STRUCTURAL_TAG, "structures must be objects")
        return lambda rng: rng.choice(options)(rng)
    raise ConstraintError(STRUCTURAL_TAG, "needs a format or a structures list")


def _build(kind: str, value: str, choices: Sequence[str]) -> TextGenerator:
    if kind == JSON_SCHEMA:
        try:
            schema = json.loads(value)
        except json.JSONDecodeError as exc:
            # xgrammar's words, which both engines pass on
            raise ConstraintError(
                kind, f"the schema is not JSON: {exc}", "Invalid JSON grammar specification."
            ) from None
        return _schema_generator(schema)
    if kind == JSON_OBJECT:
        return _schema_generator({"type": "object"})
    if kind == REGEX:
        return _regex_generator(value)
    if kind == EBNF:
        return _ebnf_generator(value)
    if kind == CHOICE:
        options = list(choices)
        if not options:
            raise ConstraintError(kind, "no choices")
        return lambda rng: rng.choice(options)
    if kind == STRUCTURAL_TAG:
        return _structural_tag_generator(value)
    raise ConstraintError(kind, "unknown constraint kind")


def compile_constraint(kind: str, value: str = "", choices: Sequence[str] = ()) -> TextGenerator:
    """The text generator of a constraint, test-run once; ConstraintError when it cannot be
    built (bad JSON, an unsupported keyword or regex feature, an undefined rule, ...)."""
    try:
        generator = _build(kind, value, choices)
        generator(random.Random(0))
    except ConstraintError:
        raise
    except (SchemaError, PatternError, RecursionError) as exc:
        raise ConstraintError(kind, str(exc)) from None
    except (AttributeError, TypeError, KeyError, IndexError) as exc:  # a malformed schema
        raise ConstraintError(kind, f"malformed ({type(exc).__name__}: {exc})") from None
    return generator


class TextPlan:
    """Constrained output: a fresh valid text per seed, tokenized with the engine's tokenizer."""

    __slots__ = ("_generate", "_encode")

    def __init__(self, generate: TextGenerator, encode: Encode) -> None:
        self._generate = generate
        self._encode = encode

    def tokens(self, seed: int) -> Sequence[int]:
        return self._encode(self._generate(random.Random(seed)))


class FixedPlan:
    """Scripted output: the same tokens for every seed."""

    __slots__ = ("_tokens",)

    def __init__(self, tokens: Sequence[int]) -> None:
        self._tokens = tuple(tokens)

    def tokens(self, seed: int) -> Sequence[int]:
        return self._tokens
