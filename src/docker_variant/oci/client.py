"""An async client for the read side of the OCI distribution API.

Only what a variant scan needs: tags, manifests (resolving an index to this host's
platform) and config blobs. Every failure becomes a ``RegistryError`` subclass with a
one-line message naming what was fetched and from where; no httpx or json exception
escapes.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import hashlib
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from docker_variant.errors import DockerVariantError, InvalidInputError, one_line
from docker_variant.jsondoc import load_json
from docker_variant.numbers import is_number
from docker_variant.oci.auth import RegistryAuth, registry_ca_files
from docker_variant.oci.errcode import ERROR_BODY_LIMIT, ErrorCode, read_error
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RateLimitedError,
    RegistryAuthError,
    RegistryError,
    UpstreamUnavailableError,
)
from docker_variant.oci.grammar import is_digest
from docker_variant.oci.http import async_client, tls_with
from docker_variant.oci.imageindex import stated_platform
from docker_variant.oci.mediatypes import (
    GENERIC_TYPES,
    INDEX_TYPES,
    MANIFEST_ACCEPT,
    MANIFEST_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
)
from docker_variant.oci.reference import (
    check_manifest_reference,
    check_repository,
    registry_base_url,
)
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.platform import Platform, host_platform

__all__ = [
    "DEFAULT_RATE_LIMIT_WAIT",
    "Manifest",
    "Platform",
    "RegistryClient",
    "config_labels",
    "host_platform",
    "retry_after",
]

_MANIFEST_LIMIT = 4 << 20  # the distribution spec's minimum a registry must accept
_CONFIG_LIMIT = 32 << 20
_TAGS_LIMIT = 32 << 20
#: A client waits out 429s for at most this long in all, and retries at most this often.
DEFAULT_RATE_LIMIT_WAIT = 30.0
_RATE_LIMIT_RETRIES = 3


@dataclass(frozen=True)
class Manifest:
    """A fetched manifest. When a tag names an index, this is the platform manifest chosen
    from it and ``index_digest`` is the index's own digest."""

    media_type: str
    digest: str
    raw: bytes
    data: dict[str, Any]
    index_digest: str | None = None

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    @property
    def tag_digest(self) -> str:
        """What the tag points at: pulling this digest works on every platform of an index."""
        return self.index_digest or self.digest

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def config_digest(self) -> str:
        if self.is_index:
            raise InvalidInputError(f"manifest {self.digest} is an index: it has no config")
        digest: str = self.data["config"]["digest"]  # checked when the manifest was read
        return digest


def config_labels(config: Mapping[str, Any], where: str) -> dict[str, str]:
    """``config.Labels`` of an image config; absent or null means no labels."""
    section = config.get("config")
    labels = section.get("Labels") if isinstance(section, dict) else None
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise BadUpstreamResponseError(f"{where}: config.Labels is not an object of strings")
    return labels


