"""Scheduler speed: matching an index against a large pool, and placements through HTTP.

1. An index of 30 variants against 80,000 devices (10,000 agents with 8 GPUs each, of six
   GPU/driver kinds), built in memory: our matcher (each distinct device class compiled
   once, then a dict look-up per device) vs variantlib's ``sort_and_filter_supported_variants``
   called per device. variantlib is timed on a sample of devices and extrapolated (said so in
   the output); on that sample both must give the same order, device by device. Each call of
   variantlib also reads the metadata of every installed distribution
   (``inject_abi_dependency``), which dominates its time and grows with the environment, so
   it is timed a second time with that step stubbed out: the ordering alone.
2. A gang of 64 nodes x 8 GPUs at 1k, 10k and 50k agents: ``plan()`` on the indexed pool,
   the former planner that scanned every node (``tests/scheduler_reference.py``) as the
   baseline (giving the same plan), a whole ``Store.place`` on SQLite (versions read, plan on
   the pool in memory, the commit of 512 allocations, the pool in memory updated; freed
   again, untimed, after each run), the same with an agent TTL, and ``plan()`` refusing 9
   GPUs a node (every variant explained). Each figure is the median of ``--runs`` (at least
   7) after 5 warm-up runs, with ``gc.collect()`` before every timed run; the growth from 10k
   to 50k agents is printed next to the aim (at most 50 ms at 50k agents, at most 2x).
3. ``variant-scheduler serve`` on SQLite in its own process: heartbeats/s, placements/s
   (one client, then 8 concurrent clients) and deletes/s, next to ``GET /healthz``
   (one ``SELECT 1``) with as many clients, as the floor of a request; each with the
   server's CPU per request (user + system from ``/proc``, which other load on the machine
   does not inflate as it does wall time) and the load average. The aim: placements at
   least half of ``/healthz``'s rate, with one client and with eight.

Run: .venv/bin/python bench/bench_scheduler.py [--agents 10000] [--sample 300]
     [--gang-agents 1000,10000,50000] [--runs 9] [--only gang] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import importlib.metadata
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
from sqlalchemy import insert
from variantlib.resolver import lib as resolver_lib

from baseline import variantlib_order

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "devtools"))
import devstack
from docker_variant.planner.placement import Judge, Plan, plan
from docker_variant.planner.pool import Pool, build_pool, profile_key
from docker_variant.providers.nvidia import nvidia_features
from docker_variant.scheduler import Store
from docker_variant.scheduler.documents import AgentReport, PlacementRequest
from docker_variant.scheduler.models import agents as agent_table
from docker_variant.scheduler.models import devices as device_table
from docker_variant.scheduler.models import profiles as profile_table
from docker_variant.variant import Variant, VariantIndex
from docker_variant.variant.index import ImageRef

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from scheduler_reference import reference_plan  # the former planner

GANG_NODES, GANG_DEVICES = 64, 8
AIM_MS, AIM_GROWTH = 50.0, 2.0
WARM_UP = 5  # untimed calls first: the first store of a process needs a few to settle

# (CUDA of the driver, compute capability): H200 R570/R580, A100 R535, B200 R580, L4, H100 R550
KINDS = [((12, 8), (9, 0)), ((13, 0), (9, 0)), ((12, 2), (8, 0)), ((13, 0), (10, 0))]
KINDS += [((12, 2), (8, 9)), ((12, 4), (9, 0))]
HOST = {"x86_64": {"level": ["v4", "v3", "v2", "v1"]}}


def make_index() -> VariantIndex:
    """30 builds: six CUDA minimums times five architecture sets."""
    cudas = ["12.2", "12.4", "12.6", "12.8", "12.9", "13.0"]
    arches = [
        ["80_real"],
        ["80_real", "86_real", "89_real", "90_real"],
        ["90_real"],
        ["90_real", "100_real"],
        ["100_real", "120_real"],
    ]
    variants = {}
    images = {}
    for cuda in cudas:
        for i, arch in enumerate(arches):
            label = f"cu{cuda.replace('.', '')}_a{i}"
            props = {"nvidia": {"cuda_version_lower_bound": [cuda], "sm_arch": arch}}
            variants[label] = Variant.from_json(label, props)
            digest = "sha256:" + hashlib.sha256(label.encode()).hexdigest()
            images[label] = ImageRef(f"1.0-{label}", digest)  # an index names each image
    return VariantIndex(["nvidia", "x86_64"], variants, images)


def make_reports(agents: int, seed: int = 3) -> list[AgentReport]:
    rng = random.Random(seed)
    reports = []
    for a in range(agents):
        cuda, cc = rng.choice(KINDS)
        lists = {"nvidia": nvidia_features(cuda, cc)}
        devices = {"cuda": {f"GPU-{a}-{i}": lists for i in range(8)}}
        reports.append(AgentReport(f"agent-{a:05d}", "default", HOST, devices))
    return reports


def device_lists(pool: Pool) -> list[tuple[str, str]]:
    return [(n.host, d.profile) for n in pool.nodes for d in n.devices["cuda"]]


def ours(index: VariantIndex, pool: Pool) -> tuple[list[list[str]], int]:
    """Every device's ranked labels (compatible variants, best first)."""
    judge = Judge(index, pool.profiles)
    orders: dict[str, list[str]] = {}
    result = []
    for host, profile in device_lists(pool):
        cls = judge.classify(host, profile)
        order = orders.get(cls.key)
        if order is None:
            ranked = sorted((r, k) for k, r in cls.ranks.items() if k in index.variants)
            order = orders[cls.key] = [k for _, k in ranked if k != "null"]
        result.append(order)
    return result, len(judge.classes)


