"""One choice's text path, called by the token loop per batch of token ids (hot path).

detokenize -> stop strings; a stop string ends the choice (finish_reason "stop", the string and
what follows trimmed). The output parsers (tool calls, reasoning) plug in after the stop
strings.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.preprocessor.detokenizer import IncrementalDetokenizer
from switchyard.preprocessor.stop_strings import StopMatcher
from switchyard.preprocessor.tokenizer import TokenizerBundle


class ChoiceOutput:
    __slots__ = ("index", "_detok", "_stop", "finish_reason", "cached_tokens", "first_sent")

    def __init__(
        self,
        index: int,
        tokenizer: TokenizerBundle,
        prompt_ids: Sequence[int],
        stops: Sequence[str],
    ) -> None:
        self.index = index
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stop = StopMatcher(stops) if stops else None
        self.finish_reason: str | None = None  # set once the choice is done
        self.cached_tokens = 0
        self.first_sent = False  # its role chunk went out (streamed chat)

    def feed(self, token_ids: Sequence[int]) -> str:
        """The text these ids add; sets finish_reason "stop" when a stop string completes."""
        text = self._detok.add(token_ids)
        stop = self._stop
        if stop is not None and text:
            text, stopped = stop.feed(text)
            if stopped:
                self.finish_reason = "stop"
        return text

    def finish(self, finish_reason: str) -> str:
        """The held-back text at the engine's end of the choice."""
        tail = self._detok.flush()
        stop = self._stop
        if stop is not None:
            tail, stopped = stop.feed(tail)
            if stopped:
                finish_reason = "stop"
            else:
                tail += stop.flush()
        self.finish_reason = finish_reason
        return tail
