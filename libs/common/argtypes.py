"""argparse types of the plain numeric flags every service has (counts, timeouts): a bad value
is a usage error naming the flag at parse time, from the command line, SWITCHYARD_<FLAG> or
the --config file alike. Ports and endpoints have theirs beside them (ports.port_number,
endpoints.zmq_endpoint, metrics.metrics_port)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole_number(minimum: int) -> Callable[[str], int]:
    """argparse type of a whole number >= `minimum` (a count of replicas, probes, ranks)."""

    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return whole_number


def seconds(text: str) -> float:
    """argparse type of a number of seconds >= 0 (a drain or stall timeout, a warning
    interval): a negative number or NaN is refused, not taken as "at once" or "never"."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type of a number of seconds > 0 and finite (a start-up or stream timeout):
    0, a negative number, NaN and inf are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value