def matching(agents: int, sample: int) -> None:
    index = make_index()
    pool = build_pool(make_reports(agents))
    devices = device_lists(pool)
    started = time.perf_counter()
    ranked, classes = ours(index, pool)
    t_ours = time.perf_counter() - started

    rng = random.Random(5)
    picks = rng.sample(range(len(devices)), sample)

    def per_device() -> float:
        started = time.perf_counter()
        for i in picks:
            host, profile = devices[i]
            merged = {**pool.profiles[host], **pool.profiles[profile]}
            assert variantlib_order(index, merged) == ranked[i], f"parity broken on device {i}"
        return (time.perf_counter() - started) / sample

    t_lib_each = per_device()
    with mock.patch.object(resolver_lib, "inject_abi_dependency", lambda *_args: None):
        t_core_each = per_device()
    dists = sum(1 for _ in importlib.metadata.distributions())

    print(f"30 variants against {len(devices):,} devices on {agents:,} agents ({classes} classes)")
    print(f"  ours, every device                    {t_ours * 1e3:10.1f} ms")
    for what, each in (
        (f"variantlib ({dists} installed dists)", t_lib_each),
        ("variantlib, ordering alone", t_core_each),
    ):
        total = each * len(devices)
        print(
            f"  {what:<37} {total * 1e3:10.0f} ms  (extrapolated from {sample} devices: "
            f"{each * 1e3:.2f} ms each; same order on all)"
        )
        print(
            f"    ratio ours / it                     {t_ours / total:10.6f}  (x{total / t_ours:,.0f})"
        )


# --------------------------------------------------------------------------- gangs


def median_ms(call: Callable[[], object], runs: int, after: Callable[[], object] = list) -> float:
    """The median of ``runs`` timed calls after ``WARM_UP`` untimed ones, with ``gc.collect()``
    before each one (so that no run pays for another's garbage); ``after`` runs untimed."""
    for _ in range(WARM_UP):
        call()
        after()
    times = []
    for _ in range(runs):
        gc.collect()
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
        after()
    return statistics.median(times) * 1e3


def filled_store(root: Path, reports: list[AgentReport]) -> Store:
    """A store on SQLite holding ``reports``, written in bulk (as if every agent had sent
    its first heartbeat); its pool is read into memory by the first placement."""
    store = Store.open(f"sqlite:///{root / 'bench.db'}")
    documents: dict[str, Any] = {}
    agents, devices = [], []
    now = time.time()
    for r in reports:
        host = profile_key(r.host)
        documents[host] = r.host
        agents.append(
            {
                "agent_id": r.agent_id,
                "resource_group": r.resource_group,
                "host_profile": host,
                "first_seen": now,
                "last_seen": now,
                "platform": r.platform,
            }
        )
        for name, members in r.devices.items():
            for device_id, lists in members.items():
                key = profile_key(lists)
                documents[key] = lists
                devices.append(
                    {
                        "agent_id": r.agent_id,
                        "device_name": name,
                        "device_id": device_id,
                        "profile": key,
                    }
                )
    with store.engine.begin() as conn:
        rows = [{"id": key, "lists": json.dumps(lists)} for key, lists in documents.items()]
        conn.execute(insert(profile_table), rows)
        conn.execute(insert(agent_table), agents)
        conn.execute(insert(device_table), devices)
    return store


