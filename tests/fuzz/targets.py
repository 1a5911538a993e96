"""Fuzz targets: each takes arbitrary bytes and feeds them to one reader of untrusted input.

The property, for every target but ``route`` and ``headers``: the reader returns (findings, a document) or
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
from docker_variant.providers import amd
from docker_variant.providers.descriptors import MAX_DESCRIPTOR_BYTES, apply_descriptors
from docker_variant.providers.hostroot import HostRoot
from docker_variant.providers.pci import read_pci_devices
from docker_variant.proxy.names import PathError, RouteKind, parse_v2_path
from docker_variant.proxy.passthrough import forwarded_headers
from docker_variant.publish.matrix import parse_matrix
from docker_variant.tomldoc import load_toml
from docker_variant.variant.index import VariantIndex
from docker_variant.vendors import builtin_namespaces
from docker_variant.vendors.descriptor import parse_descriptor

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


def descriptor(data: bytes) -> None:
    """A device descriptor file as ``providers.descriptors`` reads one (bounded, UTF-8,
    depth first), then matched against a host root with one PCI device."""
    with contextlib.suppress(DockerVariantError):
        document = load_toml(data, "fuzz descriptor", max_bytes=MAX_DESCRIPTOR_BYTES)
        described = parse_descriptor(document, "fuzz descriptor", builtin_namespaces())
        apply_descriptors([described], _host_root())


_ROOT: list[HostRoot] = []
_FILES = (  # where the sysfs target writes its input: each a file a provider reads
    f"{amd.TOPOLOGY}/1/properties",
    "sys/bus/pci/devices/0000:17:00.0/vendor",
    "sys/bus/pci/devices/0000:17:00.0/device",
    "sys/module/amdgpu/version",
    "opt/rocm/.info/version",
)


def _host_root() -> HostRoot:
    """One host root for the run: a KFD GPU node and a PCI device, as the fixtures have."""
    if not _ROOT:
        root = Path(tempfile.mkdtemp(prefix="fuzz-hostroot-"))
        for relative in _FILES:
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_bytes(b"0x1ed2\n")
        _ROOT.append(HostRoot(root))
    return _ROOT[0]


def sysfs(data: bytes) -> None:
    """Any bytes where a host-root file should be (KFD ``properties``, PCI ``vendor`` and
    ``device``, the driver's and ROCm's ``version``): the AMD provider and the PCI reader
    answer (an empty namespace at worst) or raise the package's own error."""
    root = _host_root()
    for relative in _FILES:
        root.path(relative).write_bytes(data)
    with contextlib.suppress(DockerVariantError):
        amd.detect(root, {})
    read_pci_devices(root)


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
    "descriptor": descriptor,
    "sysfs": sysfs,
}
CORPUS = Path(__file__).resolve().parent / "corpus"
