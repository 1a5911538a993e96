"""Start-up of the commands a user runs most, against a bare interpreter doing the least the
command could: ``docker-variant --help`` and ``docker-variant providers`` against
``python -c 'import variantlib.api'`` (what a variant-aware installer loads; ``import
variantlib`` alone loads an almost empty package), ``variant-scheduler --help`` against
``python -c 'import argparse'``, and ``docker-variant --version`` and ``variant-proxy --help``
against ``variant-scheduler --help``. Wall time of whole processes, the median of ROUNDS runs
each, the commands rotated within each round so that a slow moment hits all of them alike.

    .venv/bin/python bench/bench_startup.py [--rounds N]

Aims (bench/README.md): each command at most 1.5 times its baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
PYTHON = sys.executable

VARIANTLIB_API = "python -c 'import variantlib.api'"  # what a variant-aware installer loads
ARGPARSE = "python -c 'import argparse'"
HELP, PROVIDERS, SCHEDULER_HELP, VERSION, PROXY_HELP = (
    "docker-variant --help",
    "docker-variant providers",
    "variant-scheduler --help",
    "docker-variant --version",
    "variant-proxy --help",
)
COMMANDS: dict[str, list[str]] = {
    VARIANTLIB_API: [PYTHON, "-c", "import variantlib.api"],
    ARGPARSE: [PYTHON, "-c", "import argparse"],
    HELP: [str(BIN / "docker-variant"), "--help"],
    PROVIDERS: [str(BIN / "docker-variant"), "providers"],
    SCHEDULER_HELP: [str(BIN / "variant-scheduler"), "--help"],
    VERSION: [str(BIN / "docker-variant"), "--version"],
    PROXY_HELP: [str(BIN / "variant-proxy"), "--help"],
}
#: (command, baseline): the ratios printed, each against its aim
RATIOS = [
    (HELP, VARIANTLIB_API), (PROVIDERS, VARIANTLIB_API), (SCHEDULER_HELP, ARGPARSE),
    (VERSION, SCHEDULER_HELP), (PROXY_HELP, SCHEDULER_HELP),
]  # fmt: skip
AIM = 1.5


def _run(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        # the detection cache as a user has it after the first run (providers reads it)
        env = {**os.environ, "XDG_CACHE_HOME": cache, "COLUMNS": "100"}
        for command in COMMANDS.values():
            _run(command, env)  # warm: page cache, .pyc files, the detection cache
        names = list(COMMANDS)
        times: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(_run(COMMANDS[name], env))
    load = os.getloadavg()[0]
    print(f"start-up, median of {args.rounds} runs (load average {load:.2f})")
    median = {name: statistics.median(runs) * 1000 for name, runs in times.items()}
    for name in names:
        print(f"  {name:36} {median[name]:7.1f} ms")
    for name, baseline in RATIOS:
        ratio = median[name] / median[baseline]
        verdict = "met" if ratio <= AIM else "missed"
        print(f"  {name:26} / {baseline:36} {ratio:5.2f} (aim {AIM}: {verdict})")


if __name__ == "__main__":
    main()
