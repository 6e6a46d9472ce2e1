"""Endpoints answered here, without an engine: /tokenize and /detokenize (vLLM's, also under
/v1), and the Anthropic Messages API's /v1/messages/count_tokens.

Each takes the body and returns the JSON answer (or raises a RequestError). A chat prompt
goes through the chat stages that make a prompt (model, template) and is encoded as the
tokenize stage encodes it, so its count is what the generation endpoint bills as
usage.prompt_tokens; nothing bounds it by the context length (vLLM's tokenize does not
either: `max_model_len` is in the answer).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import orjson

from switchyard.preprocessor.anthropic_requests import parse_count_tokens
from switchyard.preprocessor.catalog import ModelEntry
from switchyard.preprocessor.errors import (
    INVALID_VALUE,
    MISSING_FIELD,
    InvalidRequestError,
    ModelNotFoundError,
    ServiceUnavailableError,
)
from switchyard.preprocessor.openai_requests import ChatCompletionRequest, SamplingOptions
from switchyard.preprocessor.stages import messages
from switchyard.preprocessor.stages.context import (
    COUNT_TOKENS,
    DETOKENIZE,
    TOKENIZE,
    Deps,
    RequestContext,
)
from switchyard.preprocessor.stages.prompt import render_template, resolve_model
from switchyard.preprocessor.tokenize_requests import parse_detokenize, parse_tokenize
from switchyard.preprocessor.tokenizer import TokenizerBundle

UNBOUNDED = sys.maxsize  # no context-length budget when only counting


def resolve(deps: Deps, model: str | None) -> tuple[ModelEntry, TokenizerBundle]:
    """The model's catalog entry and tokenizer; an absent model is the only one served."""
    catalog = deps.catalog()
    if model is None:
        if len(catalog) != 1:
            raise InvalidRequestError(
                f"Name the model: this server serves {len(catalog)} models.",
                MISSING_FIELD,
                "model",
            )
        model = next(iter(catalog))
    entry = catalog.get(model)
    if entry is None:
        if not catalog:
            raise ServiceUnavailableError("No engine is available: none is routable right now.")
        raise ModelNotFoundError(model)
    tokenizer = deps.tokenizer(model)
    if tokenizer is None:
        raise ServiceUnavailableError(
            f"The tokenizer of model {model!r} is not loaded yet.", "not_ready"
        )
    return entry, tokenizer


async def chat_prompt_ids(ctx: RequestContext, add_special_tokens: bool = False) -> list[int]:
    """The chat request's prompt ids: rendered by the chat stage, encoded as the tokenize
    stage encodes (add_special_tokens: the tokenizer's own on top, as vLLM's option)."""
    render_template(ctx)
    tokenizer = ctx.tokenizer
    assert tokenizer is not None
    text = ctx.prompt_texts[0] or ""
    offload = ctx.deps.limits.offload_chars
    if add_special_tokens:
        ids = await tokenizer.encode_async(text, True, offload)
    else:
        ids = await tokenizer.prompts.encode(text, UNBOUNDED, offload)
    ctx.prompt_ids = [ids]
    return ids


async def tokenize(ctx: RequestContext, body: bytes) -> bytes:
    """`ctx`: the request's context (the prompt stages', and the access log's)."""
    deps = ctx.deps
    req = parse_tokenize(body)
    entry, tokenizer = resolve(deps, req.model)
    chat = req.chat
    request = ChatCompletionRequest(
        entry.name,
        chat.messages if chat is not None else (),
        SamplingOptions(),
        tools=chat.tools if chat is not None else (),
        template_kwargs=chat.template_kwargs if chat is not None else {},
        add_generation_prompt=chat.add_generation_prompt if chat is not None else True,
        continue_final_message=chat.continue_final_message if chat is not None else False,
    )
    ctx.body = request
    ctx.entry, ctx.tokenizer = entry, tokenizer
    if chat is not None:
        ids = await chat_prompt_ids(ctx, req.add_special_tokens)
    else:
        assert req.prompt is not None
        offload = deps.limits.offload_chars
        ids = await tokenizer.prompts.encode(req.prompt, UNBOUNDED, offload)
        if req.add_special_tokens:  # what /v1/completions sends (vLLM's default)
            ids = tokenizer.with_special_tokens(ids)
        ctx.prompt_ids = [ids]
    strs = [tokenizer.tokenizer.id_to_token(i) for i in ids] if req.return_token_strs else None
    return orjson.dumps(
        {
            "count": len(ids),
            "max_model_len": entry.context_length,
            "tokens": ids,
            "token_strs": strs,
        }
    )


async def detokenize(ctx: RequestContext, body: bytes) -> bytes:
    req = parse_detokenize(body)
    entry, tokenizer = resolve(ctx.deps, req.model)
    ctx.body = ChatCompletionRequest(entry.name, (), SamplingOptions())
    ctx.entry = entry
    ids = list(req.tokens)
    for i, token in enumerate(ids):
        if token >= tokenizer.vocab_size:
            raise InvalidRequestError(
                f"Token id {token} is out of vocabulary (size {tokenizer.vocab_size}).",
                INVALID_VALUE,
                f"tokens[{i}]",
            )
    # Special tokens stay: the text of a rendered prompt comes back whole.
    return orjson.dumps({"prompt": tokenizer.decode(ids, skip_special_tokens=False)})


async def count_tokens(ctx: RequestContext, body: bytes) -> bytes:
    """What /v1/messages would bill as input (its usage's input_tokens plus
    cache_read_input_tokens): the same stages render the same prompt."""
    ctx.body = parse_count_tokens(body)
    resolve_model(ctx)
    messages.thinking(ctx)
    return orjson.dumps({"input_tokens": len(await chat_prompt_ids(ctx))})


LOCAL: dict[str, Callable[[RequestContext, bytes], Awaitable[bytes]]] = {
    TOKENIZE: tokenize,
    DETOKENIZE: detokenize,
    COUNT_TOKENS: count_tokens,
}
