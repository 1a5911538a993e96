"""Numbers in what an image says about itself are bounded: a 5,000-digit version in
``cuda/version.txt``, ``version.json``, ROCm's ``.info/version``, a ``libcudart.so.<digits>``
name or the config's ``CUDA_VERSION`` is ignored (no finding), never an internal error."""

from __future__ import annotations

import io
import json
import tarfile

from crafted import elf64
from docker_variant.contents.evidence import CUDA_RUNTIME, ROCM_VERSION, env_finding
from docker_variant.contents.properties import propose
from docker_variant.contents.walker import merge_layers, scan_layer

HUGE = "9" * 5000


def _layer(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_huge_numbers_in_version_files_and_names_are_ignored() -> None:
    elf = elf64([], b"")
    layer = _layer(
        {
            "usr/local/cuda/version.txt": f"CUDA Version {HUGE}.1.2\n".encode(),
            "usr/local/cuda-12.8/version.json": json.dumps(
                {"cuda": {"name": "CUDA SDK", "version": f"{HUGE}.8.1"}}
            ).encode(),
            "opt/rocm/.info/version": f"{HUGE}.2.0-66\n".encode(),
            "opt/rocm-6.2.0/.info/version": f"6.{HUGE}\n".encode(),
            f"usr/local/cuda/lib64/libcudart.so.{HUGE}.1.2": elf,
            f"usr/local/cuda/lib64/libcudart.so.12.{HUGE}.2": elf,
            f"site/nvidia/cuda_runtime/lib/libcudart.so.{HUGE}": elf,
            f"site/nvidia_cuda_runtime_cu12-12.{HUGE}.dist-info/METADATA": b"Name: x\n",
        }
    )
    contents = merge_layers([scan_layer(io.BytesIO(layer), "huge")])
    assert contents.of_kind(CUDA_RUNTIME, ROCM_VERSION) == []
    env = env_finding([f"CUDA_VERSION={HUGE}.8", f"CUDA_VERSION=12.{HUGE}"])
    assert env is None
    assert propose(contents.with_finding(env)).properties == ()


def test_bounded_numbers_beside_the_huge_ones_still_count() -> None:
    layer = _layer(
        {
            "usr/local/cuda/version.txt": b"CUDA Version 12.8.93\n",
            "opt/rocm/.info/version": b"6.4.1-120\n",
        }
    )
    contents = merge_layers([scan_layer(io.BytesIO(layer), "ok")])
    assert [f.version for f in contents.of_kind(CUDA_RUNTIME)] == [(12, 8, 93)]
    assert [f.version for f in contents.of_kind(ROCM_VERSION)] == [(6, 4, 1)]
    env = env_finding(["CUDA_VERSION=12.9.1"])
    assert env is not None and env.version == (12, 9, 1)


def test_a_deeply_nested_version_json_is_ignored() -> None:
    deep = b'{"cuda": ' * 50_000 + b"1" + b"}" * 50_000  # 650 KB: over the 64 KiB read
    nested = b"[" * 30_000 + b"]" * 30_000  # 60 KB: read, refused by the depth bound
    for content in (deep, nested):
        layer = _layer({"usr/local/cuda/version.json": content})
        assert merge_layers([scan_layer(io.BytesIO(layer), "deep")]).of_kind(CUDA_RUNTIME) == []
