"""One choice's text path, called by the token loop per batch of token ids (hot path).

detokenize -> stop strings -> output parsers (reasoning, tool calls). A stop string ends the
choice (finish_reason "stop"; the string and what follows trimmed). A token of the request's
`stop_token_ids` that ends the output is left out of the text, as vLLM's and SGLang's own
servers do (it still counts as a completion token): a delta's last token that is one is held
back until the engine's final message says whether it matched (`matched_token_id`). Without
parsers `text` returns plain text; with them `parsed` returns (content, reasoning, tool_calls)
deltas. The choice also keeps what the whole request needs of it: its generated ids (for
migration), its token counts, and the finish reason ("tool_calls" once a call was made, unless
max_tokens cut the output). A constrained output that migrates is regenerated from the prompt
(an engine starts its grammar afresh with each request): `replay` and `past_replay` check that
the regenerated tokens are the ones the choice already has, and tell where the new ones begin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from switchyard.preprocessor.detokenizer import IncrementalDetokenizer
from switchyard.preprocessor.parsers import OutputParser, ParsedDelta
from switchyard.preprocessor.parsers.types import EMPTY
from switchyard.preprocessor.stages.logprobs import CompletionLogprobs
from switchyard.preprocessor.stop_strings import StopMatcher
from switchyard.preprocessor.tokenizer import TokenizerBundle


class ChoiceOutput:
    __slots__ = (
        "index",
        "prompt",
        "_detok",
        "_drop",
        "_stop",
        "_stop_ids",
        "_held",
        "parser",
        "_feed",
        "finish_reason",
        "cached_tokens",
        "first_sent",
        "generated",
        "reasoning_tokens",
        "done",
        "completion_logprobs",
        "echo",
        "echoed",
        "group",
        "replay_at",
        "overrun",
    )

    def __init__(
        self,
        index: int,
        tokenizer: TokenizerBundle,
        prompt_ids: list[int],
        stops: Sequence[str],
        parser: OutputParser | None = None,
        skip_special_tokens: bool = True,
        completion_logprobs: CompletionLogprobs | None = None,
        echo: str = "",
        group: int = 0,
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        self.index = index  # the OpenAI choice index
        self.prompt = prompt_ids  # this choice's prompt (a batch has several)
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
        # Kept special tokens (a parser reads its markers): EOS would show up as text.
        self._drop = frozenset(tokenizer.eos_token_ids) if not skip_special_tokens else None
        self._stop = StopMatcher(stops) if stops else None
        self._stop_ids = frozenset(stop_token_ids) or None
        self._held: int | None = None  # a stop token id that may have ended the output
        self.parser = parser
        self._feed: Callable[[str], ParsedDelta] | None = (
            parser.feeder() if parser is not None else None
        )
        self.finish_reason: str | None = None  # set once the choice is done
        self.cached_tokens = 0
        self.first_sent = False  # its role chunk went out (streamed chat)
        self.generated: list[int] = []
        self.reasoning_tokens = 0
        self.done = False
        self.completion_logprobs = completion_logprobs
        self.echo = echo  # completions echo: the prompt text, sent before the output
        self.echoed = False  # the echo went out (streamed completions)
        self.group = group  # which prompt of a batch it answers
        self.replay_at = -1  # replaying: how many of `generated` came again (-1: not replaying)
        self.overrun = 0  # ids of the last delta after the one a stop string completed in

    def _text(self, token_ids: Sequence[int]) -> str:
        if self._stop is not None and len(token_ids) > 1:
            return self._text_until_stop(token_ids)
        return self._text_of(token_ids)

    def _text_until_stop(self, token_ids: Sequence[int]) -> str:
        """Token by token: a stop string may complete inside a delta of several ids (an
        engine merges steps when its reader lags). The ids after the one it completed in are
        no output, and, as vLLM counts, no completion tokens (`overrun`)."""
        out = []
        for k, token_id in enumerate(token_ids):
            out.append(self._text_of((token_id,)))
            if self.done:
                self.overrun = len(token_ids) - k - 1
                break
        return "".join(out)

    def _text_of(self, token_ids: Sequence[int]) -> str:
        if self._held is not None:  # more output came: it did not end it (min_tokens)
            token_ids = [self._held, *token_ids]
            self._held = None
        if self._stop_ids is not None and token_ids and token_ids[-1] in self._stop_ids:
            self._held = token_ids[-1]
            token_ids = token_ids[:-1]
        if self._drop is not None:
            token_ids = [t for t in token_ids if t not in self._drop]
        text = self._detok.add(token_ids)
        stop = self._stop
        if stop is not None and text:
            text, stopped = stop.feed(text)
            if stopped:
                self.finish_reason = "stop"
                self.done = True
        return text

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the choice, if one did."""
        stop = self._stop
        return stop.matched if stop is not None and stop.stopped else None

    def replay(self) -> None:
        """The output so far is to come again from the start of a new engine request."""
        self.replay_at = 0 if self.generated else -1

    def past_replay(self, token_ids: Sequence[int]) -> int:
        """How many of `token_ids` are the output so far coming again (the rest are new);
        -1 when they differ from it."""
        at = self.replay_at
        generated = self.generated
        k = min(len(token_ids), len(generated) - at)
        if list(token_ids[:k]) != generated[at : at + k]:
            return -1
        at += k
        self.replay_at = at if at < len(generated) else -1
        return k

    text = _text  # the text these ids add (no parsers); one call per token, not two

    def parsed(self, token_ids: Sequence[int]) -> ParsedDelta:
        """(content, reasoning, tool_calls) these ids add."""
        parser = self.parser
        assert parser is not None and self._feed is not None
        if parser.in_reasoning:
            self.reasoning_tokens += len(token_ids)
        text = self._text(token_ids)
        parsed = self._feed(text) if text else EMPTY
        if self.done:  # a stop string ended it: release what the parsers hold
            parsed = _join(parsed, parser.finish())
        return parsed

    def finish(self, finish_reason: str, matched_token_id: int | None = None) -> str | ParsedDelta:
        """The held-back output at the engine's end of the choice: text without parsers,
        (content, reasoning, tool_calls) with them. `matched_token_id`: the stop token that
        ended it (the engine's final message), whose text stays out."""
        held = self._held
        tail = ""
        if held is not None:
            self._held = None
            if held != matched_token_id and (self._drop is None or held not in self._drop):
                tail = self._detok.add((held,))
        # What the detokenizer still holds is an incomplete UTF-8 character (the output
        # stopped inside it): vLLM's server drops it, as its decode stream never completes
        # it (SGLang's would send U+FFFD); so do we.
        stop = self._stop
        if stop is not None:
            tail, stopped = stop.feed(tail)
            if stopped:
                finish_reason = "stop"
            else:
                tail += stop.flush()
        self.done = True
        parser = self.parser
        if parser is None:
            self.finish_reason = finish_reason
            return tail
        assert self._feed is not None
        out = _join(self._feed(tail) if tail else EMPTY, parser.finish())
        self.finish_reason = self._reason(finish_reason)
        return out

    def stopped_reason(self) -> None:
        """After a stop string ended it (finish_reason "stop"): a tool call made before it
        still makes it a tool_calls choice."""
        if self.finish_reason is not None:
            self.finish_reason = self._reason(self.finish_reason)

    def _reason(self, finish_reason: str) -> str:
        if self.parser is not None and self.parser.called and finish_reason != "length":
            return "tool_calls"
        return finish_reason


def _join(a: ParsedDelta, b: ParsedDelta) -> ParsedDelta:
    if a is EMPTY:
        return b
    if b is EMPTY:
        return a
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])
