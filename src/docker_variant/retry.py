"""Jittered exponential backoff: the one way this package waits before trying again.

``Backoff.delay(attempt)`` is ``first * 2**attempt`` (at most ``cap``) times a random factor
drawn from ``[low, high]``: ``low = 0`` is "full jitter" (racing writers spread out, so the
loser of a race does not meet the winner again), ``0.8..1.2`` keeps a heartbeat near its
schedule while clients that failed together do not retry together.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "retry"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Backoff:
    first: float  # seconds before the second try (attempt 0)
    cap: float = math.inf  # no delay is longer
    low: float = 0.0  # the random factor's range
    high: float = 1.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``attempt`` failed tries (0: after the first)."""
        base = min(self.first * 2 ** min(attempt, 64), self.cap)
        return float(base * (rng or random).uniform(self.low, self.high))

    def pause(self, attempt: int) -> None:
        time.sleep(self.delay(attempt))


def retry(
    call: Callable[[], _T],
    *,
    attempts: int,
    backoff: Backoff,
    retryable: Callable[[Exception], bool],
) -> _T:
    """``call()``, tried again after ``backoff`` while it raises an error ``retryable``
    accepts, at most ``attempts`` times in all; the last error is raised."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as error:
            if not retryable(error) or attempt + 1 >= attempts:
                raise
        backoff.pause(attempt)
    raise ValueError(f"attempts must be >= 1, got {attempts}")
