"""Constraints compiled to text generators, output plans, and the script file."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from switchyard.mock_engine import structured
from switchyard.mock_engine.config import default_tokenizer_dir
from switchyard.mock_engine.errors import ConfigError
from switchyard.mock_engine.script import load_script
from switchyard.mock_engine.structured import (
    ConstraintError,
    FixedPlan,
    TextPlan,
    compile_constraint,
)
from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
}


def texts(kind: str, value: str = "", choices: tuple[str, ...] = ()) -> list[str]:
    generate = compile_constraint(kind, value, choices)
    return [generate(random.Random(seed)) for seed in range(15)]


class TestKinds:
    def test_json_schema(self) -> None:
        for text in texts(structured.JSON_SCHEMA, json.dumps(WEATHER)):
            value = json.loads(text)
            assert isinstance(value["city"], str) and value["days"] >= 1

    def test_json_object(self) -> None:
        for text in texts(structured.JSON_OBJECT):
            assert isinstance(json.loads(text), dict)

    def test_regex(self) -> None:
        for text in texts(structured.REGEX, r"(yes|no), [0-9]{2}"):
            assert re.fullmatch(r"(yes|no), [0-9]{2}", text)

    def test_choice(self) -> None:
        out = texts(structured.CHOICE, choices=("red", "green", "blue"))
        assert set(out) <= {"red", "green", "blue"} and len(set(out)) > 1

    def test_ebnf(self) -> None:
        for text in texts(structured.EBNF, 'root ::= "v" [0-9] ("." [0-9])?'):
            assert re.fullmatch(r"v[0-9](\.[0-9])?", text)


TOOL_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<tool_call>"],
        "tags": [
            {
                "type": "tag",
                "begin": '<tool_call>\n{"name": "get_weather", "arguments": ',
                "content": {"type": "json_schema", "json_schema": WEATHER},
                "end": "}\n</tool_call>",
            }
        ],
        "at_least_one": True,
        "stop_after_first": True,
    },
}


class TestStructuralTag:
    def test_triggered_tag_emits_one_schema_valid_call(self) -> None:
        for text in texts(structured.STRUCTURAL_TAG, json.dumps(TOOL_TAG)):
            body = text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
            call = json.loads(body)
            assert call["name"] == "get_weather" and call["arguments"]["days"] >= 1

    def test_legacy_structures(self) -> None:
        tag = {
            "type": "structural_tag",
            "structures": [
                {"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"}
            ],
            "triggers": ["<function="],
        }
        for text in texts(structured.STRUCTURAL_TAG, json.dumps(tag)):
            assert text.startswith("<function=get_weather>") and text.endswith("</function>")
            json.loads(text[len("<function=get_weather>") : -len("</function>")])

    def test_sequence_or_const_regex_and_untyped_tags(self) -> None:
        fmt = {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": "<calls>"},
                {
                    "type": "tags_with_separator",
                    "separator": ",",
                    "tags": [
                        {"begin": "<a>", "content": {"type": "regex", "pattern": "[0-9]+"},
                         "end": "</a>"},
                        {"begin": "<b>", "content": {"type": "or", "elements": [
                            {"type": "const_string", "value": "x"},
                            {"type": "grammar", "grammar": 'root ::= "y"'},
                        ]}, "end": ["</b>", "</bb>"]},
                    ],
                },
            ],
        }  # fmt: skip
        for text in texts(structured.STRUCTURAL_TAG, json.dumps({"format": fmt})):
            assert re.fullmatch(r"<calls>(<a>[0-9]+</a>|<b>[xy]</b>)", text), text

    @pytest.mark.parametrize(
        "value",
        [
            "not json",
            json.dumps({"type": "structural_tag"}),
            json.dumps({"format": {"type": "qwen_xml_parameter", "json_schema": {}}}),
            json.dumps(
                {"format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}}}
            ),
            json.dumps({"format": {"type": "sequence", "elements": []}}),
        ],
    )
    def test_malformed_or_unsupported_tags_are_refused(self, value: str) -> None:
        with pytest.raises(ConstraintError):
            compile_constraint(structured.STRUCTURAL_TAG, value)


class TestRefusals:
    @pytest.mark.parametrize(
        "kind,value",
        [
            (structured.JSON_SCHEMA, "{not json"),
            (structured.JSON_SCHEMA, json.dumps({"not": {}})),
            (structured.JSON_SCHEMA, json.dumps({"type": "object", "properties": []})),
            (structured.REGEX, "(?=lookahead)"),
            (structured.EBNF, 'rootless ::= "a"'),
            (structured.CHOICE, ""),
            ("xml", ""),
        ],
    )
    def test_refused_with_the_kind_named(self, kind: str, value: str) -> None:
        with pytest.raises(ConstraintError) as raised:
            compile_constraint(kind, value)
        assert raised.value.kind == kind
        if value != "{not json":  # that one in xgrammar's words: "Invalid JSON grammar ..."
            assert kind in str(raised.value)


class TestPlans:
    def test_text_plan_tokenizes_with_the_engines_tokenizer(self) -> None:
        facts = load_tokenizer_facts(default_tokenizer_dir())
        plan = TextPlan(
            compile_constraint(structured.JSON_SCHEMA, json.dumps(WEATHER)), facts.encode_output
        )
        ids = list(plan.tokens(42))
        assert ids == list(plan.tokens(42)) and facts.bos_token_id not in ids
        text = facts.tokenizer.decode(ids)
        assert json.loads(text)["days"] >= 1
        assert len(ids) > 3  # split at real token boundaries, not one blob

    def test_fixed_plan_ignores_the_seed(self) -> None:
        assert FixedPlan([5, 6]).tokens(1) == FixedPlan([5, 6]).tokens(2) == (5, 6)


class TestScript:
    def write(self, tmp_path: Path, data: object) -> Path:
        path = tmp_path / "script.json"
        path.write_text(json.dumps(data))
        return path

    def test_latest_marker_in_the_prompt_wins(self, tmp_path: Path) -> None:
        script = load_script(
            self.write(
                tmp_path,
                [
                    {"marker": "weather in Paris?", "output": "CALL"},
                    {"marker": "sunny, 21C", "output": "It is sunny."},
                ],
            )
        )
        first_turn = "user: weather in Paris?"
        second_turn = first_turn + " assistant: CALL tool: sunny, 21C"
        assert script.match(first_turn).output == "CALL"  # type: ignore[union-attr]
        assert script.match(second_turn).output == "It is sunny."  # type: ignore[union-attr]
        assert script.match("nothing relevant") is None

    def test_mapping_form_and_ties_keep_file_order(self, tmp_path: Path) -> None:
        script = load_script(self.write(tmp_path, {"hello": "A", "lo": "B"}))
        assert script.match("say hello").output == "A"  # type: ignore[union-attr]

    @pytest.mark.parametrize(
        "data", [[], [{"marker": "", "output": "x"}], [{"marker": "m"}], "text", [3]]
    )
    def test_malformed_scripts_are_config_errors(self, tmp_path: Path, data: object) -> None:
        with pytest.raises(ConfigError) as raised:
            load_script(self.write(tmp_path, data))
        assert raised.value.field == "script"

    def test_unreadable_script(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError):
            load_script(tmp_path / "missing.json")
