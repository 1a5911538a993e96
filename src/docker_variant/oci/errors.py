"""Registry errors: each says what failed and where, on one line.

All of them are ``UnreachableError`` (CLI exit code 3, but for ``BadDocumentError``); the proxy reads ``status``,
``code`` and ``headers`` to answer its caller the way the upstream answered it.
"""

from __future__ import annotations

from typing import Any

import httpx

from docker_variant.errors import (
    MissingError,
    UnauthorizedError,
    UnreachableError,
    login_hint,
    one_line,
)

__all__ = [
    "BadDocumentError",
    "BadUpstreamResponseError",
    "NotFoundError",
    "RateLimitedError",
    "RegistryAuthError",
    "RegistryError",
    "UpstreamUnavailableError",
]


class RegistryError(UnreachableError):
    """The registry refused or failed a request.

    ``status`` is the HTTP status (``None`` when no response came), ``code`` the OCI error
    code of the body (``MANIFEST_UNKNOWN``, ...), ``headers`` the response's headers, so a
    ``WWW-Authenticate`` challenge can be handed back to a caller unchanged.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        headers: httpx.Headers | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(one_line(message))
        self.status = status
        self.code = code
        self.headers = headers if headers is not None else httpx.Headers()
        self.url = url


class RegistryAuthError(RegistryError, UnauthorizedError):
    """401 or 403: no credentials, wrong credentials, or no permission. ``registry`` (the
    ``host[:port]`` whose credentials failed; default the URL's) is named in the hint."""

    def __init__(self, message: str, *, registry: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        host = registry or (httpx.URL(self.url).netloc.decode() if self.url else None)
        self.hint = login_hint(host) if host else None


class NotFoundError(RegistryError, MissingError):
    """404: unknown repository, tag, manifest or blob."""


class UpstreamUnavailableError(RegistryError):
    """No usable answer: connection refused, DNS failure, time-out, 5xx or 429."""


class RateLimitedError(UpstreamUnavailableError):
    """429 beyond what the client waits for: the message names the limit."""


class BadUpstreamResponseError(RegistryError):
    """An answer that is not what the distribution API promises (bad JSON, wrong type)."""


class BadDocumentError(BadUpstreamResponseError):
    """A variant index document from a registry (a proxy's ``_variants`` answer) that is not
    JSON or breaks the document's rules. The CLI exits 2 as for the same document given with
    ``--index``: a malformed document is bad input whoever serves it, and retrying will not
    mend it. Servers still answer it as any bad upstream answer (502)."""

    exit_code = 2
