"""Writes the seed corpus, ``corpus/<target>/seed-*``: small real and crafted inputs for each
target (an object file from gcc, crafted fatbins and offload bundles, tar layers in each
format, references, an index document and a matrix). Run it again only to change the seeds:
``python tests/fuzz/seeds.py``. Inputs the fuzzer found are kept beside them as
``crash-*`` (each one a regression case) and are never rewritten here."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/

from crafted import bundle, elf64, fatbin
from fuzz.targets import CORPUS

C_SOURCE = """
#include <immintrin.h>
int add(int a) { __m256i x = _mm256_set1_epi32(a); return _mm256_extract_epi32(x, 3) + 1; }
"""

REFERENCES = [
    "registry.example.com:5000/org/app:1.0.0-cu128",
    "localhost/app@sha256:" + "a" * 64,
    "app:latest",
    "ghcr.io/a/b/c:v1@sha256:" + "0123456789abcdef" * 4,
    "[::1]:5000/x/y",
]

INDEX = {
    "default-priorities": {"namespace": ["nvidia", "x86_64"]},
    "variants": {
        "cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}},
        "v3": {"x86_64": {"level": ["v3"]}},
    },
    "images": {
        "cu128": {"tag": "1.0-cu128", "digest": "sha256:" + "b" * 64},
        "v3": {"tag": "1.0-v3", "digest": "sha256:" + "c" * 64},
    },
    "bare": {"tag": "1.0", "digest": "sha256:" + "d" * 64},
    "invalid": [{"tag": "1.0-bad", "error": "no labels"}],
}

MATRIX = """dockerfile = "build/Dockerfile"
namespace-order = ["nvidia"]
[build-args]
BASE = "debian"
[[variant]]
label = "cu128"
properties = ["nvidia :: sm_arch :: 90_real", "nvidia :: cuda_version_lower_bound :: 12.8"]
build-args = { BASE = "cuda", CUDA = "12.8" }
platform = "linux/arm64"
[[variant]]
bare = true
"""


def _gcc_object(work: Path) -> bytes:
    source = work / "add.c"
    source.write_text(C_SOURCE)
    obj = work / "add.o"
    subprocess.run(
        ["gcc", "-O2", "-march=x86-64-v3", "-mneeded", "-c", "-o", str(obj), str(source)],
        check=True,
    )
    subprocess.run(["strip", "--strip-debug", str(obj)], check=True)
    return obj.read_bytes()


def _tar(entries: list[tuple[str, bytes | str | None, bytes]], form: int) -> bytes:
    """``(name, content, type)``: bytes a file, str a link target, None a directory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=form) as archive:
        for name, content, kind in entries:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = kind, content
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    data = buffer.getvalue()
    end = -(-len(data.rstrip(b"\0")) // 512) * 512  # without tarfile's 10 KiB record padding
    return data[:end] + b"\0" * 1024


def seeds(work: Path) -> dict[str, dict[str, bytes]]:
    obj = _gcc_object(work)
    code = fatbin([(2, 90), (2, 80), (1, 120)])
    two = code + b"\0" * 8 + fatbin([(2, 100)])
    hip = bundle([b"host-x86_64-unknown-linux--", b"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"])
    both = code + hip
    lib = elf64([(".nv_fatbin", 0, len(code)), (".hip_fatbin", len(code), len(hip))], both)
    same = elf64([(".nv_fatbin", 0, len(code))] * 3, code)
    layer = [
        ("usr/local/cuda-12.8", None, tarfile.DIRTYPE),
        ("usr/local/cuda-12.8/version.txt", b"CUDA Version 12.8.93\n", tarfile.REGTYPE),
        ("usr/local/cuda-12.8/version.json", b'{"cuda": {"version": "12.8.93"}}', tarfile.REGTYPE),
        ("opt/rocm-6.2.0/.info/version", b"6.2.0-66\n", tarfile.REGTYPE),
        ("usr/lib/libk.so", lib, tarfile.REGTYPE),
        ("usr/lib/libcudart.so.12.8.93", obj, tarfile.REGTYPE),
        ("usr/lib/libcudart.so.12", "libcudart.so.12.8.93", tarfile.SYMTYPE),
        ("usr/lib/hard.so", "usr/lib/libk.so", tarfile.LNKTYPE),
        ("usr/share/.wh.gone", b"", tarfile.REGTYPE),
        ("var/.wh..wh..opq", b"", tarfile.REGTYPE),
        ("usr/lib/" + "long-directory-name/" * 8 + "x.so", obj, tarfile.REGTYPE),
    ]
    pax = _tar(layer, tarfile.PAX_FORMAT)
    return {
        "elf": {"seed-gcc-object.o": obj, "seed-fatbin-and-bundle.so": lib, "seed-same.so": same},
        "fatbin": {"seed-one": code, "seed-two-padded": two},
        "offload": {
            "seed-bundle": hip,
            "seed-empty-bundles": bundle([]) * 3,
            "seed-compressed": b"CCOB" + b"\0" * 28,
        },
        "tar": {
            "seed-pax.tar": pax,
            "seed-gnu.tar": _tar(layer[:4] + layer[6:], tarfile.GNU_FORMAT),
            "seed-pax.tar.gz": zlib.compress(pax, 9, wbits=31),
        },
        "reference": {f"seed-{i}": r.encode() for i, r in enumerate(REFERENCES)},
        "index": {"seed-index.json": json.dumps(INDEX, indent=1).encode()},
        "matrix": {"seed-matrix.toml": MATRIX.encode()},
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        for target, files in seeds(Path(name)).items():
            folder = CORPUS / target
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("seed-*"):
                old.unlink()
            for file_name, data in files.items():
                (folder / file_name).write_bytes(data)
            print(f"{target}: {len(files)} seeds, {sum(map(len, files.values()))} bytes")
    if shutil.which("gcc") is None:  # pragma: no cover
        raise SystemExit("gcc is needed for the ELF seeds")


if __name__ == "__main__":
    main()
