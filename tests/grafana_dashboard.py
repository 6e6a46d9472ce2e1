"""The Grafana dashboard's JSON structure, as Grafana's dashboard kind (schema 0.0, the
`kinds/dashboard` CUE lineage) defines it, as a JSON Schema; and the metric names its
queries use.

Written from the kind's field list (types, ranges, enums), not copied from it. Stricter than
the kind where a file to import or provision needs it: a uid and a title, the fields the kind
gives defaults (Grafana writes them out on export), and a PromQL `expr` in every target.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "switchyard.json"

_UINT32 = {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}
_DATASOURCE = {
    "type": "object",
    "properties": {"type": {"type": "string"}, "uid": {"type": "string"}},
    "additionalProperties": False,
}
_GRID_POS = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
        "static": {"type": "boolean"},
    },
    "additionalProperties": False,
}
_FIELD_CONFIG = {
    "type": "object",
    "required": ["defaults", "overrides"],
    "properties": {
        "defaults": {
            "type": "object",
            "properties": {
                "unit": {"type": "string"},
                "decimals": {"type": "number"},
                "min": {"type": "number"},
                "max": {"type": "number"},
                "displayName": {"type": "string"},
                "noValue": {"type": "string"},
                "custom": {"type": "object"},
                "mappings": {"type": "array"},
                "color": {
                    "type": "object",
                    "required": ["mode"],
                    "properties": {"mode": {"type": "string"}},
                },
            },
        },
        "overrides": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["matcher", "properties"],
                "properties": {"matcher": {"type": "object"}, "properties": {"type": "array"}},
            },
        },
    },
}
_TARGET = {
    "type": "object",
    "required": ["refId", "expr"],  # Prometheus queries: a PromQL expression each
    "properties": {
        "refId": {"type": "string", "minLength": 1},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "datasource": _DATASOURCE,
    },
}
_PANEL = {
    "type": "object",
    "required": ["type", "id", "gridPos", "targets", "options", "fieldConfig", "transformations"],
    "properties": {
        "type": {"type": "string", "minLength": 1, "not": {"enum": ["row", "graph", "heatmap"]}},
        "id": _UINT32,
        "title": {"type": "string"},
        "description": {"type": "string"},
        "transparent": {"type": "boolean"},
        "datasource": _DATASOURCE,
        "gridPos": _GRID_POS,
        "targets": {"type": "array", "minItems": 1, "items": _TARGET},
        "options": {"type": "object"},
        "fieldConfig": _FIELD_CONFIG,
        "transformations": {
            "type": "array",
            "items": {"type": "object", "required": ["id", "options"]},
        },
        "repeatDirection": {"enum": ["h", "v"]},
    },
}
_ROW = {
    "type": "object",
    "required": ["type", "id", "collapsed", "panels"],
    "properties": {
        "type": {"const": "row"},
        "id": _UINT32,
        "collapsed": {"type": "boolean"},
        "title": {"type": "string"},
        "gridPos": _GRID_POS,
        "panels": {"type": "array", "items": _PANEL},
    },
}
_VARIABLE = {
    "type": "object",
    "required": ["name", "type", "hide"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "type": {
            "enum": [
                "query",
                "adhoc",
                "constant",
                "datasource",
                "interval",
                "textbox",
                "custom",
                "system",
            ]
        },  # fmt: skip
        "hide": {"enum": [0, 1, 2]},
        "label": {"type": "string"},
        "skipUrlSync": {"type": "boolean"},
        "query": {"type": ["string", "object"]},
        "datasource": _DATASOURCE,
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": [
        "uid",
        "title",
        "editable",
        "graphTooltip",
        "schemaVersion",
        "style",
        "time",
        "panels",
        "templating",
        "annotations",
    ],  # fmt: skip
    "properties": {
        "id": {"type": ["integer", "null"]},
        "uid": {"type": "string", "minLength": 1, "maxLength": 40},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "style": {"enum": ["light", "dark"]},
        "timezone": {"type": "string"},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "fiscalYearStartMonth": {"type": "integer", "minimum": 0, "maximum": 11},
        "liveNow": {"type": "boolean"},
        "refresh": {"anyOf": [{"type": "string"}, {"const": False}]},
        "schemaVersion": {"type": "integer", "minimum": 0, "maximum": 65535},
        "version": _UINT32,
        "panels": {"type": "array", "items": {"anyOf": [_ROW, _PANEL]}},
        "templating": {
            "type": "object",
            "properties": {"list": {"type": "array", "items": _VARIABLE}},
        },
        "annotations": {
            "type": "object",
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "datasource", "enable", "iconColor"],
                    },
                }
            },
        },
        "links": {"type": "array"},
    },
}

_METRIC = re.compile(r"\b(switchyard_[a-z0-9_]+)")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested ones included (rows themselves not)."""
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(dashboard) for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def metric_names(expr: str) -> set[str]:
    """The sample names a PromQL expression reads (`switchyard_...`)."""
    return set(_METRIC.findall(expr))


def family(sample: str) -> str:
    """A sample name's metric family (histogram and counter suffixes removed)."""
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def families(dashboard: dict[str, Any]) -> set[str]:
    """The metric families every query of the dashboard reads."""
    return {family(name) for expr in queries(dashboard) for name in metric_names(expr)}
