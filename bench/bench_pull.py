"""`docker variant pull` against plain `docker pull` of the same chosen tag (~100 MB image).

Run: .venv/bin/python bench/bench_pull.py   (starts its own registry, proxy and engine)
Both pulls go through the same engine and registry; before each the local image is removed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

from docker_variant import devstack
from docker_variant.providers.nvidia import nvidia_features

SIZE_MB = 100
ROUNDS = 5


def main() -> None:
    with devstack.local_stack("dv-bench-", proxy=False) as stack:
        registry, env, root = stack.registry, stack.client_env(), stack.root

        def sh(*args: str) -> str:
            return subprocess.run(
                list(args), env=env, check=True, capture_output=True, text=True
            ).stdout

        sh("docker-variant", "install-plugin")
        ctx = root / "ctx"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(
            "FROM scratch\nCOPY payload /payload\nCOPY app.txt /app.txt\n"
        )
        (ctx / "payload").write_bytes(os.urandom(SIZE_MB * 1024 * 1024))
        ref = f"{registry.address}/bench/app:1.0.0"
        variants = {
            "cu128": ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"],
            "cu126": ["nvidia :: cuda_version_lower_bound :: 12.6"],
            "v3": ["x86_64 :: level :: v3"],
            "null": [],
        }
        for label, props in variants.items():
            (ctx / "app.txt").write_text(label)
            labels = sh(
                "docker-variant",
                "labels",
                "--label",
                label,
                *[a for p in props for a in ("--property", p)],
            ).split()
            sh("docker", "build", "-q", "--network=host", "-t", f"{ref}-{label}", *labels, str(ctx))
            sh("docker", "push", f"{ref}-{label}")
        host = root / "h200.json"
        host.write_text(
            json.dumps(
                {
                    "nvidia": nvidia_features((12, 8), (9, 0)),
                    "x86_64": {"level": ["v4", "v3", "v2", "v1"]},
                }
            )
        )

        def clean() -> None:
            listing = sh(
                "docker",
                "images",
                "--format",
                "{{.Repository}}:{{.Tag}}",
                f"{registry.address}/bench/app",
            ).split()
            refs = [r for r in listing if not r.endswith(":<none>")]
            if refs:
                sh("docker", "rmi", "-f", *refs)

        def timed(*args: str) -> float:
            clean()
            start = time.perf_counter()
            sh(*args)
            return time.perf_counter() - start

        plain, variant, resolve = [], [], []
        for _ in range(ROUNDS):
            plain.append(timed("docker", "pull", "-q", f"{ref}-cu128"))
            variant.append(timed("docker", "variant", "pull", "--providers-file", str(host), ref))
            start = time.perf_counter()
            sh("docker", "variant", "resolve", "--providers-file", str(host), ref)
            resolve.append(time.perf_counter() - start)
        p, v, r = (statistics.median(x) for x in (plain, variant, resolve))
        print(
            f"pull of a {SIZE_MB} MB variant image (4 variants in the version), median of {ROUNDS}"
        )
        print(f"  docker pull REF-cu128            {p * 1e3:8.0f} ms")
        print(f"  docker variant pull REF          {v * 1e3:8.0f} ms")
        print(f"  ratio variant / plain            {v / p:8.2f}")
        print(f"  selection alone (variant resolve) {r * 1e3:7.0f} ms")


if __name__ == "__main__":
    main()
