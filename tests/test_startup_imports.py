"""Start-up (bench/bench_startup.py has the times): ``docker-variant --version`` and
``variant-proxy --help`` load no library they do not print with, checked by the modules a
whole process has loaded at its exit, not by the clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from docker_variant import __version__

BIN = Path(sys.executable).parent
# Runs a console script (argv[2:]) as its own process would, and at exit writes the names of
# the modules it loaded to argv[1].
_WRAPPER = """
import atexit, json, runpy, sys
out, script = sys.argv[1], sys.argv[2]
@atexit.register
def dump():
    with open(out, "w") as handle:
        json.dump(sorted(n for n, m in sys.modules.items() if m is not None), handle)
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""
#: what the servers and the CLI run on, none of which prints a version or an option list
HEAVY = ("typer", "click", "rich", "httpx", "uvicorn", "starlette", "anyio", "redis",
         "prometheus_client", "sqlalchemy", "docker_variant.cli", "docker_variant.proxy.app",
         "docker_variant.oci.client", "docker_variant.server.limits")  # fmt: skip


def _loaded(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(out), str(BIN / argv[0]), *argv[1:]],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    modules = set(json.loads(out.read_text()))
    return done, {m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY}


@pytest.mark.parametrize(
    ("argv", "printed"),
    [
        (("docker-variant", "--version"), f"docker-variant {__version__}\n"),
        (("variant-proxy", "--help"), "usage: variant-proxy"),
        (("variant-proxy", "--version"), __version__),
        (("variant-scheduler", "--help"), "usage: variant-scheduler"),
    ],
)
def test_version_and_help_load_no_heavy_library(
    tmp_path: Path, argv: tuple[str, ...], printed: str
) -> None:
    done, heavy = _loaded(tmp_path, *argv)
    assert done.returncode == 0, done.stderr
    assert printed in done.stdout
    assert heavy == set(), sorted(heavy)


def test_the_cli_still_answers_version_after_other_options(tmp_path: Path) -> None:
    """Only ``--version`` alone takes the short way; the CLI's own option prints the same."""
    done, heavy = _loaded(tmp_path, "docker-variant", "--json", "--version")
    assert (done.returncode, done.stdout) == (0, f"docker-variant {__version__}\n"), done.stderr
    assert "typer" in heavy
