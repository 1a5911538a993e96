"""The tar reader against tarfile on archives hypothesis writes with tarfile itself: every
format (ustar, GNU, pax), long and non-ASCII names, every member type, data of any size,
gzip or plain. What the reader yields (name, kind, size, link target, data) is what tarfile
reads back; only the end-of-archive padding may be missing."""

from __future__ import annotations

import io
import tarfile
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from docker_variant.contents.tarstream import open_layer

PART = st.text(alphabet="abcé_.-0123456789", min_size=1, max_size=40).filter(
    lambda p: p not in (".", "..")
)
NAME = st.lists(PART, min_size=1, max_size=8).map("/".join)
KIND = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                        tarfile.FIFOTYPE])  # fmt: skip
MEMBER = st.tuples(NAME, KIND, st.binary(max_size=1500), NAME)
FORMAT = st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])


def _write(members: list[tuple[str, bytes, bytes, str]], form: int) -> bytes | None:
    buffer = io.BytesIO()
    try:
        with tarfile.open(fileobj=buffer, mode="w", format=form) as archive:
            for name, kind, data, link in members:
                info = tarfile.TarInfo(name)
                info.type = kind
                if kind == tarfile.REGTYPE:
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
                else:
                    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                        info.linkname = link
                    archive.addfile(info)
    except ValueError:  # a name ustar cannot hold
        return None
    return buffer.getvalue()


def _kind(info: tarfile.TarInfo) -> str:
    if info.isfile():
        return "file"
    if info.isdir():
        return "directory"
    if info.issym():
        return "symlink"
    return "hardlink" if info.islnk() else "other"


@settings(max_examples=300, deadline=None)
@given(members=st.lists(MEMBER, max_size=12), form=FORMAT, gz=st.booleans(),
       cut=st.booleans())  # fmt: skip
def test_the_reader_reads_what_tarfile_wrote(
    members: list[tuple[str, bytes, bytes, str]], form: int, gz: bool, cut: bool
) -> None:
    data = _write(members, form)
    if data is None:
        return
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        theirs = []
        end = 0
        for info in archive:
            handle = archive.extractfile(info) if info.isfile() else None
            content = handle.read() if handle else b""
            size = info.size if info.isfile() else 0
            theirs.append((info.name, _kind(info), size, info.linkname, content))
            end = info.offset_data + size
    if cut:  # umoci 0.4: no end-of-archive blocks, no padding after the last data
        data = data[:end]
    layer = zlib.compress(data, 1, wbits=31) if gz else data
    stream = open_layer(io.BytesIO(layer), "t")
    ours = [(m.name, m.kind, m.size, m.linkname, d.read()) for m, d in stream]
    assert ours == theirs
