"""Where a version's variant index comes from (docs/reference/image-index.md): the proxy's ``_variants``
API if the registry has one, else a variant image index at ``VERSION``, else a client-side
scan (the three give the same document)."""

from __future__ import annotations

import hashlib
from typing import Any

from docker_variant.errors import InvalidInputError, UnreachableError
from docker_variant.localcache import read_entry, write_entry
from docker_variant.oci.client import Manifest, Read, RegistryClient, SyncRegistryClient
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import NotFoundError, RegistryError
from docker_variant.oci.imageindex import read_image_index
from docker_variant.oci.reference import Reference, versioned_reference
from docker_variant.variant.index import VariantIndex, build_index

__all__ = [
    "download_index",
    "fetch_index",
    "fetch_index_async",
    "published_without",
    "refresh_proxy_index",
]

#: How long a registry answering ``_variants`` with a plain 404 is taken to have no proxy.
PLAIN_REGISTRY_TTL = 600.0
#: ``--index URL``: at most this many bytes, all of them within this many seconds.
INDEX_DOWNLOAD_LIMIT = 16 << 20
INDEX_DOWNLOAD_DEADLINE = 30.0


def _plain_memo(base_url: str) -> str:
    return f"plain-{hashlib.sha256(base_url.encode()).hexdigest()[:16]}.json"


def _read_proxy_index(
    client: RegistryClient | SyncRegistryClient, repository: str, version: str
) -> Read[VariantIndex | None]:
    """The proxy's ``_variants`` document, or ``None`` from a registry without the
    extension. Such a registry is remembered for ``PLAIN_REGISTRY_TTL`` seconds, so that
    the next command skips the probe."""
    memo = _plain_memo(client.base_url)
    if read_entry(memo, PLAIN_REGISTRY_TTL) is not None:
        return None
    index = yield from client.read_variant_index(repository, version, False)
    if index is None:
        write_entry(memo, client.base_url)
    return index


async def fetch_index_async(client: RegistryClient, repository: str, version: str) -> VariantIndex:
    """The proxy's ``_variants`` if the registry has the extension, else its variant image
    index or a scan (``_read_proxy_index``)."""
    index = await client.run(_read_proxy_index(client, repository, version))
    if index is not None:
        return index
    from docker_variant.oci.scan import read_version

    return await read_version(client, repository, version)


def fetch_index(ref: str | Reference) -> tuple[Reference, VariantIndex]:
    """Parse ``registry/name:version`` and fetch its index with Docker's credentials.

    As ``fetch_index_async``, without asyncio (a command that then talks to the engine
    uses one HTTP stack): the proxy's document or a published variant image index is one
    or two requests in a row; a scan of the tags runs its many requests on a few threads
    over the same client."""
    reference = versioned_reference(ref)
    version = reference.tag
    assert version is not None
    with SyncRegistryClient.for_registry(reference.registry) as client:
        found, top = _published_index(client, reference.repository, version)
        if found is None:
            from docker_variant.oci.scan import scan_images_sync

            found = scan_images_sync(client, reference.repository, version, top=top).index(version)
    if found.is_empty:
        # As `docker pull` of a missing tag: an error, not "nothing fits this host".
        raise NotFoundError(
            f"{reference}: no image tagged {version} or {version}-<label> in {reference.name}",
            status=404,
            code=ErrorCode.MANIFEST_UNKNOWN,
        )
    return reference, found


def _published_index(
    client: SyncRegistryClient, repository: str, version: str
) -> tuple[VariantIndex | None, Manifest | None]:
    """The proxy's document, else the variant image index at ``version`` (as
    ``read_version`` reads it); else ``None`` and the manifest at ``version`` if any, for
    the scan."""
    index = client.run(_read_proxy_index(client, repository, version))
    if index is not None:
        return index, None
    try:
        top = client.fetch_manifest(repository, version)
    except NotFoundError as exc:
        if exc.code == ErrorCode.NAME_UNKNOWN:
            raise  # no such repository: nothing of it can be read
        return None, None
    if top.is_index:
        entries = read_image_index(top.data, version)
        if entries is not None:
            return build_index(version, [e.record() for e in entries]), top
    return None, top


def download_index(
    url: str, *, limit: int = INDEX_DOWNLOAD_LIMIT, deadline: float = INDEX_DOWNLOAD_DEADLINE
) -> VariantIndex:
    """An index document from ``url``: at most ``limit`` bytes within ``deadline`` seconds
    in all (a slow or endless server is cut off), then checked like a file."""
    import time

    import httpx

    from docker_variant.jsondoc import load_json
    from docker_variant.oci.bodies import BodyLimit, read_bounded
    from docker_variant.oci.http import sync_client

    what = f"index {url}"
    started = time.monotonic()

    def too_large(declared: str | None) -> InvalidInputError:
        if declared is not None:
            return InvalidInputError(f"{what}: {declared} bytes is over the {limit} allowed")
        return InvalidInputError(f"{what}: more than the {limit} bytes allowed")

    def in_time() -> None:
        if time.monotonic() - started > deadline:
            raise UnreachableError(f"{what}: not downloaded within {deadline:g} s")

    try:
        with (
            sync_client(timeout=min(deadline, 10.0), follow_redirects=True) as http,
            http.stream("GET", url) as r,
        ):
            if not r.is_success:
                raise UnreachableError(f"{what}: answered {r.status_code} {r.reason_phrase}")
            declared = r.headers.get("content-length")
            bound = BodyLimit(limit, too_large, declared=declared, check=in_time)
            body = read_bounded(r.iter_bytes(), bound)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise InvalidInputError(f"{what}: not a valid URL ({exc})") from None
    except httpx.TimeoutException:
        raise UnreachableError(f"{what}: timed out") from None
    except httpx.HTTPError as exc:
        raise UnreachableError(f"{what}: {exc or type(exc).__name__}") from None
    except ValueError as exc:  # httpx's URL parser on hosts such as [::1:5699
        raise InvalidInputError(f"{what}: not a valid URL ({exc})") from None
    return VariantIndex.from_json(load_json(body, what, max_bytes=limit), what)


def refresh_proxy_index(ref: Reference, version: str, **client_kwargs: Any) -> bool:
    """After a push: have a variant-proxy in front of ``ref.registry`` rebuild the index of
    ``version``. Best effort, since the push itself already succeeded: ``True`` when a proxy
    answered with a fresh index, ``False`` when there is none or it failed."""
    if not version:
        return False

    try:
        with SyncRegistryClient.for_registry(ref.registry, **client_kwargs) as client:
            return client.get_variant_index(ref.repository, version, refresh=True) is not None
    except (RegistryError, InvalidInputError):
        return False


def published_without(ref: Reference, version: str, **client_kwargs: Any) -> bool:
    """After a push of the variant image ``ref`` (``version-<label>``): whether ``version``
    holds a published variant image index that lacks it. ls, resolve and pull read that
    index, not the tags, so the image is not among the version's until it is published
    again. Best effort: ``False`` when that cannot be read."""
    if not version or ref.tag is None:
        return False
    try:
        with SyncRegistryClient.for_registry(ref.registry, **client_kwargs) as client:
            top = client.fetch_manifest(ref.repository, version)
    except (RegistryError, InvalidInputError):
        return False
    entries = read_image_index(top.data, version) if top.is_index else None
    return entries is not None and all(entry.tag != ref.tag for entry in entries)
