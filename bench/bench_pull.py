"""`docker variant pull` against plain `docker pull` of the same chosen tag, at 100 MB and 1 GB,
and the whole `docker-variant resolve --index` process against importing variantlib.

Run: .venv/bin/python bench/bench_pull.py [--rounds N] [--sizes 100,1024]
(starts its own registry and engine, as the tests do; about 10 minutes here.)

Both pulls go through the same engine and registry; before each, every local image of the
repository is removed, so each pull downloads and extracts the whole image. The two kinds
alternate, and swap which goes first each round. Each size is measured twice: with the index
from a tag scan (a plain registry), then with the version published (SPEC 10). The fixed cost
of `docker variant pull` is the difference of the medians (issue 8's aim: at most 150 ms at
either size). The resolve ratio is whole processes, interleaved, median of many (aim: at most
1.5x).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import docker_variant

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "devtools"))
import devstack
from docker_variant.providers.nvidia import nvidia_features

FIXED_COST_AIM_MS = 150.0
RESOLVE_RATIO_AIM = 1.5
VARIANTS = {
    "cu128": ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"],
    "cu126": ["nvidia :: cuda_version_lower_bound :: 12.6"],
    "v3": ["x86_64 :: level :: v3"],
    "null": [],
}


def _byte_compile_package() -> None:
    """Measure the package as an install runs it, from .pyc files. This machine sets
    PYTHONDONTWRITEBYTECODE, so an editable install edited since scripts/setup would
    otherwise compile its modules in every process (100 to 150 ms on the pull path)."""
    compileall.compile_dir(Path(docker_variant.__file__).parent, quiet=1)


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def _range_ms(values: list[float]) -> str:
    return f"{min(values) * 1e3:,.0f} to {max(values) * 1e3:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="pulls of each kind per size")
    parser.add_argument("--sizes", default="100,1024", help="image sizes in MB")
    parser.add_argument("--resolve-runs", type=int, default=15)
    parser.add_argument("--tiny", action="store_true", help="a 1 MB image, one round (CI)")
    args = parser.parse_args()
    if args.tiny:
        args.sizes, args.rounds, args.resolve_runs = "1", 1, 2
    sizes = [int(s) for s in args.sizes.split(",") if s]
    _byte_compile_package()

    with devstack.local_stack("dv-bench-", proxy=False) as stack:
        registry, env, root = stack.registry, stack.client_env(), stack.root

        def sh(*argv: str) -> str:
            return subprocess.run(
                list(argv), env=env, check=True, capture_output=True, text=True
            ).stdout

        def timed(*argv: str) -> float:
            start = time.perf_counter()
            sh(*argv)
            return time.perf_counter() - start

        sh("docker-variant", "install-plugin")
        host = root / "h200.json"
        host.write_text(
            json.dumps(
                {
                    "nvidia": nvidia_features((12, 8), (9, 0)),
                    "x86_64": {"level": ["v4", "v3", "v2", "v1"]},
                }
            )
        )
        label_args = {
            label: sh(
                "docker-variant",
                "labels",
                "--label",
                label,
                *[a for p in props for a in ("--property", p)],
            ).split()
            for label, props in VARIANTS.items()
        }

        results: list[tuple[int, str, list[float], list[float]]] = []
        for size in sizes:
            repository = f"{registry.address}/bench/app{size}"
            ref = f"{repository}:1.0.0"
            _push_version(sh, root / f"ctx{size}", ref, size, label_args)

            def clean(repository: str = repository) -> None:
                listing = sh(
                    "docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repository
                ).split()
                refs = [r for r in listing if not r.endswith(":<none>")]
                if refs:
                    sh("docker", "rmi", "-f", *refs)

            plain_argv = ("docker", "pull", "-q", f"{ref}-cu128")
            variant_argv = ("docker", "variant", "pull", "--providers-file", str(host), ref)
            # a warm-up of each: the engine's first pull, the plugin's first registry probe
            for argv in (plain_argv, variant_argv):
                clean()
                sh(*argv)
            # first as a plain registry serves it (the client scans the tags), then published
            # (SPEC 10: one request for the whole version)
            for source in ("tag scan", "published index"):
                if source == "published index":
                    sh("docker-variant", "publish", ref)
                plain: list[float] = []
                variant: list[float] = []
                for round_ in range(args.rounds):
                    order = [(plain, plain_argv), (variant, variant_argv)]
                    for times, argv in order if round_ % 2 == 0 else reversed(order):
                        clean()
                        times.append(timed(*argv))
                results.append((size, source, plain, variant))
            clean()

        index_file = root / "index.json"
        os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]  # this process's registry probe
        index_file.write_text(json.dumps(_index_of(ref)))
        resolve_cmd = [
            "docker-variant", "resolve", "--index", str(index_file),
            "--providers-file", str(host),
        ]  # fmt: skip
        baseline_cmd = [sys.executable, "-c", "import variantlib.api"]
        assert sh(*resolve_cmd).strip() == "1.0.0-cu128"
        resolve_times: list[float] = []
        baseline_times: list[float] = []
        for _ in range(args.resolve_runs):
            baseline_times.append(timed(*baseline_cmd))
            resolve_times.append(timed(*resolve_cmd))

    print(f"`docker variant pull` vs `docker pull REF-cu128`, 4 variants, {args.rounds} rounds")
    print(
        f"  {'size':>7} {'index from':>15} {'docker pull (median)':>21} "
        f"{'docker variant pull':>20} {'fixed cost':>11} {'aim':>7} {'ratio':>6}"
    )
    for size, source, plain, variant in results:
        fixed = _median_ms(variant) - _median_ms(plain)
        paired = statistics.median(v - p for v, p in zip(variant, plain, strict=True)) * 1e3
        verdict = "met" if fixed <= FIXED_COST_AIM_MS else "NOT met"
        print(
            f"  {size:>4} MB {source:>15} {_median_ms(plain):>18,.0f} ms "
            f"{_median_ms(variant):>17,.0f} ms {fixed:>8,.0f} ms {FIXED_COST_AIM_MS:>4.0f} ms "
            f"{_median_ms(variant) / _median_ms(plain):>6.2f}"
            f"  ({verdict}; per-round difference median {paired:,.0f} ms)"
        )
        print(
            f"{'':>25}ranges: docker pull {_range_ms(plain)} ms, "
            f"docker variant pull {_range_ms(variant)} ms"
        )
    ratio = statistics.median(resolve_times) / statistics.median(baseline_times)
    print(f"whole process, median of {args.resolve_runs} (interleaved)")
    print(f"  docker-variant resolve --index --providers-file {_median_ms(resolve_times):7.0f} ms")
    print(f"  python -c 'import variantlib.api'              {_median_ms(baseline_times):7.0f} ms")
    print(
        f"  ratio {ratio:.2f}, aim at most {RESOLVE_RATIO_AIM} "
        f"({'met' if ratio <= RESOLVE_RATIO_AIM else 'NOT met'})"
    )


def _push_version(
    sh: Callable[..., str], ctx: Path, ref: str, size_mb: int, label_args: dict[str, list[str]]
) -> None:
    """One version, one image per variant; the payload is the first layer, shared by all."""
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\nCOPY app.txt /app.txt\n")
    with (ctx / "payload").open("wb") as payload:
        for _ in range(size_mb):
            payload.write(os.urandom(1 << 20))
    for label, labels in label_args.items():
        (ctx / "app.txt").write_text(label)
        sh("docker", "build", "-q", "--network=host", "-t", f"{ref}-{label}", *labels, str(ctx))
        sh("docker", "push", f"{ref}-{label}")
    (ctx / "payload").unlink()


def _index_of(ref: str) -> dict[str, object]:
    """The version's section 5 document, as the client builds it from the registry."""
    from docker_variant.oci.source import fetch_index

    _, index = fetch_index(ref)
    return index.to_json()


if __name__ == "__main__":
    main()
