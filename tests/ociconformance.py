"""The OCI distribution-spec conformance workflows (pull, push, content discovery, content
management), written after the spec's own conformance suite, whose Go program cannot be had
here. ``run(base_url, repo)`` answers each check by name with a pass or a one-line failure,
so that one target's results can be compared with another's: a proxy in front of a registry
must fail nothing the registry alone passes."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

import httpx

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Failed(Exception):
    pass


def _with_digest(location: str, data: bytes) -> httpx.URL:
    """An upload's Location with ``digest`` added to its own query (httpx's ``params``
    would replace the registry's upload state)."""
    return httpx.URL(location).copy_merge_params({"digest": _digest(data)})


def _expect(answer: httpx.Response, *statuses: int) -> httpx.Response:
    if answer.status_code not in statuses:
        raise Failed(f"{answer.request.method} {answer.request.url.path}: {answer.status_code}")
    return answer


class Workflows:
    """One target's checks; each method named ``check_*`` raises ``Failed`` or returns."""

    def __init__(self, client: httpx.Client, repo: str) -> None:
        self.http = client
        self.repo = repo
        self.config = json.dumps({"architecture": "amd64", "os": "linux"}).encode()
        self.layer = os.urandom(300_000)
        self.chunked = os.urandom(200_000)

    def _location(self, answer: httpx.Response) -> str:
        location = answer.headers.get("location")
        if not location:
            raise Failed(f"{answer.request.url.path}: no Location")
        return location

    def _upload(self, data: bytes, repo: str | None = None) -> str:
        start = _expect(self.http.post(f"/v2/{repo or self.repo}/blobs/uploads/"), 202)
        put = self.http.put(
            _with_digest(self._location(start), data),
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        _expect(put, 201)
        return _digest(data)

    def _manifest(self, layers: list[bytes]) -> bytes:
        return json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": OCI_CONFIG,
                    "digest": _digest(self.config),
                    "size": len(self.config),
                },
                "layers": [
                    {"mediaType": LAYER, "digest": _digest(data), "size": len(data)}
                    for data in layers
                ],
            }
        ).encode()

    # --- push -------------------------------------------------------------------------

    def check_push_blob_post_then_put(self) -> None:
        digest = self._upload(self.config)
        _expect(self.http.head(f"/v2/{self.repo}/blobs/{digest}"), 200)

    def check_push_blob_monolithic_post(self) -> None:
        data = os.urandom(4096)
        answer = self.http.post(
            f"/v2/{self.repo}/blobs/uploads/",
            params={"digest": _digest(data)},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        _expect(answer, 201, 202)  # 202: the registry wants the PUT way (allowed)
        if answer.status_code == 202:
            self._upload(data)

    def check_push_blob_chunked(self) -> None:
        start = _expect(self.http.post(f"/v2/{self.repo}/blobs/uploads/"), 202)
        location = self._location(start)
        half = len(self.chunked) // 2
        for first, piece in ((0, self.chunked[:half]), (half, self.chunked[half:])):
            patch = self.http.patch(
                location,
                content=piece,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Range": f"{first}-{first + len(piece) - 1}",
                },
            )
            location = self._location(_expect(patch, 202))
        status = _expect(self.http.get(location), 204)
        if status.headers.get("range") != f"0-{len(self.chunked) - 1}":
            raise Failed(f"upload status Range {status.headers.get('range')!r}")
        _expect(self.http.put(_with_digest(location, self.chunked)), 201)

    def check_push_blob_streamed_chunked_encoding(self) -> None:
        data = os.urandom(150_000)
        start = _expect(self.http.post(f"/v2/{self.repo}/blobs/uploads/"), 202)
        patch = self.http.patch(
            self._location(start),
            content=iter([data[:50_000], data[50_000:]]),  # Transfer-Encoding: chunked
            headers={"Content-Type": "application/octet-stream"},
        )
        put = self.http.put(_with_digest(self._location(_expect(patch, 202)), data))
        _expect(put, 201)

    def check_push_manifest_by_tag_and_digest(self) -> None:
        self._upload(self.config)
        self._upload(self.layer)
        manifest = self._manifest([self.layer])
        headers = {"Content-Type": OCI_MANIFEST}
        put = self.http.put(f"/v2/{self.repo}/manifests/1.0", content=manifest, headers=headers)
        if _expect(put, 201).headers.get("docker-content-digest") != _digest(manifest):
            raise Failed("manifest PUT: wrong Docker-Content-Digest")
        path = f"/v2/{self.repo}/manifests/{_digest(manifest)}"
        _expect(self.http.put(path, content=manifest, headers=headers), 201)

    def check_push_cross_repository_mount(self) -> None:
        other = f"{self.repo}-mount"
        digest = self._upload(self.layer)
        answer = self.http.post(
            f"/v2/{other}/blobs/uploads/", params={"mount": digest, "from": self.repo}
        )
        _expect(answer, 201)
        _expect(self.http.head(f"/v2/{other}/blobs/{digest}"), 200)

    def check_push_manifest_with_unknown_blob_is_refused(self) -> None:
        manifest = self._manifest([os.urandom(64)])
        answer = self.http.put(
            f"/v2/{self.repo}/manifests/missing",
            content=manifest,
            headers={"Content-Type": OCI_MANIFEST},
        )
        _expect(answer, 400)

    # --- pull -------------------------------------------------------------------------

    def check_pull_manifest_by_tag_and_digest(self) -> None:
        self.check_push_manifest_by_tag_and_digest()
        manifest = self._manifest([self.layer])
        accept = {"Accept": OCI_MANIFEST}
        for reference in ("1.0", _digest(manifest)):
            got = _expect(
                self.http.get(f"/v2/{self.repo}/manifests/{reference}", headers=accept), 200
            )
            if got.content != manifest or got.headers.get("content-type") != OCI_MANIFEST:
                raise Failed(f"manifest {reference}: other bytes or type")
            head = _expect(
                self.http.head(f"/v2/{self.repo}/manifests/{reference}", headers=accept), 200
            )
            if head.headers.get("content-length") != str(len(manifest)):
                raise Failed(f"HEAD manifest {reference}: Content-Length")

    def check_pull_blob_whole_and_ranged(self) -> None:
        digest = self._upload(self.layer)
        got = _expect(self.http.get(f"/v2/{self.repo}/blobs/{digest}"), 200, 307)
        if got.status_code == 307:
            got = _expect(self.http.get(self._location(got)), 200)
        if got.content != self.layer:
            raise Failed("blob: other bytes")
        part = self.http.get(f"/v2/{self.repo}/blobs/{digest}", headers={"Range": "bytes=10-19"})
        if _expect(part, 206, 200).status_code == 206 and part.content != self.layer[10:20]:
            raise Failed("ranged blob: other bytes")

    def check_pull_unknown_manifest_and_blob_are_404(self) -> None:
        _expect(self.http.get(f"/v2/{self.repo}/manifests/no-such-tag"), 404)
        _expect(self.http.head(f"/v2/{self.repo}/blobs/sha256:{'0' * 64}"), 404)
        _expect(self.http.get(f"/v2/{self.repo}-never/manifests/1.0"), 404)

    def check_pull_invalid_names_are_refused(self) -> None:
        for path in ("/v2/UPPER/manifests/1", "/v2/a/manifests/.INVALID_MANIFEST_NAME"):
            _expect(self.http.get(path), 400, 404)

    # --- content discovery ------------------------------------------------------------

    def check_discovery_tags_list_and_pagination(self) -> None:
        self.check_push_manifest_by_tag_and_digest()
        manifest = self._manifest([self.layer])
        for tag in ("a", "b", "c"):
            self.http.put(
                f"/v2/{self.repo}/manifests/{tag}",
                content=manifest,
                headers={"Content-Type": OCI_MANIFEST},
            )
        tags = _expect(self.http.get(f"/v2/{self.repo}/tags/list"), 200).json()["tags"]
        if not {"1.0", "a", "b", "c"} <= set(tags):
            raise Failed(f"tags/list: {tags}")
        page = _expect(self.http.get(f"/v2/{self.repo}/tags/list", params={"n": 2}), 200)
        if len(page.json()["tags"]) != 2 or "link" not in page.headers:
            raise Failed("tags/list?n=2: no page or no Link")
        after = self.http.get(f"/v2/{self.repo}/tags/list", params={"n": 10, "last": "a"})
        if "1.0" in _expect(after, 200).json()["tags"]:
            raise Failed("tags/list?last=a: tags before a")

    def check_discovery_base_and_catalog(self) -> None:
        _expect(self.http.get("/v2/"), 200)
        _expect(self.http.get("/v2/_catalog"), 200)

    # --- content management -----------------------------------------------------------

    def check_management_delete_manifest_and_blob(self) -> None:
        self._upload(self.config)
        data = os.urandom(2048)
        digest = self._upload(data)
        manifest = self._manifest([data])
        self.http.put(
            f"/v2/{self.repo}/manifests/del",
            content=manifest,
            headers={"Content-Type": OCI_MANIFEST},
        )
        _expect(self.http.delete(f"/v2/{self.repo}/manifests/{_digest(manifest)}"), 202)
        _expect(self.http.get(f"/v2/{self.repo}/manifests/{_digest(manifest)}"), 404)
        _expect(self.http.delete(f"/v2/{self.repo}/blobs/{digest}"), 202)
        _expect(self.http.head(f"/v2/{self.repo}/blobs/{digest}"), 404)

    def check_management_cancel_upload(self) -> None:
        start = _expect(self.http.post(f"/v2/{self.repo}/blobs/uploads/"), 202)
        location = self._location(start)
        _expect(self.http.delete(location), 204)
        _expect(self.http.get(location), 404)


def run(base_url: str, repo: str) -> dict[str, str]:
    """Each check's outcome against ``base_url``: ``"pass"`` or why it failed."""
    results: dict[str, str] = {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        workflows = Workflows(client, repo)
        checks: dict[str, Callable[[], None]] = {
            name.removeprefix("check_"): getattr(workflows, name)
            for name in dir(workflows)
            if name.startswith("check_")
        }
        for name, check in sorted(checks.items()):
            try:
                check()
            except (Failed, httpx.HTTPError, KeyError, ValueError) as exc:
                results[name] = f"{type(exc).__name__}: {exc}"
            else:
                results[name] = "pass"
    return results
