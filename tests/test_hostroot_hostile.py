"""Hostile files where sysfs files should be, under ``--host-root``: a FIFO with no writer, a
link to ``/dev/zero``, a symlink loop, a 1 GB file. Each ends at once, in bounded memory,
with exit 0 and the namespace empty (the file counts as absent, as a vanished sysfs
attribute does), never a hang, a traceback or a read of the whole file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clirun import cli_env

HOSTS = Path(__file__).parent / "fixtures" / "hostroot"
MAX_RSS_KB = 256 * 1024  # a CLI run takes about 60 MB; reading 1 GB would take 1 GB


def fifo(path: Path) -> None:
    os.mkfifo(path)


def dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def loop(path: Path) -> None:
    path.symlink_to(path.name)  # itself: ELOOP on open


def one_gigabyte(path: Path) -> None:
    with path.open("wb") as handle:  # sparse: no disk used, but a read of it would take 1 GB
        handle.truncate(1 << 30)


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": fifo,
    "dev-zero": dev_zero,
    "loop": loop,
    "1GB": one_gigabyte,
}


# Linux keeps the peak RSS of the memory a process exec'd from, so a CLI started straight
# from a large pytest would report pytest's size. A fresh, small interpreter starts it
# instead and reports its child's peak alone (wait4), on its own last line of stderr.
PEAK_OF_CHILD = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
sys.stderr.write("\\npeak-rss-kib=%d\\n" % usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def providers(tmp_path: Path, *more: str) -> tuple[int, dict[str, Any], str, int]:
    """``docker-variant providers --json --host-root ROOT``: (exit code, the JSON, stderr,
    its peak memory in KiB), killed with its starter if it runs past a deadline."""
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                PEAK_OF_CHILD,
                sys.executable,
                "-m",
                "docker_variant",
                "providers",
                "--devices",
                "--json",
                "--host-root",
                *more,
            ],
            stdout=stdout,
            stderr=stderr,
            env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "cache")}, tmp_path),
            start_new_session=True,  # the deadline ends the starter and the CLI together
        )
    deadline = threading.Timer(60, os.killpg, (process.pid, signal.SIGKILL))
    deadline.start()
    try:
        code = process.wait()  # a hang ends at the deadline, and fails below
    finally:
        deadline.cancel()
    text, errors = out.read_text(), err.read_text()
    errors, _, peak = errors.rpartition("\npeak-rss-kib=")
    return (
        code,
        json.loads(text) if text.strip() else {},
        errors,
        int(peak) if peak.strip().isdigit() else MAX_RSS_KB,
    )


def test_the_fixtures_are_read_when_intact(tmp_path: Path) -> None:
    """The control: the same host roots, untouched, give their namespaces."""
    code, report, err, _ = providers(tmp_path, str(HOSTS / "mi300x"))
    assert (code, report["host"]["amd"]["gfx_arch"]) == (0, ["gfx942"]), err
    descriptors = str(Path(__file__).parents[1] / "examples" / "providers.d")
    code, report, err, _ = providers(tmp_path, str(HOSTS / "warboy"), "--descriptors", descriptors)
    assert (code, len(report["devices"]["furiosa"])) == (0, 2), err


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_kfd_properties_file_is_absent(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(HOSTS / "mi300x", root)
    nodes = sorted((root / "sys/class/kfd/kfd/topology/nodes").iterdir())
    for node in nodes:
        (node / "properties").unlink()
        HOSTILE[kind](node / "properties")
    code, report, err, peak = providers(tmp_path, str(root))
    assert code == 0, err
    assert "Traceback" not in err
    assert not report.get("host", {}).get("amd")
    assert peak < MAX_RSS_KB, peak


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_pci_id_file_is_absent(kind: str, tmp_path: Path) -> None:
    """A descriptor's PCI match reads ``vendor`` and ``device``: a hostile one is no match."""
    root = tmp_path / "root"
    shutil.copytree(HOSTS / "warboy", root)
    for device in (root / "sys/bus/pci/devices").iterdir():
        (device / "vendor").unlink()
        HOSTILE[kind](device / "vendor")
    descriptors = Path(__file__).parents[1] / "examples" / "providers.d"
    code, report, err, peak = providers(tmp_path, str(root), "--descriptors", str(descriptors))
    assert code == 0, err
    assert "Traceback" not in err
    assert not report.get("devices", {}).get("furiosa")
    assert peak < MAX_RSS_KB, peak
