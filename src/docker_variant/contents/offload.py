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

__all__ = ["BUNDLE_MAGIC", "BundleSummary", "OffloadError", "read_bundles"]

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
_MAX_ENTRIES = 4096
_MAX_ID = 1024
_CHUNK = 1 << 20


class OffloadError(ValueError):
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


def _find(stream: IO[bytes], start: int, end: int, needle: bytes) -> int:
    """The offset of ``needle`` in [start, end), reading 1 MiB at a time; -1 if absent."""
    pos = start
    while pos < end:
        stream.seek(pos)
        chunk = stream.read(min(_CHUNK + len(needle), end - pos))
        if not chunk:
            return -1
        found = chunk.find(needle)
        if found >= 0:
            return pos + found
        pos += _CHUNK
    return -1


def read_bundles(stream: IO[bytes], offset: int, size: int) -> BundleSummary:
    """Every offload bundle in ``size`` bytes at ``offset`` (a ``.hip_fatbin`` section)."""
    summary = BundleSummary()
    end = offset + size
    stream.seek(offset)
    if stream.read(4) == COMPRESSED_MAGIC:
        summary.bundles = summary.compressed = 1
        return summary
    pos = _find(stream, offset, end, BUNDLE_MAGIC)
    while pos >= 0:
        stream.seek(pos + len(BUNDLE_MAGIC))
        head = stream.read(8)
        if len(head) < 8:
            raise OffloadError(f"offload bundle at {pos - offset} is cut short")
        (count,) = struct.unpack("<Q", head)
        if count > _MAX_ENTRIES:
            raise OffloadError(f"offload bundle at {pos - offset} claims {count} entries")
        furthest = pos + len(BUNDLE_MAGIC) + 8
        for _ in range(count):
            fixed = stream.read(24)
            if len(fixed) < 24:
                raise OffloadError(f"offload bundle at {pos - offset}: entry table cut short")
            entry_offset, entry_size, id_size = struct.unpack("<QQQ", fixed)
            if id_size > _MAX_ID:
                raise OffloadError(f"offload bundle at {pos - offset}: id of {id_size} bytes")
            bundle_id = stream.read(id_size).decode("ascii", "replace")
            if pos + entry_offset + entry_size > end:
                raise OffloadError(
                    f"offload bundle at {pos - offset}: entry {bundle_id} runs past the section"
                )
            furthest = max(furthest, pos + entry_offset + entry_size)
            if (target := gfx_target(bundle_id)) is not None:
                summary.targets.add(target)
        summary.bundles += 1
        pos = _find(stream, furthest, end, BUNDLE_MAGIC)
    return summary
