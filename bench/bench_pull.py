"""`docker variant pull` against plain `docker pull` of the same chosen tag, with the floor
of any Python plugin measured in the same run, and the whole `docker-variant resolve --index`
process against importing variantlib.

Run: .venv/bin/python bench/bench_pull.py [--rounds N] [--sizes 100,1024] [--tiny]
(starts its own registry and engine, as the tests do; about 5 minutes here at 100 MB;
``--tiny``: a 1 MB image, 2 rounds, to check that the benchmark runs, in seconds.)

Both pulls go through the same engine and registry. Each size is pulled two ways: downloaded
(before each pull every local image of the repository is removed, so the whole image is
fetched and extracted) and present (the image is already there: what is left is the fixed
cost). Each is measured with the index from a tag scan (a plain registry), then with the
version published (one request for the whole version). The two kinds alternate, and swap
which goes first each round. The fixed cost of `docker variant pull` is the difference of
the medians (issue 20's aim: at most 250 ms), in wall time and in CPU time (user + system of
the processes each pull starts: the Docker CLI, and for the plugin its probe and itself).

The floor is what any plugin written in Python on httpx pays on top of `docker pull`, each
part the median of its runs, interleaved with the pulls' rounds:
- probe: Docker runs ``docker-variant docker-cli-plugin-metadata`` before the plugin, which
  a Python plugin answers from a Python process (the installed ``docker variant`` plugin
  script answers it without starting Python, about 1 ms: docker-variant pays less than this
  part of the floor);
- interpreter: ``python -c pass``, as the console script starts it;
- ``import httpx``: its import and httpcore's (which its first client loads), less the
  interpreter (without the two optional imports the entry point skips: httpx's own command
  line and trio);
- round trips: the requests the plugin makes beyond the engine's pull when the version is
  published and the image present, from a process that has httpx imported (the version's
  manifest from the registry; a ping and one inspection of the pulled image, whose tags
  are then in place, from the engine), with fresh connections as a new process has. A
  tag scan, and tagging a downloaded image, need more requests than this floor counts.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import httpx

import docker_variant

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "devtools"))
import devstack
from docker_variant.providers.nvidia import nvidia_features

FIXED_COST_AIM_MS = 250.0
RESOLVE_RATIO_AIM = 1.5
VARIANTS = {
    "cu128": ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"],
    "cu126": ["nvidia :: cuda_version_lower_bound :: 12.6"],
    "v3": ["x86_64 :: level :: v3"],
    "null": [],
}
_IMPORT_HTTPX = (
    "import sys; sys.modules['httpx._main'] = None; sys.modules['trio'] = None\n"
    "import httpx, httpcore"
)
_OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _byte_compile_package() -> None:
    """Measure the package as an install runs it, from .pyc files. This machine sets
    PYTHONDONTWRITEBYTECODE, so an editable install edited since scripts/setup would
    otherwise compile its modules in every process (100 to 150 ms on the pull path)."""
    compileall.compile_dir(Path(docker_variant.__file__).parent, quiet=1)


#: One measured run: (wall seconds, CPU seconds of the processes it started, user + system).
Run = tuple[float, float]


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def _range_ms(values: list[float]) -> str:
    return f"{min(values) * 1e3:,.0f} to {max(values) * 1e3:,.0f}"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every waited-for descendant
    return usage.ru_utime + usage.ru_stime


def _run(env: dict[str, str], *argv: str) -> Run:
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(list(argv), env=env, check=True, capture_output=True)
    return time.perf_counter() - start, _children_cpu() - cpu


def _wall(runs: list[Run]) -> list[float]:
    return [wall for wall, _ in runs]


def _cpu(runs: list[Run]) -> list[float]:
    return [cpu for _, cpu in runs]


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


class Floor:
    """The floor's parts, each sampled once per call of ``sample``."""

    def __init__(self, env: dict[str, str], registry: str, engine: str, ref: str) -> None:
        self.env, self.registry, self.engine, self.ref = env, registry, engine, ref
        self.parts: dict[str, list[Run]] = {
            "probe": [],
            "interpreter": [],
            "interpreter + import httpx": [],
            "round trips": [],
        }

    def _round_trips(self) -> Run:
        name, _, tag = self.ref.rpartition(":")
        repository = name.split("/", 1)[1]
        chosen = f"{self.ref}-cu128"
        start, cpu = time.perf_counter(), time.process_time()
        # plain HTTP needs no trust store: a context without one, as the plugin's is until
        # a handshake (loading the system's CAs is tens of ms that neither pays)
        untrusting = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        with httpx.Client(base_url=f"http://{self.registry}", verify=untrusting) as registry:
            # the published variant image index (before publishing: a 404, one round trip)
            registry.get(f"/v2/{repository}/manifests/{tag}", headers={"Accept": _OCI_INDEX})
        transport = httpx.HTTPTransport(uds=self.engine.removeprefix("unix://"), verify=untrusting)
        with httpx.Client(transport=transport, base_url="http://docker") as engine:
            engine.get("/_ping").raise_for_status()
            engine.get(f"/images/{quote(chosen, safe='')}/json")
        return time.perf_counter() - start, time.process_time() - cpu

    def sample(self) -> None:
        probe = ("docker-variant", "docker-cli-plugin-metadata")
        self.parts["probe"].append(_run(self.env, *probe))
        self.parts["interpreter"].append(_run(self.env, sys.executable, "-c", "pass"))
        self.parts["interpreter + import httpx"].append(
            _run(self.env, sys.executable, "-c", _IMPORT_HTTPX)
        )
        self.parts["round trips"].append(self._round_trips())

    def medians_ms(self, of: Callable[[list[Run]], list[float]]) -> dict[str, float]:
        """Each part's median (``of``: ``_wall`` or ``_cpu``), ``import httpx`` less the
        interpreter."""
        medians = {part: _median_ms(of(runs)) for part, runs in self.parts.items()}
        both = medians.pop("interpreter + import httpx")
        medians["import httpx"] = both - medians["interpreter"]
        return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="pulls of each kind per case")
    parser.add_argument("--sizes", default="100", help="image sizes in MB")
    parser.add_argument("--resolve-runs", type=int, default=15)
    parser.add_argument("--tiny", action="store_true", help="1 MB, 2 rounds: that it runs")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.sizes, args.resolve_runs = 2, "1", 2
    sizes = [int(s) for s in args.sizes.split(",") if s]
    _byte_compile_package()
    load_before = _load()

    with devstack.local_stack("dv-bench-", proxy=False) as stack:
        registry, env, root = stack.registry, stack.client_env(), stack.root
        assert stack.engine is not None

        def sh(*argv: str) -> str:
            return subprocess.run(
                list(argv), env=env, check=True, capture_output=True, text=True
            ).stdout

        def timed(*argv: str) -> Run:
            return _run(env, *argv)

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

        results: list[tuple[str, list[Run], list[Run]]] = []
        floor: Floor | None = None
        for size in sizes:
            repository = f"{registry.address}/bench/app{size}"
            ref = f"{repository}:1.0.0"
            _push_version(sh, root / f"ctx{size}", ref, size, label_args)
            if floor is None:
                floor = Floor(env, registry.address, stack.engine.address, ref)

            def clean(repository: str = repository) -> None:
                listing = sh(
                    "docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repository
                ).split()
                refs = [r for r in listing if not r.endswith(":<none>")]
                if refs:
                    sh("docker", "rmi", "-f", *refs)

            plain_argv: tuple[str, ...] = ("docker", "pull", "-q", f"{ref}-cu128")
            variant_argv = ("docker", "variant", "pull", "--providers-file", str(host), ref)
            # a warm-up of each: the engine's first pull, the plugin's first registry probe
            for argv in (plain_argv, variant_argv):
                clean()
                sh(*argv)
            # first as a plain registry serves it (the client scans the tags), then published
            for source in ("tag scan", "published index"):
                if source == "published index":
                    sh("docker-variant", "publish", ref)
                for present in (False, True):
                    plain: list[Run] = []
                    variant: list[Run] = []
                    for round_ in range(args.rounds):
                        order = [(plain, plain_argv), (variant, variant_argv)]
                        for times, argv in order if round_ % 2 == 0 else reversed(order):
                            if not present:
                                clean()
                            times.append(timed(*argv))
                        floor.sample()
                    case = f"{size} MB, {'present' if present else 'downloaded'}, {source}"
                    results.append((case, plain, variant))
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
            baseline_times.append(timed(*baseline_cmd)[0])
            resolve_times.append(timed(*resolve_cmd)[0])

    assert floor is not None
    print(
        f"`docker variant pull` vs `docker pull REF-cu128`, 4 variants, {args.rounds} rounds; "
        f"load average {load_before} before, {_load()} after"
    )
    for measure, of in (("wall", _wall), ("CPU", _cpu)):
        parts = floor.medians_ms(of)
        floor_ms = sum(parts.values())
        print(
            f"{measure}: floor (probe + interpreter + import httpx + round trips, medians of "
            f"{len(floor.parts['probe'])}): {floor_ms:,.0f} ms = "
            + " + ".join(f"{part} {ms:,.0f}" for part, ms in parts.items())
        )
        print(
            f"  {'case':<38} {'docker pull':>12} {'variant pull':>13} {'fixed cost':>11} "
            f"{'over floor':>11} {'aim':>7}"
        )
        for case, plain_runs, variant_runs in results:
            docker_s, plugin_s = of(plain_runs), of(variant_runs)
            fixed = _median_ms(plugin_s) - _median_ms(docker_s)
            paired = statistics.median(v - p for v, p in zip(plugin_s, docker_s, strict=True)) * 1e3
            verdict = "met" if fixed <= FIXED_COST_AIM_MS else "NOT met"
            print(
                f"  {case:<38} {_median_ms(docker_s):>9,.0f} ms {_median_ms(plugin_s):>10,.0f} ms "
                f"{fixed:>8,.0f} ms {fixed - floor_ms:>8,.0f} ms {FIXED_COST_AIM_MS:>4.0f} ms"
                f"  ({verdict}; per-round difference median {paired:,.0f} ms)"
            )
            print(
                f"{'':>40}ranges: docker pull {_range_ms(docker_s)} ms, "
                f"docker variant pull {_range_ms(plugin_s)} ms"
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
    """The version's index document, as the client builds it from the registry."""
    from docker_variant.oci.source import fetch_index

    _, index = fetch_index(ref)
    return index.to_json()


if __name__ == "__main__":
    main()
