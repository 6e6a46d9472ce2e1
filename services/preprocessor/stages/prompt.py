"""The stages before any engine is involved: model, template, outputs, tokenize, check.

- `resolve_model`: the model's catalog entry, tokenizer and output parsers (404 / 503).
- `render_template` (chat): the messages and tools through the model's chat template.
- `outputs` (chat): the per-request output parsers (tool calls, reasoning) and the engine
  constraint that `tool_choice` required / a named function asks for.
- `tokenize`: each prompt's ids, refusing a prompt that certainly cannot fit before it is
  tokenized in full (prompt_encoder); a completions text prompt gets the tokenizer's own
  special tokens (a Llama BOS), as vLLM adds them; client-given ids are checked against the
  vocabulary.
- `check`: the exact context-length check and the engine-neutral sampling parameters; a
  field only some engine protocols can honour (`seed`) is required of the route, and refused
  only when none of the model's engines can honour it.
"""

from __future__ import annotations

import msgspec

from switchyard.common.capabilities import SEED
from switchyard.preprocessor.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_VALUE,
    UNSUPPORTED_VALUE,
    InvalidRequestError,
    ModelNotFoundError,
    ServiceUnavailableError,
)
from switchyard.preprocessor.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    SamplingOptions,
    check_context,
    check_max_tokens,
)
from switchyard.preprocessor.parsers import tool_choice_constraint
from switchyard.preprocessor.prompt_encoder import PromptTooLong
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.protos.messages import Constraint, SamplingParams


def resolve_model(ctx: RequestContext) -> None:
    model = ctx.request.model
    entry = ctx.deps.catalog().get(model)
    if entry is None:
        if not ctx.deps.catalog():
            raise ServiceUnavailableError("No engine is available: none is routable right now.")
        raise ModelNotFoundError(model)
    tokenizer = ctx.deps.tokenizer(model)
    if tokenizer is None:
        raise ServiceUnavailableError(
            f"The tokenizer of model {model!r} is not loaded yet.", "not_ready"
        )
    embeddings = ctx.inp.endpoint == "embeddings"
    if entry.is_generation == embeddings:
        what = (
            "a generation model: it has no embeddings"
            if embeddings
            else ("an embedding model: use /v1/embeddings")
        )
        raise InvalidRequestError(f"The model {model!r} is {what}.", "model_not_supported", "model")
    ctx.entry = entry
    ctx.tokenizer = tokenizer
    if isinstance(ctx.request, ChatCompletionRequest):  # chat, and Responses as chat
        ctx.parsers = ctx.deps.parsers(model, tokenizer)


def render_template(ctx: RequestContext) -> None:
    req = ctx.request
    tokenizer = ctx.tokenizer
    assert isinstance(req, ChatCompletionRequest) and tokenizer is not None
    template = tokenizer.chat_template
    for name in req.template_kwargs:
        if name == "reasoning_effort" and name not in template.source:
            raise InvalidRequestError(
                "'reasoning_effort' is not used by this model's chat template.",
                UNSUPPORTED_VALUE,
                "reasoning_effort",
            )
    text = template.render(
        req.messages,
        req.add_generation_prompt,
        tools=req.tools or None,
        chat_template_kwargs=req.template_kwargs or None,
    )
    if req.continue_final_message:
        text = _continue_final(text, req.messages[-1])
    ctx.prompt_texts = [text]
    ctx.param = "messages"


def _continue_final(text: str, last: dict) -> str:
    """The prompt cut right after the final assistant message's text (as vLLM does), so the
    model continues that message instead of starting a new one."""
    content = last.get("content") or ""
    if isinstance(content, list):
        content = "\n".join(part.get("text", "") for part in content)
    at = text.rfind(content) if content else -1
    if at < 0:
        raise InvalidRequestError(
            "'continue_final_message': the chat template does not render the final message's "
            "text as given, so there is nothing to continue.",
            INVALID_VALUE,
            "continue_final_message",
        )
    return text[: at + len(content)]


def outputs(ctx: RequestContext) -> None:
    """The constraint tool_choice asks for (the parsers are made per choice in `generate`)."""
    req = ctx.request
    assert isinstance(req, ChatCompletionRequest)
    choice = ctx.parsers
    if req.tools and req.tool_choice in ("required",) or isinstance(req.tool_choice, dict):
        built = tool_choice_constraint(req.tools, req.tool_choice, req.parallel_tool_calls)
        if built is not None:
            if req.sampling.constraint is not None:
                raise InvalidRequestError(
                    f"tool_choice {req.tool_choice!r} constrains the output itself: it cannot "
                    f"be combined with '{req.sampling.constraint_param}'.",
                    INVALID_VALUE,
                    "tool_choice",
                )
            ctx.extra["constraint"] = Constraint(kind=built.kind, value=built.value)
    reasoning = choice is not None and choice.reasoning is not None and req.separate_reasoning
    if reasoning:
        assert choice is not None and choice.reasoning is not None
        probe = choice.reasoning.parser(ctx.prompt_texts[0] or "", req.template_kwargs)
        reasoning = probe is not None
    ctx.reasoning = reasoning


