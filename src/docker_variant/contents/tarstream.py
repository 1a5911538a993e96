"""Tar streams read once, front to back, through a bounded window: image layers (gzip or plain
tar) and the engine's ``docker save`` archive.

The one reader of tar for inspection. It never buffers more than a fixed window, whatever
the layer holds or how well it compresses:

- gzip is inflated by ``zlib.decompressobj`` with ``max_length``: at most ``CHUNK`` bytes
  of compressed input are held and at most ``CHUNK`` bytes of output made per step;
  concatenated gzip members are read as one stream, as gzip and the runtimes read them;
- tar headers are parsed here (ustar, GNU long names, pax ``path``/``linkpath``/``size``),
  sliced out of the window without copying the rest of it (tarfile's stream mode copies its
  1 MiB buffer on every small read: quadratic in the number of members);
- ``TarLimits`` bounds one stream: ``MAX_MEMBERS`` members, ``MAX_EXTENDED`` bytes per pax or
  GNU long-name header, ``MAX_HEADER_BYTES`` of header bytes in all and ``MAX_TAR_BYTES`` of
  tar once decompressed.

A stream past a limit, a bad header checksum, a corrupt gzip stream or one that ends before
its end is one ``ContentsError`` line (exit code 2) naming the stream and the rule. A stream
that ends right after its last member's data, lacking only padding and the end-of-archive
blocks (umoci 0.4 writes layers so), is read to its end, as Docker and containerd read it.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from docker_variant.errors import InvalidInputError, one_line

__all__ = [
    "CHUNK",
    "DIRECTORY",
    "FILE",
    "HARDLINK",
    "MAX_EXTENDED",
    "MAX_HEADER_BYTES",
    "MAX_MEMBERS",
    "MAX_TAR_BYTES",
    "OTHER",
    "SYMLINK",
    "ContentsError",
    "Member",
    "MemberData",
    "Readable",
    "TarLimits",
    "TarStats",
    "TarStream",
    "open_layer",
    "open_tar",
]

CHUNK = 64 << 10  # the window: compressed input per step, output per step
BLOCK = 512
MAX_MEMBERS = 1_000_000  # more than any real layer (a full TeX Live tree is about 200,000)
MAX_EXTENDED = 1 << 20  # one pax or GNU long-name header (PATH_MAX is 4,096)
MAX_HEADER_BYTES = 256 << 20  # header blocks and extended headers of one stream
MAX_TAR_BYTES = 64 << 30  # one layer once decompressed

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

# member kinds
FILE, DIRECTORY, SYMLINK, HARDLINK, OTHER = "file", "directory", "symlink", "hardlink", "other"
_KINDS = {b"0": FILE, b"\0": FILE, b"7": FILE, b"1": HARDLINK, b"2": SYMLINK, b"5": DIRECTORY}
# types whose size field says nothing about data that follows (archive/tar's header-only types)
_HEADER_ONLY = {b"1", b"2", b"3", b"4", b"5", b"6"}
_PAX_RECORD_LENGTH = re.compile(rb"([0-9]{1,20}) ")
_PAX_SIZE = re.compile(r"[0-9]{1,20}")


class ContentsError(InvalidInputError):
    """A layer or image archive that cannot be read (exit code 2)."""


class Readable(Protocol):
    """What the reader reads from: ``read(n)`` gives at most ``n`` bytes, ``b""`` at the end."""

    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class TarLimits:
    """The bounds of one stream (defaults: the module's constants)."""

    members: int = MAX_MEMBERS
    extended: int = MAX_EXTENDED
    header_bytes: int = MAX_HEADER_BYTES
    tar_bytes: int = MAX_TAR_BYTES


@dataclass
class TarStats:
    """What reading a stream cost: members, header bytes, tar bytes (decompressed), the
    bytes sliced out of the window (each tar byte at most once, so the work is linear) and
    the inflate steps."""

    members: int = 0
    header_bytes: int = 0
    tar_bytes: int = 0
    copied: int = 0
    steps: int = 0


@dataclass(frozen=True)
class Member:
    name: str
    kind: str  # FILE, DIRECTORY, SYMLINK, HARDLINK or OTHER
    size: int  # bytes of data that follow (0 for links and directories)
    linkname: str = ""
    offset: int = 0  # of its header in the tar stream

    def isfile(self) -> bool:
        return self.kind == FILE

    def issym(self) -> bool:
        return self.kind == SYMLINK

    def islnk(self) -> bool:
        return self.kind == HARDLINK


class _Source(Protocol):
    def read(self, size: int) -> bytes: ...


class _Plain:
    """Tar bytes as they come: ``head`` (already read to sniff the format), then ``raw``."""

    def __init__(self, raw: Readable, head: bytes, stats: TarStats) -> None:
        self._raw = raw
        self._head = head
        self._stats = stats

    def read(self, size: int) -> bytes:
        if self._head:
            data, self._head = self._head[:size], self._head[size:]
            return data
        self._stats.steps += 1
        return self._raw.read(size)


class _Gunzip:
    """Inflated bytes of ``head`` + ``raw``, at most ``size`` per read, through a fixed
    window; a stream that ends before its gzip end is a ``ContentsError``."""

    def __init__(self, raw: Readable, head: bytes, what: str, stats: TarStats) -> None:
        self._raw = raw
        self._pending = head  # compressed input not yet given to the inflater
        self._what = what
        self._stats = stats
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._done = False

    def _input(self) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        return self._raw.read(CHUNK)

    def read(self, size: int) -> bytes:
        size = min(size, CHUNK) if size > 0 else CHUNK  # 0 would mean no limit to zlib
        while not self._done:
            if self._inflate.eof:
                rest = self._inflate.unused_data or self._input()
                if not rest.startswith(GZIP_MAGIC[: len(rest)]) or not rest:
                    self._done = True  # the end, or bytes after it that are not gzip
                    break
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next member
                self._pending = rest
                continue
            data = self._inflate.unconsumed_tail or self._input()
            self._stats.steps += 1
            try:
                # with no input left this still gives what the inflater holds back
                out = self._inflate.decompress(data, size)
            except zlib.error as exc:
                raise ContentsError(
                    f"{self._what}: corrupt or truncated gzip stream ({one_line(str(exc))})"
                ) from None
            if not out and not data and not self._inflate.eof:
                raise ContentsError(
                    f"{self._what}: corrupt or truncated gzip stream (the data ends before "
                    "the gzip stream does)"
                )
            if out:
                return out
        return b""


def _read_exactly(read: Callable[[int], bytes], size: int) -> bytes:
    """Exactly ``size`` bytes from ``read``, fewer only where the stream ends (a read may
    return less than asked: a socket, a decompressor's window)."""
    first = read(size)
    if len(first) == size or not first:
        return first
    parts, have = [first], len(first)
    while have < size:
        data = read(size - have)
        if not data:
            break
        parts.append(data)
        have += len(data)
    return b"".join(parts)


def open_layer(raw: Readable, name: str, limits: TarLimits | None = None) -> TarStream:
    """The tar stream of a layer read from ``raw``: gzip or plain tar, told by its first
    bytes; anything else (zstd included) is one ``ContentsError``."""
    head = _read_exactly(raw.read, BLOCK)
    stats = TarStats()
    source: _Source
    if head.startswith(GZIP_MAGIC):
        source = _Gunzip(raw, head, f"layer {name}", stats)
    elif head.startswith(ZSTD_MAGIC):
        raise ContentsError(f"layer {name}: zstd-compressed layers are not supported (gzip or tar)")
    elif head[257:262] == b"ustar" or not head.strip(b"\0"):
        source = _Plain(raw, head, stats)  # an all-zero block: an empty archive
    else:
        raise ContentsError(
            f"layer {name}: neither gzip-compressed nor a tar archive "
            f"(starts with {head[:8].hex()})"
        )
    return TarStream(source, f"layer {name}", limits or TarLimits(), stats)


def open_tar(raw: Readable, what: str, limits: TarLimits | None = None) -> TarStream:
    """A plain tar stream (the engine's ``docker save`` archive); ``what`` names it in
    errors."""
    stats = TarStats()
    return TarStream(_Plain(raw, b"", stats), what, limits or TarLimits(), stats)


class MemberData:
    """The data of the current member: ``read(n)`` gives ``n`` bytes or what is left of the
    member (a member cut short is a ``ContentsError``); ``peek`` does not consume."""

    def __init__(self, stream: TarStream, size: int) -> None:
        self._stream = stream
        self.left = size

    def read(self, size: int = -1, /) -> bytes:
        if self.left <= 0:
            return b""
        want = self.left if size < 0 else min(size, self.left)
        data = self._stream._take(want)
        self.left -= len(data)
        if len(data) < want:
            self._stream._short_data(self.left)
        return data

    def peek(self, size: int) -> bytes:
        """Up to ``size`` bytes from here, not consumed."""
        return self._stream._peek(min(size, self.left))


@dataclass
class _Extended:
    """What pax and GNU long-name headers say about the member that follows them."""

    path: str | None = None
    linkpath: str | None = None
    size: int | None = None
    fields: dict[str, str] = field(default_factory=dict)


def _text(raw: bytes) -> str:
    # backslashreplace: a name that is not UTF-8 stays distinct and printable
    return raw.decode("utf-8", "backslashreplace")


def _cstring(raw: bytes) -> bytes:
    end = raw.find(b"\0")
    return raw if end < 0 else raw[:end]


class TarStream:
    """The members of a tar stream, each once: iterate, and read a file's data through
    ``data`` before asking for the next (what is not read is skipped)."""

    def __init__(self, source: _Source, what: str, limits: TarLimits, stats: TarStats) -> None:
        self._source = source
        self.what = what
        self.limits = limits
        self.stats = stats
        self._buffer = b""
        self._at = 0  # position in _buffer
        self._offset = 0  # position in the tar stream of _buffer[_at]
        self._current: MemberData | None = None
        self._padding = 0

    # ------------------------------------------------------------------ the window

    def _fill(self, size: int) -> bytes:
        data = self._source.read(size)
        self.stats.tar_bytes += len(data)
        if self.stats.tar_bytes > self.limits.tar_bytes:
            raise ContentsError(
                f"{self.what}: more than {self.limits.tar_bytes} bytes of tar once "
                "decompressed (the limit for one layer)"
            )
        return data

    def _read(self, size: int) -> bytes:
        """At most ``size`` bytes (at least one unless the stream ended)."""
        if self._at < len(self._buffer):
            data = self._buffer[self._at : self._at + size]
            self._at += len(data)
        elif size >= CHUNK:
            data = self._fill(min(size, CHUNK))
        else:
            self._buffer, self._at = self._fill(CHUNK), 0
            data = self._buffer[:size]
            self._at = len(data)
        self._offset += len(data)
        self.stats.copied += len(data)
        return data

    def _take(self, size: int) -> bytes:
        """Exactly ``size`` bytes, fewer only where the stream ends."""
        return _read_exactly(self._read, size)

    def _peek(self, size: int) -> bytes:
        left = len(self._buffer) - self._at
        if left < size:
            parts = [self._buffer[self._at :]]
            while left < size:
                data = self._fill(CHUNK)
                if not data:
                    break
                parts.append(data)
                left += len(data)
            self._buffer, self._at = b"".join(parts), 0
        return self._buffer[self._at : self._at + size]

    def _skip(self, size: int) -> int:
        """Skip ``size`` bytes; returns how many the stream still had."""
        skipped = 0
        while skipped < size:
            left = len(self._buffer) - self._at
            if left:
                step = min(left, size - skipped)
                self._at += step
            else:
                data = self._fill(min(CHUNK, size - skipped))
                if not data:
                    break
                step = len(data)
            skipped += step
            self._offset += step
        return skipped

    def _short_data(self, missing: int) -> None:
        raise ContentsError(
            f"{self.what}: corrupt or truncated tar stream (a member's data is "
            f"{missing} bytes short)"
        )

    # ------------------------------------------------------------------ members

    def _finish_member(self) -> None:
        if self._current is not None:
            left = self._current.left
            if left and self._skip(left) < left:
                self._short_data(left)
            self._current = None
        self._skip(self._padding)  # a stream may end here, lacking only the padding
        self._padding = 0

    def _count_header(self, size: int) -> None:
        self.stats.header_bytes += size
        if self.stats.header_bytes > self.limits.header_bytes:
            raise ContentsError(
                f"{self.what}: more than {self.limits.header_bytes} bytes of tar "
                "headers (the limit for one layer)"
            )

    def _corrupt(self, offset: int, why: str) -> ContentsError:
        return ContentsError(
            f"{self.what}: corrupt or truncated tar stream (header at {offset}: {why})"
        )

    def _number(self, raw: bytes, offset: int, what: str) -> int:
        if raw[:1] and raw[0] & 0x80:  # GNU base-256, for sizes over 8 GiB
            if raw[0] != 0x80:
                raise self._corrupt(offset, f"negative {what}")
            return int.from_bytes(raw[1:], "big")
        text = raw.replace(b"\0", b" ").strip()
        if not text:
            return 0
        if not all(48 <= c <= 55 for c in text):
            raise self._corrupt(
                offset, f"{what} {one_line(text.decode('latin-1'), 40)!r} is not octal"
            )
        return int(text, 8)

    def _extended_data(self, size: int, offset: int) -> bytes:
        if size > self.limits.extended:
            raise ContentsError(
                f"{self.what}: an extended tar header of {size} bytes at {offset} "
                f"(the limit is {self.limits.extended})"
            )
        self._count_header(size)
        data = self._take(size)
        if len(data) < size:
            raise self._corrupt(offset, "the stream ends inside an extended header")
        self._skip(-size % BLOCK)
        return data

    def _pax(self, data: bytes, offset: int, into: _Extended) -> None:
        at = 0
        while at < len(data):
            match = _PAX_RECORD_LENGTH.match(data, at)
            if match is None:
                if not data[at:].strip(b"\0"):
                    return  # zero padding after the last record
                raise self._corrupt(offset, "a pax record without its length")
            length = int(match[1])
            record = data[match.end() : at + length]
            if length <= len(match[0]) or at + length > len(data) or not record.endswith(b"\n"):
                raise self._corrupt(offset, f"a pax record of length {length} does not fit")
            key, sep, value = record[:-1].partition(b"=")
            if not sep:
                raise self._corrupt(offset, "a pax record without '='")
            text = _text(value)
            name = _text(key)
            into.fields[name] = text
            if name == "path" or name == "GNU.sparse.name":
                into.path = text
            elif name == "linkpath":
                into.linkpath = text
            elif name == "size":
                if _PAX_SIZE.fullmatch(text) is None:
                    raise self._corrupt(offset, f"pax size {one_line(text, 40)!r}")
                into.size = int(text)
            at += length

    def __iter__(self) -> Iterator[tuple[Member, MemberData]]:
        extended = _Extended()
        while True:
            self._finish_member()
            offset = self._offset
            block = self._take(BLOCK)
            if not block.strip(b"\0"):
                return  # the end-of-archive block, or the stream's end (maybe cut in it)
            if len(block) < BLOCK:
                raise self._corrupt(offset, "the stream ends inside a header")
            self._count_header(BLOCK)
            self._check_sum(block, offset)
            kind = block[156:157]
            size = self._number(block[124:136], offset, "size")
            if kind in (b"x", b"g", b"L", b"K"):
                data = self._extended_data(size, offset)
                if kind == b"x":
                    self._pax(data, offset, extended)
                elif kind == b"L":
                    extended.path = _text(_cstring(data))
                elif kind == b"K":
                    extended.linkpath = _text(_cstring(data))
                continue  # a global header ('g') changes nothing here, as in archive/tar
            self.stats.members += 1
            if self.stats.members > self.limits.members:
                raise ContentsError(
                    f"{self.what}: more than {self.limits.members} members (the limit "
                    "for one layer)"
                )
            if kind == b"S" and block[482]:  # old GNU sparse: more sparse maps follow
                self._sparse_maps(offset)
            member = self._member(block, kind, size, offset, extended)
            extended = _Extended()
            self._current = MemberData(self, member.size)
            self._padding = -member.size % BLOCK
            yield member, self._current

    def _check_sum(self, block: bytes, offset: int) -> None:
        stated = self._number(block[148:156], offset, "checksum")
        unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
        high = sum(1 for b in block[:148] + block[156:] if b > 127)
        signed = unsigned - 256 * high  # old tars summed the bytes as signed chars
        if stated not in (unsigned, signed):
            raise self._corrupt(offset, "bad checksum")

    def _sparse_maps(self, offset: int) -> None:
        while True:
            block = self._take(BLOCK)
            if len(block) < BLOCK:
                raise self._corrupt(offset, "the stream ends inside a sparse map")
            self._count_header(BLOCK)
            if not block[504]:
                return

    def _member(
        self, block: bytes, kind: bytes, size: int, offset: int, extended: _Extended
    ) -> Member:
        name = _cstring(block[0:100])
        if block[257:263] == b"ustar\0":  # POSIX: a prefix field (GNU uses the bytes otherwise)
            prefix = _cstring(block[345:500])
            if prefix:
                name = prefix + b"/" + name
        text = extended.path if extended.path is not None else _text(name)
        link = extended.linkpath
        linkname = link if link is not None else _text(_cstring(block[157:257]))
        if extended.size is not None:
            size = extended.size
        if kind in _HEADER_ONLY:
            size = 0
        member_kind = _KINDS.get(kind, OTHER)
        if member_kind == FILE and text.endswith("/"):
            member_kind = DIRECTORY  # pre-POSIX archives mark directories so
        if member_kind == DIRECTORY:
            text = text.rstrip("/") or text
        if "GNU.sparse.major" in extended.fields or "GNU.sparse.map" in extended.fields:
            member_kind = OTHER  # its data is a sparse map and fragments, not the file
        if size > self.limits.tar_bytes:
            raise ContentsError(
                f"{self.what}: a member of {size} bytes at {offset}, more than the "
                f"{self.limits.tar_bytes} bytes of tar read from one layer"
            )
        return Member(text, member_kind, size, linkname, offset)
