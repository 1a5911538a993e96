"""variant-proxy, alone and behind the shipped nginx front, against the registry it fronts.

Run: .venv/bin/python bench/bench_proxy.py [--rounds N] [--turns N] [--tiny]

Peers, all in front of one loopback registry and measured in the same rounds:
- ``direct``: the registry itself;
- ``nginx``: nginx alone, a plain ``proxy_pass`` with nginx's default buffering (the
  "default-config" peer);
- ``front``: the shipped ``deploy/nginx/variant-proxy.conf`` before the registry and
  variant-proxy (the production set-up);
- ``proxy``: variant-proxy alone (the demo's set-up);
- ``relay``: a bare TCP relay, no HTTP, a thread each way: the ceiling of any relay here.

Figures (each a median over the round; requests take turns between the peers in an order
that rotates every turn; the load average is printed with every round):
- manifest GET (kept-alive httpx client), each peer over direct;
- resolved manifest GET (``X-Variant-Properties``, warm index cache) over a plain manifest
  GET, through the front (variant-proxy answers ``X-Accel-Redirect``, nginx fetches the
  manifest) and from the proxy alone (which relays it);
- blob GET of 256 MiB with curl: each peer's throughput over direct's;
- ``_variants`` warm through the front over the client-side tag scan (what it saves).

The aims (issue 41) are printed with each figure: through the front, a plain manifest within
0.05 of nginx alone (of direct), a blob within 0.03, and a resolved manifest at most 1.3x a
plain one; the proxy alone at most 1.5x direct for a manifest, a resolved one at most 1.3x
its plain one, and at least nginx's default-config throughput for a blob. ``--tiny`` runs every
part at a size that runs in seconds (CI runs it so that the script keeps working; its
figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "devtools"))
import devstack
from docker_variant.oci.scan import scan_index_sync
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest

REPO = "bench/app"
HOST = {"nvidia": {"cuda_version_lower_bound": ["12.8", "12.6"]}, "x86_64": {"level": ["v3"]}}


def nginx_default(registry: str, root: Path) -> devstack.Service:
    """nginx alone before ``registry``: a plain ``proxy_pass``, nginx's default buffering,
    kept-alive upstream connections."""

    def site(port: int) -> str:
        return f"""upstream registry {{ server {registry}; keepalive 16; }}