def gang(agents: int, runs: int, scan: bool) -> tuple[float, float]:
    """One pool size: prints its row; (plan() ms, Store.place ms)."""
    index = make_index()
    request = PlacementRequest(GANG_NODES, GANG_DEVICES, index=index)
    reports = make_reports(agents)
    pool = build_pool(reports)
    outcome = plan(index, pool, GANG_NODES, GANG_DEVICES)
    assert isinstance(outcome, Plan) and len(outcome.allocations) == GANG_NODES
    t_plan = median_ms(lambda: plan(index, pool, GANG_NODES, GANG_DEVICES), runs)
    too_big = GANG_DEVICES + 1  # no node has 9 GPUs: a refusal, every variant explained
    t_refused = median_ms(lambda: plan(index, pool, GANG_NODES, too_big), runs)
    t_scan = float("nan")
    if scan:
        assert reference_plan(index, pool, GANG_NODES, GANG_DEVICES) == outcome
        t_scan = median_ms(lambda: reference_plan(index, pool, GANG_NODES, GANG_DEVICES), runs)
    signatures = sum(1 for _ in pool.buckets())
    with tempfile.TemporaryDirectory(prefix="dv-bench-") as tmp:
        store = filled_store(Path(tmp), reports)
        try:
            t_place = placements(store, request, runs)
        finally:
            store.close()
        # the same database, served with an agent TTL (no heartbeat arrives meanwhile)
        store = Store.open(f"sqlite:///{Path(tmp) / 'bench.db'}", agent_ttl=600)
        try:
            t_ttl = placements(store, request, runs)
        finally:
            store.close()
    print(
        f"  {agents:>7,} {t_plan:7.1f} ms {t_scan:11.1f} ms {t_place:9.1f} ms {t_ttl:9.1f} ms "
        f"{t_refused:6.1f} ms {signatures:>10}"
    )
    return t_plan, t_place


def placements(store: Store, request: PlacementRequest, runs: int) -> float:
    """The median ``Store.place`` of ``request``, freed again (untimed) after each run."""
    made: list[str] = []
    index = request.index
    assert index is not None

    def place() -> None:
        document = store.place(index, request, lambda c: c.tag)
        assert isinstance(document, dict), document
        made.append(document["id"])

    def free() -> None:
        assert store.delete_placement(made.pop())

    return median_ms(place, runs, free)


def gangs(sizes: list[int], runs: int, scan: bool) -> None:
    print(
        f"a gang of {GANG_NODES} nodes x {GANG_DEVICES} GPUs, 30 variants; median of {runs} "
        f"runs after {WARM_UP} warm-up runs, gc.collect() before each"
    )
    print(
        f"  {'agents':>7} {'plan()':>9} {'scan (before)':>14} {'Store.place':>12} "
        f"{'with TTL':>12} {'refusal':>9} {'signatures':>10}"
    )
    figures = {agents: gang(agents, runs, scan) for agents in sizes}
    if 10_000 in figures and 50_000 in figures:
        (plan_10k, place_10k), (plan_50k, place_50k) = figures[10_000], figures[50_000]
        growth = plan_50k / plan_10k
        met = plan_50k <= AIM_MS and growth <= AIM_GROWTH
        print(
            f"  growth 10k -> 50k agents: plan() x{growth:.2f}, Store.place "
            f"x{place_50k / place_10k:.2f}"
        )
        print(
            f"  aim (plan() <= {AIM_MS:g} ms at 50k agents, growth <= {AIM_GROWTH:g}x): "
            f"{'met' if met else 'NOT met'} ({plan_50k:.1f} ms, x{growth:.2f}); "
            f"Store.place {place_50k:.1f} ms at 50k "
            f"({'within' if place_50k <= AIM_MS else 'over'} {AIM_MS:g} ms)"
        )


# --------------------------------------------------------------------------- HTTP


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far: per request, robust to other
    load on the machine, unlike wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def rate(
    count: int, workers: int, call: Callable[[int], Awaitable[None]], pid: int
) -> tuple[float, float]:
    """(calls per second, server CPU ms per call) of ``call(i)`` for i in range(count),
    ``workers`` at a time."""
    queue = iter(range(count))

    async def worker() -> None:
        for i in queue:
            await call(i)

    cpu = server_cpu_s(pid)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - started
    return count / elapsed, 1e3 * (server_cpu_s(pid) - cpu) / count


