"""CUDA fatbins: the architectures in an ELF's ``.nv_fatbin`` section, from headers only.

A ``.nv_fatbin`` section holds fatbins back to back. Each starts with magic ``0xBA55ED50``
(u32 LE), u16 version, u16 header size and u64 payload size; its entries follow, each with
u16 kind (1 = PTX, 2 = cubin), u16, u32 entry header size, u64 payload size, the SM number
(e.g. 90) as u32 at offset 28 and flags as u64 at offset 40 (0x2000: compressed). Payloads
are skipped by seeking, never read, so compressed ones need no decompression: the
architecture is in the entry header. The reads are linear in the section: each entry header
once, padding in 64-byte steps. Checked against ``libcurand.so.10`` of
``nvidia-curand-cu12`` 10.3.10.19 (11 fatbins, cubins sm_50 ... sm_121, PTX compute_121).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import IO

from docker_variant.errors import InvalidInputError

__all__ = ["FATBIN_MAGIC", "FatbinError", "FatbinSummary", "read_fatbins"]

FATBIN_MAGIC = 0xBA55ED50
_HEADER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQ")
KIND_PTX, KIND_CUBIN = 1, 2
_COMPRESSED = 0x2000
_MAX_ENTRY_HEADER = 4096
_MAX_PADDING = 4096  # zero padding tolerated between fatbins


class FatbinError(InvalidInputError):
    """A truncated or corrupt fatbin; the message names the offset."""


def arch_of(sm: int) -> tuple[int, int]:
    """90 -> (9, 0); 121 -> (12, 1)."""
    return divmod(sm, 10)


@dataclass
class FatbinSummary:
    fatbins: int = 0
    cubins: set[tuple[int, int]] = field(default_factory=set)
    ptx: set[tuple[int, int]] = field(default_factory=set)
    compressed: int = 0
    entries: int = 0


def _read(stream: IO[bytes], offset: int, size: int) -> bytes:
    stream.seek(offset)
    return stream.read(size)


def read_fatbins(stream: IO[bytes], offset: int, size: int) -> FatbinSummary:
    """Every fatbin in ``size`` bytes at ``offset`` of ``stream`` (a ``.nv_fatbin`` section)."""
    summary = FatbinSummary()
    pos, end = offset, offset + size
    while pos + _HEADER.size <= end:
        head = _read(stream, pos, _HEADER.size)
        if len(head) < _HEADER.size:
            raise FatbinError(f"fatbin header at {pos - offset} is cut short")
        magic, _version, header_size, payload = _HEADER.unpack(head)
        if magic != FATBIN_MAGIC:
            if magic == 0 and summary.fatbins:  # alignment padding after a fatbin
                skip = _zero_run(stream, pos, min(end, pos + _MAX_PADDING))
                if skip and pos + skip >= end:
                    break
                if skip:
                    pos += skip
                    continue
            raise FatbinError(f"no fatbin magic at offset {pos - offset} (found {magic:#010x})")
        if header_size < _HEADER.size or pos + header_size + payload > end:
            raise FatbinError(
                f"fatbin at offset {pos - offset} claims {header_size}+{payload} bytes; "
                f"the section has {end - pos} left (truncated)"
            )
        summary.fatbins += 1
        entry, stop = pos + header_size, pos + header_size + payload
        while entry + _ENTRY.size <= stop:
            raw = _read(stream, entry, 48)
            if len(raw) < _ENTRY.size:
                raise FatbinError(f"fatbin entry at offset {entry - offset} is cut short")
            kind, _unknown, entry_header, entry_size = _ENTRY.unpack_from(raw)
            if kind == 0 and entry_header == 0:  # zero padding inside the payload
                break
            if not 32 <= entry_header <= _MAX_ENTRY_HEADER or entry + entry_header > stop:
                raise FatbinError(
                    f"fatbin entry at offset {entry - offset}: header size {entry_header} "
                    "is not plausible"
                )
            if entry + entry_header + entry_size > stop:
                raise FatbinError(
                    f"fatbin entry at offset {entry - offset} claims {entry_size} bytes "
                    "past its fatbin (truncated)"
                )
            sm = struct.unpack_from("<I", raw, 28)[0]
            if kind == KIND_CUBIN:
                summary.cubins.add(arch_of(sm))
            elif kind == KIND_PTX:
                summary.ptx.add(arch_of(sm))
            if len(raw) >= 48 and entry_header >= 48:
                flags = struct.unpack_from("<Q", raw, 40)[0]
                summary.compressed += bool(flags & _COMPRESSED)
            summary.entries += 1
            entry += entry_header + entry_size
        pos = stop
    return summary


def _zero_run(stream: IO[bytes], start: int, limit: int) -> int:
    """How many zero bytes start at ``start`` (up to ``limit``), read 64 bytes at a time so
    that a short run costs a short read."""
    pos = start
    while pos < limit:
        data = _read(stream, pos, min(64, limit - pos))
        stripped = data.lstrip(b"\0")
        pos += len(data) - len(stripped)
        if stripped or not data:
            break
    return pos - start
