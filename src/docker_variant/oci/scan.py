"""Build a version's variant index from a registry (docs/reference/index-document.md and image-index.md, client side).

Where it comes from, cheapest first: a variant image index at tag ``VERSION`` (one manifest
request, no config blobs), else a scan of the tags ``VERSION`` and ``VERSION-*`` (a tag list,
then a manifest and a config per image). Both feed ``build_index``, so the document is the
same either way. A scan is written once, as batches of the clients' reads (``_scan_plan``),
run concurrently by either client: on asyncio (the proxy, ``publish``) or on a few threads
of the sync client (a command, which then loads no asyncio).

One bad image never breaks the index: bad upstream data for a tag (a config that is not
JSON, a malformed manifest) lists that tag under ``invalid``. What makes the whole index
unknowable (no credentials, no such repository, registry down) is raised.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from docker_variant.errors import without_origins
from docker_variant.oci.client import (
    Manifest,
    Read,
    RegistryClient,
    SyncRegistryClient,
    config_labels,
)
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import BadUpstreamResponseError, NotFoundError
from docker_variant.oci.imageindex import IndexEntry, read_image_index, stated_platform
from docker_variant.variant.index import ImageRecord, VariantIndex, build_index

__all__ = [
    "VersionImages",
    "read_version",
    "scan_images",
    "scan_images_sync",
    "scan_index",
    "scan_index_sync",
    "top_manifest",
]

_T = TypeVar("_T")
_Client = RegistryClient | SyncRegistryClient


@dataclass(frozen=True)
class VersionImages:
    """What a registry holds for one version: every readable image manifest, the tags that
    could not be read."""

    entries: list[IndexEntry]
    errors: list[ImageRecord]

    def records(self) -> list[ImageRecord]:
        return [*(e.record() for e in self.entries), *self.errors]

    def index(self, version: str) -> VariantIndex:
        return build_index(version, self.records())


async def read_version(client: RegistryClient, repository: str, version: str) -> VariantIndex:
    """The version's index: from its variant image index if it has one, else a scan. The
    index is built on a worker thread (``offload``): its labels are parsed there."""
    from docker_variant.oci.offload import off_loop

    top = await top_manifest(client, repository, version)
    if top is not None and top.is_index:
        published = await off_loop(_published, top, version)
        if published is not None:
            return published
    images = await scan_images(client, repository, version, top=top)
    return await off_loop(images.index, version)


def _published(top: Manifest, version: str) -> VariantIndex | None:
    """The index from the variant image index ``top``; None when it is not one."""
    entries = read_image_index(top.data, version)
    return None if entries is None else VersionImages(entries, []).index(version)


async def scan_index(client: RegistryClient, repository: str, version: str) -> VariantIndex:
    """The index from a tag scan only (no variant image index read)."""
    return (await scan_images(client, repository, version)).index(version)


async def scan_images(
    client: RegistryClient,
    repository: str,
    version: str,
    *,
    top: Manifest | None = None,
) -> VersionImages:
    """List the tags ``version`` and ``version-*`` and read every image manifest's labels.

    ``top`` is the manifest at ``version`` when the caller already fetched it. A variant
    image index at ``version`` contributes its bare entries (the bare image it replaced).
    Requests run concurrently up to the client's ``max_concurrency``.
    """
    plan = _scan_plan(client, repository, version, top)
    try:
        batch = next(plan)
        while True:
            batch = plan.send(await client.run_all(batch))
    except StopIteration as done:
        images: VersionImages = done.value
        return images


def scan_images_sync(
    client: SyncRegistryClient,
    repository: str,
    version: str,
    *,
    top: Manifest | None = None,
) -> VersionImages:
    """``scan_images`` with the sync client: its requests run on up to its
    ``max_concurrency`` threads."""
    plan = _scan_plan(client, repository, version, top)
    try:
        batch = next(plan)
        while True:
            batch = plan.send(client.run_all(batch))
    except StopIteration as done:
        images: VersionImages = done.value
        return images


#: A scan: yields batches of reads to run concurrently, is sent each batch's results in
#: order, and returns what it found.
_Plan = Generator[list[Read[Any]], list[Any], VersionImages]


def _scan_plan(client: _Client, repository: str, version: str, top: Manifest | None) -> _Plan:
    """Three batches: the tag list; each tag's manifest (``top`` is not fetched again);
    each image's config, and for an index each platform's manifest and config."""
    (listed,) = yield [client.read_tags(repository, None)]
    tags = [t for t in listed if t == version or t.startswith(f"{version}-")]
    unread = [t for t in tags if t != version or top is None]
    fetched = yield [_guarded(t, "", client.read_manifest(repository, t)) for t in unread]
    tops: dict[str, Manifest | ImageRecord] = dict(zip(unread, fetched, strict=True))
    if top is not None and version in tags:
        tops[version] = top
    found: dict[str, list[IndexEntry] | ImageRecord] = {}
    owners: list[str] = []  # the tag of each read of the last batch
    reads: list[Read[IndexEntry | ImageRecord]] = []
    for tag in tags:
        manifest = tops[tag]
        if isinstance(manifest, ImageRecord):
            found[tag] = manifest
            continue
        try:
            published = (
                read_image_index(manifest.data, version)
                if tag == version and manifest.is_index
                else None
            )
            images = (
                [] if published is not None else _image_reads(client, repository, tag, manifest)
            )
        except BadUpstreamResponseError as exc:
            found[tag] = ImageRecord(tag, manifest.digest, error=_reason(exc))
            continue
        if published is not None:  # re-publishing: keep the bare image the index replaced
            found[tag] = [e for e in published if e.label is None]
        elif not images:
            found[tag] = ImageRecord(
                tag, manifest.digest, error="an index without any platform's image"
            )
        else:
            found[tag] = []
            owners.extend([tag] * len(images))
            reads.extend(_guarded(tag, manifest.digest, read) for read in images)
    results = yield list(reads)
    for tag, result in zip(owners, results, strict=True):
        so_far = found[tag]
        if isinstance(so_far, ImageRecord):
            continue  # another image of the tag failed: the tag is listed invalid once
        if isinstance(result, ImageRecord):
            found[tag] = result
        else:
            so_far.append(result)
    entries: list[IndexEntry] = []
    errors: list[ImageRecord] = []
    for tag in tags:
        outcome = found[tag]
        if isinstance(outcome, ImageRecord):
            errors.append(outcome)
        else:
            entries.extend(outcome)
    return VersionImages(entries, errors)


async def top_manifest(client: RegistryClient, repository: str, tag: str) -> Manifest | None:
    """The manifest or index at ``tag`` as it is; ``None`` when the tag does not exist (a
    missing repository is raised: nothing of it can be read)."""
    try:
        return await client.fetch_manifest(repository, tag)
    except NotFoundError as exc:
        if exc.code == ErrorCode.NAME_UNKNOWN:
            raise
        return None


def _guarded(tag: str, digest: str, read: Read[_T]) -> Read[_T | ImageRecord]:
    """``read``; or, when upstream data is bad or a tag or blob went away since the
    listing, the tag listed invalid (a missing repository is raised: nothing of it can be
    read)."""
    try:
        return (yield from read)
    except BadUpstreamResponseError as exc:
        return ImageRecord(tag, digest, error=_reason(exc))
    except NotFoundError as exc:
        if exc.code == ErrorCode.NAME_UNKNOWN:
            raise
        return ImageRecord(tag, digest, error=_reason(exc))


def _reason(exc: Exception) -> str:
    """Why a tag is listed invalid: the error, its URLs without their origin. The document
    is the same whoever scanned (a client, or a proxy whose upstream's address is the
    operator's business); the path says which request it was."""
    return without_origins(str(exc))


def _image_reads(
    client: _Client, repository: str, tag: str, top: Manifest
) -> list[Read[IndexEntry]]:
    """A read of each image at ``tag``: the image itself, or each platform's image of an
    index (not its attestations)."""
    if not top.is_index:
        return [_entry(client, repository, tag, top)]
    reads = []
    for descriptor in top.data["manifests"]:
        platform = stated_platform(descriptor.get("platform"))
        if platform is not None and platform.os != "unknown":  # not an attestation
            reads.append(_child_entry(client, repository, tag, str(descriptor["digest"])))
    return reads


def _child_entry(client: _Client, repository: str, tag: str, digest: str) -> Read[IndexEntry]:
    child = yield from client.read_manifest(repository, digest)
    if child.is_index:
        raise BadUpstreamResponseError(
            f"manifest {repository}@{digest}: an index inside the index of {repository}:{tag}; "
            "expected an image manifest"
        )
    return (yield from _entry(client, repository, tag, child))


def _entry(client: _Client, repository: str, tag: str, manifest: Manifest) -> Read[IndexEntry]:
    config = yield from client.read_config(repository, manifest)
    where = f"config blob {manifest.config_digest} of {repository}:{tag}"
    return IndexEntry(
        tag=tag,
        platform=stated_platform(config),
        media_type=manifest.media_type,
        digest=manifest.digest,
        size=manifest.size,
        labels=config_labels(config, where, client.limits),
    )


def scan_index_sync(
    base_url: str, repository: str, version: str, **client_kwargs: Any
) -> VariantIndex:
    """``scan_index`` for synchronous callers; ``client_kwargs`` go to
    ``SyncRegistryClient``."""
    with SyncRegistryClient(base_url, **client_kwargs) as client:
        return scan_images_sync(client, repository, version).index(version)
