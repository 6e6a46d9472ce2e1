"""Engine constraints in an engine-neutral form, built from `tool_choice` (response_format's
are made by openai_requests).

`Constraint(kind, value)` maps one to one onto the engines' `constraint` oneof (vLLM:
json_schema, regex, grammar, structural_tag, json_object, choice; SGLang: regex,
json_schema, ebnf_grammar, structural_tag, where json_object and choice have to be
expressed as a schema or a regex by the engine adapter). `value` is the constraint's text:
a schema as JSON, a pattern, a grammar, a structural tag as JSON, "" for json_object, and
for choice a JSON list of the strings.

tool_choice, as the engines' gateways do it (smg, SGLang, vLLM):
- "required": a JSON schema for a list of at least one {"name": <one of the tools>,
  "parameters": <that tool's parameters>} object (at most one when parallel_tool_calls is
  false); the tools' `$defs` are merged at the top.
- a named function: that function's parameters schema itself.
- "auto" / "none" / absent: no constraint.
How the constrained output becomes tool calls again: `ParserChoice.for_request` given the
same tool_choice picks `RequiredToolParser` (each list item is a call, its "parameters"
the arguments) or `NamedToolParser` (the whole output is the named call's arguments)
instead of the family's markup parser, streaming or not; finish_reason is then
"tool_calls". When a reasoning parser is active the constraint must start after the
reasoning (vLLM's `grammar_from_first_token` false): the reasoning comes first, then the
constrained JSON, which the parsers read from the content part.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidRequestError

ConstraintKind = Literal["json_schema", "regex", "ebnf", "structural_tag", "json_object", "choice"]
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: ConstraintKind
    value: str


def tool_choice_constraint(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    parallel_tool_calls: bool = True,
) -> Constraint | None:
    """The constraint `tool_choice` asks of the engine; 400s name the offending field."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    functions = _functions(tools)
    if tool_choice == "required":
        if not functions:
            raise InvalidRequestError(
                'tool_choice "required" needs at least one tool in "tools".', param="tool_choice"
            )
        return Constraint("json_schema", _dumps(required_schema(functions, parallel_tool_calls)))
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidRequestError(
                'tool_choice must be "none", "auto", "required" or '
                '{"type": "function", "function": {"name": ...}}.',
                param="tool_choice",
            )
        for candidate in functions:
            if candidate.get("name") == name:
                return Constraint("json_schema", _dumps(_parameters(candidate)))
        raise InvalidRequestError(
            f"tool_choice names the function {name!r}, which is not in tools.",
            param="tool_choice",
        )
    raise InvalidRequestError(
        'tool_choice must be "none", "auto", "required" or a named function.',
        param="tool_choice",
    )


def required_schema(
    functions: Sequence[Mapping[str, Any]], parallel_tool_calls: bool = True
) -> dict[str, Any]:
    """The schema of the list of calls `tool_choice: "required"` constrains output to."""
    defs: dict[str, Any] = {}
    options = []
    for function in functions:
        parameters = _parameters(function)
        for name, definition in (parameters.get("$defs") or {}).items():
            if name in defs and defs[name] != definition:
                raise InvalidRequestError(
                    f"The tools define '$defs/{name}' differently; a required tool_choice "
                    "needs one definition per name.",
                    param="tools",
                )
            defs[name] = definition
        options.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [function["name"]]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": options}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _functions(tools: Sequence[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    functions = []
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidRequestError(
                'Each tool must be {"type": "function", "function": {"name": ...}}.',
                param="tools",
            )
        functions.append(function)
    return functions


def _parameters(function: Mapping[str, Any]) -> Mapping[str, Any]:
    parameters = function.get("parameters")
    return parameters if isinstance(parameters, Mapping) and parameters else EMPTY_PARAMETERS


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
