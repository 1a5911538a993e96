"""Crafted binaries for the parser tests and the fuzz corpus: minimal ELF64 files with the
sections asked for, CUDA fatbins and clang offload bundles, laid out as the parsers'
docstrings (and the real files those were checked against) describe them."""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from pathlib import Path

from docker_variant.contents.offload import BUNDLE_MAGIC

FATBIN_MAGIC = 0xBA55ED50
EM_X86_64 = 62
SHT_PROGBITS, SHT_STRTAB = 1, 3
ZEROS_MEMBER = 1 << 30


def fatbin(entries: list[tuple[int, int]], payload: int = 16) -> bytes:
    """One fatbin of ``(kind, sm)`` entries (kind 1 PTX, 2 cubin), each with a 64-byte entry
    header and ``payload`` bytes of code."""
    body = b""
    for kind, sm in entries:
        header = struct.pack("<HHIQ", kind, 0x0101, 64, payload)
        header += b"\0" * (28 - len(header)) + struct.pack("<I", sm)
        header += b"\0" * (40 - len(header)) + struct.pack("<Q", 0)
        header = header.ljust(64, b"\0")
        body += header + b"\xcc" * payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def bundle(ids: list[bytes], code: int = 16) -> bytes:
    """One uncompressed offload bundle with an entry per id, ``code`` bytes each."""
    table_end = len(BUNDLE_MAGIC) + 8 + sum(24 + len(i) for i in ids)
    table, at = b"", table_end
    for bundle_id in ids:
        table += struct.pack("<QQQ", at, code, len(bundle_id)) + bundle_id
        at += code
    return BUNDLE_MAGIC + struct.pack("<Q", len(ids)) + table + b"\0" * code * len(ids)


def elf64(
    sections: list[tuple[str, int, int]],
    data: bytes,
    *,
    machine: int = EM_X86_64,
) -> bytes:
    """An ELF64 little-endian file: ``data`` at offset 64, then the section name table, then
    the section headers: a null section, ``.shstrtab`` and one per ``(name, offset, size)``
    (offsets relative to ``data``)."""
    names = b"\0.shstrtab\0"
    name_at: dict[str, int] = {".shstrtab": 1}
    for name, _, _ in sections:
        if name not in name_at:
            name_at[name] = len(names)
            names += name.encode() + b"\0"
    strtab_at = 64 + len(data)
    shoff = (strtab_at + len(names) + 7) // 8 * 8
    shnum = 2 + len(sections)
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    big = shnum >= 0xFF00  # the count goes into section 0's size, e_shnum is 0
    header += struct.pack(
        "<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 0 if big else shnum, 1
    )
    out = io.BytesIO()
    out.write(header)
    out.write(data)
    out.write(names)
    out.write(b"\0" * (shoff - out.tell()))

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    out.write(section(0, 0, 0, shnum if big else 0))
    out.write(section(1, SHT_STRTAB, strtab_at, len(names)))
    for name, offset, size in sections:
        out.write(section(name_at[name], SHT_PROGBITS, 64 + offset, size))
    return out.getvalue()


class CountingStream(io.BytesIO):
    """A BytesIO that counts its reads and the bytes they returned: the parsers' work."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0
        self.bytes = 0

    def read(self, size: int | None = -1, /) -> bytes:
        data = super().read(size)
        self.reads += 1
        self.bytes += len(data)
        return data


def gzip_of_zeros(path: Path, size: int = ZEROS_MEMBER) -> Path:
    """A one-member layer, ``data/zeros`` of ``size`` zero bytes, as ONE gzip stream of about
    ``size / 1000`` bytes: deflate blocks ended by a full flush repeat byte for byte, so the
    stream is written without compressing ``size`` bytes."""
    info = tarfile.TarInfo("data/zeros")
    info.size = size
    header = info.tobuf()
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    mib = b"\0" * (1 << 20)
    first = deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    again = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    assert block == again  # what makes the repetition valid deflate
    end = b"\0" * 1024
    crc = zlib.crc32(header)
    for _ in range(size >> 20):
        crc = zlib.crc32(mib, crc)
    crc = zlib.crc32(end, crc)
    total = len(header) + size + len(end)
    with path.open("wb") as out:
        out.write(b"\x1f\x8b\x08\x00\0\0\0\0\x00\x03")  # gzip header, no name, Unix
        out.write(first)
        for _ in range(size >> 20):
            out.write(block)
        out.write(deflate.compress(end) + deflate.flush())
        out.write(struct.pack("<II", crc, total & 0xFFFFFFFF))
    return path


#: A tar member to write: bytes a file, str a symlink target, None a directory.
Member = tuple[str, "bytes | str | None"]


def add_members(archive: tarfile.TarFile, entries: list[Member]) -> None:
    """Write ``(name, content)`` members into ``archive``."""
    for name, content in entries:
        info = tarfile.TarInfo(name)
        if content is None:
            info.type = tarfile.DIRTYPE
            archive.addfile(info)
        elif isinstance(content, str):
            info.type, info.linkname = tarfile.SYMTYPE, content
            archive.addfile(info)
        else:
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
