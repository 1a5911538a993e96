"""Shared fixtures: real registries (Debian ``docker-registry``), test images, a fake upstream.

The registry binary is installed in CI; tests that need it skip, with the reason, only
where it is missing. Everything listens on 127.0.0.1 and is stopped by its pid.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakeupstream import FakeUpstream
from imaging import ImageBuilder

_START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RunningRegistry:
    """A live registry: ``host`` is ``127.0.0.1:PORT`` (the reference form), ``url`` its base."""

    host: str
    url: str
    root: Path
    process: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _registry_config(port: int, storage: Path, htpasswd: Path | None) -> str:
    lines = [
        "version: 0.1",
        "log:",
        "  level: error",
        "  accesslog:",
        "    disabled: true",
        "http:",
        f"  addr: 127.0.0.1:{port}",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {storage}",
        "  delete:",
        "    enabled: true",
    ]
    if htpasswd is not None:
        lines += ["auth:", "  htpasswd:", "    realm: test-registry", f"    path: {htpasswd}"]
    return "\n".join(lines) + "\n"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_registry(root: Path, htpasswd: Path | None = None) -> RunningRegistry:
    """Start ``docker-registry serve`` on a free port; returns once ``GET /v2/`` answers."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry (Debian package docker-registry) is not installed")
    root.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):  # the free port may be taken between probe and bind
        port = _free_port()
        config = root / f"config-{port}.yml"
        config.write_text(_registry_config(port, root / "storage", htpasswd))
        log = (root / f"registry-{port}.log").open("wb")
        process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
        log.close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{url}/v2/", timeout=1).status_code in (200, 401):
                    return RunningRegistry(f"127.0.0.1:{port}", url, root, process)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        _stop(process)
        text = (root / f"registry-{port}.log").read_text(errors="replace")
        if "address already in use" not in text:
            raise RuntimeError(f"docker-registry did not start on port {port}: {text[-2000:]}")
    raise RuntimeError("docker-registry: no free port after 3 attempts")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """One open registry for the session; tests keep apart by repository name."""
    running = start_registry(tmp_path_factory.mktemp("registry"))
    yield running
    _stop(running.process)


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
        _stop(running.process)


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
