"""variant-proxy from several revisions of this repository, in the same rounds.

Run: .venv/bin/python bench/bench_proxy_ab.py [REV ...] [--rounds N] [--turns N] [--run N]
     [--tiny]
- each REV (a commit, a branch, a tag; ``.`` for the working tree; a folder holding a built
  ``docker_variant`` package; default: ``HEAD .``) is exported with ``git archive REV``, its
  C extensions built in place where it has a ``setup.py``, and started as a
  ``variant-proxy`` of its own (this interpreter, that tree first on ``PYTHONPATH``, this
  venv's packages behind it) in front of one registry, beside the bare uvloop relay of
  ``bench_proxy.py``
- manifest GETs take turns between direct, every proxy and the relay, in an order that
  rotates every turn, as in ``bench_proxy.py``; each round prints every server's median over
  direct and its CPU per GET, and the last line each proxy's CPU against the first REV's;
  a proxy whose heads are read by the expressions, not C, is marked "(no C)"
- ``--run N``: each server takes N requests in a row a turn (default 1: as the aim's rounds
  of ``bench_proxy.py``; 10: as under steady traffic)
- ``--tiny``: one round of 20 turns (CI runs it so that the script keeps working)

What a change does to the proxy's cost shows best this way: the machine's speed moves between
runs here by more than most changes move the proxy, and every server in one round sees the
same machine. Two proxies of the same code in the same rounds differ by up to 0.04 of direct
at a median of 200 turns; the CPU per GET, which the load disturbs far less, by a few per
cent (bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
# bench_proxy.py's peers and rounds; it puts tests/ and devtools/ on the path, for these two
import bench_proxy
import devstack
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "/v2/bench/ab/manifests/1"


def export(rev: str, into: Path) -> Path:
    """The ``src`` folder of ``rev`` (``.``: the working tree's own; a folder with a
    ``docker_variant`` package in it: that folder, as a build left it)."""
    if rev == ".":
        return REPO / "src"
    if (Path(rev) / "docker_variant").is_dir():
        return Path(rev).resolve()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev],
        capture_output=True,
        check=True,
    ).stdout
    target = into / rev.replace("/", "_")
    target.mkdir()
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    if (target / "setup.py").exists():  # C extensions, built in place as an install does
        # (optional ones: where one fails, the proxy serves without it, marked "no C")
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
            cwd=target,
            capture_output=True,
            check=False,
        )
    return target / "src"


@contextlib.contextmanager
def python_path(first: Path) -> Iterator[None]:
    """``first`` at the head of the ``PYTHONPATH`` that started processes inherit."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(first), before]))
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def imported_from(src: Path) -> tuple[Path, bool]:
    """Where a process started with ``src`` first on its path imports the package from, and
    whether its proxy reads heads in C (``heads.NATIVE``; False where the tree has none)."""
    script = (
        "import docker_variant.proxy.heads as h; print(h.__file__); "
        "print(getattr(h, 'NATIVE', False))"
    )
    with python_path(src):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        )
    location, native = done.stdout.split()
    return Path(location).parent.parent.parent, native == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="*", default=["HEAD", "."], help="revisions (. = tree)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of turns")
    parser.add_argument("--turns", type=int, default=1000, help="manifest GETs of each a round")
    parser.add_argument("--run", type=int, default=1, help="requests in a row of each a turn")
    parser.add_argument("--tiny", action="store_true", help="one round of 20 turns (CI)")
    args = parser.parse_args()
    rounds, turns = (1, 20) if args.tiny else (args.rounds, args.turns)
    revs: list[str] = args.revs
    with (
        tempfile.TemporaryDirectory(prefix="dv-ab-") as trees,
        devstack.local_stack("dv-ab-", engine=False, proxy=False) as stack,
    ):
        registry = stack.registry
        layer = os.urandom(1000)
        push_blob(registry.url, "bench/ab", b"{}")
        push_blob(registry.url, "bench/ab", layer)
        push_manifest(registry.url, "bench/ab", "1", raw_manifest(b"{}", [layer]), OCI_MANIFEST)
        services: list[devstack.Service] = []
        peers = {"direct": (registry.url, registry.process.pid)}
        try:
            for number, rev in enumerate(revs):
                src = export(rev, Path(trees))
                location, native = imported_from(src)
                if location != src.resolve():
                    raise SystemExit(f"bench_proxy_ab: {rev}'s tree is not what Python imports")
                with python_path(src):
                    proxy = devstack.start_proxy(registry.url, stack.root / f"proxy-{number}")
                services.append(proxy)
                peers[f"{number}:{rev}{'' if native else ' (no C)'}"] = (
                    proxy.url,
                    proxy.process.pid,
                )
            relay = bench_proxy.start_relay("loop", registry.address, stack.root)
            services.append(relay)
            peers["relay"] = (relay.url, relay.process.pid)
            names = [name for name in peers if name != "direct"]
            print(
                f"manifest GET over direct, median of {turns} a round, {', '.join(peers)} "
                f"taking turns in rotated order; load average {bench_proxy.load_average()}"
            )
            cpu_sums = dict.fromkeys(names, 0.0)
            with contextlib.ExitStack() as closing:
                clients = {name: closing.enter_context(httpx.Client()) for name in peers}
                for _ in range(rounds):
                    runs: dict[str, Callable[[], object]] = {
                        name: functools.partial(
                            clients[name].get, url + MANIFEST, headers={"Accept": OCI_MANIFEST}
                        )
                        for name, (url, _) in peers.items()
                    }
                    pids = {name: pid for name, (_, pid) in peers.items()}
                    ms, cpu = bench_proxy.turns_ms(runs, turns, pids, args.run)
                    for name in names:
                        cpu_sums[name] += cpu[name]
                    print(
                        "  "
                        + "   ".join(
                            f"{name} {ms[name] / ms['direct']:.3f} ({cpu[name]:.0f} us CPU)"
                            for name in names
                        )
                        + f"   direct {ms['direct']:.2f} ms"
                    )
            first = names[0]
            print(
                "  CPU per GET against "
                + first
                + ": "
                + "   ".join(
                    f"{name} {cpu_sums[name] / cpu_sums[first]:.3f}" for name in names[1:-1]
                )
                + f"; load average {bench_proxy.load_average()}"
            )
        finally:
            for service in services:
                service.stop()


if __name__ == "__main__":
    main()
