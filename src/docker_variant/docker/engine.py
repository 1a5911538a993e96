"""A small Docker Engine API client (httpx over the engine's socket).

Only what ``docker variant`` needs: ping, inspect, build, pull, tag, push, remove a tag. The engine
is found as the Docker CLI finds it: ``DOCKER_HOST``, else ``DOCKER_CONTEXT`` or the config's
``currentContext``, else ``unix:///var/run/docker.sock``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from docker_variant.errors import (
    InvalidInputError,
    MissingError,
    UnauthorizedError,
    UnreachableError,
    login_hint,
    one_line,
)
from docker_variant.jsondoc import load_json, read_json_file
from docker_variant.oci.auth import docker_config_path, load_credentials
from docker_variant.oci.http import sync_client, sync_transport

__all__ = [
    "Engine",
    "EngineAuthError",
    "EngineError",
    "EngineNotFoundError",
    "ProgressEvent",
    "engine_host",
]

DEFAULT_HOST = "unix:///var/run/docker.sock"
_META_LIMIT = 16 << 20  # a context's meta.json, the Docker config
_ERROR_LIMIT = 64 << 10  # enough of an error answer for its message
_EVENT_LIMIT = 1 << 20  # one line of a pull, push or build progress stream
ProgressEvent = dict[str, Any]


class EngineError(UnreachableError):
    """The engine is unreachable, or refused or failed an operation (exit code 3)."""


class EngineNotFoundError(EngineError, MissingError):
    """The engine, or the registry behind it, has no such image, tag or repository."""


class EngineAuthError(EngineError, UnauthorizedError):
    """The registry behind the engine refused its credentials, or their absence."""


# What the engine relays from a registry, by the words the engine and distribution use:
# "no basic auth credentials", "unauthorized: authentication required", "denied: requested
# access to the resource is denied"; "manifest unknown", "name unknown", "... not found".
_REFUSED = re.compile(r"no basic auth credentials|unauthorized|authentication required|denied")
_UNKNOWN = re.compile(r"not found|manifest unknown|name unknown|does not exist|no such image")


def engine_error(message: str, status: int | None, registry: str | None) -> EngineError:
    """The error for a failed engine operation: refused credentials (the hint names
    ``docker login`` for ``registry``), something missing, or any other failure."""
    lowered = message.lower()
    if status in (401, 403) or _REFUSED.search(lowered):
        refused = EngineAuthError(message)
        refused.hint = login_hint(registry) if registry else None
        return refused
    if status == 404 or _UNKNOWN.search(lowered):
        return EngineNotFoundError(message)
    return EngineError(message)


def _context_host(name: str) -> str:
    if name == "default":
        return os.environ.get("DOCKER_HOST") or DEFAULT_HOST
    root = (
        docker_config_path().parent
        / "contexts"
        / "meta"
        / hashlib.sha256(name.encode()).hexdigest()
    )
    try:
        meta = read_json_file(root / "meta.json", f"docker context {name!r}", max_bytes=_META_LIMIT)
        host = meta["Endpoints"]["docker"]["Host"]
    except InvalidInputError as exc:
        raise InvalidInputError(f"{exc} (cannot read its endpoint)") from exc
    except (KeyError, TypeError) as exc:
        raise InvalidInputError(
            f"docker context {name!r}: cannot read its endpoint ({exc!r} missing)"
        ) from exc
    if not isinstance(host, str):
        raise InvalidInputError(f"docker context {name!r}: endpoint host is not a string")
    return host


def engine_host() -> str:
    if host := os.environ.get("DOCKER_HOST"):
        return host
    context = os.environ.get("DOCKER_CONTEXT")
    if not context:
        try:
            config = read_json_file(docker_config_path(), "Docker config", max_bytes=_META_LIMIT)
            context = config.get("currentContext") if isinstance(config, dict) else None
        except InvalidInputError:
            context = None
    return _context_host(context) if context else DEFAULT_HOST


def _registry_auth_header(registry: str) -> dict[str, str]:
    creds = load_credentials(registry)
    if creds is None:
        return {}
    payload: dict[str, str] = {"serveraddress": registry}
    if creds.identity_token:
        payload["identitytoken"] = creds.identity_token
    else:
        payload |= {"username": creds.username or "", "password": creds.password or ""}
    encoded = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
    return {"X-Registry-Auth": encoded}


class Engine:
    def __init__(self, host: str | None = None, timeout: float = 30.0) -> None:
        self.host = host or engine_host()
        # Both are plain HTTP (TLS engines are not supported). httpx builds a TLS context for
        # any transport (verify=False too); the factory's is the process's one, whose trust
        # store is read only by a handshake that this engine never makes.
        if self.host.startswith("unix://"):
            transport = sync_transport(uds=self.host.removeprefix("unix://"))
            base = "http://docker"
        elif self.host.startswith(("tcp://", "http://")):
            transport = sync_transport()
            base = "http://" + self.host.split("://", 1)[1]
        else:
            raise InvalidInputError(
                f"DOCKER_HOST {self.host!r}: only unix:// and tcp:// (plain) engines are supported"
            )
        # Pull and push streams can be silent for long while a big layer moves: no read timeout.
        self._http = sync_client(
            transport=transport,
            base_url=base,
            timeout=httpx.Timeout(timeout, read=None),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise EngineError(
                f"Docker engine at {self.host} is not reachable ({exc or type(exc).__name__})"
            ) from exc
        return response

    def _fail(
        self,
        response: httpx.Response,
        what: str,
        body: bytes | None = None,
        registry: str | None = None,
    ) -> EngineError:
        """The engine's ``{"message": ...}`` of a failed request, on one line (an operation
        on ``registry``: a refusal names it in the hint)."""
        body = response.content[:_ERROR_LIMIT] if body is None else body
        try:
            data = load_json(body, what)
            message = data.get("message") if isinstance(data, dict) else None
        except InvalidInputError:
            message = None
        if not isinstance(message, str):
            message = body.decode("utf-8", "replace")
        text = f"{what}: {_first_line(message) or response.status_code}"
        return engine_error(text, response.status_code, registry)

    def ping(self) -> None:
        response = self._request("GET", "/_ping")
        if response.status_code != 200:
            raise self._fail(response, f"Docker engine at {self.host}")

    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        response = self._request("GET", f"/images/{quote(ref, safe='')}/json")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._fail(response, f"inspect {ref}")
        data = load_json(response.content, f"the engine's inspection of {ref}")
        if not isinstance(data, dict):
            raise EngineError(f"inspect {ref}: the engine answered JSON that is not an object")
        return data

    def _stream(
        self,
        method: str,
        path: str,
        what: str,
        on_event: Callable[[ProgressEvent], None],
        registry: str | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if response.status_code != 200:
                    raise self._fail(response, what, _head(response.iter_bytes()), registry)
                for event in _json_lines(response.iter_bytes()):
                    if "error" in event:
                        details = event.get("errorDetail")
                        detail = details.get("message") if isinstance(details, dict) else None
                        detail = _first_line(str(detail or event["error"]))
                        raise engine_error(f"{what}: {detail or 'failed'}", None, registry)
                    on_event(event)
        except httpx.TransportError as exc:
            raise EngineError(
                f"{what}: connection to the Docker engine lost ({exc or type(exc).__name__})"
            ) from exc

    def pull(
        self,
        repository: str,
        tag_or_digest: str,
        registry: str,
        on_event: Callable[[ProgressEvent], None],
        platform: str | None = None,
    ) -> None:
        """Pull ``repository:tag`` or ``repository@digest`` (``repository`` includes the
        registry); ``platform`` (``os/arch[/variant]``) is the image's, as ``docker pull
        --platform``."""
        params = {"fromImage": repository, "tag": tag_or_digest}
        if platform:
            params["platform"] = platform
        self._stream(
            "POST",
            "/images/create",
            f"pull {repository}{'@' if ':' in tag_or_digest else ':'}{tag_or_digest}",
            on_event,
            registry,
            params=params,
            headers=_registry_auth_header(registry),
        )

    def push(
        self, repository: str, tag: str, registry: str, on_event: Callable[[ProgressEvent], None]
    ) -> None:
        self._stream(
            "POST",
            f"/images/{quote(repository, safe='')}/push",
            f"push {repository}:{tag}",
            on_event,
            registry,
            params={"tag": tag},
            headers=_registry_auth_header(registry) or {"X-Registry-Auth": "e30="},  # "{}"
        )

    def build(
        self,
        context: bytes,
        tag: str,
        on_event: Callable[[ProgressEvent], None],
        *,
        dockerfile: str = "Dockerfile",
        build_args: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        platform: str | None = None,
    ) -> str:
        """Build ``context`` (a tar archive) with the engine's builder and tag it ``tag``;
        returns the image ID. The build uses the host's network, as ``--network=host``."""
        params = {
            "t": tag,
            "dockerfile": dockerfile,
            "buildargs": json.dumps(dict(build_args or {})),
            "labels": json.dumps(dict(labels or {})),
            "networkmode": "host",
            "rm": "1",
            "forcerm": "1",
        }
        if platform:
            params["platform"] = platform
        image_id: list[str] = []

        def watch(event: ProgressEvent) -> None:
            aux = event.get("aux")
            if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                image_id.append(aux["ID"])
            on_event(event)

        self._stream(
            "POST",
            "/build",
            f"build {tag}",
            watch,
            params=params,
            content=context,
            headers={"Content-Type": "application/x-tar"},
        )
        if image_id:
            return image_id[-1]
        inspected = self.inspect_image(tag)
        if inspected is None:
            raise EngineError(f"build {tag}: the engine reports no such image after building it")
        return str(inspected["Id"])

    def tag(self, source: str, repository: str, tag: str) -> None:
        response = self._request(
            "POST", f"/images/{quote(source, safe='')}/tag", params={"repo": repository, "tag": tag}
        )
        if response.status_code != 201:
            raise self._fail(response, f"tag {source} as {repository}:{tag}")

    def untag(self, ref: str) -> None:
        response = self._request(
            "DELETE", f"/images/{quote(ref, safe='')}", params={"noprune": "1"}
        )
        if response.status_code not in (200, 404, 409):
            raise self._fail(response, f"remove tag {ref}")

    @contextlib.contextmanager
    def export_image(self, ref: str) -> Iterator[Iterator[bytes]]:
        """``GET /images/{ref}/get`` (``docker save``): the image as a tar stream, in chunks
        as they arrive; nothing is held beyond one chunk."""
        what = f"export {ref}"

        def chunks(response: httpx.Response) -> Iterator[bytes]:
            try:
                yield from response.iter_bytes(1 << 20)
            except httpx.TransportError as exc:
                raise EngineError(
                    f"{what}: connection to the Docker engine lost ({exc or type(exc).__name__})"
                ) from exc

        try:
            with self._http.stream("GET", f"/images/{quote(ref, safe='')}/get") as response:
                if response.status_code == 404:
                    raise EngineNotFoundError(f"{ref}: no such local image")
                if response.status_code != 200:
                    raise self._fail(response, what, _head(response.iter_bytes()))
                yield chunks(response)
        except httpx.TransportError as exc:
            raise EngineError(
                f"Docker engine at {self.host} is not reachable ({exc or type(exc).__name__})"
            ) from exc


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return one_line(lines[0]) if lines else ""


def _head(chunks: Iterator[bytes]) -> bytes:
    """The first ``_ERROR_LIMIT`` bytes of an error answer: enough for its message."""
    body = b""
    for chunk in chunks:
        body += chunk
        if len(body) >= _ERROR_LIMIT:
            break
    return body[:_ERROR_LIMIT]


def _json_lines(chunks: Iterator[bytes]) -> Iterator[ProgressEvent]:
    """The engine's progress stream: one JSON object a line, each line at most
    ``_EVENT_LIMIT`` bytes (an engine sending an endless line is cut off, not buffered)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > _EVENT_LIMIT:
            raise EngineError(
                f"the Docker engine sent a progress line of more than {_EVENT_LIMIT} bytes"
            )
        yield from _events(lines)
    yield from _events([pending])


def _events(lines: list[bytes]) -> Iterator[ProgressEvent]:
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = load_json(line, "progress line", max_bytes=_EVENT_LIMIT)
        except InvalidInputError as exc:
            shown = line[:120].decode("utf-8", "replace")
            raise EngineError(
                f"the Docker engine sent a malformed progress line: {shown!r}"
            ) from exc
        if isinstance(event, dict):
            yield event
