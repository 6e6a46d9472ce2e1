"""Fault injection for chaos tests: refused calls, a hung engine, a crash after N tokens.

- `admit()` is drawn once per Generate call: a fraction of calls is refused at once as
  UNAVAILABLE, another as OVERLOADED (the servicers send the gRPC codes). The draws come from
  one rng seeded with --fault-seed, so the sequence of verdicts is the same on every run.
- `hang_after_tokens`: the core stops a request after that many tokens without ending it (the
  stream stays open and silent until the caller cancels; Abort does not rescue it).
- `exit_after_tokens`: once the engine has generated that many tokens in total (all requests),
  the process ends with os._exit: no graceful stream end, no cleanup, as in a crash.

Pure bookkeeping apart from `crash`, which is injected (tests never exit for real).
"""

from __future__ import annotations

import enum
import logging
import os
import random
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)

CRASH_EXIT_CODE = 1


class Refusal(enum.StrEnum):
    UNAVAILABLE = "unavailable"  # gRPC UNAVAILABLE
    OVERLOADED = "overloaded"  # gRPC RESOURCE_EXHAUSTED


def exit_now() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


class FaultInjector:
    """The faults one engine injects; all off by default."""

    def __init__(
        self,
        *,
        exit_after_tokens: int | None = None,
        hang_after_tokens: int | None = None,
        fail_unavailable: float = 0.0,
        fail_overloaded: float = 0.0,
        rng: random.Random | None = None,
        crash: Callable[[], None] = exit_now,
    ) -> None:
        self.exit_after_tokens = exit_after_tokens
        self.hang_after_tokens = hang_after_tokens
        self.fail_unavailable = fail_unavailable
        self.fail_overloaded = fail_overloaded
        self._rng = rng if rng is not None else random.Random()
        self._crash = crash
        self.refused = 0

    def admit(self) -> Refusal | None:
        """The verdict on one Generate call: None to serve it, else how to refuse it."""
        if not (self.fail_unavailable or self.fail_overloaded):
            return None
        draw = self._rng.random()
        if draw < self.fail_unavailable:
            verdict: Refusal | None = Refusal.UNAVAILABLE
        elif draw < self.fail_unavailable + self.fail_overloaded:
            verdict = Refusal.OVERLOADED
        else:
            return None
        self.refused += 1
        return verdict

    def hangs_at(self, produced: int) -> bool:
        """Whether a request that has produced `produced` tokens goes silent now."""
        return self.hang_after_tokens is not None and produced >= self.hang_after_tokens

    def after_token(self, total_generated: int) -> None:
        """Called once a token has been handed on; crashes the process at the limit."""
        if self.exit_after_tokens is not None and total_generated >= self.exit_after_tokens:
            logger.warning(
                "exiting abruptly after %d generated tokens (--exit-after-tokens)",
                total_generated,
            )
            self._crash()
