"""Clients for the read side of the OCI distribution API: ``RegistryClient`` on asyncio,
``SyncRegistryClient`` in the calling thread, with one copy of the reads and their checks.

Only what a variant scan needs: tags, manifests (resolving an index to this host's
platform) and config blobs; on asyncio also blobs and manifest pushes. Every failure
becomes a ``RegistryError`` subclass with a one-line message naming what was fetched and
from where; no httpx or json exception escapes.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import hashlib
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

import httpx

from docker_variant.errors import DockerVariantError, InvalidInputError, one_line
from docker_variant.jsondoc import load_json
from docker_variant.numtext import header_number, is_number
from docker_variant.oci.auth import RegistryAuth, registry_tls_files
from docker_variant.oci.bodies import BodyLimit, TooLarge, aread_bounded, read_bounded
from docker_variant.oci.errcode import ERROR_BODY_LIMIT, ErrorCode, read_error
from docker_variant.oci.errors import (
    BadDocumentError,
    BadUpstreamResponseError,
    NotFoundError,
    RateLimitedError,
    RegistryAuthError,
    RegistryError,
    UpstreamUnavailableError,
)
from docker_variant.oci.extension import EXTENSION, variants_path
from docker_variant.oci.grammar import digest_problem, is_digest
from docker_variant.oci.http import (
    TLSFiles,
    async_client,
    client_tls,
    command_tls,
    sync_client,
    tls_failure,
)
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
from docker_variant.variant.labels import LABEL_PREFIX
from docker_variant.variant.platform import Platform, host_platform

__all__ = [
    "DEFAULT_MAX_PAGES",
    "DEFAULT_RATE_LIMIT_WAIT",
    "DEFAULT_READ_DEADLINE",
    "MAX_PAGES_ENV",
    "READ_DEADLINE_ENV",
    "Manifest",
    "Platform",
    "Read",
    "ReadLimits",
    "RegistryClient",
    "SyncRegistryClient",
    "config_labels",
    "host_platform",
    "read_limits",
    "retry_after",
]

_MANIFEST_LIMIT = 4 << 20  # the distribution spec's minimum a registry must accept
_CONFIG_LIMIT = 32 << 20
_TAGS_LIMIT = 32 << 20
_NO_EXTENSION = frozenset({400, 404, 405})  # how registries answer _variants they lack
_DISCOVER_LIMIT = 64 << 10
#: A client waits out 429s for at most this long in all, and retries at most this often.
DEFAULT_RATE_LIMIT_WAIT = 30.0
_RATE_LIMIT_RETRIES = 3
#: A command's registry reads (``for_registry`` of the sync client: ls, resolve, pull, shell
#: completion) end within this many seconds in all: httpx's time-outs are per socket read, so
#: a registry sending a byte a second, or page after page, would hold a command for ever.
READ_DEADLINE_ENV = "DOCKER_VARIANT_REGISTRY_TIMEOUT"
DEFAULT_READ_DEADLINE = 60.0
#: A tag list is read in at most this many pages (every client: a registry may link a next
#: page for ever).
MAX_PAGES_ENV = "DOCKER_VARIANT_REGISTRY_MAX_PAGES"
DEFAULT_MAX_PAGES = 1000
#: A body larger than this is checked and parsed on a worker thread by ``RegistryClient``,
#: so that the event loop (the proxy's other callers) never waits on one document.
_INLINE_BODY = 64 << 10


@dataclass(frozen=True)
class ReadLimits:
    """What a scan reads of one image: a larger config is refused unread, and labels past
    these bounds make the image invalid before any of them is parsed."""

    config_bytes: int = _CONFIG_LIMIT
    labels: int = 1024
    variant_label_chars: int = 64 << 10  # the values of its dev.pep817.* labels together


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


def config_labels(
    config: Mapping[str, Any], where: str, limits: ReadLimits | None = None
) -> dict[str, str]:
    """``config.Labels`` of an image config; absent or null means no labels. Past
    ``limits`` (by default ``ReadLimits()``) it is refused before any label is parsed."""
    limits = limits or ReadLimits()
    section = config.get("config")
    labels = section.get("Labels") if isinstance(section, dict) else None
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise BadUpstreamResponseError(f"{where}: config.Labels is not an object of strings")
    if len(labels) > limits.labels:
        raise BadUpstreamResponseError(
            f"{where}: config.Labels has {len(labels)} labels; at most {limits.labels} are read"
        )
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise BadUpstreamResponseError(f"{where}: config.Labels is not an object of strings")
    variant_bytes = sum(len(v) for k, v in labels.items() if k.startswith(LABEL_PREFIX))
    if variant_bytes > limits.variant_label_chars:
        raise BadUpstreamResponseError(
            f"{where}: the values of its {LABEL_PREFIX}* labels are {variant_bytes} "
            f"characters; at most {limits.variant_label_chars} are read"
        )
    return labels


@dataclass(frozen=True)
class _Get:
    """One GET a read needs, its body capped at ``limit`` bytes."""

    url: str
    what: str
    limit: int
    headers: Mapping[str, str] | None = None
    params: Mapping[str, str] | None = None


_Answer = tuple[httpx.Response, bytes]
_T = TypeVar("_T")
#: A read: yields each GET it needs, is sent its answer (or has its error thrown in). The
#: clients' ``read_*`` methods make them; ``run_all`` runs several (``oci.scan`` composes
#: its own from them).
Read = Generator[_Get, _Answer, _T]


_Transport = TypeVar("_Transport", httpx.BaseTransport, httpx.AsyncBaseTransport)
#: What a read's runner does next (``_RegistryReads.exchanges``): send a GET, or wait so many
#: seconds before sending it again (a 429).
_Step = _Get | float
#: What came of a step: its answer, ``None`` after a wait, or the error of its GET.
_Outcome = _Answer | Exception | None
_Steps = Generator[_Step, _Answer | None, Any]


class _RegistryReads(Generic[_Transport]):
    """The read side of the distribution API, written once for both clients.

    Each read is a generator that yields the GETs it needs and checks what comes back;
    ``exchanges`` wraps it with the retries and the deadline, and every request's options,
    body bounds and answers are decided here too. The two clients differ only in how they
    carry that out: ``RegistryClient`` on asyncio (concurrent scans, the proxy),
    ``SyncRegistryClient`` in the calling thread (a command's few requests in a row). A
    429 is retried after its ``Retry-After`` while the client's wait budget lasts (public
    registries limit pulls); then, or when the registry asks for a longer wait, it fails
    naming the limit.
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
        transport: _Transport | None = None,
        rate_limit_wait: float = DEFAULT_RATE_LIMIT_WAIT,
        tls: ssl.SSLContext | None = None,
        deadline: float | None = None,
        max_pages: int = DEFAULT_MAX_PAGES,
        limits: ReadLimits | None = None,
    ) -> None:
        """``headers`` go out on every request; ``deadline``: seconds all of this client's
        reads must end within (``None``: no deadline, each request within ``timeout``)."""
        if max_concurrency < 1:
            raise InvalidInputError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if max_pages < 1:
            raise InvalidInputError(f"max_pages must be at least 1, got {max_pages}")
        if deadline is not None and not deadline > 0:
            raise InvalidInputError(f"deadline must be above 0 seconds, got {deadline}")
        self.max_concurrency = max_concurrency
        self.max_pages = max_pages
        self.deadline = deadline
        # the deadline covers every read of the client's life: one command's reads
        self._deadline_at = None if deadline is None else time.monotonic() + deadline
        self.base_url = base_url.rstrip("/")
        self.registry = httpx.URL(self.base_url).netloc.decode("ascii", "replace")
        self.platform = platform or host_platform()
        self.rate_limit_wait = rate_limit_wait
        self._wait_budget = rate_limit_wait
        self.limits = limits or ReadLimits()
        self._timeout = httpx.Timeout(timeout)
        http = {"auth": auth, "headers": headers, "timeout": timeout, "tls": tls}
        self._connect(http, transport)

    def _connect(self, settings: dict[str, Any], transport: _Transport | None) -> None:
        """Make this client's HTTP client from ``settings`` (``oci.http``'s keywords)."""
        raise NotImplementedError

    @classmethod
    def for_registry(cls, registry: str, *, config_path: Path | None = None, **kwargs: Any) -> Self:
        """A client for ``registry`` (``host[:port]``) with Docker's stored credentials and
        the CAs Docker keeps for it (``certs.d``)."""
        return cls(**(_registry_settings(registry, config_path) | cls._bounds() | kwargs))

    @staticmethod
    def _bounds() -> dict[str, Any]:
        """What ``for_registry`` bounds a client's reads with (none: no deadline)."""
        return {}

    def exchanges(self, read: Read[_T]) -> Generator[_Step, _Answer | None, _T]:
        """``read`` as its client carries it out: each GET to send (its answer sent back, or
        its error thrown in: the read decides, a 404 may be an answer) and each wait in
        seconds before a 429 is asked again (``None`` sent back)."""
        done, step = _step(read.send, None)
        while not done:
            try:
                answer = yield from self._attempts(step)
            except Exception as exc:
                done, step = _step(read.throw, exc)
            else:
                done, step = _step(read.send, answer)
        result: _T = step
        return result

    def _attempts(self, get: _Get) -> Generator[_Step, _Answer | None, _Answer]:
        """``get``, sent again after each 429 while the wait budget and deadline allow."""
        for attempt in range(_RATE_LIMIT_RETRIES + 1):
            try:
                answer = yield get
            except UpstreamUnavailableError as exc:
                delay = self._rate_limit_delay(exc, attempt)
                left = self._time_left(get)  # the next attempt fails if the wait outlasts it
                yield delay if left is None else min(delay, left)
            else:
                assert answer is not None
                return answer
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _options(self, get: _Get) -> dict[str, Any]:
        """``stream``'s keywords for ``get``: its headers and query, each time-out capped
        at the deadline."""
        return {"headers": get.headers, "params": get.params, **self._timeout_within(get)}

    def _body_limit(self, get: _Get, response: httpx.Response) -> BodyLimit:
        """How much of ``response``'s body is read: an answer's up to ``get.limit`` (a
        manifest is not a gigabyte), an error's first ``ERROR_BODY_LIMIT`` bytes (enough
        to find its code); the deadline checked between chunks."""
        check = self._check_time(get)
        if not response.is_success:
            too_large = _too_large(get.what, response, ERROR_BODY_LIMIT)
            return BodyLimit(ERROR_BODY_LIMIT, too_large, truncate=True, check=check)
        too_large = _too_large(get.what, response, get.limit)
        declared = response.headers.get("content-length")
        return BodyLimit(get.limit, too_large, declared=declared, check=check)

    @staticmethod
    def _answer(get: _Get, response: httpx.Response, body: bytes) -> _Answer:
        """``response`` and its ``body`` as the read's answer, or the error it says."""
        if not response.is_success:
            raise _status_error(response, body, get.what)
        return response, body

    def _rate_limit_delay(self, exc: UpstreamUnavailableError, attempt: int) -> float:
        """Seconds to wait before retrying after ``exc``; raises when it is no 429 or the
        wait is over the budget or the retries are used up."""
        if exc.status != 429:
            raise exc
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
        return delay

    def _time_left(self, get: _Get) -> float | None:
        """Seconds left before the deadline (``None``: no deadline); raises once it passed."""
        if self._deadline_at is None:
            return None
        left = self._deadline_at - time.monotonic()
        if left <= 0:
            raise UpstreamUnavailableError(
                f"{get.what}: registry {self.registry} not read within {_seconds(self.deadline or 0)}, "
                f"the deadline of a command's registry reads ({READ_DEADLINE_ENV})",
                url=get.url,
            ) from TimeoutError()  # servers report it as a time-out (server.errors.timed_out)
        return left

    def _timeout_within(self, get: _Get) -> dict[str, Any]:
        """``stream``'s keyword for ``get``: each wait of httpx's ``timeout`` capped at the
        time left (every socket read included), so one silent read cannot outlast it."""
        left, timeout = self._time_left(get), self._timeout
        if left is None:
            return {}

        def cap(value: float | None) -> float:
            return left if value is None else min(value, left)

        return {
            "timeout": httpx.Timeout(
                connect=cap(timeout.connect),
                read=cap(timeout.read),
                write=cap(timeout.write),
                pool=cap(timeout.pool),
            )
        }

    def _check_time(self, get: _Get) -> Callable[[], object]:
        """What a body's reader calls between chunks: a drip of a byte a second passes every
        per-read time-out, not the deadline."""
        return lambda: self._time_left(get)

    @staticmethod
    @contextlib.contextmanager
    def _failures(get: _Get) -> Iterator[None]:
        """httpx's failures (no usable answer) of ``get`` as this package's errors."""
        try:
            yield
        except httpx.HTTPError as exc:
            raise _transport_error(exc, get.what, get.url) from exc

    def read_tags(self, repository: str, page_size: int | None) -> Read[list[str]]:
        check_repository(repository)
        what = f"tag list of {repository}"
        url = f"{self.base_url}/v2/{repository}/tags/list"
        params = {"n": str(page_size)} if page_size else None
        tags: dict[str, None] = {}  # ordered set: pages may overlap while tags are pushed
        seen: set[str] = set()
        for _page in range(self.max_pages):
            response, body = yield _Get(url, what, _TAGS_LIMIT, params=params)
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
        raise _bad(
            f"{what}: registry {self.registry} links more than {self.max_pages} pages of tags, "
            f"the most read ({MAX_PAGES_ENV})",
            response,
        )

    def read_platform_manifest(
        self, repository: str, reference: str, platform: Platform | None
    ) -> Read[Manifest]:
        top = yield from self.read_manifest(repository, reference)  # checks both names
        if not top.is_index:
            return top
        digest = _pick_platform(top, platform or self.platform, _name(repository, reference))
        child = yield from self.read_manifest(repository, digest)
        if child.is_index:
            raise BadUpstreamResponseError(
                f"manifest {_name(repository, digest)}: an index inside the index of "
                f"{_name(repository, reference)}; expected an image manifest"
            )
        return replace(child, index_digest=top.digest)

    def read_config(self, repository: str, manifest: Manifest) -> Read[dict[str, Any]]:
        check_repository(repository)
        digest = manifest.config_digest
        what = f"config blob {digest} of {repository}"
        url = f"{self.base_url}/v2/{repository}/blobs/{digest}"
        response, body = yield _Get(url, what, self.limits.config_bytes)
        _check_digest(body, digest, what, response)
        return _json_object(body, what, response)

    def read_labels(self, repository: str, manifest: Manifest) -> Read[dict[str, str]]:
        config = yield from self.read_config(repository, manifest)
        url = f"{self.base_url}/v2/{repository}/blobs/{manifest.config_digest}"
        return config_labels(config, f"config blob {url}", self.limits)

    def read_image_labels(self, repository: str, tag: str) -> Read[tuple[str, dict[str, str]]]:
        manifest = yield from self.read_platform_manifest(repository, tag, None)
        labels = yield from self.read_labels(repository, manifest)
        return manifest.tag_digest, labels

    def read_variant_index(
        self, repository: str, version: str, refresh: bool
    ) -> Read[VariantIndex | None]:
        check_repository(repository)
        check_manifest_reference(version)
        what = f"variant index of {repository}:{version}"
        url = self.base_url + variants_path(repository, version)
        headers = {"Cache-Control": "no-cache"} if refresh else None
        try:
            response, body = yield _Get(url, what, _TAGS_LIMIT, headers=headers)
        except RegistryError as exc:
            # A registry without the extension answers the unknown route as it likes: 404,
            # with an error code or not, 405 or 400. A proxy's own 404 (no such repository
            # or version) is told apart by its discovery answer, which lists _variants.
            if exc.status not in _NO_EXTENSION or (yield from self._lists_variants()):
                raise
            return None
        try:
            # not JSON, or not the document: exit 2, as the same bytes from --index
            return VariantIndex.from_json(load_json(body, what), what)
        except InvalidInputError as exc:
            raise _bad(str(exc), response, BadDocumentError) from exc

    def _lists_variants(self) -> Read[bool]:
        """Whether ``GET /v2/_oci/ext/discover`` lists the ``_variants`` extension (False
        for any error: a registry without discovery has no extension either)."""
        url = f"{self.base_url}/v2/_oci/ext/discover"
        try:
            response, body = yield _Get(url, "extension discovery", _DISCOVER_LIMIT)
            data = _json_object(body, "extension discovery", response)
        except RegistryError:
            return False
        extensions = data.get("extensions")
        return isinstance(extensions, list) and any(
            isinstance(e, dict) and e.get("name") == EXTENSION for e in extensions
        )

    def read_manifest(self, repository: str, reference: str) -> Read[Manifest]:
        check_repository(repository)
        check_manifest_reference(reference)
        what = f"manifest {_name(repository, reference)}"
        _check_verifiable(reference, what)
        response, body = yield _Get(
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


class RegistryClient(_RegistryReads[httpx.AsyncBaseTransport]):
    """The distribution API of one registry (or a proxy in front of it), on asyncio.

    ``headers`` go out on every request: the proxy passes a caller's ``Authorization``
    this way, so the upstream decides what that caller may read. At most
    ``max_concurrency`` requests are in flight at once.
    """

    def _connect(
        self, settings: dict[str, Any], transport: httpx.AsyncBaseTransport | None
    ) -> None:
        import asyncio  # here: the sync client's commands load no asyncio

        self._semaphore = asyncio.Semaphore(self.max_concurrency)
        self._http = async_client(
            base_url=self.base_url,
            follow_redirects=True,  # blobs may live behind a redirect (S3, CDN)
            limits=httpx.Limits(max_connections=self.max_concurrency),
            transport=transport,
            **settings,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def list_tags(self, repository: str, *, page_size: int | None = None) -> list[str]:
        """Every tag, following ``Link: <...>; rel="next"`` pages."""
        return await self.run(self.read_tags(repository, page_size))

    async def get_manifest(
        self, repository: str, reference: str, *, platform: Platform | None = None
    ) -> Manifest:
        """The manifest of a tag or digest; an index resolves to ``platform``'s manifest
        (default: this host's), else the index's first linux one."""
        return await self.run(self.read_platform_manifest(repository, reference, platform))

    async def get_config(self, repository: str, manifest: Manifest) -> dict[str, Any]:
        """The image config blob named by ``manifest``, checked to be a JSON object."""
        return await self.run(self.read_config(repository, manifest))

    async def get_labels(self, repository: str, manifest: Manifest) -> dict[str, str]:
        """``config.Labels`` of the image config that ``manifest`` names."""
        return await self.run(self.read_labels(repository, manifest))

    async def image_labels(self, repository: str, tag: str) -> tuple[str, dict[str, str]]:
        """``(digest the tag points at, config.Labels)``."""
        return await self.run(self.read_image_labels(repository, tag))

    async def get_variant_index(
        self, repository: str, version: str, *, refresh: bool = False
    ) -> VariantIndex | None:
        """The proxy's ``/v2/<name>/_variants/<version>`` document; ``None`` when the
        registry has no such extension (a plain 404 without an OCI error code).
        ``refresh`` asks a caching proxy for a fresh document (``Cache-Control: no-cache``)."""
        return await self.run(self.read_variant_index(repository, version, refresh))

    async def fetch_manifest(self, repository: str, reference: str) -> Manifest:
        """The manifest or index at ``reference`` as it is (no platform resolution)."""
        return await self.run(self.read_manifest(repository, reference))

    async def stream_blob(
        self, repository: str, digest: str, *, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        """A blob's bytes as they arrive (a layer of gigabytes is never held), checked
        against ``digest`` once the last chunk is in: a mismatch raises after it."""
        check_repository(repository)
        if digest_problem(digest) or not digest.startswith("sha256:"):
            raise InvalidInputError(f"blob {digest!r} of {repository}: only sha256 digests")
        what = f"blob {digest} of {repository}"
        get = _Get(f"{self.base_url}/v2/{repository}/blobs/{digest}", what, 0)
        hasher = hashlib.sha256()
        async with self._semaphore:
            with self._failures(get):
                async with self._http.stream("GET", get.url) as response:
                    if not response.is_success:
                        bound = self._body_limit(get, response)
                        self._answer(
                            get, response, await aread_bounded(response.aiter_bytes(), bound)
                        )
                    async for chunk in response.aiter_bytes(chunk_size):
                        hasher.update(chunk)
                        yield chunk
                    if "sha256:" + hasher.hexdigest() != digest:
                        raise _bad(f"{what}: content does not match its digest", response)

    async def put_manifest(
        self, repository: str, reference: str, body: bytes, media_type: str
    ) -> str:
        """PUT a manifest (or index) at a tag; returns the digest the registry reports."""
        check_repository(repository)
        check_manifest_reference(reference)
        url = f"{self.base_url}/v2/{repository}/manifests/{reference}"
        what = f"push of manifest {_name(repository, reference)}"
        async with self._semaphore:
            with self._failures(_Get(url, what, 0)):
                response = await self._http.put(
                    url, content=body, headers={"Content-Type": media_type}
                )
            if not response.is_success:
                raise _status_error(response, response.content[:ERROR_BODY_LIMIT], what)
        digest = _sha256(body)
        _check_stated_digest(response, body, digest, what)
        return digest

    async def run(self, read: Read[_T]) -> _T:
        """Carry out one read (``read_*``) on asyncio."""
        steps = self.exchanges(read)
        done, step = _step(steps.send, None)
        while not done:
            outcome = await self._carry_out(step)
            if isinstance(outcome, tuple) and len(outcome[1]) > _INLINE_BODY:
                # a big document is checked and parsed off the event loop
                from docker_variant.oci.offload import off_loop

                done, step = await off_loop(_resume, steps, outcome)
            else:
                done, step = _resume(steps, outcome)
        result: _T = step
        return result

    async def _carry_out(self, step: _Step) -> _Outcome:
        import asyncio

        if isinstance(step, float):
            await asyncio.sleep(step)
            return None
        try:
            return await self._get(step)
        except Exception as exc:  # thrown into the read, which decides
            return exc

    async def run_all(self, reads: Sequence[Read[_T]]) -> list[_T]:
        """Run ``reads`` concurrently (at most ``max_concurrency`` requests in flight), their
        results in order; the first error stops the others and is raised."""
        import asyncio

        tasks = [asyncio.ensure_future(self.run(read)) for read in reads]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            # gather leaves the other reads running; stop them before raising
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _get(self, get: _Get) -> _Answer:
        with self._failures(get):
            async with (
                self._semaphore,
                self._http.stream("GET", get.url, **self._options(get)) as r,
            ):
                body = await aread_bounded(r.aiter_bytes(), self._body_limit(get, r))
                return self._answer(get, r, body)


class SyncRegistryClient(_RegistryReads[httpx.BaseTransport]):
    """The same reads as ``RegistryClient``, one request at a time in the calling thread,
    over httpx's sync client: for a command that makes a few requests in a row (``pull``
    and ``resolve`` fetching a published or proxied index), which then loads neither
    asyncio nor anyio and shares one HTTP stack with the engine client. ``run_all`` runs
    many reads (a tag scan) on up to ``max_concurrency`` threads. ``for_registry`` bounds
    its reads as a command's are (``read_limits``)."""

    def _connect(self, settings: dict[str, Any], transport: httpx.BaseTransport | None) -> None:
        self._http = sync_client(
            base_url=self.base_url,
            follow_redirects=True,  # blobs may live behind a redirect (S3, CDN)
            transport=transport,
            **settings,
        )

    @staticmethod
    def _bounds() -> dict[str, Any]:
        deadline, max_pages = read_limits()
        return {"deadline": deadline, "max_pages": max_pages}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def list_tags(self, repository: str, *, page_size: int | None = None) -> list[str]:
        """Every tag, following ``Link: <...>; rel="next"`` pages."""
        return self.run(self.read_tags(repository, page_size))

    def get_manifest(
        self, repository: str, reference: str, *, platform: Platform | None = None
    ) -> Manifest:
        """As ``RegistryClient.get_manifest``."""
        return self.run(self.read_platform_manifest(repository, reference, platform))

    def get_config(self, repository: str, manifest: Manifest) -> dict[str, Any]:
        """As ``RegistryClient.get_config``."""
        return self.run(self.read_config(repository, manifest))

    def get_labels(self, repository: str, manifest: Manifest) -> dict[str, str]:
        """As ``RegistryClient.get_labels``."""
        return self.run(self.read_labels(repository, manifest))

    def image_labels(self, repository: str, tag: str) -> tuple[str, dict[str, str]]:
        """As ``RegistryClient.image_labels``."""
        return self.run(self.read_image_labels(repository, tag))

    def get_variant_index(
        self, repository: str, version: str, *, refresh: bool = False
    ) -> VariantIndex | None:
        """As ``RegistryClient.get_variant_index``."""
        return self.run(self.read_variant_index(repository, version, refresh))

    def fetch_manifest(self, repository: str, reference: str) -> Manifest:
        """As ``RegistryClient.fetch_manifest``."""
        return self.run(self.read_manifest(repository, reference))

    def run(self, read: Read[_T]) -> _T:
        """Carry out one read (``read_*``) in this thread."""
        steps = self.exchanges(read)
        done, step = _step(steps.send, None)
        while not done:
            done, step = _resume(steps, self._carry_out(step))
        result: _T = step
        return result

    def _carry_out(self, step: _Step) -> _Outcome:
        if isinstance(step, float):
            time.sleep(step)
            return None
        try:
            return self._get(step)
        except Exception as exc:  # thrown into the read, which decides
            return exc

    def run_all(self, reads: Sequence[Read[_T]]) -> list[_T]:
        """Run ``reads`` on up to ``max_concurrency`` threads sharing this client's
        connections, their results in order; the first error cancels the reads not started
        yet and is raised once the running ones are done."""
        if self.max_concurrency == 1 or len(reads) < 2:
            return [self.run(read) for read in reads]
        from concurrent.futures import ThreadPoolExecutor

        workers = min(self.max_concurrency, len(reads))
        with ThreadPoolExecutor(workers, thread_name_prefix="registry-read") as pool:
            futures = [pool.submit(self.run, read) for read in reads]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def _get(self, get: _Get) -> _Answer:
        with self._failures(get), self._http.stream("GET", get.url, **self._options(get)) as r:
            return self._answer(get, r, read_bounded(r.iter_bytes(), self._body_limit(get, r)))


def read_limits() -> tuple[float, int]:
    """A command's bounds on its registry reads: ``(deadline in seconds, pages of a tag
    list)``, from ``READ_DEADLINE_ENV`` and ``MAX_PAGES_ENV`` or their defaults."""
    deadline = os.environ.get(READ_DEADLINE_ENV, "").strip()
    pages = os.environ.get(MAX_PAGES_ENV, "").strip()
    whole, dot, fraction = deadline.partition(".")
    if deadline and not (
        is_number(whole) and (not dot or is_number(fraction)) and float(deadline) > 0
    ):
        raise InvalidInputError(
            f"{READ_DEADLINE_ENV}={one_line(deadline, 40)!r}: expected seconds above 0, "
            "such as 60 or 2.5"
        )
    if pages and not (is_number(pages) and int(pages) >= 1):
        raise InvalidInputError(
            f"{MAX_PAGES_ENV}={one_line(pages, 40)!r}: expected a whole number of pages, 1 or more"
        )
    return (
        float(deadline) if deadline else DEFAULT_READ_DEADLINE,
        int(pages) if pages else DEFAULT_MAX_PAGES,
    )


def _step(resume: Callable[[Any], Any], value: Any) -> tuple[bool, Any]:
    """Resume a read: ``(False, its next GET)`` or ``(True, its result)``; StopIteration,
    which cannot cross a thread's future, is turned into the second."""
    try:
        return False, resume(value)
    except StopIteration as finished:
        return True, finished.value


def _resume(steps: _Steps, outcome: _Outcome) -> tuple[bool, Any]:
    """Hand ``outcome`` to ``steps`` (an error is thrown in): as ``_step``."""
    if isinstance(outcome, Exception):
        return _step(steps.throw, outcome)
    return _step(steps.send, outcome)


def _registry_settings(registry: str, config_path: Path | None) -> dict[str, Any]:
    """Base URL, Docker's stored credentials, and what ``certs.d`` and the command's
    ``--ca-file``/``--client-cert`` say to trust and present, for ``registry``."""
    settings: dict[str, Any] = {"auth": RegistryAuth.from_docker_config(registry, config_path)}
    docker = registry_tls_files(registry)
    if docker:
        client_tls(docker)  # a bad certs.d file is named as certs.d's
        settings["tls"] = client_tls(_with_command_tls(docker))
    settings["base_url"] = registry_base_url(registry, tls=bool(docker))
    return settings


def _with_command_tls(docker: TLSFiles) -> TLSFiles:
    """certs.d's files and the command's: both CAs trusted; the command's client
    certificate, if it gives one, presented rather than certs.d's."""
    given = command_tls()
    if given.client_cert is not None:
        return TLSFiles((*given.ca_files, *docker.ca_files), given.client_cert, given.client_key)
    cas = (*given.ca_files, *docker.ca_files)
    return TLSFiles(cas, docker.client_cert, docker.client_key, names=docker.names)


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
    seconds = header_number(value)  # delta-seconds: ASCII digits only (not "²")
    if seconds is not None:
        return float(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return 1.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _too_large(what: str, response: httpx.Response, limit: int) -> TooLarge:
    """The error for an answer's body over ``limit`` bytes (``oci.bodies``)."""

    def error(declared: str | None) -> BadUpstreamResponseError:
        if declared is not None:
            return _bad(f"{what}: {declared} bytes is more than the {limit} allowed", response)
        return _bad(f"{what}: more than the {limit} bytes allowed", response)

    return error


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


def _bad(
    message: str,
    response: httpx.Response,
    cls: type[BadUpstreamResponseError] = BadUpstreamResponseError,
) -> BadUpstreamResponseError:
    url = str(response.url)
    return cls(
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
    # It goes into a blob URL: the grammar first, as for every other part of a URL.
    stated = str(config["digest"])
    if digest_problem(stated) or not stated.startswith("sha256:"):
        raise _bad(f"{what}: config digest {one_line(stated, 150)!r} is not sha256", response)
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
    handshake = tls_failure(exc)
    if handshake is not None:
        if "certificate verify failed" in handshake:
            hint = (
                f"trusting {command_tls().describe()}; give --ca-file, or certs.d/HOST:PORT/ca.crt"
            )
        else:
            hint = "if it asks for a client certificate: --client-cert, or certs.d/HOST:PORT/client.cert"
        return f"TLS: {handshake} ({hint})"
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
