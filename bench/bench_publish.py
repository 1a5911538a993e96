"""`resolve` through a published variant image index vs a tag scan, from the registry
directly (no proxy), at 10, 50 and 200 variants (docs/reference/image-index.md).

Run: .venv/bin/python bench/bench_publish.py
- in process: ``read_version`` (what ls/resolve/pull call without a proxy), median of 7
  after a warm-up, before and after `docker-variant publish`;
- the whole `docker-variant resolve REF` process, median of 5;
- requests the registry served for one resolve, from its own access log.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "devtools"))
import devstack
from docker_variant.oci.client import RegistryClient
from docker_variant.oci.scan import read_version
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest

H200 = {
    "nvidia": {"cuda_version_lower_bound": ["12.8", "12.7", "12"], "sm_arch": ["90_real"]},
    "x86_64": {"level": ["v4", "v3", "v2", "v1"]},
}


def small_layer() -> bytes:
    """A gzip-compressed tar of one 1 KiB file: the smallest layer a publisher accepts."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        data = os.urandom(1024)
        member = tarfile.TarInfo("data.bin")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return out.getvalue()


def push_variants(base: str, repo: str, count: int) -> None:
    """``count`` variant images of version 1.0.0 sharing one small layer."""
    layer = small_layer()
    push_blob(base, repo, layer)
    for i in range(count):
        labels = {
            "dev.pep817.variant-label": f"v{i}",
            "dev.pep817.variant.nvidia.cuda_version_lower_bound": f"12.{i % 10}",
            "dev.pep817.variant.x86_64.level": f"v{1 + i % 4}",
        }
        config = json.dumps(
            {"architecture": "amd64", "os": "linux", "config": {"Labels": labels}}
        ).encode()
        push_blob(base, repo, config)
        push_manifest(base, repo, f"1.0.0-v{i}", raw_manifest(config, [layer]), OCI_MANIFEST)


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def in_process_ms(base: str, repo: str, repeat: int = 7) -> float:
    async def read() -> None:
        async with RegistryClient(base) as client:
            await read_version(client, repo, "1.0.0")

    return median_ms(lambda: asyncio.run(read()), repeat)


def main() -> None:
    tiny = "--tiny" in sys.argv[1:]  # ten variants, few repeats: seconds, for CI
    counts, repeat, cli_repeat = ((10,), 2, 1) if tiny else ((10, 50, 200), 7, 5)
    root = Path(tempfile.mkdtemp(prefix="dv-bench-pub-", dir="/tmp"))
    registry = devstack.start_registry(root / "registry", access_log=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "NV_VARIANT"))}
    env |= {"DOCKER_CONFIG": str(root / "dc"), "XDG_CACHE_HOME": str(root / "cache")}
    host = root / "h200.json"
    host.write_text(json.dumps(H200))
    cli = [sys.executable, "-m", "docker_variant"]

    def resolve(ref: str) -> None:
        subprocess.run([*cli, "resolve", ref, "--providers-file", str(host)], env=env, check=True,
                       capture_output=True)  # fmt: skip

    def requests_for_resolve(ref: str) -> int:
        before = len(devstack.registry_requests(registry))
        resolve(ref)
        paths = devstack.registry_requests(registry)[before:]
        return sum(1 for p in paths if "/manifests/" in p or "/blobs/" in p)

    try:
        print("resolve from the registry, no proxy: tag scan vs published variant image index")
        print(f"  {'N':>4} {'scan ms':>9} {'index ms':>9} {'scan/index':>11}"
              f" {'CLI scan':>9} {'CLI index':>10} {'GETs scan':>10} {'GETs index':>11}")  # fmt: skip
        for count in counts:
            repo = f"bench/pub{count}"
            ref = f"{registry.address}/{repo}:1.0.0"
            push_variants(registry.url, repo, count)
            scan = in_process_ms(registry.url, repo, repeat)
            cli_scan = median_ms(lambda r=ref: resolve(r), cli_repeat)  # type: ignore[misc]
            scan_gets = requests_for_resolve(ref)
            published = subprocess.run(
                [*cli, "publish", ref], env=env, capture_output=True, text=True
            )
            if published.returncode != 0:
                raise SystemExit(f"docker-variant publish {ref}: {published.stderr.strip()}")
            index = in_process_ms(registry.url, repo, repeat)
            cli_index = median_ms(lambda r=ref: resolve(r), cli_repeat)  # type: ignore[misc]
            index_gets = requests_for_resolve(ref)
            print(f"  {count:>4} {scan:9.1f} {index:9.2f} {scan / index:11.1f}"
                  f" {cli_scan:9.0f} {cli_index:10.0f} {scan_gets:>10} {index_gets:>11}")  # fmt: skip
    finally:
        registry.stop()
        subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()
