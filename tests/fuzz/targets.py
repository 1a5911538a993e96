"""Fuzz targets: each takes arbitrary bytes and feeds them to one reader of untrusted input.

The property, for every target but ``head``: the reader returns (findings, a document) or
raises the package's own error (a ``DockerVariantError``), never anything else, and stays
within an operation budget counted in code (bytes and reads of the stream it parses, the tar
reader's own counters). A target raises ``AssertionError`` (the budget) or lets the stray
exception through: both are crashes to the fuzzer and failures to pytest. ``route``'s: the
proxy's path parser gives a route or its own ``PathError``, and a route's upstream path
parses back to the same route.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

from crafted import CountingStream
from docker_variant.contents.elf import read_elf
from docker_variant.contents.evidence import elf_findings
from docker_variant.contents.fatbin import read_fatbins
from docker_variant.contents.offload import read_bundles
from docker_variant.contents.tarstream import CHUNK, TarLimits
from docker_variant.contents.walker import merge_layers, scan_layer
from docker_variant.errors import DockerVariantError
from docker_variant.jsondoc import load_json
from docker_variant.oci.reference import parse_reference
from docker_variant.proxy.names import PathError, RouteKind, parse_v2_path
from docker_variant.proxy.passthrough import forwarded_headers
from docker_variant.publish.matrix import parse_matrix
from docker_variant.variant.index import VariantIndex

Target = Callable[[bytes], None]
MAX_LEN = 1 << 14  # inputs the runner generates (seeds may be larger)
_SPOOL = Path(tempfile.gettempdir())
# a small tar budget, so that a fuzzed size field cannot make one input run for minutes
_LIMITS = TarLimits(tar_bytes=64 << 20)


def _stream_budget(stream: CountingStream, data: bytes) -> None:
    """A parser of seekable bytes reads each range about once: at most 16 times the input
    in bytes (entry headers overlap, padding is read in 64-byte steps) and a read per 4
    bytes."""
    assert stream.bytes <= 16 * len(data) + (64 << 10), (stream.bytes, len(data))
    assert stream.reads <= len(data) // 4 + 256, (stream.reads, len(data))


def elf(data: bytes) -> None:
    stream = CountingStream(data)
    try:
        parsed = read_elf(stream, len(data))
        elf_findings(stream, parsed, "/fuzz/lib.so")
    except DockerVariantError:
        pass
    _stream_budget(stream, data)


def fatbin(data: bytes) -> None:
    stream = CountingStream(data)
    with contextlib.suppress(DockerVariantError):
        read_fatbins(stream, 0, len(data))
    _stream_budget(stream, data)


def offload(data: bytes) -> None:
    stream = CountingStream(data)
    with contextlib.suppress(DockerVariantError):
        read_bundles(stream, 0, len(data))
    _stream_budget(stream, data)


def _scan(data: bytes) -> None:
    try:
        scan = scan_layer(io.BytesIO(data), "fuzz", _SPOOL, limits=_LIMITS)
    except DockerVariantError:
        return
    merge_layers([scan, scan])
    stats = scan.tar
    assert stats.copied <= stats.tar_bytes, stats  # each tar byte sliced out once
    work = 4 * (stats.members + 1) + 4 * (stats.tar_bytes + len(data)) // CHUNK + 64
    assert stats.steps <= work, (stats, len(data))


def tar(data: bytes) -> None:
    """The layer as given (plain tar, gzip or neither), and the same bytes gzip-compressed,
    so that the tar parser is fuzzed behind the inflater too."""
    _scan(data)
    if data[:2] != b"\x1f\x8b":
        _scan(zlib.compress(data, 1, wbits=31))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def reference(data: bytes) -> None:
    with contextlib.suppress(DockerVariantError):
        parse_reference(_text(data))


def index(data: bytes) -> None:
    with contextlib.suppress(DockerVariantError):
        VariantIndex.from_json(load_json(data, "fuzz index"), "fuzz index")


def matrix(data: bytes) -> None:
    with contextlib.suppress(DockerVariantError):
        parse_matrix(_text(data), "fuzz matrix")


def route(data: bytes) -> None:
    """The proxy's route parser on any request target: a route or ``PathError``, and a
    route's upstream path names the same repository and reference again."""
    try:
        parsed = parse_v2_path(data.decode("latin-1"))
    except PathError:
        return
    if parsed.name is not None and parsed.kind not in (RouteKind.VARIANTS, RouteKind.DISCOVER):
        again = parse_v2_path(parsed.upstream_path())  # the proxy's own routes go nowhere
        assert (again.kind, again.name, again.reference) == (
            parsed.kind,
            parsed.name,
            parsed.reference,
        ), (parsed, again)


_HOP = {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host"}


def headers(data: bytes) -> None:
    """The proxy's choice of request headers to send upstream, over any request head (its
    header lines as a server hands them on, names in lower case): never a hop-by-hop one,
    nor one that ``Connection`` names, nor a ``Content-Length`` beside chunked framing."""
    fields = []
    for line in data.split(b"\n")[1:]:
        name, colon, value = line.rstrip(b"\r").partition(b":")
        if colon:
            fields.append((name.strip().lower(), value.strip()))
    kept = forwarded_headers(fields)
    names = {name for name, _ in kept}
    assert not names & _HOP, (names, data)
    named = {
        token.strip().lower()
        for name, value in fields
        if name == b"connection"
        for token in value.split(b",")
    }
    assert not names & named, (names, named)
    if any(name == b"transfer-encoding" for name, _ in fields):
        assert b"content-length" not in names, data


TARGETS: dict[str, Target] = {
    "elf": elf,
    "fatbin": fatbin,
    "offload": offload,
    "tar": tar,
    "reference": reference,
    "index": index,
    "matrix": matrix,
    "route": route,
    "headers": headers,
}
CORPUS = Path(__file__).resolve().parent / "corpus"
