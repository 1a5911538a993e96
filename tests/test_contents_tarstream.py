"""The bounded tar reader (``contents/tarstream.py``) under hostile layers: a gzip bomb read in
a fixed window (peak RSS of a child process), 100,000 empty members read in linear work or
refused by the member budget, streams cut short, and the tar formats real layers use, read
as tarfile reads them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from crafted import ZEROS_MEMBER, add_members, gzip_of_zeros
from docker_variant.contents.tarstream import (
    CHUNK,
    ContentsError,
    TarLimits,
    open_tar,
)
from docker_variant.contents.walker import merge_layers, scan_layer

CHILD = """
import json, sys
from pathlib import Path
from docker_variant.contents.walker import scan_layer
with open(sys.argv[1], "rb") as stream:
    scan = scan_layer(stream, "bomb", Path(sys.argv[2]))
status = Path("/proc/self/status").read_text()
hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
print(json.dumps({"hwm_kib": hwm, "tar_bytes": scan.tar.tar_bytes, "steps": scan.tar.steps,
                  "copied": scan.tar.copied, "entries": sorted(scan.entries)}))
"""


def test_a_gzip_bomb_is_read_in_a_fixed_window(tmp_path: Path) -> None:
    """1 MB of gzip, 1 GiB of zeros: a child process streams it whole with its peak RSS
    (VmHWM) under 96 MiB, in linear work (inflate steps of at most CHUNK bytes)."""
    bomb = gzip_of_zeros(tmp_path / "bomb.tar.gz")
    assert bomb.stat().st_size < 2 << 20
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(bomb), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result = json.loads(done.stdout)
    assert result["entries"] == ["/data/zeros"]
    assert result["tar_bytes"] >= ZEROS_MEMBER  # streamed to its end, not given up on
    assert result["hwm_kib"] < 96 << 10, f"peak RSS {result['hwm_kib'] >> 10} MiB"
    # each step inflates up to CHUNK bytes: about tar_bytes / CHUNK steps, never per byte
    assert result["steps"] <= 2 * result["tar_bytes"] // CHUNK + 64
    assert result["copied"] <= result["tar_bytes"]


def test_the_decompressed_size_is_capped(tmp_path: Path) -> None:
    bomb = gzip_of_zeros(tmp_path / "bomb.tar.gz", 64 << 20)
    with bomb.open("rb") as stream, pytest.raises(ContentsError) as caught:
        scan_layer(stream, "sha256:bomb", limits=TarLimits(tar_bytes=16 << 20))
    assert str(caught.value) == (
        f"layer sha256:bomb: a member of {64 << 20} bytes at 0, more than the {16 << 20} "
        "bytes of tar read from one layer"
    )
    assert caught.value.exit_code == 2
    many = _empty_members(5_000)  # 2.5 MB of tar headers
    with pytest.raises(ContentsError) as caught:
        scan_layer(io.BytesIO(many), "sha256:many", limits=TarLimits(tar_bytes=1 << 20))
    assert str(caught.value) == (
        f"layer sha256:many: more than {1 << 20} bytes of tar once decompressed "
        "(the limit for one layer)"
    )


def _empty_members(count: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
        for i in range(count):
            archive.addfile(tarfile.TarInfo(f"d/{i}"))
    return buffer.getvalue()


def test_100000_empty_members_take_linear_work_or_the_member_budget() -> None:
    layer = _empty_members(100_000)
    scan = scan_layer(io.BytesIO(layer), "many")
    assert len(scan.entries) == 100_000
    stats = scan.tar
    assert stats.members == 100_000
    assert stats.header_bytes == 100_000 * 512
    # each header is sliced out of the window once: bytes copied stay at the tar's size
    # (tarfile's stream mode copied its 1 MiB buffer for each: 100,000 MiB)
    assert stats.copied <= stats.tar_bytes
    assert stats.steps <= 2 * stats.tar_bytes // CHUNK + len(layer) // CHUNK + 64
    with pytest.raises(ContentsError) as caught:
        scan_layer(io.BytesIO(layer), "many", limits=TarLimits(members=10_000))
    assert str(caught.value) == "layer many: more than 10000 members (the limit for one layer)"


def test_a_gzip_cut_in_half_is_one_clear_error() -> None:
    whole = _empty_members(2_000)
    for cut in (whole[: len(whole) // 2], whole[:20], whole[: len(whole) - 200]):
        with pytest.raises(ContentsError) as caught:
            scan_layer(io.BytesIO(cut), "sha256:cut")
        assert str(caught.value).startswith("layer sha256:cut: corrupt or truncated gzip stream")
        assert "\n" not in str(caught.value)


def test_a_corrupt_gzip_and_a_bad_header_checksum_are_errors() -> None:
    whole = bytearray(_empty_members(50))
    whole[40] ^= 0xFF
    with pytest.raises(ContentsError, match="corrupt or truncated gzip stream"):
        scan_layer(io.BytesIO(bytes(whole)), "x")
    plain = bytearray(tarfile.TarInfo("a").tobuf() + tarfile.TarInfo("b").tobuf())
    plain[512 + 3] ^= 0x01  # a bit of the second header's name
    with pytest.raises(ContentsError) as caught:
        scan_layer(io.BytesIO(bytes(plain)), "x")
    assert str(caught.value) == (
        "layer x: corrupt or truncated tar stream (header at 512: bad checksum)"
    )


def test_extended_headers_are_bounded() -> None:
    info = tarfile.TarInfo("a/" + "n" * 3000)
    long_name = info.tobuf(tarfile.PAX_FORMAT) + b"\0" * 1024
    assert scan_layer(io.BytesIO(long_name), "x").entries == {"/a/" + "n" * 3000}
    too_long = tarfile.TarInfo("a/" + "n" * 5000).tobuf(tarfile.PAX_FORMAT) + b"\0" * 1024
    scan = scan_layer(io.BytesIO(too_long), "x")
    assert scan.entries == set()
    assert scan.warnings == [
        f"layer x: skipped member {'a/' + 'n' * 78!r}...: a name or link target longer "
        "than 4096 bytes"
    ]
    with pytest.raises(ContentsError, match=r"an extended tar header of \d+ bytes at 0"):
        scan_layer(io.BytesIO(long_name), "x", limits=TarLimits(extended=1024))
    gnu = tarfile.TarInfo("g/" + "m" * 3000).tobuf(tarfile.GNU_FORMAT) * 40 + b"\0" * 1024
    with pytest.raises(ContentsError, match="more than 65536 bytes of tar headers"):
        scan_layer(io.BytesIO(gnu), "x", limits=TarLimits(header_bytes=64 << 10))


def test_concatenated_gzip_members_are_one_stream() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("usr/a", "usr/b"):
            info = tarfile.TarInfo(name)
            info.size = 3
            archive.addfile(info, io.BytesIO(b"abc"))
    raw = buffer.getvalue()
    halves = zlib.compress(raw[:1024], wbits=31) + zlib.compress(raw[1024:], wbits=31)
    assert scan_layer(io.BytesIO(halves), "x").entries == {"/usr/a", "/usr/b"}


TAR_FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]


@pytest.mark.parametrize("form", TAR_FORMATS, ids=["ustar", "gnu", "pax"])
def test_members_as_tarfile_reads_them(form: int) -> None:
    deep = "usr/lib/" + "/".join(["python3.11-site-packages-long-directory"] * 4)
    entries: list[tuple[str, bytes | str | None]] = [
        ("usr/lib", None),
        (f"{deep}/libcudart.so.12", b"\x7fELF-ish contents" * 40),
        (f"{deep}/link", "libcudart.so.12"),
        (f"{deep}/.wh..wh..opq", b""),
        ("etc/é-utf8", b"x"),
    ]
    target = f"{deep}/libcudart.so.12"  # a link name over 100 bytes: GNU and pax only
    if form == tarfile.USTAR_FORMAT:
        entries = [(n, c) for n, c in entries if n.isascii()]
        target = "usr/lib/short"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=form) as archive:
        add_members(archive, entries)
        hard = tarfile.TarInfo("usr/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, target
        archive.addfile(hard)
    data = buffer.getvalue()
    ours = [
        (m.name, m.kind, m.size, m.linkname, d.read()) for m, d in open_tar(io.BytesIO(data), "t")
    ]
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        theirs = []
        for info in archive:
            handle = archive.extractfile(info) if info.isfile() else None
            kind = {tarfile.DIRTYPE: "directory", tarfile.SYMTYPE: "symlink"}.get(info.type)
            kind = kind or ("hardlink" if info.islnk() else "file")
            content = handle.read() if handle else b""
            theirs.append(
                (info.name, kind, info.size if info.isfile() else 0, info.linkname, content)
            )
    assert ours == theirs
    scan = scan_layer(io.BytesIO(data), "t")
    assert scan.opaque == {"/" + deep}
    assert scan.symlinks == {f"/{deep}/link": f"/{deep}/libcudart.so.12"}
    assert scan.hardlinks == {"/usr/hard": f"/{target}"}


def test_pax_size_overrides_the_header_and_links_carry_no_data() -> None:
    """A pax ``size`` record is the size (tar writes it for files over 8 GiB); a hard link
    whose header states a size has no data after it (archive/tar reads it so)."""
    info = tarfile.TarInfo("big")
    info.size = 5
    info.pax_headers = {"size": "5"}
    pax = bytearray(info.tobuf(tarfile.PAX_FORMAT))
    ustar = pax[-512:]
    ustar[124:136] = b"00000000000\0"  # the ustar field says 0; the pax record says 5
    ustar[148:156] = b"        "
    ustar[148:156] = b"%06o\0 " % sum(ustar)
    link = tarfile.TarInfo("hard")
    link.type, link.linkname, link.size = tarfile.LNKTYPE, "big", 0
    link_block = bytearray(link.tobuf())
    link_block[124:136] = b"00000001000\0"  # 512 bytes said; none follow
    link_block[148:156] = b"        "
    link_block[148:156] = b"%06o\0 " % sum(link_block)
    after = tarfile.TarInfo("after").tobuf()
    data = bytes(pax[:-512] + ustar) + b"hello".ljust(512, b"\0") + bytes(link_block) + after
    members = [
        (m.name, m.size, d.read()) for m, d in open_tar(io.BytesIO(data + b"\0" * 1024), "t")
    ]
    assert members == [("big", 5, b"hello"), ("hard", 0, b""), ("after", 0, b"")]


def test_an_empty_blob_and_an_empty_archive_are_empty_layers() -> None:
    for data in (b"", b"\0" * 1024, zlib.compress(b"\0" * 1024, wbits=31)):
        scan = scan_layer(io.BytesIO(data), "empty")
        assert scan.entries == set() and scan.findings == {}
    assert merge_layers([scan_layer(io.BytesIO(b""), "e")]).findings == ()


def test_a_checksum_summed_as_signed_bytes_is_accepted() -> None:
    """Old tars summed the header as signed chars: a byte over 127 counts negative."""
    block = bytearray(tarfile.TarInfo("placeholder").tobuf(tarfile.USTAR_FORMAT))
    block[0:100] = b"caf\xe9".ljust(100, b"\0")  # latin-1, not UTF-8
    block[148:156] = b" " * 8
    signed = sum(b - 256 if b > 127 else b for b in block)
    block[148:156] = b"%06o\0 " % signed
    ((member, _),) = list(open_tar(io.BytesIO(bytes(block) + b"\0" * 1024), "t"))
    assert member.name == "caf\\xe9"  # not UTF-8: shown escaped, still one distinct name


def test_a_full_temp_disk_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    from docker_variant.errors import DockerVariantError

    def full(self: object, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile.SpooledTemporaryFile, "write", full)
    elf = b"\x7fELF" + b"\0" * 60
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("usr/lib/libx.so")
        info.size = len(elf)
        archive.addfile(info, io.BytesIO(elf))
    with pytest.raises(DockerVariantError) as caught:
        scan_layer(io.BytesIO(buffer.getvalue()), "x")
    assert str(caught.value) == (
        "cannot copy /usr/lib/libx.so (64 bytes) to a temp file: No space left on device "
        "(TMPDIR names where it goes)"
    )
