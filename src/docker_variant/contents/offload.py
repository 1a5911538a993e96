"""Clang offload bundles (HIP/ROCm device code): the gfx targets in an ELF's ``.hip_fatbin``.

An uncompressed bundle is ``__CLANG_OFFLOAD_BUNDLE__`` (24 bytes), a u64 entry count, then per
entry u64 offset, u64 size, u64 id length and the id, e.g.
``hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-``. Only the table is read; code objects are skipped.
A compressed bundle (magic ``CCOB``) keeps its table inside the compressed data: it is
reported as such, its targets unknown.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import IO

from docker_variant.errors import InvalidInputError

__all__ = ["BUNDLE_MAGIC", "BundleSummary", "OffloadError", "read_bundles"]

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
_MAX_ENTRIES = 4096
_MAX_ID = 1024
_CHUNK = 1 << 20


class OffloadError(InvalidInputError):
    """A corrupt offload bundle."""


@dataclass
class BundleSummary:
    bundles: int = 0
    compressed: int = 0
    targets: set[str] = field(default_factory=set)  # gfx90a, gfx942, ... (features dropped)


def gfx_target(bundle_id: str) -> str | None:
    """``hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-`` -> ``gfx90a``; host entries -> None."""
    triple, _, target = bundle_id.partition("--")
    if "amdgcn" not in triple or not target:
        return None
    name = target.split(":", 1)[0]
    return name if name.startswith("gfx") else None


class _Scanner:
    """Finds the bundle magic in [start, end) going forward only: a window of ``_CHUNK``
    bytes is read once and searched again from where the last bundle ended, so many small
    bundles cost one pass over the section, not one ``_CHUNK`` read each."""

    def __init__(self, stream: IO[bytes], end: int) -> None:
        self._stream = stream
        self._end = end
        self._window = b""
        self._window_at = 0  # stream offset of _window[0]

    def find(self, start: int) -> int:
        """The offset of the next magic at or after ``start``; -1 if none."""
        pos, size = start, len(BUNDLE_MAGIC)
        while pos + size <= self._end:
            window_end = self._window_at + len(self._window)
            if not self._window_at <= pos <= window_end - size:
                self._stream.seek(pos)
                self._window = self._stream.read(min(_CHUNK, self._end - pos))
                self._window_at, window_end = pos, pos + len(self._window)
                if len(self._window) < size:
                    return -1
            found = self._window.find(BUNDLE_MAGIC, pos - self._window_at)
            if found >= 0:
                return self._window_at + found
            pos = window_end - size + 1  # the magic may straddle the window's end
        return -1


def read_bundles(stream: IO[bytes], offset: int, size: int) -> BundleSummary:
    """Every offload bundle in ``size`` bytes at ``offset`` (a ``.hip_fatbin`` section)."""
    summary = BundleSummary()
    end = offset + size
    stream.seek(offset)
    if stream.read(4) == COMPRESSED_MAGIC:
        summary.bundles = summary.compressed = 1
        return summary
    scanner = _Scanner(stream, end)
    pos = scanner.find(offset)
    while pos >= 0:
        at = pos + len(BUNDLE_MAGIC)
        stream.seek(at)
        head = stream.read(8)
        if len(head) < 8 or at + 8 > end:
            raise OffloadError(f"offload bundle at {pos - offset} is cut short")
        (count,) = struct.unpack("<Q", head)
        if count > _MAX_ENTRIES:
            raise OffloadError(f"offload bundle at {pos - offset} claims {count} entries")
        at += 8
        furthest = at
        for _ in range(count):
            fixed = stream.read(24)
            if len(fixed) < 24 or at + 24 > end:
                raise OffloadError(f"offload bundle at {pos - offset}: entry table cut short")
            entry_offset, entry_size, id_size = struct.unpack("<QQQ", fixed)
            if id_size > _MAX_ID or at + 24 + id_size > end:
                raise OffloadError(f"offload bundle at {pos - offset}: id of {id_size} bytes")
            bundle_id = stream.read(id_size).decode("ascii", "replace")
            at += 24 + id_size
            if pos + entry_offset + entry_size > end:
                raise OffloadError(
                    f"offload bundle at {pos - offset}: entry {bundle_id} runs past the section"
                )
            furthest = max(furthest, pos + entry_offset + entry_size)
            if (target := gfx_target(bundle_id)) is not None:
                summary.targets.add(target)
        summary.bundles += 1
        # the next bundle starts after this one's table and code objects: no byte is
        # searched or read as a table twice
        pos = scanner.find(max(furthest, at))
    return summary
