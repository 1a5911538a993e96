"""Registry credentials from Docker's ``config.json`` and the distribution auth flows.

``RegistryAuth`` answers a 401 the way Docker does: Basic when challenged with
``Basic``, and the token flow (``GET realm?service=&scope=``) when challenged with
``Bearer``. Tokens are cached per scope, and a host's challenge is remembered, so after
the first request of a scan every later one goes out already authorised.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import subprocess
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from docker_variant.errors import InvalidInputError
from docker_variant.jsondoc import load_json, read_json_stream
from docker_variant.oci.bodies import BodyLimit
from docker_variant.oci.credcache import once_per_command
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import BadUpstreamResponseError, RegistryAuthError
from docker_variant.oci.http import USER_AGENT, TLSFiles

__all__ = [
    "DOCKER_CERTS_DIR",
    "Credentials",
    "RegistryAuth",
    "docker_config_path",
    "load_credentials",
    "parse_challenge",
    "registry_tls_files",
]

# Docker stores Hub credentials under its v1 index address, for helpers and auths alike.
_HUB_SERVER = "https://index.docker.io/v1/"
_HUB_KEYS = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
_HELPER_TIMEOUT_S = 30
_TOKEN_MARK = "docker_variant_token_request"  # request extension: read this response's body
_DEFAULT_TOKEN_LIFETIME_S = 60  # the token spec's default when expires_in is absent
_CONFIG_LIMIT = 16 << 20  # a Docker config or a helper's answer
_TOKEN_LIMIT = 1 << 20  # a token answer (JWTs are kilobytes)


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = None
    identity_token: str | None = None  # an OAuth2 refresh token (``docker login`` via SSO)

    def basic_header(self) -> str | None:
        if self.username is None or self.password is None:
            return None
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def docker_config_path() -> Path:
    """``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``, as Docker reads it."""
    root = os.environ.get("DOCKER_CONFIG")
    return (Path(root) if root else Path.home() / ".docker") / "config.json"


#: Where the Docker engine keeps each registry's CAs and client certificate; a module
#: constant so that tests can point it elsewhere.
DOCKER_CERTS_DIR = Path("/etc/docker/certs.d")


def registry_tls_files(registry: str) -> TLSFiles:
    """What Docker trusts and presents for ``registry``: ``certs.d/<host:port>/`` under
    ``$DOCKER_CONFIG`` (or ``~/.docker``) and under ``/etc/docker``, read as the engine reads
    it: ``*.crt`` are CAs (besides the system's), ``NAME.cert`` a client certificate whose key
    is ``NAME.key``. A registry with any is spoken to over HTTPS, loopback too."""
    roots = [docker_config_path().parent / "certs.d", DOCKER_CERTS_DIR]
    cas: list[str] = []
    pairs: list[tuple[str, str]] = []
    for root in roots:
        folder = root / registry
        with contextlib.suppress(OSError):
            files = sorted(p for p in folder.iterdir() if p.is_file())
            cas += [str(p) for p in files if p.suffix == ".crt"]
            pairs += _client_pairs(files)
    cert, key = pairs[0] if pairs else (None, None)
    return TLSFiles(tuple(cas), cert, key, names=_CERTS_D_NAMES)


_CERTS_D_NAMES = ("certs.d CA", "certs.d client certificate", "certs.d client key")


def _client_pairs(files: list[Path]) -> list[tuple[str, str]]:
    """certs.d's ``NAME.cert``/``NAME.key`` pairs; half a pair is an error, as Docker's."""
    names = {p.name for p in files}
    pairs: list[tuple[str, str]] = []
    for path in files:
        if path.suffix == ".cert":
            key = path.with_suffix(".key")
            if key.name not in names:
                raise InvalidInputError(
                    f"missing key {str(key)!r} for client certificate {str(path)!r}"
                )
            pairs.append((str(path), str(key)))
        elif path.suffix == ".key" and path.with_suffix(".cert").name not in names:
            raise InvalidInputError(
                f"missing client certificate {str(path.with_suffix('.cert'))!r} for key {str(path)!r}"
            )
    return pairs


def load_credentials(registry: str, config_path: Path | None = None) -> Credentials | None:
    """The credentials Docker would use for ``registry``; ``None`` when it has none (read
    once within ``credentials_once``)."""
    path = config_path or docker_config_path()
    return once_per_command((registry, path), lambda: _read_credentials(registry, path))


def _read_credentials(registry: str, path: Path) -> Credentials | None:
    what = f"{path}: unreadable Docker config"
    try:
        with path.open("rb") as handle:
            config = read_json_stream(handle, what, max_bytes=_CONFIG_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidInputError(f"{what}: {exc.strerror or type(exc).__name__}") from exc
    if not isinstance(config, dict):
        raise InvalidInputError(f"{path}: a Docker config must be a JSON object")

    hub = registry in _HUB_KEYS
    server = _HUB_SERVER if hub else registry
    helpers = config.get("credHelpers")
    helper = helpers.get(registry) if isinstance(helpers, dict) else None
    helper = helper or config.get("credsStore")
    if isinstance(helper, str) and helper:
        found = _from_helper(helper, server)
        if found is not None:
            return found
    auths = config.get("auths")
    if not isinstance(auths, dict):
        return None
    keys = _HUB_KEYS if hub else {registry}
    for key, entry in auths.items():
        if (key in keys or _hostname(key) in keys) and isinstance(entry, dict):
            return _from_auths_entry(entry, f"{path}: auths[{key!r}]")
    return None


def _hostname(key: str) -> str:
    # Docker's ConvertToHostname: "https://host:5000/v1/" -> "host:5000"
    return key.removeprefix("https://").removeprefix("http://").partition("/")[0]


def _from_auths_entry(entry: dict[str, Any], where: str) -> Credentials | None:
    username, password = entry.get("username"), entry.get("password")
    encoded = entry.get("auth")
    if isinstance(encoded, str) and encoded:
        try:
            decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"{where}.auth: not base64 of user:password") from exc
        username, colon, password = decoded.partition(":")
        if not colon:
            raise InvalidInputError(f"{where}.auth: decodes to no 'user:password' pair")
    token = entry.get("identitytoken")
    creds = Credentials(
        username if isinstance(username, str) and username else None,
        password if isinstance(password, str) else None,
        token if isinstance(token, str) and token else None,
    )
    return None if creds == Credentials() else creds


def _from_helper(name: str, server: str) -> Credentials | None:
    """``docker-credential-<name> get``; a missing or failing helper means no credentials."""
    try:
        done = subprocess.run(
            [f"docker-credential-{name}", "get"],
            input=server,
            capture_output=True,
            text=True,
            timeout=_HELPER_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None  # "credentials not found in native keychain"
    try:
        data = load_json(done.stdout, f"docker-credential-{name} get", max_bytes=_CONFIG_LIMIT)
    except InvalidInputError:
        return None
    if not isinstance(data, dict):
        return None
    username, secret = data.get("Username"), data.get("Secret")
    if not isinstance(secret, str) or not secret:
        return None
    if username == "<token>":  # how helpers hand back an identity token
        return Credentials(identity_token=secret)
    return Credentials(username if isinstance(username, str) else None, secret)


_PARAM_RE = re.compile(r'([A-Za-z_][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


def parse_challenge(values: list[str]) -> tuple[str, dict[str, str]] | None:
    """The first Bearer (else Basic) challenge of ``WWW-Authenticate`` headers."""
    found: list[tuple[str, dict[str, str]]] = []
    for value in values:
        scheme, _, rest = value.strip().partition(" ")
        params = {
            m.group(1).lower(): m.group(2).replace('\\"', '"')
            if m.group(2) is not None
            else m.group(3)
            for m in _PARAM_RE.finditer(rest)
        }
        found.append((scheme.lower(), params))
    for wanted in ("bearer", "basic"):
        for scheme, params in found:
            if scheme == wanted:
                return scheme, params
    return None


_SCOPE_PATH_RE = re.compile(r"/v2/(.+?)/(?:manifests/[^/]+|blobs/uploads/.*|blobs/[^/]+|tags/list)")


def _guess_scope(request: httpx.Request) -> str | None:
    """The scope a registry will ask for, so a cached token can go out before any 401."""
    match = _SCOPE_PATH_RE.fullmatch(request.url.path)
    if match is None:
        return None
    actions = "pull" if request.method in ("GET", "HEAD") else "pull,push"
    return f"repository:{match.group(1)}:{actions}"


@dataclass(frozen=True)
class _Realm:
    realm: str
    service: str | None


class RegistryAuth(httpx.Auth):
    """Basic and Bearer-token auth for one registry's credentials (or none: anonymous)."""

    def __init__(
        self,
        credentials: Credentials | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.credentials = credentials
        self._clock = clock
        self._basic_hosts: set[str] = set()
        self._realms: dict[str, _Realm] = {}
        self._tokens: dict[tuple[_Realm, str], tuple[str, float]] = {}

    @classmethod
    def from_docker_config(cls, registry: str, config_path: Path | None = None) -> RegistryAuth:
        return cls(load_credentials(registry, config_path))

    # httpx reads response bodies for an auth flow only if asked to, for every response;
    # read just the token endpoint's answers, so that blob downloads still stream. httpx
    # reads every answer the flow replaces (a 401) whole: both are bounded first.
    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
        flow = self.auth_flow(request)
        outgoing = next(flow)
        while True:
            response = yield outgoing
            if outgoing.extensions.get(_TOKEN_MARK):
                _bound(response).read()
            try:
                outgoing = flow.send(response)
            except StopIteration:
                return
            _bound(response)

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        flow = self.auth_flow(request)
        outgoing = next(flow)
        while True:
            response = yield outgoing
            if outgoing.extensions.get(_TOKEN_MARK):
                await _bound(response).aread()
            try:
                outgoing = flow.send(response)
            except StopIteration:
                return
            _bound(response)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if "Authorization" in request.headers:
            yield request  # a caller's own credentials, passed through untouched
            return
        host = request.url.netloc.decode("ascii")
        basic = self.credentials.basic_header() if self.credentials else None
        realm, scope = self._realms.get(host), _guess_scope(request)
        if realm is not None and scope is not None:
            token = self._cached(realm, scope)
            if token is None:
                token = yield from self._fetch_token(request, realm, scope, None)
            request.headers["Authorization"] = f"Bearer {token}"
        elif basic is not None and host in self._basic_hosts:
            request.headers["Authorization"] = basic

        response = yield request
        if response.status_code != 401:
            return
        challenge = parse_challenge(response.headers.get_list("www-authenticate"))
        if challenge is None:
            return
        scheme, params = challenge
        if scheme == "basic":
            if basic is None or request.headers.get("Authorization") == basic:
                return  # nothing (new) to offer: the caller sees the 401
            self._basic_hosts.add(host)
            request.headers["Authorization"] = basic
        else:
            if "realm" not in params:
                return
            realm = _Realm(params["realm"], params.get("service"))
            self._realms[host] = realm
            scope = params.get("scope") or scope or ""
            token = yield from self._fetch_token(request, realm, scope, response)
            request.headers["Authorization"] = f"Bearer {token}"
        yield request

    def _cached(self, realm: _Realm, scope: str) -> str | None:
        hit = self._tokens.get((realm, scope))
        if hit is None or hit[1] <= self._clock():
            return None
        return hit[0]

    def _fetch_token(
        self,
        original: httpx.Request,
        realm: _Realm,
        scope: str,
        challenged: httpx.Response | None,
    ) -> Generator[httpx.Request, httpx.Response, str]:
        creds = self.credentials
        query = httpx.QueryParams([("scope", s) for s in scope.split()])
        if realm.service:
            query = query.add("service", realm.service)
        extensions: dict[str, Any] = {_TOKEN_MARK: True}
        if "timeout" in original.extensions:  # without it httpcore would wait forever
            extensions["timeout"] = original.extensions["timeout"]
        # A flow's requests skip the client's own headers; the body is counted as sent.
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if creds is not None and creds.identity_token:
            # OAuth2 refresh-token grant, as Docker does for SSO logins
            form = {
                "grant_type": "refresh_token",
                "client_id": "docker-variant",
                "refresh_token": creds.identity_token,
                "scope": scope,
                "service": realm.service or "",
            }
            token_request = httpx.Request(
                "POST", realm.realm, data=form, headers=headers, extensions=extensions
            )
        else:
            if creds is not None and (basic := creds.basic_header()):
                headers["Authorization"] = basic
            token_request = httpx.Request(
                "GET", realm.realm, params=query, headers=headers, extensions=extensions
            )
        response = yield token_request
        where = f"token endpoint {realm.realm}"
        if response.status_code in (401, 403):
            headers_for_caller = challenged.headers if challenged is not None else response.headers
            raise RegistryAuthError(
                f"{where} refused credentials for scope {scope!r} ({response.status_code})",
                status=response.status_code,
                code=ErrorCode.UNAUTHORIZED if response.status_code == 401 else ErrorCode.DENIED,
                headers=headers_for_caller,
                url=str(token_request.url),
                # the token endpoint may be elsewhere: the login is the registry's
                registry=challenged.url.netloc.decode() if challenged is not None else None,
            )
        token, lifetime = _read_token(response, where)
        self._tokens[(realm, scope)] = (token, self._clock() + max(lifetime - 10, 1))
        return token


class _BoundedStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that raises once more than ``_TOKEN_LIMIT`` bytes have come."""

    def __init__(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, url: str) -> None:
        self._stream = stream
        self._url = url

    def _limit(self) -> BodyLimit:
        def too_large(declared: str | None) -> BadUpstreamResponseError:
            return BadUpstreamResponseError(
                f"{self._url} answered more than the {_TOKEN_LIMIT} bytes read of a token or "
                "a challenge",
                url=self._url,
            )

        return BodyLimit(_TOKEN_LIMIT, too_large)

    def __iter__(self) -> Iterator[bytes]:
        assert isinstance(self._stream, httpx.SyncByteStream)
        yield from self._limit().takes(self._stream)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert isinstance(self._stream, httpx.AsyncByteStream)
        async for chunk in self._limit().atakes(self._stream):
            yield chunk

    def close(self) -> None:
        if isinstance(self._stream, httpx.SyncByteStream):
            self._stream.close()

    async def aclose(self) -> None:
        if isinstance(self._stream, httpx.AsyncByteStream):
            await self._stream.aclose()


def _bound(response: httpx.Response) -> httpx.Response:
    """``response`` with its body (not read yet) limited to ``_TOKEN_LIMIT`` bytes."""
    if not response.is_stream_consumed and not isinstance(response.stream, _BoundedStream):
        response.stream = _BoundedStream(response.stream, str(response.request.url))
    return response


def _read_token(response: httpx.Response, where: str) -> tuple[str, int]:
    if response.status_code != 200:
        raise BadUpstreamResponseError(
            f"{where} answered {response.status_code} instead of a token",
            status=response.status_code,
            url=str(response.request.url),
        )
    try:
        data = load_json(response.content, "token", max_bytes=_TOKEN_LIMIT)
    except InvalidInputError as exc:
        raise BadUpstreamResponseError(
            f"{where} answered a token that is not JSON: {exc}", url=str(response.request.url)
        ) from exc
    if not isinstance(data, dict):
        data = {}
    token = data.get("token") or data.get("access_token")
    if not isinstance(token, str):
        raise BadUpstreamResponseError(
            f"{where} answered JSON without 'token' or 'access_token'",
            url=str(response.request.url),
        )
    lifetime = data.get("expires_in")
    if not isinstance(lifetime, int) or lifetime <= 0:
        lifetime = _DEFAULT_TOKEN_LIFETIME_S
    return token, lifetime
