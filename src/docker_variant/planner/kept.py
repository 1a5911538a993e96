"""``Kept``: the last few values by key, most recently used kept; safe across the server's
threads. The scheduler keeps what repeated placements of one index would otherwise work out
again (the request read from a body, the index read from a document, the judge of an index):
each is immutable, so a kept value never goes stale, and the bound only limits memory."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Kept"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Kept(Generic[K, V]):
    def __init__(self, size: int, on_drop: Callable[[V], object] | None = None) -> None:
        self.size = size
        self._on_drop = on_drop
        self._values: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._values.get(key)
            if found is not None:
                self._values.move_to_end(key)
            return found

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` (replacing one kept under ``key``), drop the least recently used
        past the bound, and return ``value``."""
        dropped: list[V] = []
        with self._lock:
            replaced = self._values.pop(key, None)
            if replaced is not None and replaced is not value:
                dropped.append(replaced)
            self._values[key] = value
            while len(self._values) > self.size:
                dropped.append(self._values.popitem(last=False)[1])
            if self._on_drop is not None:
                for old in dropped:
                    self._on_drop(old)
        return value
