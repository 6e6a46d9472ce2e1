"""POST /tokenize and /detokenize bodies (vLLM's shapes; also under /v1) -> request types.

    tokenize    {"model"?, "prompt", "add_special_tokens"? (true), "return_token_strs"?}
                {"model"?, "messages", "tools"?, "chat_template_kwargs"?,
                 "add_generation_prompt"? (true), "continue_final_message"?,
                 "add_special_tokens"? (false), "return_token_strs"?}
    detokenize  {"model"?, "tokens": [ids]}

A `messages` body is the chat request it would be (openai_requests.chat_prompt: the same
checks, the same template inputs), so its count is what /v1/chat/completions bills as
usage.prompt_tokens; a `prompt` body with the default add_special_tokens counts what
/v1/completions bills. vLLM's `chat_template` (a template sent by the client),
`media_io_kwargs` and `mm_processor_kwargs` are refused by name; any other field is a 400
naming it. `model` may be left out when one model is served (as vLLM serves one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from . import openai_schema as schema
from .errors import UNSUPPORTED_VALUE, InvalidRequestError
from .openai_requests import ChatPrompt, _decode, chat_prompt

_CONFIG = {"forbid_unknown_fields": True, "frozen": True, "kw_only": True}


class TokenizeBody(Struct, **_CONFIG):  # type: ignore[call-arg]
    """Both of vLLM's tokenize requests in one: exactly one of prompt / messages."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[schema.Message], Meta(min_length=1)] | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = None
    # messages only
    tools: Annotated[list[schema.FunctionTool], Meta(max_length=128)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    # refused by name (see the module docstring)
    chat_template: str | None = None
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class DetokenizeBody(Struct, **_CONFIG):  # type: ignore[call-arg]
    tokens: list[Annotated[int, Meta(ge=0)]]
    model: str | None = None


TOKENIZE_DECODER = msgspec.json.Decoder(TokenizeBody)
DETOKENIZE_DECODER = msgspec.json.Decoder(DetokenizeBody)
_CHAT_ONLY = ("tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    model: str | None
    prompt: str | None  # a completions prompt, or None for `chat`
    chat: ChatPrompt | None
    add_special_tokens: bool
    return_token_strs: bool


@dataclass(frozen=True, slots=True)
class DetokenizeRequest:
    model: str | None
    tokens: tuple[int, ...]


def parse_tokenize(body: bytes) -> TokenizeRequest:
    raw: TokenizeBody = _decode(TOKENIZE_DECODER, body)
    for name in ("chat_template", "media_io_kwargs", "mm_processor_kwargs"):
        if getattr(raw, name) is not None:
            raise InvalidRequestError(
                f"'{name}' is not supported: prompts are rendered with the model's own chat "
                "template, and text only.",
                UNSUPPORTED_VALUE,
                name,
            )
    if (raw.prompt is None) == (raw.messages is None):
        raise InvalidRequestError(
            "Give exactly one of 'prompt' (text) or 'messages' (a chat).",
            "missing_field" if raw.prompt is None else "invalid_value",
            "prompt",
        )
    strs = bool(raw.return_token_strs)
    if raw.messages is None:
        for name in _CHAT_ONLY:
            if getattr(raw, name) is not None:
                raise InvalidRequestError(
                    f"'{name}' goes with 'messages', not 'prompt'.", "invalid_value", name
                )
        special = True if raw.add_special_tokens is None else raw.add_special_tokens
        return TokenizeRequest(raw.model, raw.prompt, None, special, strs)
    chat = chat_prompt(
        raw.messages,
        raw.tools,
        raw.chat_template_kwargs,
        raw.add_generation_prompt,
        raw.continue_final_message,
    )
    return TokenizeRequest(raw.model, None, chat, bool(raw.add_special_tokens), strs)


def parse_detokenize(body: bytes) -> DetokenizeRequest:
    raw: DetokenizeBody = _decode(DETOKENIZE_DECODER, body)
    return DetokenizeRequest(raw.model, tuple(raw.tokens))
