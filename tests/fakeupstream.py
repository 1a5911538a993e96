"""A tiny scripted HTTP server on 127.0.0.1 that plays a broken (or token-auth) registry.

Routes map a path to a ``Reply`` or to a function of the request; unknown paths get 404.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    truncate_to: int | None = None  # announce len(body), send this many bytes, hang up
    chunked: bool = False  # send the body with Transfer-Encoding: chunked, in pieces
    drip_s: float = 0.0  # send the body a byte at a time, this many seconds apart
    raw: bytes | None = None  # the whole answer, head included, written as it is in one write


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


Route = Reply | Callable[[Seen], Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client hanging up mid-body (a size limit, a time-out) is expected here


class FakeUpstream:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[Seen] = []
        self._stopping = threading.Event()  # ends a drip at stop()
        self.heads: list[tuple[str, str]] = []  # (method, path) as each head arrives, body unread
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                upstream.heads.append((self.command, parts.path))
                length = int(self.headers.get("content-length") or 0)
                seen = Seen(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length) if length else b"",
                )
                upstream.requests.append(seen)
                route = upstream.routes.get(parts.path, Reply(404, b"404 page not found"))
                reply = route(seen) if callable(route) else route
                if reply.raw is not None:
                    self.wfile.write(reply.raw)  # the connection is kept for the next request
                    return
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                if reply.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(reply.body)))
                if reply.truncate_to is not None:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD" and reply.chunked:
                    step = max(1, len(reply.body) // 3)
                    for start in range(0, len(reply.body), step):
                        piece = reply.body[start : start + step]
                        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                elif self.command != "HEAD" and reply.drip_s:
                    for byte in reply.body:
                        if upstream._stopping.wait(reply.drip_s):
                            break
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                elif self.command != "HEAD":
                    sent = (
                        reply.body if reply.truncate_to is None else reply.body[: reply.truncate_to]
                    )
                    self.wfile.write(sent)
                if reply.truncate_to is not None:
                    self.close_connection = True

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output clean

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def serve_image(
        self,
        repository: str,
        tag: str,
        config: bytes,
        *,
        stated_digest: str | None = None,
        manifest: bytes | None = None,
    ) -> str:
        """Serve an image manifest at ``tag`` (and at its digest) and its config blob, as a
        registry does, with ``Docker-Content-Digest``: the manifest's own digest, or
        ``stated_digest`` for a registry that lies about it. Returns the true digest."""
        body = manifest if manifest is not None else _raw_manifest(config)
        digest = _sha256(body)
        headers = {
            "Content-Type": "application/vnd.oci.image.manifest.v1+json",
            "Docker-Content-Digest": stated_digest or digest,
        }
        self.routes[f"/v2/{repository}/manifests/{tag}"] = Reply(body=body, headers=headers)
        self.routes[f"/v2/{repository}/manifests/{digest}"] = Reply(body=body, headers=headers)
        self.routes[f"/v2/{repository}/blobs/{_sha256(config)}"] = Reply(body=config)
        return digest

    def start(self) -> FakeUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _raw_manifest(config: bytes) -> bytes:
    config_descriptor = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        "digest": _sha256(config),
        "size": len(config),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_descriptor,
        "layers": [],
    }
    return json.dumps(manifest).encode()
