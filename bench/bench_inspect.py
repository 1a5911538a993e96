"""Inspection throughput: the layer walker over a gzip layer holding ``libcurand.so.10``
(167 MB, from the ``nvidia-curand-cu12`` 10.3.10.19 wheel) against ``tar -xzOf LAYER >
/dev/null`` of the same layer (issue 9's aim: within 2x of tar).

Run: .venv/bin/python bench/bench_inspect.py [--rounds N] [--wheels DIR] [--registry] [--tiny]
(the wheel comes from pytest's cache, ``.pytest_cache/d/docker-variant-nvidia-wheels``, as the
tests left it, else ``pip download``; about a minute here. ``--tiny``: one round over a small
layer of this interpreter's own ELF, no download, in seconds: a check that the bench runs.)

Each round runs both, alternating which goes first; the walker runs in a child process of
its own so that its peak RSS (``ru_maxrss``) can be reported: the layer must never be held in
memory. Medians are printed, with the ratio. ``--registry`` also times whole
``docker-variant inspect`` processes against a loopback registry holding the layer (process
start-up, download through the OCI client and the parse thread included).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEEL = "nvidia-curand-cu12==10.3.10.19"
RATIO_AIM = 2.0


def _wheel(cache: Path) -> Path:
    found = sorted(cache.glob("nvidia_curand_cu12-10.3.10.19-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), WHEEL],
            check=True,
        )
        found = sorted(cache.glob("nvidia_curand_cu12-10.3.10.19-*.whl"))
    return found[0]


def _layer(wheel: Path, work: Path) -> Path:
    root = work / "root"
    site = root / "usr/local/lib/python3.11/site-packages"
    site.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    layer = work / "layer.tar.gz"
    subprocess.run(["tar", "-czf", str(layer), "-C", str(root), "."], check=True)
    return layer


def _tiny_layer(work: Path) -> Path:
    """A small gzip layer: this interpreter's executable (a real ELF) and some text."""
    root = work / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python").write_bytes(Path(sys.executable).resolve().read_bytes())
    (root / "etc").mkdir()
    (root / "etc/motd").write_text("tiny bench layer\n" * 1000)
    layer = work / "layer.tar.gz"
    subprocess.run(["tar", "-czf", str(layer), "-C", str(root), "."], check=True)
    return layer


def _child(layer: Path) -> None:
    """One walk of ``layer``; prints seconds, peak RSS and what it found."""
    from docker_variant.contents.walker import merge_layers, scan_layer

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as spool, layer.open("rb") as stream:
        contents = merge_layers([scan_layer(stream, layer.name, Path(spool))])
    elapsed = time.perf_counter() - started
    fatbins = [f.value for f in contents.findings if f.kind == "fatbin"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": elapsed, "max_rss": rss, "fatbins": fatbins}))


def _walk(layer: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(layer)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def _tar(layer: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["tar", "-xzOf", str(layer)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return time.perf_counter() - started


def _push(url: str, layer: Path) -> str:
    """The layer as a one-layer image ``bench/inspect:1`` (monolithic blob uploads)."""
    import hashlib

    import httpx

    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}}).encode()
    data = layer.read_bytes()
    blobs = {"sha256:" + hashlib.sha256(b).hexdigest(): b for b in (config, data)}
    with httpx.Client(base_url=url, timeout=120) as http:
        for digest, blob in blobs.items():
            started = http.post("/v2/bench/inspect/blobs/uploads/")
            started.raise_for_status()
            location = httpx.URL(url).join(started.headers["location"])
            http.put(
                location.copy_merge_params({"digest": digest}), content=blob
            ).raise_for_status()
        (config_digest, layer_digest) = blobs
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest,
                    "size": len(data),
                }
            ],
        }
        http.put(
            "/v2/bench/inspect/manifests/1",
            content=json.dumps(manifest).encode(),
            headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
        ).raise_for_status()
    return "bench/inspect:1"


def _cli_rounds(layer: Path, rounds: int) -> list[float]:
    """Whole ``docker-variant inspect --json`` processes against a loopback registry."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "devtools"))
    import devstack

    with tempfile.TemporaryDirectory(prefix="bench-inspect-reg-") as name:
        registry = devstack.start_registry(Path(name))
        try:
            ref = f"{registry.address}/{_push(registry.url, layer)}"
            command = [
                str(Path(sys.executable).parent / "docker-variant"),
                "inspect",
                "--json",
                ref,
            ]
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                subprocess.run(command, check=True, capture_output=True)
                times.append(time.perf_counter() - started)
            return times
        finally:
            registry.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--wheels", type=Path, default=ROOT / ".pytest_cache/d/docker-variant-nvidia-wheels"
    )
    parser.add_argument(
        "--registry",
        action="store_true",
        help="also time the whole CLI against a loopback registry (docker-registry)",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="one round over a small layer of this interpreter's ELF (no download): seconds",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    if args.tiny:
        args.rounds = 1
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as name:
        if args.tiny:
            layer = _tiny_layer(Path(name))
            size = layer.stat().st_size
            print(f"layer: {size / 1e6:.2f} MB gzip (tiny: {Path(sys.executable).name} inside)")
        else:
            layer = _layer(_wheel(args.wheels), Path(name))
            size = layer.stat().st_size
            print(f"layer: {size / 1e6:.1f} MB gzip (libcurand.so.10 inside, 167 MB)")
        walks: list[float] = []
        tars: list[float] = []
        rss: list[float] = []
        for round_ in range(args.rounds):
            order = ["walk", "tar"] if round_ % 2 == 0 else ["tar", "walk"]
            for kind in order:
                if kind == "walk":
                    result = _walk(layer)
                    walks.append(result["seconds"])
                    rss.append(result["max_rss"])
                else:
                    tars.append(_tar(layer))
        walk, tar = statistics.median(walks), statistics.median(tars)
        print(f"inspect walker : median {walk:.2f} s ({size / walk / 1e6:.0f} MB/s of gzip)")
        print(f"tar -xzOf      : median {tar:.2f} s ({size / tar / 1e6:.0f} MB/s of gzip)")
        print(f"peak RSS of the walker: {max(rss) / 2**20:.0f} MiB (the layer is {size >> 20} MiB)")
        print(f"ratio walker/tar: {walk / tar:.2f} (aim: at most {RATIO_AIM})")
        print(f"rounds: {args.rounds}; walker {[round(w, 2) for w in walks]}")
        print(f"tar {[round(t, 2) for t in tars]}")
        if args.registry:
            cli = _cli_rounds(layer, args.rounds)
            median = statistics.median(cli)
            print(
                f"docker-variant inspect from a loopback registry (whole process): median "
                f"{median:.2f} s, {median / tar:.2f}x tar; {[round(c, 2) for c in cli]}"
            )


if __name__ == "__main__":
    main()