def _prompt_budget(ctx: RequestContext) -> int:
    """The most prompt tokens that can still fit with the requested completion."""
    assert ctx.entry is not None
    max_tokens = ctx.request.sampling.max_tokens or 1
    return max(0, ctx.entry.context_length - max_tokens)


async def tokenize(ctx: RequestContext) -> None:
    tokenizer = ctx.tokenizer
    assert tokenizer is not None and ctx.entry is not None
    req = ctx.request
    if isinstance(req, CompletionRequest):
        ctx.param = "prompt"
        ctx.prompt_texts = [p if isinstance(p, str) else None for p in req.prompts]
    opts = req.sampling
    check_max_tokens(opts.max_tokens, ctx.entry.context_length, opts.max_tokens_param)
    budget = _prompt_budget(ctx)
    batch = len(ctx.prompt_texts) > 1
    ctx.prompt_ids = []
    for i, text in enumerate(ctx.prompt_texts):
        param = f"{ctx.param}[{i}]" if batch else ctx.param
        if text is None:
            ids = list(req.prompts[i])  # type: ignore[union-attr]
            if max(ids) >= tokenizer.vocab_size:
                raise InvalidRequestError(
                    f"Token ids must be below the vocabulary size {tokenizer.vocab_size}.",
                    INVALID_VALUE,
                    param,
                )
        else:
            try:
                ids = await tokenizer.prompts.encode(text, budget, ctx.deps.limits.offload_chars)
            except PromptTooLong as exc:
                where = "prompt" if ctx.param == "prompt" else "messages"
                raise InvalidRequestError(
                    f"This model's maximum context length is {ctx.entry.context_length} "
                    f"tokens. However, your {where} resulted in at least {exc.tokens} tokens. "
                    f"Please reduce the length of the {where}.",
                    CONTEXT_LENGTH_EXCEEDED,
                    param,
                ) from None
            if ctx.param == "prompt":  # completions add the tokenizer's own (vLLM's default)
                ids = tokenizer.with_special_tokens(ids)
        if not ids:
            raise InvalidRequestError("The prompt is empty.", INVALID_VALUE, param)
        ctx.prompt_ids.append(ids)


def check(ctx: RequestContext) -> None:
    assert ctx.entry is not None and ctx.tokenizer is not None
    req = ctx.request
    assert not isinstance(req, EmbeddingRequest)  # embeddings take the embed stage
    opts = req.sampling
    batch = len(ctx.prompt_ids) > 1
    max_tokens = min(
        check_context(
            len(ids),
            opts.max_tokens,
            ctx.entry.context_length,
            f"{ctx.param}[{i}]" if batch else ctx.param,
        )
        for i, ids in enumerate(ctx.prompt_ids)
    )
    vocab = ctx.tokenizer.vocab_size
    for token_id in opts.stop_token_ids:
        if token_id >= vocab:
            raise InvalidRequestError(
                f"stop_token_ids: {token_id} is not below the vocabulary size {vocab}.",
                INVALID_VALUE,
                "stop_token_ids",
            )
    for token_id, _ in opts.logit_bias:
        if token_id >= vocab:
            raise InvalidRequestError(
                f"logit_bias: token {token_id} is not below the vocabulary size {vocab}.",
                INVALID_VALUE,
                "logit_bias",
            )
    if opts.seed is not None:
        if SEED not in ctx.entry.capabilities:
            raise InvalidRequestError(
                f"'seed' is not supported for model {req.model!r}: its engines are SGLang "
                "engines, whose gRPC API takes no seed.",
                UNSUPPORTED_VALUE,
                "seed",
            )
        ctx.requires = (SEED,)  # only vLLM engines (router filter `capable`)
    constraint = ctx.extra.get("constraint") or opts.constraint
    ctx.sampling = sampling_params(opts, max_tokens, constraint)
    if isinstance(req, ChatCompletionRequest):
        ctx.logprobs = req.top_logprobs if req.logprobs else None
        ctx.top_logprobs = req.top_logprobs
    else:
        ctx.logprobs = req.logprobs
        if req.best_of > opts.n and ctx.logprobs is None:
            ctx.logprobs = 0  # best_of ranks the candidates by their logprobs


def sampling_params(
    opts: SamplingOptions, max_tokens: int, constraint: Constraint | None = None
) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=-1 if opts.top_k is None else opts.top_k,
        min_p=opts.min_p,
        min_tokens=min(opts.min_tokens, max_tokens),
        repetition_penalty=opts.repetition_penalty,
        presence_penalty=opts.presence_penalty,
        frequency_penalty=opts.frequency_penalty,
        seed=opts.seed,
        ignore_eos=opts.ignore_eos,
        stop_token_ids=list(opts.stop_token_ids),
        logit_bias=dict(opts.logit_bias),
        n=opts.n,
        constraint=constraint,
    )


__all__ = [
    "check",
    "msgspec",
    "outputs",
    "render_template",
    "resolve_model",
    "sampling_params",
    "tokenize",
]
