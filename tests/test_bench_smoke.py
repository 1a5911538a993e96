"""Every benchmark still runs: each bench/ script at its ``--tiny`` size, as a subprocess,
must exit 0 and print its ratio lines. Its figures decide nothing here (tiny sizes on a
shared machine mean nothing); the benchmarks themselves are run by hand (bench/README.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
# script -> the tools it needs, and what its output must contain
SCRIPTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "bench_selection.py": ((), ("ratio ours / variantlib", "ratio resolve / bare python")),
    "bench_publish.py": (("docker-registry",), ("scan/index",)),
    "bench_proxy.py": (
        ("docker-registry", "curl", "nginx"),
        (
            "ratio proxy/direct",
            "ratio relay/direct",
            "ratio resolved/plain, front",
            "ratio resolved/plain, proxy",
            "ratio proxy alone/nginx default config",
            "load average",
            "client/warm",
        ),
    ),
    "bench_proxy_servers.py": (("docker-registry",), ("ratio uvicorn accel/direct",)),
    "bench_pull.py": (("docker-registry", "dockerd", "skopeo"), ("ratio", "fixed cost")),
    "bench_scheduler.py": ((), ("ratio",)),
    "bench_inspect.py": ((), ("ratio",)),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_the_benchmark_runs_at_its_tiny_size(script: str) -> None:
    tools, expected = SCRIPTS[script]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{script} needs {', '.join(missing)} (scripts/setup installs them)")
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--tiny"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=BENCH.parent,
    )
    assert done.returncode == 0, (
        f"{script} --tiny failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    for text in expected:
        assert text in done.stdout, f"{script} --tiny printed no {text!r} line:\n{done.stdout}"
