"""Build tiny OCI images with umoci and push them with skopeo (or raw, over HTTP).

Images share one OCI layout: a chain of base tags with 0..N one-file layers is built once,
and each image is only a ``umoci config`` (labels) on top of a base, so a build is a few
milliseconds and a push only uploads a new config blob.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def variant_labels(label: str, **props: str) -> dict[str, str]:
    """Image labels for a variant: ``variant_labels("cu128", nvidia__sm_arch="90_real")``."""
    labels = {"dev.pep817.variant-label": label}
    labels.update({f"dev.pep817.variant.{k.replace('__', '.')}": v for k, v in props.items()})
    return labels


def _run(*args: str | Path) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed: {done.stderr.strip()}")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class ImageBuilder:
    """umoci images in one layout under ``workdir``; ``push`` sends one to a registry."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.layout = workdir / "layout"
        self._bases: dict[int, str] = {}
        self._count = 0
        _run("umoci", "init", "--layout", self.layout)

    def _base(self, layers: int) -> str:
        """A tag with ``layers`` one-file layers, built once and reused."""
        if layers in self._bases:
            return self._bases[layers]
        tag = f"base{layers}"
        if layers == 0:
            _run("umoci", "new", "--image", f"{self.layout}:{tag}")
        else:
            below = self._base(layers - 1)
            content = self.workdir / f"layer{layers}"
            content.write_text(f"layer {layers}\n")
            _run(
                "umoci", "insert", "--rootless", "--image", f"{self.layout}:{below}",
                "--tag", tag, content, f"/layer{layers}",
            )  # fmt: skip
        self._bases[layers] = tag
        return tag

    def build(
        self, labels: Mapping[str, str], layers: int = 1, *, architecture: str = "amd64"
    ) -> str:
        """A new layout tag whose config carries ``labels``; returns the tag."""
        self._count += 1
        tag = f"img{self._count}"
        args: list[str | Path] = [
            "umoci",
            "config",
            "--image",
            f"{self.layout}:{self._base(layers)}",
        ]
        args += ["--tag", tag, "--architecture", architecture, "--os", "linux"]
        # a unique label, so that no two built images share a config (or a digest)
        args += ["--config.label", f"test.image-id={tag}"]
        for key, value in labels.items():
            args += ["--config.label", f"{key}={value}"]
        _run(*args)
        return tag

    def push(
        self, layout_tag: str, destination: str, *, creds: tuple[str, str] | None = None
    ) -> str:
        """``skopeo copy`` to ``host:port/repo:tag``; returns the pushed manifest digest."""
        digest_file = self.workdir / f"{layout_tag}.digest"
        args: list[str | Path] = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if creds is not None:
            args += ["--dest-creds", f"{creds[0]}:{creds[1]}"]
        args += ["--digestfile", digest_file, f"oci:{self.layout}:{layout_tag}"]
        args.append(f"docker://{destination}")
        _run(*args)
        return digest_file.read_text().strip()

    def build_and_push(
        self,
        destination: str,
        labels: Mapping[str, str] | None = None,
        *,
        layers: int = 1,
        architecture: str = "amd64",
        creds: tuple[str, str] | None = None,
    ) -> str:
        tag = self.build(labels or {}, layers, architecture=architecture)
        return self.push(tag, destination, creds=creds)


# Raw pushes: for what umoci will not build (a config that is not JSON, an index).


def push_blob(base_url: str, repository: str, data: bytes, auth: Any = None) -> str:
    digest = sha256_digest(data)
    with httpx.Client(base_url=base_url, auth=auth) as http:
        started = http.post(f"/v2/{repository}/blobs/uploads/")
        started.raise_for_status()
        location = httpx.URL(base_url).join(started.headers["location"])
        done = http.put(
            location.copy_merge_params({"digest": digest}),
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        done.raise_for_status()
    return digest


def push_manifest(
    base_url: str, repository: str, tag: str, body: bytes, media_type: str, auth: Any = None
) -> str:
    with httpx.Client(base_url=base_url, auth=auth) as http:
        done = http.put(
            f"/v2/{repository}/manifests/{tag}", content=body, headers={"Content-Type": media_type}
        )
        done.raise_for_status()
    return sha256_digest(body)


def raw_manifest(config: bytes, layers: Sequence[bytes] = ()) -> bytes:
    """An OCI image manifest for ``config`` (any bytes) and layer blobs."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": len(config)},
        "layers": [
            {"mediaType": OCI_LAYER, "digest": sha256_digest(b), "size": len(b)} for b in layers
        ],
    }
    return json.dumps(manifest).encode()


def push_raw_image(
    base_url: str, repository: str, tag: str, config: bytes, auth: Any = None
) -> str:
    """Push ``config`` (not necessarily JSON) as an image config; returns the digest."""
    push_blob(base_url, repository, config, auth)
    return push_manifest(base_url, repository, tag, raw_manifest(config), OCI_MANIFEST, auth)


def push_index(
    base_url: str,
    repository: str,
    tag: str,
    entries: Sequence[tuple[str, str, str]],
    auth: Any = None,
) -> str:
    """An OCI index of already-pushed manifests ``(digest, os, architecture)``."""
    manifests = []
    with httpx.Client(base_url=base_url, auth=auth) as http:
        for digest, os_name, arch in entries:
            head = http.head(
                f"/v2/{repository}/manifests/{digest}", headers={"Accept": OCI_MANIFEST}
            )
            head.raise_for_status()
            manifests.append(
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": digest,
                    "size": int(head.headers["content-length"]),
                    "platform": {"os": os_name, "architecture": arch},
                }
            )
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})
    return push_manifest(base_url, repository, tag, body.encode(), OCI_INDEX, auth)
