"""Build a version's variant index from a registry (docs/reference/index-document.md and image-index.md, client side).

Where it comes from, cheapest first: a variant image index at tag ``VERSION`` (one manifest
request, no config blobs), else a scan of the tags ``VERSION`` and ``VERSION-*`` (a tag list,
then a manifest and a config per image). Both feed ``build_index``, so the document is the
same either way.

One bad image never breaks the index: bad upstream data for a tag (a config that is not
JSON, a malformed manifest) lists that tag under ``invalid``. What makes the whole index
unknowable (no credentials, no such repository, registry down) is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from docker_variant.oci.client import Manifest, RegistryClient, config_labels
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import BadUpstreamResponseError, NotFoundError
from docker_variant.oci.imageindex import IndexEntry, read_image_index, stated_platform
from docker_variant.variant.index import ImageRecord, VariantIndex, build_index

__all__ = [
    "VersionImages",
    "read_version",
    "scan_images",
    "scan_index",
    "scan_index_sync",
    "top_manifest",
]


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
    """The version's index: from its variant image index if it has one, else a scan."""
    top = await top_manifest(client, repository, version)
    if top is not None and top.is_index:
        entries = read_image_index(top.data, version)
        if entries is not None:
            return VersionImages(entries, []).index(version)
    images = await scan_images(client, repository, version, top=top)
    return images.index(version)


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
    tags = [
        t for t in await client.list_tags(repository) if t == version or t.startswith(f"{version}-")
    ]
    fetches: list[Awaitable[list[IndexEntry] | ImageRecord]] = []
    for tag in tags:
        given = top if tag == version else None
        fetches.append(_tag_images(client, repository, tag, version, given))
    results = await _gather(fetches)
    entries: list[IndexEntry] = []
    errors: list[ImageRecord] = []
    for result in results:
        if isinstance(result, ImageRecord):
            errors.append(result)
        else:
            entries.extend(result)
    return VersionImages(entries, errors)


async def _gather(fetches: Iterable[Awaitable[Any]]) -> list[Any]:
    tasks = [asyncio.ensure_future(f) for f in fetches]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # gather leaves the other fetches running; stop them before raising
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def top_manifest(client: RegistryClient, repository: str, tag: str) -> Manifest | None:
    """The manifest or index at ``tag`` as it is; ``None`` when the tag does not exist (a
    missing repository is raised: nothing of it can be read)."""
    try:
        return await client.fetch_manifest(repository, tag)
    except NotFoundError as exc:
        if exc.code == ErrorCode.NAME_UNKNOWN:
            raise
        return None


async def _tag_images(
    client: RegistryClient,
    repository: str,
    tag: str,
    version: str,
    top: Manifest | None,
) -> list[IndexEntry] | ImageRecord:
    digest = ""
    try:
        if top is None:
            top = await client.fetch_manifest(repository, tag)
        digest = top.digest
        if not top.is_index:
            return [await _entry(client, repository, tag, top)]
        published = read_image_index(top.data, version) if tag == version else None
        if published is not None:  # re-publishing: keep the bare image the index replaced
            return [e for e in published if e.label is None]
        children = []
        for descriptor in top.data["manifests"]:
            platform = stated_platform(descriptor.get("platform"))
            if platform is not None and platform.os != "unknown":  # not an attestation
                children.append(_child_entry(client, repository, tag, str(descriptor["digest"])))
        if not children:
            return ImageRecord(tag, digest, error="an index without any platform's image")
        return list(await _gather(children))
    except BadUpstreamResponseError as exc:
        return ImageRecord(tag, digest, error=str(exc))
    except NotFoundError as exc:
        if exc.code == ErrorCode.NAME_UNKNOWN:
            raise  # the repository itself is gone
        # a tag deleted since the listing, a missing config blob
        return ImageRecord(tag, digest, error=str(exc))


async def _child_entry(
    client: RegistryClient, repository: str, tag: str, digest: str
) -> IndexEntry:
    child = await client.fetch_manifest(repository, digest)
    if child.is_index:
        raise BadUpstreamResponseError(
            f"manifest {repository}@{digest}: an index inside the index of {repository}:{tag}; "
            "expected an image manifest"
        )
    return await _entry(client, repository, tag, child)


async def _entry(
    client: RegistryClient, repository: str, tag: str, manifest: Manifest
) -> IndexEntry:
    config = await client.get_config(repository, manifest)
    where = f"config blob {manifest.config_digest} of {repository}:{tag}"
    return IndexEntry(
        tag=tag,
        platform=stated_platform(config),
        media_type=manifest.media_type,
        digest=manifest.digest,
        size=manifest.size,
        labels=config_labels(config, where),
    )


def scan_index_sync(
    base_url: str, repository: str, version: str, **client_kwargs: Any
) -> VariantIndex:
    """``scan_index`` for synchronous callers; ``client_kwargs`` go to ``RegistryClient``."""

    async def run() -> VariantIndex:
        async with RegistryClient(base_url, **client_kwargs) as client:
            return await scan_index(client, repository, version)

    return asyncio.run(run())
