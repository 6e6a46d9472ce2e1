from __future__ import annotations

import json
from datetime import datetime

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from switchyard.preprocessor.chat_template import (
    ChatTemplate,
    default_template_source,
    template_source,
    token_text,
)
from switchyard.preprocessor.errors import InvalidRequestError, TokenizerLoadError
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"

SIMPLE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def default() -> ChatTemplate:
    return ChatTemplate.from_tokenizer_config({"bos_token": BOS, "eos_token": EOS})


class TestDefaultTemplate:
    def test_used_when_config_has_none(self) -> None:
        template = default()
        assert template.is_default
        assert template.source == default_template_source()

    def test_system_user_assistant_generation_prompt(self) -> None:
        text = default().render(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "2+2?"},
            ]
        )
        assert text == (f"{BOS}Be brief.{USER}Hi{ASSISTANT}Hello!{EOS}{USER}2+2?{ASSISTANT}")

    def test_a_user_turn_ends_with_the_assistant_marker(self) -> None:
        # DeepSeek-V3's own template does this whatever add_generation_prompt says.
        text = default().render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
        assert text == f"{BOS}{USER}Hi{ASSISTANT}"

    def test_systems_joined_and_developer_is_system(self) -> None:
        text = default().render(
            [
                {"role": "system", "content": "A"},
                {"role": "user", "content": "u"},
                {"role": "developer", "content": "B"},
            ]
        )
        assert text == f"{BOS}A\n\nB{USER}u{ASSISTANT}"

    def test_list_content_parts_joined(self) -> None:
        parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        text = default().render([{"role": "user", "content": parts}])
        assert text == f"{BOS}{USER}a\nb{ASSISTANT}"

    def test_special_tokens_are_deepseek_added_tokens(self, bundle: TokenizerBundle) -> None:
        added = {
            t["content"]: t["id"]
            for t in json.loads((default_tokenizer_dir() / "tokenizer.json").read_bytes())[
                "added_tokens"
            ]
        }
        for token in (BOS, EOS, USER, ASSISTANT):
            assert token in added
            if token != BOS:  # the BOS comes from bos_token, the others are literal
                assert token in default_template_source()
            assert bundle.encode(token) == [added[token]]
        # The rendered prompt tokenizes its markers as single ids.
        ids = bundle.encode(bundle.chat_template.render([{"role": "user", "content": "hi"}]))
        assert ids[0] == added[BOS] and ids[1] == added[USER] and ids[-1] == added[ASSISTANT]


class TestConfigTemplates:
    def test_string_template_and_added_token_dicts(self) -> None:
        config = {
            "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ messages[0]['content'] }}",
            "bos_token": {"__type": "AddedToken", "content": "<s>"},
            "eos_token": "</s>",
        }
        template = ChatTemplate.from_tokenizer_config(config)
        assert not template.is_default
        assert template.render([{"role": "user", "content": "x"}]) == "<s>|</s>|x"

    def test_named_list_takes_default(self) -> None:
        config = {
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": SIMPLE},
            ]
        }
        text = ChatTemplate.from_tokenizer_config(config).render([{"role": "user", "content": "x"}])
        assert text == "[user]x\n[assistant]"

    def test_named_list_without_default(self) -> None:
        with pytest.raises(TokenizerLoadError, match="no 'default'"):
            template_source({"chat_template": [{"name": "rag", "template": "x"}]})

    def test_trim_and_lstrip_blocks(self) -> None:
        source = (
            "{% for m in messages %}\n    {% if true %}\n{{ m['content'] }}\n"
            "    {% endif %}\n{% endfor %}"
        )
        text = ChatTemplate(source).render([{"role": "user", "content": "x"}])
        assert text == "x\n"

    def test_raise_exception_is_a_400(self) -> None:
        source = "{{ raise_exception('Conversation roles must alternate') }}"
        with pytest.raises(InvalidRequestError) as info:
            ChatTemplate(source).render([{"role": "user", "content": "x"}])
        assert info.value.param == "messages"
        assert "Conversation roles must alternate" in info.value.message

    def test_strftime_now_uses_the_clock(self) -> None:
        template = ChatTemplate(
            "{{ strftime_now('%d %b %Y') }}", now=lambda: datetime(2025, 3, 7, 12, 0)
        )
        assert template.render([]) == "07 Mar 2025"

    def test_tojson_keeps_unicode(self) -> None:
        template = ChatTemplate("{{ messages[0] | tojson }}")
        assert template.render([{"role": "user", "content": "é"}]) == (
            '{"role": "user", "content": "é"}'
        )

    def test_sandbox_blocks_attribute_escape(self) -> None:
        template = ChatTemplate("{{ messages.__class__.__mro__ }}")
        with pytest.raises(InvalidRequestError):
            template.render([])

    @pytest.mark.parametrize(
        "expression",
        [
            "ns.a",  # set in namespace()
            "ns.b",  # set later
            "ns.missing is defined",
            "ns.missing | default('d')",
            "ns.f(1)",  # a str.format kept in the namespace stays the sandbox's: no escape
            "ns.__class__ is defined",
            "ns._Namespace__attrs is defined",
        ],
    )
    def test_namespace_attributes_read_as_the_stock_sandbox_does(self, expression: str) -> None:
        # The fast path for namespace() attributes must give the sandbox's own answers.
        source = (
            "{% set ns = namespace(a=1) %}{% set ns.b = 'two' %}"
            "{% set ns.f = '<{0.__class__}>'.format %}"
            "{{ " + expression + " }}"
        )
        stock = ImmutableSandboxedEnvironment().from_string(source).render()
        assert ChatTemplate(source).render([]) == stock

    def test_a_format_method_in_a_given_namespace_is_sandboxed(self) -> None:
        escape = "{{ ns.f(1) }}"
        given = Namespace(f="<{0.__class__}>".format)
        assert ChatTemplate(escape).render([], ns=given) == "<>"

    def test_namespace_internals_stay_blocked(self) -> None:
        template = ChatTemplate("{% set ns = namespace(a=1) %}{{ ns.__class__.__mro__ }}")
        with pytest.raises(InvalidRequestError):
            template.render([])

    def test_bad_syntax_fails_at_load(self) -> None:
        with pytest.raises(TokenizerLoadError, match="invalid chat template"):
            ChatTemplate("{% for %}")


class TestTokenText:
    def test_forms(self) -> None:
        assert token_text(None) == ""
        assert token_text("<s>") == "<s>"
        assert token_text({"content": "<s>", "lstrip": False}) == "<s>"
        with pytest.raises(TokenizerLoadError):
            token_text(3)
