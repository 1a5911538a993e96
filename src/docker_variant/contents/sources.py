"""Where layers come from: a registry (the OCI client, streaming each blob) or the local
engine (``GET /images/{name}/get``, the ``docker save`` tar). Each layer is read once, as it
arrives, by the walker; a registry blob is parsed in a worker thread while the next chunks
download, with at most ``PIPE_LIMIT`` bytes between the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import tempfile
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from docker_variant.contents.evidence import env_finding
from docker_variant.contents.tarstream import TarLimits, open_tar
from docker_variant.contents.walker import (
    ContentsError,
    ImageContents,
    LayerScan,
    looks_like_layer,
    merge_layers,
    scan_layer,
)
from docker_variant.errors import InvalidInputError, MissingError, UnreachableError
from docker_variant.jsondoc import load_json

if TYPE_CHECKING:
    from docker_variant.docker.engine import Engine
    from docker_variant.oci.client import RegistryClient
    from docker_variant.variant.platform import Platform

__all__ = [
    "InspectedImage",
    "Meter",
    "inspect_local",
    "inspect_manifest",
    "inspect_registry",
    "spool_dir",
]

PIPE_LIMIT = 8 << 20
_MANIFEST_LIMIT = 4 << 20
# The engine's export is not compressed (no amplification): room for the largest images.
EXPORT_LIMITS = TarLimits(members=100_000, tar_bytes=1 << 40)


class Meter(Protocol):
    """Progress: the bytes to read (when known), then each chunk read."""

    def total(self, size: int | None) -> None: ...

    def advance(self, size: int) -> None: ...


class _NoMeter:
    def total(self, size: int | None) -> None:
        pass

    def advance(self, size: int) -> None:
        pass


@dataclass(frozen=True)
class InspectedImage:
    reference: str
    source: str  # "registry" or "engine"
    platform: str | None
    labels: dict[str, str]
    contents: ImageContents


@contextlib.contextmanager
def spool_dir() -> Iterator[Path]:
    """The only place inspection writes: a temp dir, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="docker-variant-inspect-") as name:
        yield Path(name)


def _platform_text(config: Mapping[str, Any]) -> str | None:
    os_name, arch = config.get("os") or config.get("Os"), config.get("architecture")
    arch = arch or config.get("Architecture")
    variant = config.get("variant") or config.get("Variant")
    if not isinstance(os_name, str) or not isinstance(arch, str):
        return None
    return f"{os_name}/{arch}" + (f"/{variant}" if isinstance(variant, str) and variant else "")


# --------------------------------------------------------------------------- registry


class _Pipe:
    """Chunks from the event loop to the walker's thread, at most ``limit`` bytes queued."""

    def __init__(self, limit: int = PIPE_LIMIT) -> None:
        self._chunks: deque[memoryview] = deque()
        self._size = 0
        self._limit = limit
        self._cond = threading.Condition()
        self._ended = False
        self._failed = False
        self._reader_gone = False

    def put(self, chunk: bytes, timeout: float) -> bool:
        """Queue ``chunk``; False if there was no room within ``timeout`` seconds."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: self._size < self._limit or self._reader_gone, timeout
            ):
                return False
            if not self._reader_gone:
                self._chunks.append(memoryview(chunk))
                self._size += len(chunk)
                self._cond.notify_all()
            return True

    def end(self, failed: bool = False) -> None:
        with self._cond:
            self._ended, self._failed = True, failed
            self._cond.notify_all()

    def reader_done(self) -> None:
        with self._cond:
            self._reader_gone = True
            self._chunks.clear()
            self._cond.notify_all()

    def read(self, size: int = -1, /) -> bytes:
        """At most ``size`` bytes (the next chunk or part of it); ``b""`` at the end."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._chunks) or self._ended)
            if not self._chunks:
                if self._failed:
                    raise UnreachableError("the download of this layer failed")
                return b""
            chunk = self._chunks[0]
            n = len(chunk) if size < 0 else min(size, len(chunk))
            data = bytes(chunk[:n])
            if n == len(chunk):
                self._chunks.popleft()
            else:
                self._chunks[0] = chunk[n:]
            self._size -= n
            self._cond.notify_all()
            return data


async def _scan_blob(
    client: RegistryClient,
    repository: str,
    digest: str,
    spool: Path,
    meter: Meter,
) -> LayerScan:
    pipe = _Pipe()
    loop = asyncio.get_running_loop()

    def walk() -> LayerScan:
        try:
            return scan_layer(pipe, digest, spool, meter.advance)
        finally:
            pipe.reader_done()

    scan = loop.run_in_executor(None, walk)
    try:
        async for chunk in client.stream_blob(repository, digest):
            if scan.done() and scan.exception() is not None:
                break  # the walker refused the layer: no point downloading the rest
            while not await loop.run_in_executor(None, pipe.put, chunk, 0.25):
                if scan.done():
                    break
        pipe.end()
    except BaseException:
        pipe.end(failed=True)
        with contextlib.suppress(Exception):
            await scan
        raise
    return await scan


