"""Stop strings matched on the detokenized stream, across delta boundaries.

`StopMatcher.feed(delta)` emits the text that can no longer be part of a stop string and
holds back the longest tail that could still begin one. When a stop string completes, the
text before it is emitted, the stop string itself is not (OpenAI trims it), and the matcher
reports `stopped`; the earliest-starting stop string wins. `flush()` releases the held-back
tail when the stream ends without a stop.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopMatcher:
    __slots__ = ("_stops", "_max_hold", "_chars", "_held", "stopped", "matched")

    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = tuple(s for s in dict.fromkeys(stops) if s)
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._chars = frozenset("".join(self._stops))
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        """(text to emit now, whether a stop string was reached). After a stop: ("", True)."""
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        buf = self._held + text if self._held else text
        if not buf:
            return "", False
        first = -1
        for stop in self._stops:
            at = buf.find(stop)
            if at != -1 and (first == -1 or at < first):
                first = at
                self.matched = stop
        if first != -1:
            self.stopped = True
            self._held = ""
            return buf[:first], True
        hold = self._hold_length(buf)
        if hold:
            self._held = buf[-hold:]
            return buf[:-hold], False
        self._held = ""
        return buf, False

    def flush(self) -> str:
        """The held-back tail, at the end of a stream that did not stop."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _hold_length(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        if buf[-1] not in self._chars:
            return 0
        for n in range(min(self._max_hold, len(buf)), 0, -1):
            tail = buf[-n:]
            for stop in self._stops:
                if stop.startswith(tail):
                    return n
        return 0
