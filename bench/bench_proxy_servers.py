"""Candidate ASGI servers under variant-proxy: uvicorn (shipped) against granian.

Run: .venv/bin/python bench/bench_proxy_servers.py [--turns N] [--rounds N]
(granian is no dependency: ``pip install granian`` into the venv, or put it on PYTHONPATH)

Both serve the same app (``create_app``) before one loopback registry, in the same rounds,
taking turns. Figures, medians over the round, over a manifest GET from the registry direct:
- ``accel``: a resolved manifest GET as the nginx front sends it (``X-Variant-Front``): the
  proxy's whole cost on the front's resolved path (its answer is an ``X-Accel-Redirect``);
- ``relay``: a plain manifest GET the proxy relays (its cost when it runs alone).
uvicorn runs twice: as shipped (``--log-level info``, an access-log line a request) and
``quiet`` (``warning``: no access log), which tells what the log costs; granian as ``create_app``
runs under any server (its access log goes to the ``docker_variant.proxy.access`` logger, unset).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "devtools"))
import devstack
from bench_proxy import HOST, getter, load, publish, timed, turns
from imaging import OCI_MANIFEST

_APP = "from docker_variant.proxy.app import create_app\napp = create_app('{upstream}', 3600)\n"


def start_granian(upstream: str, root: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """The proxy's app under granian (one worker) on a free loopback port: its URL."""
    (root / "granian_app.py").write_text(_APP.format(upstream=upstream))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *sys.path]))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "granian", "--interface", "asgi", "--workers", "1",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "granian_app:app"]  # fmt: skip
    process = subprocess.Popen(argv, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return url, process
        except httpx.TransportError:
            time.sleep(0.1)  # not listening yet
    process.kill()
    raise SystemExit("granian did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--tiny", action="store_true", help="seconds, not minutes (CI)")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.turns = 1, 10
    root = Path(tempfile.mkdtemp(prefix="dv-bench-servers-"))
    started: list[devstack.Service] = []
    granian: subprocess.Popen[bytes] | None = None
    try:
        registry = devstack.start_registry(root / "registry")
        started.append(registry)
        manifest, _ = publish(registry.url, 1024)
        servers: dict[str, str] = {}
        for name, level in (("uvicorn", "info"), ("uvicorn quiet", "warning")):
            extra = ["--log-level", level]  # info: one access-log line a request (the default)
            uvicorn = devstack.start_proxy(registry.url, root / level, 3600, extra=extra)
            started.append(uvicorn)
            servers[name] = uvicorn.url
        if importlib.util.find_spec("granian") is None:
            print("granian is not installed: uvicorn alone is measured")
        else:
            servers["granian"], granian = start_granian(registry.url, root)
        accept = {"Accept": OCI_MANIFEST}
        front = {**accept, "X-Variant-Front": "accel-redirect",
                 "X-Variant-Properties": json.dumps(HOST, separators=(",", ":"))}  # fmt: skip
        direct = httpx.Client(base_url=registry.url, headers=accept)
        runs = {"direct": timed(getter(direct, manifest))}
        for name, url in servers.items():
            accel = httpx.Client(base_url=url, headers=front)
            assert accel.get(manifest).headers["x-accel-redirect"]  # warm, and the front's path
            runs[f"{name} accel"] = timed(getter(accel, manifest))
            relay = httpx.Client(base_url=url, headers=accept)
            runs[f"{name} relay"] = timed(getter(relay, manifest))
        for number in range(1, args.rounds + 1):
            ms = turns(runs, args.turns)
            print(f"round {number}: median ms ({load()})")
            for name, value in ms.items():
                ratio = value / ms["direct"]
                print(f"  {name:15} {value * 1e3:7.3f} ms  ratio {name}/direct {ratio:.3f}")
    finally:
        if granian is not None:
            granian.terminate()
            granian.wait()
        for service in reversed(started):
            service.stop()


if __name__ == "__main__":
    main()
