"""Token deltas -> text deltas: incremental detokenization, then stop strings.

Stop strings are matched here, not by the engine (SGLang engines run without a tokenizer): the
matched string and everything after it are trimmed, and the engine request is cancelled by
closing the pipeline generator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from switchyard.preprocessor.detokenizer import IncrementalDetokenizer
from switchyard.preprocessor.stop_strings import StopMatcher
from switchyard.preprocessor.tokenizer import TokenizerBundle
from switchyard.protos.messages import GenerateFinished, TokenDelta


@dataclass(frozen=True, slots=True)
class Outcome:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


async def text_deltas(
    tokens: AsyncIterator[TokenDelta | GenerateFinished],
    tokenizer: TokenizerBundle,
    prompt_ids: list[int],
    stops: tuple[str, ...],
) -> AsyncIterator[str | Outcome]:
    """Yields non-empty text deltas, then exactly one Outcome."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    matcher = StopMatcher(list(stops)) if stops else None
    completion = 0
    try:
        async for item in tokens:
            if type(item) is TokenDelta:
                completion += len(item.token_ids)
                text = detok.add(item.token_ids)
                if matcher is not None and text:
                    text, stopped = matcher.feed(text)
                    if stopped:
                        if text:
                            yield text
                        yield Outcome("stop", len(prompt_ids), completion, 0)
                        return
                if text:
                    yield text
            elif type(item) is GenerateFinished:
                tail = detok.flush()
                if matcher is not None:
                    tail, stopped = matcher.feed(tail)
                    if not stopped:
                        tail += matcher.flush()
                if tail:
                    yield tail
                yield Outcome(
                    item.finish_reason,
                    item.prompt_tokens,
                    item.completion_tokens,
                    item.cached_tokens,
                )
                return
    finally:
        await tokens.aclose()  # type: ignore[attr-defined]
