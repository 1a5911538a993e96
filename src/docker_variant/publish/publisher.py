"""``docker variant publish``: write a version's variant image index at tag ``VERSION``.

The images are read by the same scan that ``ls``/``resolve`` use; the index is refused
(``InvalidInputError``, exit 2) when the version holds an image that the index would
misrepresent: invalid labels, disagreeing namespace orders, two manifests of one label on
one platform, or a config that states no platform; or, unless told not to verify, an image
whose labels promise what its binaries do not deliver (``contents.check``). Publishing again
is idempotent: the same images give the same bytes, and an index already in place is not
pushed again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from docker_variant.errors import InvalidInputError
from docker_variant.oci.client import RegistryClient
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import NotFoundError
from docker_variant.oci.imageindex import IndexEntry, order_entries, write_image_index
from docker_variant.oci.mediatypes import OCI_INDEX
from docker_variant.oci.reference import Reference
from docker_variant.oci.scan import VersionImages, scan_images, top_manifest

__all__ = ["Published", "plan_index", "publish", "publish_async"]


@dataclass(frozen=True)
class Published:
    reference: Reference  # registry/name:VERSION
    digest: str
    body: bytes
    entries: list[IndexEntry]  # in index order
    changed: bool  # False: the registry already held exactly this index (or a dry run)
    warnings: tuple[str, ...] = ()  # from checking the labels against the binaries


def plan_index(images: VersionImages, name: str, version: str) -> tuple[list[IndexEntry], bytes]:
    """The entries and bytes of the variant image index of ``images``, or the refusal."""
    index = images.index(version)
    if index.is_empty:
        raise NotFoundError(
            f"{name}: no image tagged {version} or {version}-<label> to publish",
            status=404,
            code=ErrorCode.MANIFEST_UNKNOWN,
        )
    if index.invalid:
        bad = index.invalid[0]
        more = f" (and {len(index.invalid) - 1} more)" if len(index.invalid) > 1 else ""
        raise InvalidInputError(
            f"{name}:{bad.tag}: {bad.error}; publish refuses a version with invalid "
            f"images{more}: fix the labels or delete the tag"
        )
    if not index.variants:
        raise InvalidInputError(
            f"{name}:{version}: no variant images (tagged {version}-<label>) to publish"
        )
    kept = {ref.tag for ref in index.images.values()}
    if index.bare is not None:
        kept.add(index.bare.tag)
    entries = [e for e in images.entries if e.tag in kept]
    for entry in entries:
        if entry.platform is None:
            raise InvalidInputError(
                f"{name}:{entry.tag}: its image config ({entry.digest}) states no os and "
                "architecture; an index entry needs a platform"
            )
    ordered = order_entries(entries, index)
    return ordered, write_image_index(ordered, index.namespace_order)


async def publish_async(
    client: RegistryClient,
    reference: Reference,
    *,
    dry_run: bool = False,
    verify: bool = True,
    verified_tags: Collection[str] = (),
) -> Published:
    """Write the index; with ``verify``, every entry's labels are first checked against its
    binaries (``contents.check``), except the tags in ``verified_tags`` (checked before
    their push)."""
    version = reference.tag
    if version is None or reference.digest is not None:
        raise InvalidInputError(f"{reference}: publish needs registry/name:version (a tag)")
    top = await top_manifest(client, reference.repository, version)
    images = await scan_images(client, reference.repository, version, top=top)
    entries, body = plan_index(images, reference.name, version)
    warnings: list[str] = []
    if verify:
        from docker_variant.contents.check import check_registry_entries

        warnings = await check_registry_entries(
            client, reference.repository, reference.name, entries, skip_tags=verified_tags
        )
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    changed = not dry_run and (top is None or top.digest != digest)
    if changed:
        digest = await client.put_manifest(reference.repository, version, body, OCI_INDEX)
    return Published(reference, digest, body, entries, changed, tuple(warnings))


def publish(
    reference: Reference,
    *,
    dry_run: bool = False,
    verify: bool = True,
    verified_tags: Collection[str] = (),
    **client_kwargs: Any,
) -> Published:
    """``publish_async`` with Docker's credentials for ``reference``'s registry."""

    async def run() -> Published:
        async with RegistryClient.for_registry(reference.registry, **client_kwargs) as client:
            return await publish_async(
                client, reference, dry_run=dry_run, verify=verify, verified_tags=verified_tags
            )

    return asyncio.run(run())
