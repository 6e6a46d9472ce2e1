"""Chat templates: a tokenizer's Jinja template rendered the way Hugging Face does it.

Rendered in an immutable sandbox with trim_blocks/lstrip_blocks, the `raise_exception` and
`strftime_now` globals and a `tojson` filter. Messages are normalised before rendering: a
list of text parts becomes one string (parts joined by a newline, as vLLM does) and the
`developer` role becomes `system`. A config without a template gets the DeepSeek-V3 format
shipped in `templates/deepseek_v3.jinja`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import INVALID_VALUE, InvalidRequestError, TokenizerLoadError

DEFAULT_TEMPLATE_NAME = "deepseek_v3.jinja"
PART_SEPARATOR = "\n"


def default_template_source() -> str:
    return (resources.files(__package__) / "templates" / DEFAULT_TEMPLATE_NAME).read_text(
        encoding="utf-8"
    )


def token_text(token: Any) -> str:
    """A special token from tokenizer_config.json: a string, an AddedToken dict, or null."""
    if token is None:
        return ""
    if isinstance(token, str):
        return token
    if isinstance(token, Mapping) and isinstance(token.get("content"), str):
        return token["content"]
    raise TokenizerLoadError(f"unreadable special token in tokenizer config: {token!r}")


def template_source(config: Mapping[str, Any]) -> str | None:
    """The template named by a tokenizer config: a string, or the "default" of a named list."""
    source = config.get("chat_template")
    if source is None or isinstance(source, str):
        return source
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        default = named.get("default")
        if isinstance(default, str):
            return default
        raise TokenizerLoadError(
            f"chat_template lists {sorted(map(str, named))} but no 'default' template"
        )
    raise TokenizerLoadError(f"chat_template must be a string or a list, got {type(source)}")


class ChatTemplate:
    """A compiled chat template plus the special tokens it refers to."""

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        is_default: bool = False,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.is_default = is_default
        self._now = now
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = self._strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TokenizerLoadError(f"invalid chat template: {exc}") from exc

    @classmethod
    def from_tokenizer_config(
        cls,
        config: Mapping[str, Any],
        *,
        source: str | None = None,
        now: Callable[[], datetime] = datetime.now,
    ) -> ChatTemplate:
        """From tokenizer_config.json; `source` overrides its template (chat_template.jinja)."""
        if source is None:
            source = template_source(config)
        is_default = source is None
        return cls(
            default_template_source() if source is None else source,
            token_text(config.get("bos_token")),
            token_text(config.get("eos_token")),
            is_default=is_default,
            now=now,
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text; 400 (param "messages") when the template rejects the messages."""
        try:
            return self._template.render(
                messages=[_normalise(m) for m in messages],
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(
                f"The chat template could not render these messages: {exc}",
                INVALID_VALUE,
                "messages",
            ) from None

    def _strftime_now(self, fmt: str) -> str:
        return self._now().strftime(fmt)


def _normalise(message: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(message)
    out["content"] = _text(out.get("content"))
    if out.get("role") == "developer":
        out["role"] = "system"
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return PART_SEPARATOR.join(p if isinstance(p, str) else p.get("text", "") for p in content)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
