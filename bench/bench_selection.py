"""Selection speed: our compiled matcher vs variantlib, and the whole `resolve --index` process.

Run: .venv/bin/python bench/bench_selection.py   (prints a table with ratios)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from baseline import variantlib_order
from docker_variant.providers.nvidia import nvidia_features
from docker_variant.variant import SupportedLists, Variant, VariantIndex, select
from docker_variant.variant.index import ImageRef

X86_FLAGS = [
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx2",
    "avx",
    "bmi2",
    "fma",
    "f16c",
    "sse4_2",
    "popcnt",
]


def rich_host() -> SupportedLists:
    """An H200 box on a CUDA 12.8 driver with an x86-64-v4 CPU and an NPU plugin."""
    return {
        "nvidia": nvidia_features((12, 8), (9, 0)),
        "x86_64": {"level": ["v4", "v3", "v2", "v1"]} | {flag: ["on"] for flag in X86_FLAGS},
        "acme_npu": {"gen": ["g3", "g2", "g1"], "sdk": ["2.1", "2.0", "1.9"]},
    }


def make_index(count: int, seed: int = 7) -> VariantIndex:
    rng = random.Random(seed)
    cuda = [f"12.{m}" for m in range(10)] + ["11.8", "13.0"]
    sm = ["80_real", "86_real", "89_real", "90_real", "90_virtual", "100_real", "120_real"]
    variants: dict[str, Variant] = {}
    for i in range(count):
        props: dict[str, dict[str, list[str]]] = {}
        if rng.random() < 0.8:
            props["nvidia"] = {"cuda_version_lower_bound": [rng.choice(cuda)]}
            if rng.random() < 0.6:
                props["nvidia"]["sm_arch"] = rng.sample(sm, rng.randint(1, 3))
        if rng.random() < 0.5 or not props:
            props["x86_64"] = {"level": [rng.choice(["v1", "v2", "v3", "v4"])]}
            if rng.random() < 0.3:
                props["x86_64"][rng.choice(X86_FLAGS)] = ["on"]
        if rng.random() < 0.1:
            props["acme_npu"] = {"gen": [rng.choice(["g1", "g2", "g3", "g4"])]}
        variants[f"v{i:04d}"] = Variant.from_json(f"v{i:04d}", props)
    # every variant has its image (an index document names one per variant)
    images = {
        label: ImageRef(f"1.0-{label}", "sha256:" + hashlib.sha256(label.encode()).hexdigest())
        for label in variants
    }
    return VariantIndex(["nvidia", "acme_npu", "x86_64"], variants, images)


def timed(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    tiny = "--tiny" in sys.argv[1:]  # 50 variants, few repeats: seconds, for CI
    size, repeat = (50, 2) if tiny else (1000, 1)
    host = rich_host()
    index = make_index(size)
    ours = [c.label for c in select(index, host).ranked]
    theirs = variantlib_order(index, host)
    assert ours == theirs, "parity broken: the benchmark would compare different answers"
    t_ours = timed(lambda: select(index, host), 15 // repeat)
    t_lib = timed(lambda: variantlib_order(index, host), 5 // repeat)
    print(f"selection of {size:,} variants ({len(ours)} compatible) on a rich host")
    print(f"  docker_variant.select        {t_ours * 1e3:8.2f} ms")
    print(f"  variantlib sort_and_filter   {t_lib * 1e3:8.2f} ms")
    print(f"  ratio ours / variantlib      {t_ours / t_lib:8.3f}  (speed-up x{t_lib / t_ours:.1f})")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index.json"
        path.write_text(json.dumps(index.to_json()))
        env = {**os.environ, "XDG_CACHE_HOME": tmp}
        cmd = [sys.executable, "-m", "docker_variant", "resolve", "--index", str(path)]
        subprocess.run(cmd, env=env, check=True, capture_output=True)  # warms the provider cache
        t_cli = timed(
            lambda: subprocess.run(cmd, env=env, check=True, capture_output=True), 10 // repeat
        )
        t_py = timed(
            lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), 10 // repeat
        )
    print(f"whole `docker-variant resolve --index` process, warm provider cache, {size:,} variants")
    print(f"  docker-variant resolve       {t_cli * 1e3:8.1f} ms")
    print(f"  bare `python -c pass`        {t_py * 1e3:8.1f} ms")
    print(f"  ratio resolve / bare python  {t_cli / t_py:8.2f}")


if __name__ == "__main__":
    main()
