"""Build a version's variant index from a registry (SPEC section 5, client side).

One bad image never breaks the index: bad upstream data for a tag (a config that is not
JSON, a malformed manifest) lists that tag under ``invalid``. What makes the whole index
unknowable (no credentials, no such repository, registry down) is raised.
"""

from __future__ import annotations

import asyncio
from typing import Any

from docker_variant.oci.client import RegistryClient
from docker_variant.oci.errors import BadUpstreamResponseError, NotFoundError
from docker_variant.variant.index import ImageRecord, VariantIndex, build_index

__all__ = ["scan_index", "scan_index_sync"]


async def scan_index(client: RegistryClient, repository: str, version: str) -> VariantIndex:
    """List the tags ``version`` and ``version-*`` and index their labels.

    Requests run concurrently up to the client's ``max_concurrency``.
    """
    tags = [
        t for t in await client.list_tags(repository) if t == version or t.startswith(f"{version}-")
    ]
    tasks = [asyncio.ensure_future(_record(client, repository, tag)) for tag in tags]
    try:
        records = await asyncio.gather(*tasks)
    except BaseException:
        # gather leaves the other fetches running; stop them before raising
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return build_index(version, records)


async def _record(client: RegistryClient, repository: str, tag: str) -> ImageRecord:
    digest = ""
    try:
        manifest = await client.get_manifest(repository, tag)
        digest = manifest.tag_digest
        labels = await client.get_labels(repository, manifest)
    except BadUpstreamResponseError as exc:
        return ImageRecord(tag, digest, error=str(exc))
    except NotFoundError as exc:
        if exc.code == "NAME_UNKNOWN":
            raise  # the repository itself is gone
        # a tag deleted since the listing, a missing config blob, an index without linux
        return ImageRecord(tag, digest, error=str(exc))
    return ImageRecord(tag, digest, labels)


def scan_index_sync(
    base_url: str, repository: str, version: str, **client_kwargs: Any
) -> VariantIndex:
    """``scan_index`` for synchronous callers; ``client_kwargs`` go to ``RegistryClient``."""

    async def run() -> VariantIndex:
        async with RegistryClient(base_url, **client_kwargs) as client:
            return await scan_index(client, repository, version)

    return asyncio.run(run())
