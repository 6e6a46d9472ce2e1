"""JSON instances generated from schemas validate against them."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from switchyard.mock_engine.json_instances import InstanceGenerator, SchemaError

_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def check(value: Any, schema: Any, root: Any) -> None:
    """A validator for the keywords the generator claims (the test's own, independent one)."""
    if schema is True or schema == {}:
        return
    if "$ref" in schema:
        target = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part]
        check(value, target, root)
        return
    for part in schema.get("allOf", []):
        check(value, part, root)
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema.get("oneOf")
        matches = 0
        for option in options:
            try:
                check(value, option, root)
                matches += 1
            except AssertionError:
                pass
        assert matches >= 1, (value, options)
    if "const" in schema:
        assert value == schema["const"]
    if "enum" in schema:
        assert value in schema["enum"]
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        assert any(_is_type(value, k) for k in kinds), (value, kind)
    if isinstance(value, dict):
        for name in schema.get("required", []):
            assert name in value, (name, value)
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                check(value[name], sub, root)
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(schema.get("properties", {}))
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0)
        assert len(value) <= schema.get("maxItems", len(value))
        if schema.get("uniqueItems"):
            assert len({json.dumps(v, sort_keys=True) for v in value}) == len(value)
        items = schema.get("items")
        for i, item in enumerate(value):
            prefix = schema.get("prefixItems", [])
            if i < len(prefix):
                check(item, prefix[i], root)
            elif isinstance(items, dict):
                check(item, items, root)
    if isinstance(value, str):
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
        if "pattern" in schema:
            assert re.search(schema["pattern"], value), (schema["pattern"], value)
    if _is_type(value, "number"):
        if "minimum" in schema:
            assert value >= schema["minimum"]
        if "maximum" in schema:
            assert value <= schema["maximum"]
        if "exclusiveMinimum" in schema:
            assert value > schema["exclusiveMinimum"]
        if "exclusiveMaximum" in schema:
            assert value < schema["exclusiveMaximum"]
        if "multipleOf" in schema:
            ratio = value / schema["multipleOf"]
            assert abs(ratio - round(ratio)) < 1e-9


SCHEMAS = {
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 12},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "b", "c"]},
                "uniqueItems": True,
                "maxItems": 3,
            },
            "active": {"type": "boolean"},
            "nothing": {"type": "null"},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f}
            for f in ("date", "date-time", "email", "uuid", "uri", "ipv4")
        },
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer", "multipleOf": 5},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value", "children"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "unions": {
        "type": "object",
        "properties": {
            "either": {
                "anyOf": [{"type": "string", "pattern": "^x[0-9]{3}$"}, {"type": "integer"}]
            },
            "one": {"oneOf": [{"const": "fixed"}, {"type": "array", "minItems": 2}]},
            "merged": {
                "allOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                    {"properties": {"b": {"type": ["integer", "null"]}}, "required": ["b"]},
                ]
            },
            "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}]},
        },
        "required": ["either", "one", "merged", "tuple"],
    },
    "tool_call": {  # what a required tool choice constrains to
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": ["get_weather"]},
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                    "required": ["city"],
                },
            },
            "required": ["name", "parameters"],
        },
    },
}


class TestInstances:
    @pytest.mark.parametrize("name", sorted(SCHEMAS))
    def test_instances_validate(self, name: str) -> None:
        schema = SCHEMAS[name]
        generator = InstanceGenerator(schema)
        for seed in range(25):
            value = generator.instance(random.Random(seed))
            check(json.loads(json.dumps(value)), schema, schema)

    def test_seeds_give_different_instances(self) -> None:
        generator = InstanceGenerator(SCHEMAS["object"])
        values = {json.dumps(generator.instance(random.Random(s))) for s in range(10)}
        assert len(values) > 5

    def test_json_object_is_a_non_empty_object(self) -> None:
        value = InstanceGenerator({"type": "object"}).instance(random.Random(0))
        assert isinstance(value, dict) and value

    @pytest.mark.parametrize(
        "schema",
        [
            {"not": {"type": "string"}},
            {"type": "object", "properties": {"x": {"if": {}, "then": {}}}},
            False,
            {"type": "string", "pattern": "(?=a)b"},
            {"$ref": "https://example.com/remote.json"},
        ],
    )
    def test_what_cannot_be_honoured_is_refused(self, schema: Any) -> None:
        with pytest.raises(SchemaError):
            InstanceGenerator(schema).instance(random.Random(0))
