"""The stages before any engine is involved: model, template, tokenize, check.

- `resolve_model`: the model's catalog entry and tokenizer (404 / 503 when missing).
- `render_template` (chat only): the messages through the model's chat template.
- `tokenize`: the prompt's ids, refusing a prompt that certainly cannot fit before it is
  tokenized in full (prompt_encoder); client-given ids are checked against the vocabulary.
- `check`: the exact context-length check and the engine-neutral sampling parameters.
"""

from __future__ import annotations

from switchyard.preprocessor.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_VALUE,
    InvalidRequestError,
    ModelNotFoundError,
    ServiceUnavailableError,
)
from switchyard.preprocessor.openai_requests import (
    ChatCompletionRequest,
    SamplingOptions,
    check_context,
)
from switchyard.preprocessor.prompt_encoder import PromptTooLong
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.protos.messages import SamplingParams


def resolve_model(ctx: RequestContext) -> None:
    model = ctx.inp.request.model
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
    ctx.state.entry = entry
    ctx.state.tokenizer = tokenizer


def render_template(ctx: RequestContext) -> None:
    req = ctx.inp.request
    assert isinstance(req, ChatCompletionRequest) and ctx.state.tokenizer is not None
    ctx.state.prompt_text = ctx.state.tokenizer.chat_template.render(req.messages)
    ctx.state.param = "messages"


def _prompt_budget(ctx: RequestContext) -> int:
    """The most prompt tokens that can still fit with the requested completion."""
    assert ctx.state.entry is not None
    max_tokens = ctx.inp.request.sampling.max_tokens or 1
    return max(0, ctx.state.entry.context_length - max_tokens)


async def tokenize(ctx: RequestContext) -> None:
    state = ctx.state
    tokenizer = state.tokenizer
    assert tokenizer is not None and state.entry is not None
    req = ctx.inp.request
    if state.prompt_text is None:
        prompt = req.prompt  # type: ignore[union-attr]
        state.param = "prompt"
        if isinstance(prompt, str):
            state.prompt_text = prompt
        else:
            if max(prompt) >= tokenizer.vocab_size:
                raise InvalidRequestError(
                    f"Token ids must be below the vocabulary size {tokenizer.vocab_size}.",
                    INVALID_VALUE,
                    "prompt",
                )
            state.prompt_ids = list(prompt)
            return
    budget = _prompt_budget(ctx)
    try:
        state.prompt_ids = await tokenizer.prompts.encode(
            state.prompt_text, budget, ctx.deps.limits.offload_chars
        )
    except PromptTooLong as exc:
        where = "prompt" if state.param == "prompt" else "messages"
        raise InvalidRequestError(
            f"This model's maximum context length is {state.entry.context_length} tokens. "
            f"However, your {where} resulted in at least {exc.tokens} tokens. Please reduce "
            f"the length of the {where}.",
            CONTEXT_LENGTH_EXCEEDED,
            state.param,
        ) from None
    if not state.prompt_ids:
        raise InvalidRequestError("The prompt is empty.", INVALID_VALUE, state.param)


def check(ctx: RequestContext) -> None:
    state = ctx.state
    assert state.entry is not None
    opts = ctx.inp.request.sampling
    max_tokens = check_context(
        len(state.prompt_ids), opts.max_tokens, state.entry.context_length, state.param
    )
    state.sampling = sampling_params(opts, max_tokens)


def sampling_params(opts: SamplingOptions, max_tokens: int) -> SamplingParams:
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
    )
