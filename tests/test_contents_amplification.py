"""The ELF, fatbin and offload-bundle parsers read each byte range once: crafted ELF files
whose section headers all point at the same fatbin, and ``.hip_fatbin`` sections of many
empty bundles, cost reads in proportion to the file, counted by the stream they read."""

from __future__ import annotations

import pytest

from crafted import CountingStream, bundle, elf64, fatbin
from docker_variant.contents.elf import ElfError, read_elf
from docker_variant.contents.evidence import FATBIN, OFFLOAD, elf_findings
from docker_variant.contents.fatbin import FatbinError, read_fatbins
from docker_variant.contents.offload import OffloadError, read_bundles


def _findings(data: bytes) -> tuple[list[tuple[str, str]], CountingStream]:
    stream = CountingStream(data)
    found = elf_findings(stream, read_elf(stream, len(data)), "/lib/x.so")
    return [(f.kind, f.value) for f in found], stream


@pytest.mark.parametrize("headers", [200, 65_533])
def test_fatbin_section_headers_at_the_same_bytes_are_read_once(headers: int) -> None:
    """The issue's layer: 200 headers took 18.9 s (each walked the fatbin again); 65,533
    would have taken hours. Now the file is read about once, whatever the count."""
    code = fatbin([(2, sm) for sm in (50, 60, 70, 75, 80, 86, 89, 90)] * 8)
    data = elf64([(".nv_fatbin", 0, len(code))] * headers, code)
    found, stream = _findings(data)
    assert (FATBIN, "1 fatbins: cubin sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_89, sm_90; "
            "PTX (none)") in found  # fmt: skip
    assert stream.bytes <= 2 * len(data) + 4096
    # the ELF header, the section table in one read, the name table, then the fatbin's
    # header and its 64 entries once (each header walked again: 65 reads per header)
    assert stream.reads <= 6 + 65


def test_fatbin_sections_that_partly_overlap_are_refused() -> None:
    code = fatbin([(2, 90)] * 4)
    data = elf64([(".nv_fatbin", 0, len(code)), (".nv_fatbin", 16, len(code) - 16)], code)
    stream = CountingStream(data)
    with pytest.raises(FatbinError, match="overlap"):
        elf_findings(stream, read_elf(stream, len(data)), "/lib/x.so")
    # two fatbin sections side by side (a relocatable object may have them) are both read
    two = code + fatbin([(1, 120)])
    both = elf64(
        [(".nv_fatbin", 0, len(code)), (".nv_fatbin", len(code), len(two) - len(code))], two
    )
    found, _ = _findings(both)
    assert (FATBIN, "2 fatbins: cubin sm_90; PTX compute_120") in found


def test_zero_padding_between_fatbins_costs_reads_in_proportion() -> None:
    one = fatbin([(2, 80)])
    section = (one + b"\0" * 8) * 2_000
    stream = CountingStream(section)
    summary = read_fatbins(stream, 0, len(section))
    assert summary.fatbins == 2_000
    assert stream.bytes <= 3 * len(section)  # was a 4 KiB read per padding run


def test_many_empty_offload_bundles_are_one_pass() -> None:
    """100,000 empty bundles back to back: each search used to read 1 MiB (100 GiB in all);
    now the section is read about once."""
    empty = bundle([])
    section = empty * 100_000
    stream = CountingStream(section)
    summary = read_bundles(stream, 0, len(section))
    assert summary.bundles == 100_000
    assert stream.bytes <= 2 * len(section) + (1 << 20)
    with_target = empty * 10 + bundle([b"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"]) + empty
    data = elf64([(".hip_fatbin", 0, len(with_target))], with_target)
    found, _ = _findings(data)
    assert (OFFLOAD, "gfx90a") in found


def test_a_bundle_table_is_never_read_as_the_next_bundle() -> None:
    """A table holding the magic in an id: the search goes on after the table."""
    ids = [b"hipv4-amdgcn-amd-amdhsa--gfx942", b"x" + bundle([])]
    data = bundle(ids)
    assert read_bundles(CountingStream(data), 0, len(data)).bundles == 1
    cut = data[:40]
    with pytest.raises(OffloadError, match="cut short"):
        read_bundles(CountingStream(cut), 0, len(cut))


def test_section_names_without_an_end_and_absurd_headers_are_bounded() -> None:
    """A name table with no NUL: each lookup is bounded, not a scan to its end per section."""
    data = bytearray(elf64([(".nv_fatbin", 0, 0)] * 1000, b""))
    strtab_at = 64
    data[strtab_at : strtab_at + 22] = b"x" * 22  # no terminator anywhere in the table
    stream = CountingStream(bytes(data))
    elf = read_elf(stream, len(data))
    assert len(elf.sections) == 1002 and all(s.name == "" for s in elf.sections)
    bad = bytearray(data)
    bad[58:60] = (4096).to_bytes(2, "little")  # e_shentsize
    with pytest.raises(ElfError, match="section header size 4096"):
        read_elf(CountingStream(bytes(bad)), len(bad))
