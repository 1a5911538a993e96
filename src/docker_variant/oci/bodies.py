"""The one bounded reader of HTTP bodies, for answers (httpx) and requests (Starlette)
alike: no body over its limit is ever held whole.

Pure: it reads chunks from whatever iterates them, sync or async, so the servers' request
bodies and every client's answers are bounded by the same rule. A declared
``Content-Length`` over the limit is refused before anything is read (``header_number``:
ASCII digits only); else the chunks are counted as they come.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator

from docker_variant.numtext import header_number

__all__ = ["BodyLimit", "TooLarge", "aread_bounded", "read_bounded"]

#: Makes the error for a body over its limit: given the ``Content-Length`` as sent (stripped)
#: when that was over it, ``None`` when the chunks passed it.
TooLarge = Callable[[str | None], Exception]


class BodyLimit:
    """Counts a body's bytes against ``limit``; ``too_large`` makes the error raised past it.

    With ``truncate``, a body past the limit is not refused: its first ``limit`` bytes are
    kept and ``full`` says the rest need not be read (enough of an error body to find its
    code). ``check`` is called before each chunk (a deadline: a drip of a byte a second
    passes every per-read time-out)."""

    def __init__(
        self,
        limit: int,
        too_large: TooLarge,
        *,
        declared: str | None = None,
        truncate: bool = False,
        check: Callable[[], object] | None = None,
    ) -> None:
        length = header_number(declared)
        if not truncate and length is not None and length > limit:
            raise too_large((declared or "").strip())
        self.limit, self.truncate, self.full = limit, truncate, False
        self._too_large, self._check = too_large, check
        self._size = 0

    def take(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` to keep: all of it, or with ``truncate`` what fits."""
        if self._check is not None:
            self._check()
        if self._size + len(chunk) > self.limit:
            if not self.truncate:
                raise self._too_large(None)
            # keep the head: a chunk may be larger than the whole limit
            chunk, self.full = chunk[: self.limit - self._size], True
        self._size += len(chunk)
        return chunk

    def takes(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks`` as they come, each ``take``n, until ``full``."""
        for chunk in chunks:
            yield self.take(chunk)
            if self.full:
                return

    async def atakes(self, chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        """As ``takes``, from chunks that arrive on asyncio."""
        async for chunk in chunks:
            yield self.take(chunk)
            if self.full:
                return


def read_bounded(chunks: Iterable[bytes], bound: BodyLimit) -> bytes:
    """A whole body from ``chunks`` within ``bound``, read in this thread."""
    return b"".join(bound.takes(chunks))


async def aread_bounded(chunks: AsyncIterable[bytes], bound: BodyLimit) -> bytes:
    """A whole body from ``chunks`` within ``bound``, read on asyncio."""
    return b"".join([chunk async for chunk in bound.atakes(chunks)])