async def inspect_manifest(
    client: RegistryClient,
    repository: str,
    manifest: Mapping[str, Any],
    config: Mapping[str, Any],
    spool: Path,
    meter: Meter | None = None,
    scanned: dict[str, LayerScan] | None = None,
) -> ImageContents:
    """The contents of an image manifest's layers, bottom to top. ``scanned`` keeps each
    layer's scan by digest, so that images sharing base layers read them once."""
    meter = meter or _NoMeter()
    layers = manifest.get("layers") or []
    digests: list[str] = []
    total = 0
    for layer in layers:
        digest = layer.get("digest") if isinstance(layer, dict) else None
        if not isinstance(digest, str):
            raise InvalidInputError(f"{repository}: a layer descriptor without a digest")
        digests.append(digest)
        size = layer.get("size")
        total += size if isinstance(size, int) else 0
    meter.total(total or None)
    scanned = {} if scanned is None else scanned
    scans = []
    for digest in digests:
        if digest not in scanned:
            scanned[digest] = await _scan_blob(client, repository, digest, spool, meter)
        scans.append(scanned[digest])
    env = (config.get("config") or {}).get("Env") if isinstance(config, dict) else None
    return merge_layers(scans).with_finding(env_finding(env if isinstance(env, list) else None))


def inspect_registry(
    ref_text: str, *, platform: Platform | None = None, meter: Meter | None = None
) -> InspectedImage:
    """Inspect ``registry/name:tag`` (or ``@digest``) where it is, without pulling it."""
    from docker_variant.oci.client import RegistryClient, config_labels
    from docker_variant.oci.reference import parse_reference

    reference = parse_reference(ref_text)
    target = reference.digest or reference.tag
    if target is None:
        raise InvalidInputError(f"{ref_text}: name a tag or a digest (registry/name:tag)")

    async def run() -> InspectedImage:
        kwargs: dict[str, Any] = {"platform": platform} if platform is not None else {}
        async with RegistryClient.for_registry(reference.registry, **kwargs) as client:
            manifest = await client.get_manifest(reference.repository, target)
            config = await client.get_config(reference.repository, manifest)
            labels = config_labels(config, f"config of {reference}")
            with spool_dir() as spool:
                contents = await inspect_manifest(
                    client, reference.repository, manifest.data, config, spool, meter
                )
        return InspectedImage(str(reference), "registry", _platform_text(config), labels, contents)

    return asyncio.run(run())


# --------------------------------------------------------------------------- engine


class _ChunkReader:
    """A file over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes], meter: Meter) -> None:
        self._chunks = chunks
        self._pending = memoryview(b"")
        self._meter = meter

    def read(self, size: int = -1, /) -> bytes:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._pending = memoryview(chunk)
            self._meter.advance(len(chunk))
        n = len(self._pending) if size < 0 else min(size, len(self._pending))
        data = bytes(self._pending[:n])
        self._pending = self._pending[n:]
        return data


def _outer_name(name: str) -> str:
    return posixpath.normpath(name.lstrip("/"))


def inspect_local(
    ref: str,
    engine: Engine,
    meter: Meter | None = None,
    *,
    inspected: Mapping[str, Any] | None = None,
) -> InspectedImage:
    """Inspect an image of the local engine through its ``docker save`` stream;
    ``inspected``: the engine's inspection of it, where the caller already has it."""
    meter = meter or _NoMeter()
    inspected = inspected or engine.inspect_image(ref)
    if inspected is None:
        raise MissingError(f"{ref}: no such local image")
    config = inspected.get("Config") or {}
    labels = config.get("Labels") or {}
    size = inspected.get("Size")
    meter.total(size if isinstance(size, int) else None)
    scans: dict[str, LayerScan] = {}
    links: dict[str, str] = {}
    manifest: Any = None
    with spool_dir() as spool, engine.export_image(ref) as chunks:
        export = open_tar(_ChunkReader(chunks, meter), f"export of {ref}", EXPORT_LIMITS)
        for member, data in export:
            name = _outer_name(member.name)
            if member.issym():
                links[name] = _outer_name(posixpath.join(posixpath.dirname(name), member.linkname))
            elif not member.isfile():
                continue
            elif name == "manifest.json":
                if member.size > _MANIFEST_LIMIT:
                    raise ContentsError(
                        f"export of {ref}: a manifest.json of {member.size} bytes (the limit "
                        f"is {_MANIFEST_LIMIT})"
                    )
                manifest = load_json(data.read(), f"export of {ref}: manifest.json")
            elif looks_like_layer(data.peek(512)):
                scans[name] = scan_layer(data, name, spool)
    try:
        layer_names = [_outer_name(str(n)) for n in manifest[0]["Layers"]]
    except (TypeError, KeyError, IndexError) as exc:
        raise ContentsError(f"export of {ref}: no usable manifest.json") from exc
    ordered = []
    for layer in layer_names:
        seen = {layer}
        while layer in links and layer not in scans:
            layer = links[layer]
            if layer in seen:
                break
            seen.add(layer)
        if layer not in scans:
            raise ContentsError(f"export of {ref}: layer {layer} is missing from the archive")
        ordered.append(scans[layer])
    env = config.get("Env")
    contents = merge_layers(ordered).with_finding(
        env_finding(env if isinstance(env, list) else None)
    )
    return InspectedImage(ref, "engine", _platform_text(inspected), dict(labels), contents)
