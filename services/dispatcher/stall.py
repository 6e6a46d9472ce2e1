"""Notice an engine that went silent under load (SIGSTOP, a hung host or GPU).

Its TCP connection stays open, so neither the transport nor the stream sees anything: the
keepalive takes its 12 + 4 s, and streams still waiting for their first token would wait for
the preprocessor's first-token timeout (60 s). The dispatcher sees every stream of an engine,
so it can tell: the engine has streams that already produced output, and none of its streams
produced anything for `timeout` seconds. Then every stream on it is failed (kind `timeout`:
instance down, migrate), also those still waiting for their first token.

Per reply the hot path only bumps a counter (`Activity.replies`); a watchdog compares the
counters every fraction of the timeout. `check(now)` is pure, for tests.
"""

from __future__ import annotations


class Activity:
    """One engine's streams: how many run, a counter of the replies they produced, and
    whether output was flowing (armed) when it went quiet."""

    __slots__ = ("armed", "quiet_since", "replies", "seen", "streams")

    def __init__(self, now: float) -> None:
        self.replies = 0
        self.streams = 0  # running
        # Set by every reply; cleared when a stream finishes normally (what follows may be a
        # long prefill, not a stall) and when the engine is idle.
        self.armed = False
        self.seen = 0  # `replies` at the last check
        self.quiet_since = now


class StallWatch:
    def __init__(self, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError("the stall timeout must be positive")
        self.timeout = timeout
        self._engines: dict[int, Activity] = {}
        self._stalled: set[int] = set()  # reported, until the engine produces output again

    @property
    def interval(self) -> float:
        """How often to check."""
        return min(1.0, max(0.05, self.timeout / 8))

    def activity(self, instance_id: int, now: float) -> Activity:
        engine = self._engines.get(instance_id)
        if engine is None:
            engine = self._engines[instance_id] = Activity(now)
        return engine

    def check(self, now: float) -> list[int]:
        """The engines that stalled since the last check (each reported once per stall):
        output was flowing, and with streams still running nothing came for `timeout`."""
        stalled = []
        for instance_id, engine in self._engines.items():
            if engine.replies != engine.seen or engine.streams == 0:
                engine.seen = engine.replies
                engine.quiet_since = now
                self._stalled.discard(instance_id)
                if engine.streams == 0:
                    engine.armed = False
            elif (
                engine.armed
                and now - engine.quiet_since >= self.timeout
                and instance_id not in self._stalled
            ):
                self._stalled.add(instance_id)
                stalled.append(instance_id)
        return stalled

    def forget(self, instance_id: int) -> None:
        self._engines.pop(instance_id, None)
        self._stalled.discard(instance_id)
