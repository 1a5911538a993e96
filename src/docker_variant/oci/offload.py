"""Heavy parsing off the event loop, a few documents at a time.

A large upstream document (an image config, an index) is parsed and checked on a worker
thread so that other requests are served meanwhile; at most ``THREADS`` at once per event
loop, so concurrent scans of large documents cannot multiply the memory they take.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

import anyio
import anyio.to_thread

__all__ = ["THREADS", "off_loop"]

THREADS = 4
_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")
_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = (
    weakref.WeakKeyDictionary()
)


async def off_loop(work: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
    """``work(*args)`` on a worker thread, at most ``THREADS`` of them per event loop."""
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        limiter = _limiters[loop] = anyio.CapacityLimiter(THREADS)
    return await anyio.to_thread.run_sync(work, *args, limiter=limiter)