server {{
    listen 127.0.0.1:{port};
    client_max_body_size 0;
    location / {{
        proxy_pass http://registry;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $http_host;
    }}
}}
"""

    return devstack.start_nginx(site, root)


def _relay_forever(server: socket.socket, upstream_port: int) -> None:
    def pump(source: socket.socket, target: socket.socket) -> None:
        view = memoryview(bytearray(1 << 20))
        try:
            while got := source.recv_into(view):
                target.sendall(view[:got])
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
        for source, target in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(source, target), daemon=True).start()


def tcp_relay(upstream_port: int) -> tuple[int, multiprocessing.process.BaseProcess]:
    """A bare TCP relay to ``upstream_port`` in a process of its own (its threads do not
    share the client's interpreter); returns its port and the process."""
    server = socket.create_server(("127.0.0.1", 0))
    process = multiprocessing.get_context("fork").Process(
        target=_relay_forever, args=(server, upstream_port), daemon=True
    )
    process.start()
    port: int = server.getsockname()[1]
    return port, process


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def rotated(names: list[str], turn: int) -> list[str]:
    shift = turn % len(names)
    return names[shift:] + names[:shift]


def turns(runs: dict[str, Callable[[], float]], count: int) -> dict[str, float]:
    """Each run's median over ``count`` turns, the runs taking turns in a rotating order
    (each run returns its own measure: seconds, or bytes a second)."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for turn in range(count):
        for name in rotated(names, turn):
            samples[name].append(runs[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    return run


def curl_speed(url: str) -> Callable[[], float]:
    def run() -> float:
        out = subprocess.run(
            ["curl", "-sf", "-o", "/dev/null", "-w", "%{speed_download}", url],
            check=True,
            capture_output=True,
            text=True,
        )
        return float(out.stdout)

    return run


def getter(client: httpx.Client, path: str) -> Callable[[], object]:
    return lambda: client.get(path)


def verdict(ok: bool) -> str:
    return "meets the aim" if ok else "MISSES the aim"


def publish(base: str, blob_bytes: int) -> tuple[str, str]:
    """The bench version: cu128, cu126 and v3 variants and a bare image; a big blob.
    Returns (the bare manifest's path, the blob's path)."""
    layer = os.urandom(1024)
    push_blob(base, REPO, layer)
    variants = {
        "1.0.0-cu128": {"dev.pep817.variant.nvidia.cuda_version_lower_bound": "12.8"},
        "1.0.0-cu126": {"dev.pep817.variant.nvidia.cuda_version_lower_bound": "12.6"},
        "1.0.0-v3": {"dev.pep817.variant.x86_64.level": "v3"},
        "1.0.0": {},
    }
    for tag, labels in variants.items():
        if labels:
            labels = {"dev.pep817.variant-label": tag.rsplit("-", 1)[1], **labels}
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels}})
        push_blob(base, REPO, config.encode())
        push_manifest(base, REPO, tag, raw_manifest(config.encode(), [layer]), OCI_MANIFEST)
    big = os.urandom(blob_bytes)
    digest = push_blob(base, REPO, big)
    return f"/v2/{REPO}/manifests/1.0.0", f"/v2/{REPO}/blobs/{digest}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=300, help="manifest GETs a peer a round")
    parser.add_argument("--blob-turns", type=int, default=7, help="blob GETs a peer a round")
    parser.add_argument("--blob-mib", type=int, default=256)
    parser.add_argument("--tiny", action="store_true", help="seconds, not minutes (CI)")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.turns, args.blob_turns, args.blob_mib = 1, 10, 2, 4

    root = Path(tempfile.mkdtemp(prefix="dv-bench-proxy-"))
    started: list[devstack.Service] = []
    relay_process: multiprocessing.process.BaseProcess | None = None
    try:
        registry = devstack.start_registry(root / "registry")
        started.append(registry)
        proxy = devstack.start_proxy(
            registry.url, root / "proxy", cache_ttl=3600, extra=["--log-level", "warning"]
        )
        started.append(proxy)
        front = devstack.start_nginx_front(registry.address, proxy.address, root / "front")
        started.append(front)
        nginx = nginx_default(registry.address, root / "nginx")
        started.append(nginx)
        relay_port, relay_process = tcp_relay(int(registry.address.rsplit(":", 1)[1]))
        relay = f"127.0.0.1:{relay_port}"
        manifest, blob = publish(registry.url, args.blob_mib << 20)
        peers = {
            "direct": registry.url,
            "nginx": nginx.url,
            "front": front.url,
            "proxy": proxy.url,
            "relay": f"http://{relay}",
        }
        print(f"variant-proxy bench: {args.rounds} rounds, {load()}")
        accept = {"Accept": OCI_MANIFEST}
        resolved = {**accept, "X-Variant-Properties": json.dumps(HOST, separators=(",", ":"))}
        clients = {name: httpx.Client(base_url=url, headers=accept) for name, url in peers.items()}
        front_resolving = httpx.Client(base_url=front.url, headers=resolved)
        proxy_resolving = httpx.Client(base_url=proxy.url, headers=resolved)
        for resolving in (front_resolving, proxy_resolving):  # warm, and the right variant
            assert resolving.get(manifest).headers["x-variant-label"] == "cu128"
        for round_number in range(1, args.rounds + 1):
            runs = {name: timed(getter(client, manifest)) for name, client in clients.items()}
            runs["front resolved"] = timed(getter(front_resolving, manifest))
            runs["proxy resolved"] = timed(getter(proxy_resolving, manifest))
            ms = turns(runs, args.turns)
            ratio = {name: ms[name] / ms["direct"] for name in ms}
            print(f"round {round_number}: manifest GET, median ms ({load()})")
            for name in ms:
                print(
                    f"  {name:15} {ms[name] * 1e3:7.3f} ms  ratio {name}/direct {ratio[name]:.3f}"
                )
            gap = ratio["front"] - ratio["nginx"]
            print(f"  front vs nginx alone: {gap:+.3f} of direct ({verdict(gap <= 0.05)}: 0.05)")
            for peer in ("front", "proxy"):
                resolved_ratio = ms[f"{peer} resolved"] / ms[peer]
                print(
                    f"  ratio resolved/plain, {peer} {resolved_ratio:.3f} "
                    f"({verdict(resolved_ratio <= 1.3)}: 1.3)"
                )
            print(
                f"  proxy alone/direct {ratio['proxy']:.3f} ({verdict(ratio['proxy'] <= 1.5)}: 1.5)"
            )

            speed = turns(
                {name: curl_speed(url + blob) for name, url in peers.items()}, args.blob_turns
            )
            print(f"round {round_number}: blob GET of {args.blob_mib} MiB, median MB/s ({load()})")
            for name, value in speed.items():
                print(
                    f"  {name:15} {value / 1e6:8.1f} MB/s  ratio {name}/direct "
                    f"{value / speed['direct']:.3f}"
                )
            gap = (speed["nginx"] - speed["front"]) / speed["direct"]
            print(f"  front vs nginx alone: {-gap:+.3f} of direct ({verdict(gap <= 0.03)}: 0.03)")
            alone = speed["proxy"] / speed["nginx"]
            print(
                f"  ratio proxy alone/nginx default config {alone:.3f} "
                f"({verdict(alone >= 1.0)}: at least 1)"
            )

        scan = timed(lambda: scan_index_sync(registry.url, REPO, "1.0.0"))
        warm = timed(lambda: clients["front"].get(f"/v2/{REPO}/_variants/1.0.0"))
        index = turns({"client scan": scan, "front warm": warm}, max(args.turns // 10, 3))
        print(
            f"_variants warm through the front {index['front warm'] * 1e3:.3f} ms, client scan "
            f"{index['client scan'] * 1e3:.3f} ms: ratio client/warm "
            f"{index['client scan'] / index['front warm']:.1f}"
        )
    finally:
        if relay_process is not None:
            relay_process.terminate()
        for service in reversed(started):
            service.stop()


if __name__ == "__main__":
    main()
