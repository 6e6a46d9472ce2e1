"""Logprob messages as both engine families send them (OutputLogProbs, InputLogProbs and
TopLogProbs are the same shape in both protos; `pb` is the family's generated module).

Output tokens: the token's logprob and the top k (the emitted token leads: it is the mock's
argmax, so SGLang's ranked list and vLLM's "chosen token first" list coincide). Prompt tokens:
the first has no value and an empty top list; SGLang's top list is the ranked one, vLLM's
starts with the prompt token itself (vLLM puts the scored token first in its logprob dict).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from switchyard.mock_engine.types import Scored


def output_logprobs(pb: Any, scores: Sequence[Scored], top: int) -> Any:
    message = pb.OutputLogProbs(
        token_logprobs=[s.logprob for s in scores], token_ids=[s.token_id for s in scores]
    )
    if top > 0:
        for score in scores:
            ranked = score.ranked[:top]
            message.top_logprobs.append(
                pb.TopLogProbs(values=[lp for _, lp in ranked], token_ids=[t for t, _ in ranked])
            )
    return message


def input_logprobs(
    pb: Any,
    token_ids: Sequence[int],
    scores: Sequence[Scored | None],
    top: int,
    *,
    scored_first: bool,
) -> Any:
    message = pb.InputLogProbs(token_ids=list(token_ids))
    for score in scores:
        entry = pb.InputTokenLogProb()
        if score is not None:
            entry.value = score.logprob
        message.token_logprobs.append(entry)
        if top <= 0:
            continue
        if score is None:
            message.top_logprobs.append(pb.TopLogProbs())
            continue
        ranked = list(score.ranked)
        if scored_first:
            ranked = [(score.token_id, score.logprob)] + [
                r for r in ranked if r[0] != score.token_id
            ]
        ranked = ranked[:top]
        message.top_logprobs.append(
            pb.TopLogProbs(values=[lp for _, lp in ranked], token_ids=[t for t, _ in ranked])
        )
    return message
