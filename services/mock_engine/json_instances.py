"""A JSON value valid against a JSON schema, as a constrained decoder would write one.

Supported keywords: type (one or a list), enum, const, properties / required (every property
is written, required first), additionalProperties (ignored: only listed properties are
written), items (a schema, or a list / prefixItems), minItems / maxItems, uniqueItems,
minLength / maxLength, pattern (via `patterns`), format (date, time, date-time, email, uri,
uuid, ipv4, hostname), minimum / maximum / exclusiveMinimum / exclusiveMaximum / multipleOf,
anyOf / oneOf (one branch), allOf (merged), $ref into $defs / definitions (recursion bounded),
and the annotations (title, description, default, examples, ...). A keyword it cannot honour
(not, if/then/else, dependentSchemas, ...) raises SchemaError naming it: the mock engine never
emits an instance it cannot vouch for.
"""

from __future__ import annotations

import math
import random
from typing import Any

from switchyard.mock_engine.patterns import Generator, PatternError, parse_regex

_WORDS = (
    "alpha", "bravo", "delta", "echo", "mock", "river", "stone", "cloud", "amber", "pixel",
    "orbit", "cedar", "lumen", "quartz", "willow", "harbor", "ember", "nova", "tundra", "sable",
)  # fmt: skip
_ANNOTATIONS = frozenset(
    {
        "$schema", "$id", "$comment", "title", "description", "default", "examples",
        "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict", "name",
        "additionalProperties", "unevaluatedProperties", "contentMediaType",
        "contentEncoding", "nullable", "discriminator",
    }
)  # fmt: skip
_HANDLED = frozenset(
    {
        "type", "enum", "const", "properties", "required", "items", "prefixItems",
        "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf",
        "oneOf", "allOf", "$ref", "minProperties", "maxProperties",
    }
)  # fmt: skip
_MAX_DEPTH = 8  # $ref expansions before arrays and optional parts are cut short


class SchemaError(ValueError):
    """A schema the mock engine cannot produce an instance of."""


