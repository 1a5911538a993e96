"""Real binaries for the inspection tests: NVIDIA's wheels from PyPI (downloaded once into
pytest's cache dir and kept there across runs), installed as pip would, and a C program
built with ``gcc -march=x86-64-v3 -mneeded``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

CURAND = "nvidia-curand-cu12==10.3.10.19"
RUNTIME = "nvidia-cuda-runtime-cu12==12.8.90"
# What libcurand.so.10 of 10.3.10.19 holds (checked with the parser's dump of the wheel's library).
CURAND_CUBINS = [(5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0)]
CURAND_CUBINS += [(10, 0), (10, 1), (10, 3), (12, 0), (12, 1)]
CURAND_PTX = [(12, 1)]
CURAND_FATBINS = 11
SITE = "usr/local/lib/python3.11/site-packages"

AVX2_C = r"""
#include <immintrin.h>
#include <stdio.h>
int main(int argc, char **argv) {
    __m256i a = _mm256_set1_epi32(argc), b = _mm256_set1_epi32(2);
    int out[8];
    _mm256_storeu_si256((__m256i *)out, _mm256_add_epi32(a, b));
    printf("%d\n", out[0]);
    return 0;
}
"""


def download_wheels(cache: Path) -> dict[str, Path]:
    """Both wheels, from pytest's cache dir, downloaded (``pip download --no-deps``) only
    when missing there."""
    found: dict[str, Path] = {}
    for requirement in (CURAND, RUNTIME):
        name, version = requirement.split("==")
        stem = f"{name.replace('-', '_')}-{version}-"
        wheel = next(iter(sorted(cache.glob(f"{stem}*.whl"))), None)
        if wheel is None:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest",
                 str(cache), "--only-binary", ":all:", requirement],
                capture_output=True, text=True, check=False, timeout=600,
            )  # fmt: skip
            wheel = next(iter(sorted(cache.glob(f"{stem}*.whl"))), None)
            if wheel is None:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                pytest.skip(f"cannot download {requirement} from PyPI: {last}")
        found[name] = wheel
    return found


def install_wheel(wheel: Path, root: Path) -> Path:
    """Unpack a purelib wheel into ``root``'s site-packages, as pip installs it (package
    files and its ``.dist-info``); returns that site-packages dir."""
    site = root / SITE
    site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def compile_avx2(workdir: Path, extra: tuple[str, ...] = ("-march=x86-64-v3", "-mneeded")) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    source = workdir / "avx2.c"
    source.write_text(AVX2_C)
    binary = workdir / ("avx2-v3" if extra else "avx2")
    subprocess.run(
        ["gcc", "-O2", *extra, "-mavx2", "-o", str(binary), str(source)],
        check=True,
        capture_output=True,
    )
    return binary


def readelf_notes(binary: Path) -> str:
    return subprocess.run(
        ["readelf", "-n", str(binary)], check=True, capture_output=True, text=True
    ).stdout


def layer(root: Path, dest: Path, *, compress: bool = True) -> Path:
    """``root``'s tree as a layer tarball (gzip unless ``compress`` is False)."""
    with tarfile.open(dest, "w:gz" if compress else "w") as archive:
        for path in sorted(root.rglob("*")):
            archive.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return dest
