"""A request's choices and the engine requests that produce them (pure: nothing starts here).

Each prompt gets `n` choices (completions: `best_of`, of which the sink keeps `n`), each with
its own text path (choice.py): its output parsers (chat), its logprobs and echo
(completions). A prompt's choices are one generation: one engine request with `n`.
"""

from __future__ import annotations

from switchyard.preprocessor.openai_requests import ChatCompletionRequest
from switchyard.preprocessor.parsers import OutputParser
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.stages.generation import Generation
from switchyard.preprocessor.stages.logprobs import CompletionLogprobs
from switchyard.preprocessor.stages.migration import Placement


def generations(ctx: RequestContext, placement: Placement | None = None) -> list[Generation]:
    """Every prompt's choices and its generation, added to the request's state. `placement`:
    where a request that starts over may go (its attempts counted on)."""
    tokenizer = ctx.tokenizer
    assert tokenizer is not None and ctx.sampling is not None
    req = ctx.request
    chat = isinstance(req, ChatCompletionRequest)
    per_prompt = req.sampling.n if chat else req.best_of  # type: ignore[union-attr]
    echo_logprobs = None
    if not chat and req.echo and ctx.logprobs is not None:  # type: ignore[union-attr]
        echo_logprobs = ctx.logprobs
    index = 0
    out = []
    for group, prompt_ids in enumerate(ctx.prompt_ids):
        choices = []
        for _ in range(per_prompt):
            parser = None
            skip = req.sampling.skip_special_tokens
            lp = echo = None
            if chat:
                parser = _parser(ctx)
                if parser is not None and ctx.parsers is not None:
                    skip = skip and not ctx.parsers.needs_special_tokens
            else:
                if ctx.logprobs is not None:
                    lp = CompletionLogprobs(tokenizer.token_texts, ctx.logprobs)
                if req.echo:  # type: ignore[union-attr]
                    text = ctx.prompt_texts[group]
                    echo = text if text is not None else tokenizer.decode(prompt_ids)
            choices.append(
                ChoiceOutput(
                    index,
                    tokenizer,
                    prompt_ids,
                    req.sampling.stop,
                    parser,
                    skip,
                    lp,
                    echo or "",
                    group,
                    req.sampling.stop_token_ids,
                )
            )
            index += 1
        ctx.choices.extend(choices)
        gen = Generation(
            ctx,
            choices,
            prompt_ids,
            ctx.sampling,
            echo_logprobs,
            group=group,
            placement=placement.copy() if placement is not None else None,
        )
        out.append(gen)
    ctx.generations.extend(out)
    ctx.unfinished = len(ctx.choices)
    return out


def _parser(ctx: RequestContext) -> OutputParser | None:
    """A choice's output parser (None when it would parse nothing)."""
    req = ctx.request
    assert isinstance(req, ChatCompletionRequest)
    choice = ctx.parsers
    if choice is None:
        return None
    parser = choice.for_request(
        prompt=ctx.prompt_texts[0] or "",
        tools=req.tools or None,
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        chat_template_kwargs=req.template_kwargs or None,
        strict=not req.stream,
    )
    if not req.separate_reasoning:
        parser.reasoning = None  # SGLang's switch: the thinking stays in the content
    if parser.reasoning is None and parser.tools is None:
        return None
    return parser
