"""Shared fixtures: real registries (Debian ``docker-registry``), test images, a fake upstream.

The registry binary is installed in CI; tests that need it skip, with the reason, only
where it is missing. Everything listens on 127.0.0.1 and is stopped by its pid.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import devstack
from fakeupstream import FakeUpstream
from imaging import ImageBuilder

_START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RunningRegistry:
    """A live registry: ``host`` is ``127.0.0.1:PORT`` (the reference form), ``url`` its base."""

    host: str
    url: str
    root: Path
    service: devstack.Service


def start_registry(root: Path, htpasswd: Path | None = None) -> RunningRegistry:
    """``devstack.start_registry``, skipping (with the reason) where the binary is missing."""
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry (Debian package docker-registry) is not installed")
    service = devstack.start_registry(root, htpasswd, realm="test-registry")
    return RunningRegistry(service.address, service.url, service.root, service)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """One open registry for the session; tests keep apart by repository name."""
    running = start_registry(tmp_path_factory.mktemp("registry"))
    yield running
    running.service.stop()


@pytest.fixture(scope="session")
def htpasswd_registry(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[Mapping[str, str]], RunningRegistry]]:
    """Factory: ``htpasswd_registry({"user": "pass"})`` starts a registry needing Basic auth."""
    started: list[RunningRegistry] = []

    def make(users: Mapping[str, str]) -> RunningRegistry:
        if shutil.which("htpasswd") is None:
            pytest.skip("htpasswd (Debian package apache2-utils) is not installed")
        root = tmp_path_factory.mktemp("auth-registry")
        entries = [
            subprocess.run(
                ["htpasswd", "-Bbn", user, password], capture_output=True, text=True, check=True
            ).stdout.strip()
            for user, password in users.items()
        ]
        htpasswd = root / "htpasswd"
        htpasswd.write_text("\n".join(entries) + "\n")
        running = start_registry(root, htpasswd)
        started.append(running)
        return running

    yield make
    for running in started:
        running.service.stop()


@pytest.fixture(scope="session")
def image_builder(tmp_path_factory: pytest.TempPathFactory) -> ImageBuilder:
    """Builds small umoci images and pushes them with skopeo (see tests/imaging.py)."""
    for tool in ("umoci", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    return ImageBuilder(tmp_path_factory.mktemp("images"))


@pytest.fixture
def docker_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[Mapping[str, Any]], Path]:
    """Points ``DOCKER_CONFIG`` at an empty temp dir; calling it writes ``config.json``."""
    root = tmp_path / "docker-config"
    root.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(root))

    def write(config: Mapping[str, Any]) -> Path:
        path = root / "config.json"
        path.write_text(json.dumps(config))
        return path

    return write


@pytest.fixture
def fake_upstream() -> Iterator[FakeUpstream]:
    """A scripted HTTP server on 127.0.0.1 (tests/fakeupstream.py) for broken upstreams."""
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devstack.Service]:
    """A private containerd (``ctr -a SOCKET``), for pulls as a kubelet makes them."""
    for tool in ("containerd", "ctr"):
        if shutil.which(tool) is None:
            pytest.skip(
                f"{tool} is not installed (scripts/setup installs docker.io, which brings it)"
            )
    service = devstack.start_containerd(Path(f"/tmp/dv-ctrd-{tmp_path_factory.getbasetemp().name}"))
    yield service
    service.stop()
    shutil.rmtree(service.root, ignore_errors=True)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Kubernetes v1.37.2 control plane for the session (``devtools/kubecluster.py``,
    as ``scripts/kube-up`` starts it); skips, with the reason, only where Go is missing."""
    import kubecluster

    if not kubecluster.binary_path().is_file() and shutil.which("go") is None:
        pytest.skip("go is not installed: the control plane is built from the Go module proxy")
    plane = kubecluster.up(tmp_path_factory.mktemp("kube"))
    yield plane
    kubecluster.down(plane.root)


@pytest.fixture
def kube_api(kube: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The admin's client on the session's control plane, with a fresh namespace (its name
    in ``client.headers["X-Test-Namespace"]``); on teardown every pod, claim, template,
    slice and node the test made is deleted, so the next test meets an empty cluster."""
    import hashlib

    import kubeplane

    slug = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    namespace = f"t-{slug}-{hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]}"
    with kube.client() as client:
        kubeplane.create(
            client, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        client.headers["X-Test-Namespace"] = namespace
        yield client
        kubeplane.clear_namespace(client, namespace)
        for kind in ("ResourceSlice", "Node", "DeviceClass"):
            kubeplane.delete_all(client, kind)