class InstanceGenerator:
    def __init__(self, schema: Any) -> None:
        if not isinstance(schema, dict | bool):
            raise SchemaError("a JSON schema is an object or a boolean")
        self.root = schema
        self._check(schema, "#")

    def _check(self, schema: Any, where: str) -> None:
        """Refuse what cannot be honoured, once, before any generation."""
        if isinstance(schema, bool):
            if not schema:
                raise SchemaError(f"{where}: the schema false has no instance")
            return
        if not isinstance(schema, dict):
            raise SchemaError(f"{where}: a schema is an object or a boolean")
        for key, value in schema.items():
            if key in _ANNOTATIONS:
                continue
            if key not in _HANDLED:
                raise SchemaError(f"{where}: JSON schema keyword {key!r} is not supported")
            if key in ("properties",):
                for name, sub in value.items():
                    self._check(sub, f"{where}/properties/{name}")
            elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
                for i, sub in enumerate(value):
                    self._check(sub, f"{where}/{key}/{i}")
            elif key == "items":
                for i, sub in enumerate(value if isinstance(value, list) else [value]):
                    self._check(sub, f"{where}/items/{i}")
            elif key == "pattern":
                try:
                    parse_regex(value)
                except PatternError as exc:
                    raise SchemaError(f"{where}: {exc}") from None
        for section in ("$defs", "definitions"):
            for name, sub in (schema.get(section) or {}).items():
                self._check(sub, f"{where}/{section}/{name}")

    def instance(self, rng: random.Random) -> Any:
        return self._value(self.root, rng, 0)

    def _resolve(self, ref: str) -> Any:
        if ref == "#":
            return self.root
        if not ref.startswith("#/"):
            raise SchemaError(f"$ref {ref!r}: only local references are supported")
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SchemaError(f"$ref {ref!r} does not resolve")
            node = node[part]
        return node

    def _merge(self, schema: dict[str, Any]) -> dict[str, Any]:
        """allOf folded into one schema (properties and required united)."""
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict) and "$ref" in part:
                part = self._resolve(part["$ref"])
            if not isinstance(part, dict):
                continue
            if "allOf" in part:
                part = self._merge(part)
            for key, value in part.items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
                else:
                    merged.setdefault(key, value)
        return merged

    def _value(self, schema: Any, rng: random.Random, depth: int) -> Any:
        if schema is True or schema == {}:
            return rng.choice(_WORDS)
        assert isinstance(schema, dict)
        if "$ref" in schema:
            if depth > _MAX_DEPTH * 4:
                raise SchemaError("the schema's $ref recursion has no finite instance")
            target = self._resolve(schema["$ref"])
            extra = {k: v for k, v in schema.items() if k != "$ref"}
            if extra and isinstance(target, dict):
                target = {**target, **extra}
            return self._value(target, rng, depth + 1)
        if "allOf" in schema:
            return self._value(self._merge(schema), rng, depth)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            if not schema["enum"]:
                raise SchemaError("an empty enum has no instance")
            return rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not options:
                    raise SchemaError(f"an empty {key} has no instance")
                base = {k: v for k, v in schema.items() if k != key}
                branch = options[0] if depth > _MAX_DEPTH else rng.choice(options)
                if isinstance(branch, dict) and base:
                    branch = {**base, **branch}
                return self._value(branch, rng, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"] or kind
            kind = kinds[0] if depth > _MAX_DEPTH else rng.choice(kinds)
        if kind is None:
            kind = self._infer(schema)
        if kind == "object":
            return self._object(schema, rng, depth)
        if kind == "array":
            return self._array(schema, rng, depth)
        if kind == "string":
            return self._string(schema, rng)
        if kind == "integer":
            return self._integer(schema, rng)
        if kind == "number":
            return self._number(schema, rng)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        raise SchemaError(f"unknown JSON schema type {kind!r}")

    @staticmethod
    def _infer(schema: dict[str, Any]) -> str:
        if "properties" in schema or "required" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        if {"minLength", "maxLength", "pattern", "format"} & schema.keys():
            return "string"
        if {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & schema.keys():
            return "number"
        return "string"

    def _object(self, schema: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
        properties: dict[str, Any] = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        out: dict[str, Any] = {}
        for name in required:
            out[name] = self._value(properties.get(name, True), rng, depth + 1)
        if depth <= _MAX_DEPTH:
            for name, sub in properties.items():
                if name not in out:
                    out[name] = self._value(sub, rng, depth + 1)
        low = int(schema.get("minProperties", 0))
        while len(out) < low:
            out[f"{rng.choice(_WORDS)}_{len(out)}"] = rng.choice(_WORDS)
        high = schema.get("maxProperties")
        if high is not None and len(out) > high:
            keep = required + [k for k in out if k not in required]
            out = {k: out[k] for k in keep[: int(high)]}
        if not out and not properties and depth == 0 and "maxProperties" not in schema:
            out = {"result": rng.choice(_WORDS)}  # json_object: a non-empty object
        return out

    def _array(self, schema: dict[str, Any], rng: random.Random, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, True
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        count = low if depth > _MAX_DEPTH else max(low, min(low + 3, rng.randint(1, 3)))
        if high is not None:
            count = min(count, int(high))
        if prefix:
            count = max(count, len(prefix)) if high is None else min(max(count, len(prefix)), high)
        out: list[Any] = []
        attempts = 0
        while len(out) < count:
            index = len(out)
            sub = prefix[index] if prefix and index < len(prefix) else items
            value = self._value(sub, rng, depth + 1)
            attempts += 1
            if schema.get("uniqueItems") and value in out:
                if attempts > 20 * (count + 1):
                    raise SchemaError("uniqueItems: not enough distinct items to draw")
                continue
            out.append(value)
        return out

    def _string(self, schema: dict[str, Any], rng: random.Random) -> str:
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if "pattern" in schema:
            text = Generator(rng).text(parse_regex(schema["pattern"]))
        else:
            text = _FORMATS.get(schema.get("format", ""), _words)(rng)
        while len(text) < low:
            text += rng.choice("abcdefghijklmnopqrstuvwxyz")
        if high is not None and len(text) > int(high):
            text = text[: int(high)]
        return text

    @staticmethod
    def _bounds(schema: dict[str, Any]) -> tuple[float, bool, float, bool]:
        """(low, low exclusive, high, high exclusive); draft 4's boolean exclusives too."""
        low, high = float(schema.get("minimum", -math.inf)), float(schema.get("maximum", math.inf))
        low_x = schema.get("exclusiveMinimum") is True
        high_x = schema.get("exclusiveMaximum") is True
        bound = schema.get("exclusiveMinimum")
        if isinstance(bound, int | float) and not isinstance(bound, bool) and bound >= low:
            low, low_x = float(bound), True
        bound = schema.get("exclusiveMaximum")
        if isinstance(bound, int | float) and not isinstance(bound, bool) and bound <= high:
            high, high_x = float(bound), True
        return low, low_x, high, high_x

    def _integer(self, schema: dict[str, Any], rng: random.Random) -> int:
        low, low_x, high, high_x = self._bounds(schema)
        lo = (
            -math.inf
            if low == -math.inf
            else math.ceil(low) + (1 if low_x and low.is_integer() else 0)
        )
        hi = (
            math.inf
            if high == math.inf
            else math.floor(high) - (1 if high_x and high.is_integer() else 0)
        )
        if lo == -math.inf:
            lo = 0 if hi == math.inf or hi >= 0 else hi - 100
        if hi == math.inf:
            hi = lo + 100
        step = schema.get("multipleOf", 1)
        if not isinstance(step, int) or step <= 0:
            step = 1 if not isinstance(step, float) or not step.is_integer() else int(step)
        first = math.ceil(lo / step) * step
        if first > hi:
            raise SchemaError("the integer bounds and multipleOf admit no value")
        return int(first + step * rng.randint(0, int((hi - first) // step)))

    def _number(self, schema: dict[str, Any], rng: random.Random) -> float | int:
        low, low_x, high, high_x = self._bounds(schema)
        lo = low if low != -math.inf else (min(0.0, high - 100) if high != math.inf else 0.0)
        hi = high if high != math.inf else lo + 100
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and step > 0:
            first = math.ceil(lo / step)
            last = math.floor(hi / step)
            picks = [
                k
                for k in range(first, min(last, first + 100) + 1)
                if not (low_x and k * step <= low) and not (high_x and k * step >= high)
            ]
            if not picks:
                raise SchemaError("the number bounds and multipleOf admit no value")
            value = rng.choice(picks) * step
            return int(value) if float(value).is_integer() else value
        value = round(rng.uniform(lo, hi), 2)
        if value < lo or value > hi or (low_x and value <= low) or (high_x and value >= high):
            value = (lo + hi) / 2
        return value


def _words(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def _date(rng: random.Random) -> str:
    return f"20{rng.randint(10, 39)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"


_FORMATS = {
    "date": _date,
    "time": _time,
    "date-time": lambda rng: f"{_date(rng)}T{_time(rng)}",
    "email": lambda rng: f"{rng.choice(_WORDS)}@example.com",
    "uri": lambda rng: f"https://example.com/{rng.choice(_WORDS)}",
    "url": lambda rng: f"https://example.com/{rng.choice(_WORDS)}",
    "uuid": lambda rng: (
        f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-4{rng.getrandbits(12):03x}-"
        f"8{rng.getrandbits(12):03x}-{rng.getrandbits(48):012x}"
    ),
    "ipv4": lambda rng: ".".join(str(rng.randint(1, 254)) for _ in range(4)),
    "hostname": lambda rng: f"{rng.choice(_WORDS)}.example.com",
}