class RegistryClient:
    """The distribution API of one registry (or a proxy in front of it).

    ``headers`` go out on every request: the proxy passes a caller's ``Authorization``
    this way, so the upstream decides what that caller may read. At most
    ``max_concurrency`` requests are in flight at once.
    """

    def __init__(
        self,
        base_url: str,
        *,
        auth: httpx.Auth | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout = 30.0,
        max_concurrency: int = 8,
        platform: Platform | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        rate_limit_wait: float = DEFAULT_RATE_LIMIT_WAIT,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise InvalidInputError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.base_url = base_url.rstrip("/")
        self.platform = platform or host_platform()
        self.rate_limit_wait = rate_limit_wait
        self._wait_budget = rate_limit_wait
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._http = async_client(
            base_url=self.base_url,
            auth=auth,
            headers=headers,
            timeout=timeout,
            follow_redirects=True,  # blobs may live behind a redirect (S3, CDN)
            limits=httpx.Limits(max_connections=max_concurrency),
            transport=transport,
            tls=tls,
        )

    @classmethod
    def for_registry(
        cls, registry: str, *, config_path: Path | None = None, **kwargs: Any
    ) -> RegistryClient:
        """A client for ``registry`` (``host[:port]``) with Docker's stored credentials and
        the CAs Docker keeps for it (``certs.d``)."""
        auth = RegistryAuth.from_docker_config(registry, config_path)
        cas = registry_ca_files(registry)
        if cas:
            kwargs.setdefault("tls", tls_with(tuple(str(p) for p in cas)))
        return cls(registry_base_url(registry, tls=bool(cas)), auth=auth, **kwargs)

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def list_tags(self, repository: str, *, page_size: int | None = None) -> list[str]:
        """Every tag, following ``Link: <...>; rel="next"`` pages."""
        check_repository(repository)
        what = f"tag list of {repository}"
        url = f"{self.base_url}/v2/{repository}/tags/list"
        params = {"n": str(page_size)} if page_size else None
        tags: dict[str, None] = {}  # ordered set: pages may overlap while tags are pushed
        seen: set[str] = set()
        while True:
            response, body = await self._get(url, what, _TAGS_LIMIT, params=params)
            page = _json_object(body, what, response).get("tags")
            if page is None:
                page = []
            if not isinstance(page, list) or not all(isinstance(t, str) for t in page):
                raise _bad(f"{what}: 'tags' is not a list of strings", response)
            tags.update(dict.fromkeys(page))
            link = response.links.get("next", {}).get("url")
            if not link:
                return list(tags)
            url, params = str(response.url.join(link)), None
            if httpx.URL(url).netloc != response.url.netloc:
                raise _bad(f"{what}: next page {url} is on another host", response)
            if url in seen:
                raise _bad(f"{what}: next page {url} was already read (pagination loop)", response)
            seen.add(url)

    async def get_manifest(
        self, repository: str, reference: str, *, platform: Platform | None = None
    ) -> Manifest:
        """The manifest of a tag or digest; an index resolves to ``platform``'s manifest
        (default: this host's), else the index's first linux one."""
        top = await self.fetch_manifest(repository, reference)  # checks both names
        if not top.is_index:
            return top
        digest = _pick_platform(top, platform or self.platform, _name(repository, reference))
        child = await self.fetch_manifest(repository, digest)
        if child.is_index:
            raise BadUpstreamResponseError(
                f"manifest {_name(repository, digest)}: an index inside the index of "
                f"{_name(repository, reference)}; expected an image manifest"
            )
        return replace(child, index_digest=top.digest)

    async def get_config(self, repository: str, manifest: Manifest) -> dict[str, Any]:
        """The image config blob named by ``manifest``, checked to be a JSON object."""
        check_repository(repository)
        digest = manifest.config_digest
        what = f"config blob {digest} of {repository}"
        response, body = await self._get(
            f"{self.base_url}/v2/{repository}/blobs/{digest}", what, _CONFIG_LIMIT
        )
        _check_digest(body, digest, what, response)
        return _json_object(body, what, response)

    async def get_labels(self, repository: str, manifest: Manifest) -> dict[str, str]:
        """``config.Labels`` of the image config that ``manifest`` names."""
        config = await self.get_config(repository, manifest)
        url = f"{self.base_url}/v2/{repository}/blobs/{manifest.config_digest}"
        return config_labels(config, f"config blob {url}")

    async def stream_blob(
        self, repository: str, digest: str, *, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        """A blob's bytes as they arrive (a layer of gigabytes is never held), checked
        against ``digest`` once the last chunk is in: a mismatch raises after it."""
        check_repository(repository)
        if not digest.startswith("sha256:"):
            raise InvalidInputError(f"blob {digest!r} of {repository}: only sha256 digests")
        what = f"blob {digest} of {repository}"
        url = f"{self.base_url}/v2/{repository}/blobs/{digest}"
        hasher = hashlib.sha256()
        async with self._semaphore:
            try:
                async with self._http.stream("GET", url) as response:
                    if not response.is_success:
                        body = await _read(response, ERROR_BODY_LIMIT, what, truncate=True)
                        raise _status_error(response, body, what)
                    async for chunk in response.aiter_bytes(chunk_size):
                        hasher.update(chunk)
                        yield chunk
                    if "sha256:" + hasher.hexdigest() != digest:
                        raise _bad(f"{what}: content does not match its digest", response)
            except RegistryError:
                raise
            except httpx.HTTPError as exc:
                raise _transport_error(exc, what, url) from exc

    async def image_labels(self, repository: str, tag: str) -> tuple[str, dict[str, str]]:
        """``(digest the tag points at, config.Labels)``."""
        manifest = await self.get_manifest(repository, tag)
        return manifest.tag_digest, await self.get_labels(repository, manifest)

    async def get_variant_index(
        self, repository: str, version: str, *, refresh: bool = False
    ) -> VariantIndex | None:
        """The proxy's ``/v2/<name>/_variants/<version>`` document; ``None`` when the
        registry has no such extension (a plain 404 without an OCI error code).
        ``refresh`` asks a caching proxy for a fresh document (``Cache-Control: no-cache``)."""
        check_repository(repository)
        check_manifest_reference(version)
        what = f"variant index of {repository}:{version}"
        url = f"{self.base_url}/v2/{repository}/_variants/{version}"
        headers = {"Cache-Control": "no-cache"} if refresh else None
        try:
            response, body = await self._get(url, what, _TAGS_LIMIT, headers=headers)
        except NotFoundError as exc:
            if exc.code is None:
                return None
            raise
        data = _json_object(body, what, response)
        try:
            return VariantIndex.from_json(data, what)
        except InvalidInputError as exc:
            raise _bad(str(exc), response) from exc

    async def fetch_manifest(self, repository: str, reference: str) -> Manifest:
        """The manifest or index at ``reference`` as it is (no platform resolution)."""
        check_repository(repository)
        check_manifest_reference(reference)
        what = f"manifest {_name(repository, reference)}"
        _check_verifiable(reference, what)
        response, body = await self._get(
            f"{self.base_url}/v2/{repository}/manifests/{reference}",
            what,
            _MANIFEST_LIMIT,
            headers={"Accept": MANIFEST_ACCEPT},
        )
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if content_type not in INDEX_TYPES | MANIFEST_TYPES | GENERIC_TYPES:
            raise _bad(f"{what}: unexpected content type {content_type!r}", response)
        data = _json_object(body, what, response)
        media_type = content_type if content_type not in GENERIC_TYPES else _infer_type(data)
        _check_shape(data, media_type, what, response)
        # The digest is the bytes' own, never what the registry says it is: a registry
        # naming another image's digest for a tag would have it recorded and pulled.
        if is_digest(reference):
            _check_digest(body, reference, what, response)
            digest = reference
        else:
            digest = _sha256(body)
        _check_stated_digest(response, body, digest, what)
        return Manifest(media_type, digest, body, data)

    async def _get(
        self,
        url: str,
        what: str,
        limit: int,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[httpx.Response, bytes]:
        """GET with the body capped at ``limit``. A 429 is retried after its ``Retry-After``
        while this client's wait budget lasts (public registries limit pulls); then, or when
        the registry asks for a longer wait, it fails naming the limit."""
        for attempt in range(_RATE_LIMIT_RETRIES + 1):
            try:
                return await self._get_once(url, what, limit, headers=headers, params=params)
            except UpstreamUnavailableError as exc:
                if exc.status != 429:
                    raise
                delay = retry_after(exc.headers.get("retry-after"))
                if attempt == _RATE_LIMIT_RETRIES or delay > self._wait_budget:
                    raise RateLimitedError(
                        f"{exc}; rate limited: the registry asks to wait "
                        f"{_seconds(delay)} and docker-variant waits at most "
                        f"{_seconds(self.rate_limit_wait)} in all"
                        + ("" if attempt == 0 else f" (gave up after {attempt} retries)"),
                        status=429,
                        code=exc.code,
                        headers=exc.headers,
                        url=exc.url,
                    ) from exc
                self._wait_budget -= delay
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def put_manifest(
        self, repository: str, reference: str, body: bytes, media_type: str
    ) -> str:
        """PUT a manifest (or index) at a tag; returns the digest the registry reports."""
        check_repository(repository)
        check_manifest_reference(reference)
        url = f"{self.base_url}/v2/{repository}/manifests/{reference}"
        what = f"push of manifest {_name(repository, reference)}"
        async with self._semaphore:
            try:
                response = await self._http.put(
                    url, content=body, headers={"Content-Type": media_type}
                )
            except httpx.HTTPError as exc:
                raise _transport_error(exc, what, url) from exc
            if not response.is_success:
                raise _status_error(response, response.content[:ERROR_BODY_LIMIT], what)
        digest = _sha256(body)
        _check_stated_digest(response, body, digest, what)
        return digest

    async def _get_once(
        self,
        url: str,
        what: str,
        limit: int,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[httpx.Response, bytes]:
        async with self._semaphore:
            try:
                async with self._http.stream("GET", url, headers=headers, params=params) as r:
                    if not r.is_success:
                        body = await _read(r, ERROR_BODY_LIMIT, what, truncate=True)
                        raise _status_error(r, body, what)
                    return r, await _read(r, limit, what)
            except RegistryError:
                raise
            except httpx.HTTPError as exc:
                raise _transport_error(exc, what, url) from exc


def _transport_error(exc: httpx.HTTPError, what: str, url: str) -> DockerVariantError:
    """An httpx failure (no usable response) as one of our errors."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamUnavailableError(f"{what}: {url} timed out ({_kind(exc)})", url=url)
    if isinstance(exc, httpx.RemoteProtocolError):
        return BadUpstreamResponseError(
            f"{what}: {url} sent an incomplete or malformed HTTP response: {exc}", url=url
        )
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return InvalidInputError(f"{what}: bad registry URL {url}: {exc}")
    if isinstance(exc, httpx.NetworkError | httpx.ProxyError):
        return UpstreamUnavailableError(
            f"{what}: registry at {url} is unreachable: {_reason(exc)}", url=url
        )
    if isinstance(exc, httpx.DecodingError | httpx.TooManyRedirects):
        return BadUpstreamResponseError(f"{what}: {url}: {exc}", url=url)
    return RegistryError(f"{what}: {url} failed: {exc!r}", url=url)


def retry_after(value: str | None) -> float:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP date); 1 s if absent
    or unreadable, never negative."""
    if not value:
        return 1.0
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return 1.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


async def _read(
    response: httpx.Response, limit: int, what: str, *, truncate: bool = False
) -> bytes:
    """The body, refusing more than ``limit`` bytes (a manifest is not a gigabyte); with
    ``truncate``, its first ``limit`` bytes (enough of an error body to find its code)."""
    declared = response.headers.get("content-length", "")
    too_long = declared.isdigit() and (not is_number(declared) or int(declared) > limit)
    if not truncate and too_long:
        raise _bad(f"{what}: {declared} bytes is more than the {limit} allowed", response)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        if size + len(chunk) > limit:
            if truncate:  # keep the head: a chunk may be larger than the whole limit
                chunks.append(chunk[: limit - size])
                break
            raise _bad(f"{what}: more than the {limit} bytes allowed", response)
        size += len(chunk)
        chunks.append(chunk)
    return b"".join(chunks)


def _status_error(response: httpx.Response, body: bytes, what: str) -> RegistryError:
    found = read_error(body)
    code, message = (found.code, found.message) if found is not None else (None, None)
    status = response.status_code
    text = f"{what}: {response.request.method} {response.url} answered {status}"
    if code:
        text += f" {code}"
    if message:
        text += f": {message}"
    cls: type[RegistryError] = RegistryError
    if status in (401, 403):
        cls = RegistryAuthError
    elif status == 404:
        cls = NotFoundError
    elif status == 429 or status >= 500:
        cls = UpstreamUnavailableError
    return cls(text, status=status, code=code, headers=response.headers, url=str(response.url))


def _bad(message: str, response: httpx.Response) -> BadUpstreamResponseError:
    url = str(response.url)
    return BadUpstreamResponseError(
        f"{message} (from {url})",
        status=response.status_code,
        headers=response.headers,
        url=url,
    )


def _json_object(body: bytes, what: str, response: httpx.Response) -> dict[str, Any]:
    try:
        data = load_json(body, what)  # the body was read with its own, smaller bound
    except InvalidInputError as exc:
        reason = str(exc).removeprefix(f"{what}: ")
        raise _bad(f"{what} is not JSON: {reason}", response) from exc
    if not isinstance(data, dict):
        raise _bad(f"{what} is JSON but not an object", response)
    return data


def _infer_type(data: Mapping[str, Any]) -> str:
    # A registry may label a manifest application/json; its mediaType field (optional
    # for OCI) or its shape says what it is.
    stated = data.get("mediaType")
    if isinstance(stated, str) and stated in INDEX_TYPES | MANIFEST_TYPES:
        return stated
    return OCI_INDEX if "manifests" in data else OCI_MANIFEST


def _check_shape(
    data: Mapping[str, Any], media_type: str, what: str, response: httpx.Response
) -> None:
    if media_type in INDEX_TYPES:
        entries = data.get("manifests")
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("digest"), str) for e in entries
        ):
            raise _bad(f"{what}: index without a valid 'manifests' list", response)
        return
    config = data.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
        raise _bad(f"{what}: image manifest without 'config.digest'", response)
    if not str(config["digest"]).startswith("sha256:"):
        raise _bad(f"{what}: config digest {config['digest']!r} is not sha256", response)
    if not isinstance(data.get("layers", []), list):
        raise _bad(f"{what}: 'layers' is not a list", response)


def _pick_platform(index: Manifest, wanted: Platform, name: str) -> str:
    linux: list[str] = []
    for entry in index.data["manifests"]:
        plat = entry.get("platform")
        if not isinstance(plat, dict):
            continue  # no platform: not something to run
        stated = stated_platform(plat)
        if stated is not None and wanted.matches(stated):
            return str(entry["digest"])
        if plat.get("os") == "linux":
            linux.append(str(entry["digest"]))
    if linux:
        return linux[0]
    raise NotFoundError(
        f"manifest {name}: the index has no linux manifest (wanted {wanted})",
        code=ErrorCode.MANIFEST_UNKNOWN,
    )


_HASHES = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}


def _sha256(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _digest_of(body: bytes, algorithm: str) -> str | None:
    """``body``'s digest in ``algorithm``; ``None`` for an algorithm this cannot compute."""
    hasher = _HASHES.get(algorithm)
    return None if hasher is None else f"{algorithm}:{hasher(body).hexdigest()}"


def _check_verifiable(reference: str, what: str) -> None:
    """A manifest fetched by digest is checked against it, so its algorithm must be one
    this can compute."""
    algorithm = reference.partition(":")[0]
    if is_digest(reference) and algorithm not in _HASHES:
        raise InvalidInputError(
            f"{what}: cannot verify a {algorithm} digest (only {', '.join(_HASHES)})"
        )


def _check_digest(body: bytes, digest: str, what: str, response: httpx.Response) -> None:
    got = _digest_of(body, digest.partition(":")[0])
    if got != digest:
        raise _bad(f"{what}: content does not match its digest (got {got})", response)


def _check_stated_digest(response: httpx.Response, body: bytes, digest: str, what: str) -> None:
    """Refuse an answer whose ``Docker-Content-Digest`` is not the digest of its bytes."""
    stated = response.headers.get("docker-content-digest", "").strip()
    if not stated:
        return
    if _digest_of(body, stated.partition(":")[0]) != stated:
        raise _bad(
            f"{what}: the registry says Docker-Content-Digest {one_line(stated, 150)!r}, but "
            f"the {len(body)} bytes it sent have digest {digest}",
            response,
        )


def _name(repository: str, reference: str) -> str:
    return f"{repository}@{reference}" if ":" in reference else f"{repository}:{reference}"


def _reason(exc: BaseException) -> str:
    """The OS's words for a failed connection ("Connection refused"); anyio's own message
    for refused connections ("All connection attempts failed") hides them."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            # DNS errors (socket.gaierror) have negative numbers and their own text
            return os.strerror(cause.errno) if cause.errno > 0 else str(cause.strerror)
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__


def _kind(exc: httpx.TimeoutException) -> str:
    return {
        httpx.ConnectTimeout: "connect",
        httpx.ReadTimeout: "read",
        httpx.WriteTimeout: "write",
        httpx.PoolTimeout: "waiting for a connection",
    }.get(type(exc), "timeout")
