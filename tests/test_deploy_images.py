"""deploy/images/build.sh builds the three service images with a real Docker engine from a
Debian rootfs (debootstrap, cached in pytest's cache) and the wheel built here; each image is
then exported with ``docker save`` and its entrypoint run with ``--help`` in a chroot of the
rootfs (this machine's engine cannot run containers), as the image's own user.

Slow (debootstrap, three builds on the vfs storage driver): marked e2e, run once in CI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import devstack
from docker_variant import __version__

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
# image -> (what its --help starts with, an option only that program has)
IMAGES = {
    "variant-proxy": ("usage: variant-proxy", "--upstream"),
    "variant-scheduler": ("usage: variant-scheduler serve", "--tokens"),
    "variant-agent": ("usage: variant-scheduler agent", "--host-root"),
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devstack.Service]:
    for tool in ("dockerd", "docker", "debootstrap", "chroot"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    if os.geteuid() != 0:
        pytest.skip("debootstrap and chroot need root")
    service = devstack.start_dockerd(tmp_path_factory.mktemp("images-engine"))
    yield service
    service.stop()


@pytest.fixture(scope="module")
def images(
    engine: devstack.Service, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> dict[str, str]:
    dist = tmp_path_factory.mktemp("images-dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("docker_variant-*.whl")
    assert cache_dir(pytestconfig).is_dir()
    env = {
        **os.environ,
        "DOCKER_HOST": engine.address,
        "PYTHON": sys.executable,
        "ROOTFS_CACHE": str(cache_dir(pytestconfig) / "bookworm-minbase-python3.tar"),
    }
    result = subprocess.run(
        ["bash", str(REPO / "deploy/images/build.sh"), str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    built = result.stdout.split()
    assert built == [f"docker-variant/{name}:{__version__}" for name in IMAGES]
    return {name: ref for name, ref in zip(IMAGES, built, strict=True)}


def cache_dir(pytestconfig: pytest.Config) -> Path:
    """The debootstrap tarball lives across runs in pytest's cache (``.pytest_cache``)."""
    assert pytestconfig.cache is not None
    return Path(pytestconfig.cache.mkdir("docker-variant-rootfs"))


def saved_rootfs(engine: devstack.Service, ref: str, into: Path) -> dict[str, Any]:
    """``docker save`` of ``ref`` unpacked layer by layer into ``into``; returns its config."""
    saved = into.parent / f"{into.name}.saved"
    saved.mkdir()
    env = {**os.environ, "DOCKER_HOST": engine.address}
    subprocess.run(["docker", "save", "-o", str(saved / "image.tar"), ref], env=env, check=True)
    subprocess.run(["tar", "-xf", "image.tar"], cwd=saved, check=True)
    (manifest,) = json.loads((saved / "manifest.json").read_text())
    config: dict[str, Any] = json.loads((saved / manifest["Config"]).read_text())
    into.mkdir()
    for layer in manifest["Layers"]:
        names = subprocess.run(["tar", "-tf", layer], cwd=saved, capture_output=True, text=True)
        whiteouts = [n for n in names.stdout.split() if Path(n).name.startswith(".wh.")]
        assert not whiteouts, f"{ref}: layer {layer} deletes files: {whiteouts[:3]}"
        subprocess.run(
            ["tar", "--numeric-owner", "-xf", str(saved / layer), "-C", str(into)], check=True
        )
    shutil.rmtree(saved)
    return config


@pytest.mark.parametrize("name", list(IMAGES))
def test_entrypoint_answers_help_from_the_exported_rootfs(
    name: str, images: dict[str, str], engine: devstack.Service, tmp_path: Path
) -> None:
    config = saved_rootfs(engine, images[name], tmp_path / "rootfs")
    settings = config["config"]
    assert isinstance(settings, dict)
    entrypoint, user = settings["Entrypoint"], settings["User"]
    assert user == "65534:65534", "the services run as nobody"
    assert settings["Labels"]["org.opencontainers.image.version"] == __version__
    assert settings["Labels"]["org.opencontainers.image.title"] == name
    path = next(e.split("=", 1)[1] for e in settings["Env"] if e.startswith("PATH="))
    chroot = ["chroot", f"--userspec={user}", str(tmp_path / "rootfs"), "/usr/bin/env", "-i",
              f"PATH={path}", "LANG=C.UTF-8"]  # fmt: skip
    result = subprocess.run([*chroot, *entrypoint, "--help"], capture_output=True, text=True)
    expected, option = IMAGES[name]
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(expected) and option in result.stdout, result.stdout
    # the wheel built here, not some other copy: its version, and nothing of the checkout
    program = entrypoint[0]
    version = subprocess.run([*chroot, program, "--version"], capture_output=True, text=True)
    assert version.stdout.split() == [program, __version__], version.stdout + version.stderr
    where = "import docker_variant; print(docker_variant.__file__)"
    module = subprocess.run([*chroot, "python3", "-c", where], capture_output=True, text=True)
    assert module.stdout.startswith("/opt/docker-variant/lib/"), module.stdout + module.stderr
