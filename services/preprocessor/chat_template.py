"""Chat templates: a tokenizer's Jinja template rendered the way Hugging Face does it.

Rendered in an immutable sandbox with trim_blocks/lstrip_blocks, the loop-controls and
`{% generation %}` extensions, the `raise_exception` and `strftime_now` globals and HF's
`tojson` filter; `render(messages, add_generation_prompt, tools=..., **kwargs)` passes
`tools` (the request's list, or None) and the request's chat_template_kwargs (e.g.
enable_thinking) as template variables, as `apply_chat_template` does.

Messages are plain OpenAI-shaped dicts (or objects with those attributes), copied and
normalised before rendering, with only the keys the client gave: a list of text parts
becomes one string (joined by a newline, as vLLM does), a null content "", the
`developer` role `system`; `name`, `tool_call_id`, `reasoning_content` and `tool_calls`
pass through. OpenAI sends tool call arguments as JSON text where HF's templates expect
a mapping (`arguments | tojson`, `arguments.items()`), and some (DeepSeek's) concatenate
them as a string: the arguments become a `JsonArguments`, a mapping that renders and
concatenates as the client's own text, so both kinds render as the family's template
does. A config without a template gets the DeepSeek-V3 template in
`templates/deepseek_v3.jinja`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from .errors import INVALID_VALUE, InvalidRequestError, TokenizerLoadError

DEFAULT_TEMPLATE_NAME = "deepseek_v3.jinja"
PART_SEPARATOR = "\n"
# Template variables the renderer sets itself: chat_template_kwargs may not replace them.
RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt"})
_MESSAGE_FIELDS = ("name", "tool_call_id", "reasoning_content")


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
        env = _Sandbox(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols", _GenerationTag],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = self._strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TokenizerLoadError(f"invalid chat template: {exc}") from exc
        # The globals as one plain dict instead of jinja2's ChainMap over the environment's
        # (set above, never changed after): each render copies them into its context and
        # lists their names, which walks a ChainMap key by key in Python.
        self._template.globals = dict(self._template.globals)

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
        messages: Sequence[Mapping[str, Any] | Any],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text. `chat_template_kwargs` (the request's) and `extra` become
        template variables. A 400 names "messages" when the template rejects them,
        "chat_template_kwargs" when those try to set a variable the renderer sets."""
        kwargs = {**chat_template_kwargs, **extra} if chat_template_kwargs else extra
        reserved = RESERVED_KWARGS.intersection(kwargs)
        if reserved:
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {', '.join(sorted(reserved))}.",
                INVALID_VALUE,
                "chat_template_kwargs",
            )
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        try:
            return self._template.render(
                variables,
                messages=[_normalise(m) for m in messages],
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            # TypeError & co: the template did arithmetic on what the messages lack.
            raise InvalidRequestError(
                f"The chat template could not render these messages: {exc}",
                INVALID_VALUE,
                "messages",
            ) from None

    def _strftime_now(self, fmt: str) -> str:
        return self._now().strftime(fmt)


def _normalise(message: Mapping[str, Any] | Any) -> dict[str, Any]:
    """A copy with only the given keys, in the shape HF's templates read."""
    if isinstance(message, Mapping):
        out = {k: v for k, v in message.items() if v is not None}
        out["content"] = _text(message.get("content"))
    else:  # an object with OpenAI's field names (e.g. the request parser's ChatMessage)
        out = {"role": message.role, "content": _text(getattr(message, "content", None))}
        for field in (*_MESSAGE_FIELDS, "tool_calls"):
            value = getattr(message, field, None)
            if value is not None:
                out[field] = value
    if out.get("role") == "developer":
        out["role"] = "system"
    calls = out.get("tool_calls")
    if calls is not None:
        if isinstance(calls, (list, tuple)) and calls:
            out["tool_calls"] = [_tool_call(call) for call in calls]
        elif not calls:
            del out["tool_calls"]  # an empty list: the plain assistant path of templates
    return out


def _tool_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    out = dict(call)
    out.setdefault("type", "function")
    function = out.get("function")
    if isinstance(function, Mapping):
        function = dict(function)
        function["arguments"] = json_arguments(function.get("arguments"))
        out["function"] = function
    return out


class JsonArguments(dict):  # type: ignore[type-arg]
    """Tool call arguments as templates want them: a mapping (HF's shape), which renders
    and concatenates (`'...' + arguments`) as the client's JSON text."""

    __slots__ = ("text",)

    def __init__(self, value: Mapping[str, Any], text: str) -> None:
        super().__init__(value)
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __add__(self, other: object) -> str:
        if isinstance(other, str):
            return self.text + other
        return NotImplemented

    def __radd__(self, other: object) -> str:
        if isinstance(other, str):
            return other + self.text
        return NotImplemented


def json_arguments(arguments: Any) -> Any:
    """OpenAI's JSON-text arguments as a `JsonArguments`; other values unchanged (text
    that is not a JSON object stays text; null or "" becomes an empty object)."""
    if arguments is None or arguments == "":
        return JsonArguments({}, "{}")
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
            return arguments
        return JsonArguments(value, arguments) if isinstance(value, dict) else arguments
    if isinstance(arguments, Mapping) and not isinstance(arguments, JsonArguments):
        return JsonArguments(arguments, json.dumps(arguments, ensure_ascii=False))
    return arguments


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return PART_SEPARATOR.join(p if isinstance(p, str) else p.get("text", "") for p in content)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with a fast path for `namespace()` attributes (`ns.is_first`),
    which templates read in every loop: the sandbox's checks (internal attribute, known
    mutable type: a dozen isinstance calls through Namespace.__getattribute__) always pass
    for a public name on a Namespace, and cost about half a render. Same result as the
    sandbox's own getattr: the value (a str.format method wrapped), or undefined."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is not Namespace or attribute.startswith("_"):
            return super().getattr(obj, attribute)
        try:
            value = getattr(obj, attribute)
        except AttributeError:
            return self.undefined(obj=obj, name=attribute)
        wrapped = self.wrap_str_format(value)
        return value if wrapped is None else wrapped


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF marks assistant text with it): the body
    renders as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


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
