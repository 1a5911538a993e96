"""ELF headers, section headers and GNU property notes, read from a seekable stream.

Only what inspection needs: the machine, the sections (by name, offset and size) and the
``.note.gnu.property`` properties. Nothing is read but headers and the sections asked for, so
a 2 GiB library costs a few kilobytes of reads. Every inconsistency (offsets beyond the end,
absurd counts) raises ``ElfError`` with a short reason; nothing else escapes. The work is
bounded by the headers' size: the section table is read in one piece and each section name
is looked up within ``_MAX_NAME`` bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import IO

from docker_variant.errors import InvalidInputError

__all__ = [
    "ELF_MAGIC",
    "EM_AARCH64",
    "EM_X86_64",
    "ElfError",
    "ElfFile",
    "Section",
    "gnu_properties",
    "read_elf",
]

ELF_MAGIC = b"\x7fELF"
EM_386 = 3
EM_X86_64 = 62
EM_AARCH64 = 183
EM_AMDGPU = 224
MACHINES = {EM_386: "i386", EM_X86_64: "x86-64", EM_AARCH64: "aarch64", EM_AMDGPU: "amdgpu"}

NT_GNU_PROPERTY_TYPE_0 = 5
_SHN_XINDEX = 0xFFFF
_MAX_SECTIONS = 1 << 16  # real objects have tens; a million is a corrupt count
_MAX_NAMES = 16 << 20
_MAX_NAME = 4096  # one section name; real ones are a few dozen bytes
_MAX_ENTRY = 1024  # section header size; 40 or 64 in real files
_MAX_NOTE = 1 << 20


class ElfError(InvalidInputError):
    """Not a readable ELF file; the message says what is wrong."""


@dataclass(frozen=True)
class Section:
    name: str
    kind: int  # sh_type
    offset: int
    size: int
    align: int


@dataclass(frozen=True)
class ElfFile:
    is64: bool
    little: bool
    machine: int
    size: int
    sections: tuple[Section, ...]

    @property
    def machine_name(self) -> str:
        return MACHINES.get(self.machine, f"machine {self.machine}")

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)


def _read_at(stream: IO[bytes], offset: int, size: int, file_size: int, what: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ElfError(f"{what} at {offset}+{size} lies beyond the end of the file ({file_size})")
    stream.seek(offset)
    data = stream.read(size)
    if len(data) != size:
        raise ElfError(f"{what}: short read")
    return data


def read_elf(stream: IO[bytes], file_size: int) -> ElfFile:
    """The ELF header and section table of ``stream`` (``file_size`` bytes, seekable)."""
    ident = _read_at(stream, 0, 16, file_size, "ELF identification")
    if ident[:4] != ELF_MAGIC:
        raise ElfError("no ELF magic")
    if ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ElfError(f"unknown ELF class {ident[4]} or byte order {ident[5]}")
    is64, little = ident[4] == 2, ident[5] == 1
    end = "<" if little else ">"
    if is64:
        header = _read_at(stream, 0, 64, file_size, "ELF header")
        machine = struct.unpack_from(end + "H", header, 18)[0]
        shoff = struct.unpack_from(end + "Q", header, 40)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", header, 58)
        entry, minimum = end + "IIQQQQIIQQ", 64
    else:
        header = _read_at(stream, 0, 52, file_size, "ELF header")
        machine = struct.unpack_from(end + "H", header, 18)[0]
        shoff = struct.unpack_from(end + "I", header, 32)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", header, 46)
        entry, minimum = end + "IIIIIIIIII", 40
    if shoff == 0:
        return ElfFile(is64, little, machine, file_size, ())
    if not minimum <= shentsize <= _MAX_ENTRY:
        raise ElfError(f"section header size {shentsize} is not {minimum} to {_MAX_ENTRY}")
    first = struct.unpack(entry, _read_at(stream, shoff, minimum, file_size, "section header 0"))
    if shnum == 0:  # more than 0xff00 sections: the count is in section 0
        shnum = first[5]
    if shstrndx == _SHN_XINDEX:
        shstrndx = first[6]
    if shnum > _MAX_SECTIONS:
        raise ElfError(f"{shnum} sections is not a plausible count")
    table_size = (shnum - 1) * shentsize + minimum if shnum else 0
    table = _read_at(stream, shoff, table_size, file_size, "section header table")
    raw_headers: list[tuple[int, ...]] = [
        struct.unpack_from(entry, table, i * shentsize) for i in range(shnum)
    ]
    names = b""
    if 0 < shstrndx < shnum:
        strtab = raw_headers[shstrndx]
        if strtab[5] > _MAX_NAMES:
            raise ElfError(f"section name table of {strtab[5]} bytes")
        names = _read_at(stream, strtab[4], strtab[5], file_size, "section name table")
    sections = []
    for fields in raw_headers:
        name_offset, kind, offset, size, align = (
            fields[0],
            fields[1],
            fields[4],
            fields[5],
            fields[8],
        )
        end_of_name = names.find(b"\0", name_offset, name_offset + _MAX_NAME)
        name = names[name_offset:end_of_name].decode("latin-1") if end_of_name >= 0 else ""
        if kind != 8 and offset + size > file_size:  # 8 = SHT_NOBITS occupies no file space
            raise ElfError(f"section {name or '?'} ends beyond the end of the file")
        sections.append(Section(name, kind, offset, size, align))
    return ElfFile(is64, little, machine, file_size, tuple(sections))


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def gnu_properties(stream: IO[bytes], elf: ElfFile) -> dict[int, int]:
    """``{pr_type: value}`` of the ``NT_GNU_PROPERTY_TYPE_0`` notes in ``.note.gnu.property``
    (4-byte properties only: the x86 ISA and AArch64 feature words)."""
    section = elf.section(".note.gnu.property")
    if section is None or section.kind == 8:
        return {}
    if section.size > _MAX_NOTE:
        raise ElfError(f".note.gnu.property of {section.size} bytes")
    data = _read_at(stream, section.offset, section.size, elf.size, ".note.gnu.property")
    end = "<" if elf.little else ">"
    pad = 8 if elf.is64 else 4  # the gABI aligns this note's descriptor to the word size
    found: dict[int, int] = {}
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, note_type = struct.unpack_from(end + "III", data, pos)
        name_start = pos + 12
        desc_start = name_start + _align(namesz, 4)
        if desc_start + descsz > len(data):
            raise ElfError(".note.gnu.property: a note runs past the section")
        name = data[name_start : name_start + namesz]
        if note_type == NT_GNU_PROPERTY_TYPE_0 and name == b"GNU\0":
            desc = data[desc_start : desc_start + descsz]
            at = 0
            while at + 8 <= len(desc):
                pr_type, pr_size = struct.unpack_from(end + "II", desc, at)
                if at + 8 + pr_size > len(desc):
                    raise ElfError(".note.gnu.property: a property runs past its note")
                if pr_size == 4:
                    found[pr_type] = struct.unpack_from(end + "I", desc, at + 8)[0]
                at += 8 + _align(pr_size, pad)
        pos = desc_start + _align(descsz, pad)
    return found