async def http_figures(url: str, pid: int, agents: int, placements: int) -> None:
    index = make_index().to_json()
    reports = make_reports(agents, seed=11)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def heartbeat(i: int) -> None:
            r = reports[i % len(reports)]
            body = {"resource_group": r.resource_group, "host": r.host, "devices": r.devices}
            (await client.put(f"/v1/agents/{r.agent_id}", json=body)).raise_for_status()

        async def health(_i: int) -> None:
            (await client.get("/healthz")).raise_for_status()

        made: list[str] = []

        # encoded once, as a load generator sends it: the figure is the server's, not the
        # client's JSON encoding of a 10 KB index (the server reads each body whole)
        body = json.dumps({"index": index, "nodes": 1, "devices_per_node": 1}).encode()
        typed = {"Content-Type": "application/json"}

        async def place(_i: int) -> None:
            response = await client.post("/v1/placements", content=body, headers=typed)
            assert response.status_code == 201, response.text
            made.append(response.json()["id"])

        async def free(i: int) -> None:
            response = await client.delete(f"/v1/placements/{made[i]}")
            assert response.status_code == 204, response.text

        beats = await rate(agents, 8, heartbeat, pid)  # new agents: each report changes the pool
        again = await rate(agents, 8, heartbeat, pid)  # the same reports: plain heartbeats
        floors = max(50, min(500, 4 * placements))
        await rate(min(placements, 20), 1, place, pid)  # untimed: the first reads and plans
        floor = await rate(floors, 1, health, pid)
        one = await rate(placements, 1, place, pid)
        floor_8 = await rate(floors, 8, health, pid)
        many = await rate(placements, 8, place, pid)
        deletes = await rate(len(made), 8, free, pid)
    devices = agents * 8
    print(f"variant-scheduler serve on SQLite, {agents} agents, {devices:,} devices, 30 variants")
    print("  (rate; the server's CPU per request, user + system)")
    figures = [
        ("first reports (PUT, 8 clients)", beats),
        ("heartbeats, unchanged (PUT, 8 clients)", again),
        ("GET /healthz (1 client): the floor", floor),
        ("placements 1 x 1 device (1 client)", one),
        ("GET /healthz (8 clients): the floor", floor_8),
        ("placements 1 x 1 device (8 clients)", many),
        ("deletes (8 clients)", deletes),
    ]
    for what, (per_s, cpu_ms) in figures:
        print(f"  {what:40s}{per_s:8.0f} /s  {cpu_ms:6.2f} ms CPU")
    # like with like (as many clients), and 8 clients against the one-client floor, as the
    # figure was first stated
    comparisons = [("1 client", one, floor), ("8 clients", many, floor_8)]
    comparisons.append(("8 clients vs /healthz 1 client", many, floor))
    for what, placed, healthz in comparisons:
        ratio = placed[0] / healthz[0]
        verdict = "met" if ratio >= 0.5 else "NOT met"
        print(f"  placements / healthz, {what:30s}{ratio:6.2f}  (aim >= 0.5: {verdict})")
    print(f"  load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def serving(agents: int, placements: int) -> None:
    with tempfile.TemporaryDirectory(prefix="dv-bench-") as tmp:
        scheduler = devstack.start_scheduler(Path(tmp))
        try:
            asyncio.run(http_figures(scheduler.url, scheduler.process.pid, agents, placements))
        finally:
            scheduler.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=10_000, help="agents in the matching part")
    parser.add_argument("--sample", type=int, default=300, help="devices timed with variantlib")
    parser.add_argument("--http-agents", type=int, default=500, help="agents behind the API")
    parser.add_argument("--placements", type=int, default=400, help="per client setting")
    parser.add_argument(
        "--gang-agents", default="1000,10000,50000", help="pool sizes for the gang, comma-separated"
    )
    parser.add_argument("--runs", type=int, default=9, help="timed runs per gang figure (>= 7)")
    parser.add_argument("--no-scan", action="store_true", help="skip the former planner")
    parser.add_argument("--only", choices=["matching", "gang", "serving"], help="one part")
    parser.add_argument(
        "--tiny", action="store_true", help="every part at a tiny size, in seconds (CI: it runs)"
    )
    args: Any = parser.parse_args()
    if args.tiny:  # the sizes only: every code path of the full run is taken
        args.agents, args.sample, args.gang_agents = 40, 3, "200,400"
        args.http_agents, args.placements, args.runs = 8, 16, 7
    if args.runs < 7:
        parser.error("--runs: at least 7")
    if args.only in (None, "matching"):
        matching(args.agents, args.sample)
    if args.only in (None, "gang"):
        sizes = [int(n) for n in args.gang_agents.split(",")]
        gangs(sizes, args.runs, not args.no_scan)
    if args.only in (None, "serving"):
        serving(args.http_agents, args.placements)


if __name__ == "__main__":
    main()
