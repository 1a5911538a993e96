"""The pool's index against brute force: on randomized pools, changed step by step with
allocations, releases, new reports, departures and agents left out, the indexed ``plan`` gives
exactly the answer (the plan, or the refusal's every word) of the planner that scans every
node (``scheduler_reference.py``), and the index equals one rebuilt from the nodes. The store
keeps its pool current from its own commits, and notices those of another process."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from docker_variant.errors import InvalidInputError
from docker_variant.planner.placement import Plan, Refusal, plan
from docker_variant.planner.pool import Device, Node, Pool, profile_key
from docker_variant.scheduler import Store
from docker_variant.scheduler.documents import (
    PlacementRequest,
    parse_agent_report,
    parse_placement_request,
)
from docker_variant.variant import VariantIndex
from docker_variant.variant.model import SupportedLists
from scheduler_reference import reference_plan
from test_scheduler_support import (
    A100_R535,
    B200_R580,
    H200_R570,
    H200_R580,
    INDEX,
    L4_R535,
    X86_V3,
    X86_V4,
    agent_body,
    gpu_lists,
    gpu_only_index,
    open_store,
)

GRACE = {"aarch64": {"version": ["9.0a", "8a"]}}
HOSTS: list[SupportedLists] = [X86_V4, X86_V3, GRACE, {**X86_V4, **gpu_lists(B200_R580)}, {}]
DEVICES: list[SupportedLists] = [
    gpu_lists(gpu) for gpu in (H200_R570, H200_R580, A100_R535, B200_R580, L4_R535)
]
DEVICES.append({})  # an NPU: no nvidia lists
PLATFORMS = [None, None, None, "linux/arm64", "linux/amd64"]


def _amd64_only() -> dict[str, Any]:
    document = {**INDEX, "images": dict(INDEX["images"])}
    for label in ("cu128", "v3"):
        image = dict(document["images"][label])
        image["platforms"] = {"linux/amd64": image["digest"]}
        document["images"][label] = image
    return document


INDEXES = [
    VariantIndex.from_json(INDEX, "index"),
    VariantIndex.from_json(gpu_only_index(), "gpu only"),
    VariantIndex.from_json(_amd64_only(), "amd64 only"),
]
PROFILES = {profile_key(lists): lists for lists in [*HOSTS, *DEVICES]}
HOST_KEYS = [profile_key(lists) for lists in HOSTS]
DEVICE_KEYS = [profile_key(lists) for lists in DEVICES]


def random_node(rng: random.Random, agent_id: str) -> Node:
    """Mostly whole nodes of one GPU kind, some mixed, some with NPUs too or no devices."""
    devices: dict[str, list[Device]] = {}
    shape = rng.random()
    if shape > 0.05:
        kinds = DEVICE_KEYS[:3] if rng.random() < 0.8 else DEVICE_KEYS
        mixed = rng.random() < 0.2
        count = rng.choice([2, 4, 4, 8]) if not mixed else rng.randint(1, 8)
        prefix = "GPU-" if rng.random() < 0.9 else "GPU-0"  # GPU-01 and GPU-1 sort alike
        kind = rng.choice(kinds)
        devices["cuda"] = [
            Device(f"{prefix}{i}", rng.choice(kinds) if mixed else kind) for i in range(count)
        ]
    if rng.random() < 0.2:
        devices["npu"] = [Device(f"npu{i}", DEVICE_KEYS[5]) for i in range(rng.randint(0, 3))]
    if rng.random() < 0.15:  # a second GPU name: ties between a node's names
        kind = rng.choice(DEVICE_KEYS)
        devices["accel"] = [Device(f"A{i}", kind) for i in range(rng.randint(1, 4))]
    if rng.random() < 0.8:
        return Node(agent_id, HOST_KEYS[0], devices)
    return Node(agent_id, rng.choice(HOST_KEYS), devices, rng.choice(PLATFORMS))


def device_keys(pool: Pool) -> list[tuple[str, str, str]]:
    return sorted(
        (node.agent_id, name, d.device_id)
        for node in pool.nodes
        for name, members in node.devices.items()
        for d in members
    )


def random_request(rng: random.Random) -> tuple[VariantIndex, int, int, str | None]:
    index = rng.choice(INDEXES)
    gang = rng.choice([1, 1, 2, 3, 5])
    per_node = rng.choice([0, 1, 2, 3, 4, 8])
    return index, gang, per_node, rng.choice([None, None, None, "cuda", "npu", "accel", "tpu"])


def change(rng: random.Random, pool: Pool, placed: list[list[tuple[str, str, str]]]) -> None:
    """One random step: place or free a gang, allocate or release random devices, report
    (a new agent or a changed one), leave, be left out or come back."""
    step = rng.random()
    if step < 0.3:
        index, gang, per_node, name = random_request(rng)
        outcome = outcome_of(plan, index, pool, gang, per_node, name)
        if isinstance(outcome, Plan):
            keys = [
                (a.agent_id, a.device_name or "", d.device_id)
                for a in outcome.allocations
                for d in a.devices
            ]
            pool.allocate(keys)
            placed.append(keys)
    elif step < 0.45 and placed:
        pool.release(placed.pop(rng.randrange(len(placed))))
    elif step < 0.55 and (keys := device_keys(pool)):
        pool.allocate(rng.sample(keys, rng.randint(1, min(8, len(keys)))))
    elif step < 0.65 and (taken := sorted(pool.allocations())):
        pool.release(rng.sample(taken, rng.randint(1, len(taken))))
    elif step < 0.8:
        agent = rng.choice([f"r{rng.randrange(1000)}", *(n.agent_id for n in pool.nodes)])
        held = {(n, i) for a, n, i in pool.allocations() if a == agent}
        pool.put(random_node(rng, agent), held)  # a report: allocations are kept
    elif step < 0.87 and pool.nodes:
        pool.remove(rng.choice(pool.nodes).agent_id)
    elif step < 0.95 and pool.nodes:
        pool.park(rng.choice(pool.nodes).agent_id, f"no heartbeat for {rng.randint(61, 99)} s")
    elif parked := [agent for agent in pool.unavailable if agent in pool]:
        pool.unpark(rng.choice(parked))


def buckets(pool: Pool) -> dict[Any, list[str]]:
    return {key: list(agents) for key, agents in pool.buckets()}


def assert_index_is_whole(pool: Pool) -> None:
    rebuilt = Pool(pool.nodes, pool.profiles)
    assert buckets(pool) == buckets(rebuilt)
    held = {
        (n.agent_id, name, d.device_id)
        for n in pool.nodes
        for name, ds in n.devices.items()
        for d in ds
        if not d.free
    }
    assert held <= set(pool.allocations())


@pytest.mark.parametrize("seed", range(12))
def test_indexed_plan_equals_the_scan_of_every_node(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [random_node(rng, f"n{i}") for i in range(rng.randint(0, 40))]
    pool = Pool(nodes, PROFILES, {"gone": "no heartbeat for 70 s"} if seed % 3 == 0 else {})
    placed: list[list[tuple[str, str, str]]] = []
    for _step in range(30):
        change(rng, pool, placed)
        assert_index_is_whole(pool)
        for _request in range(3):
            index, gang, per_node, name = random_request(rng)
            expected = outcome_of(reference_plan, index, pool, gang, per_node, name)
            got = outcome_of(plan, index, pool, gang, per_node, name)
            assert got == expected, (seed, gang, per_node, name)


def outcome_of(
    planner: Callable[..., Plan | Refusal],
    index: VariantIndex,
    pool: Pool,
    gang: int,
    per_node: int,
    name: str | None,
) -> Plan | Refusal | type[Exception]:
    """The plan or refusal, or the error's type for a request that names no device kind."""
    try:
        return planner(index, pool, gang, per_node, device_name=name)
    except InvalidInputError:
        return InvalidInputError


def test_a_copy_is_independent() -> None:
    rng = random.Random(7)
    pool = Pool([random_node(rng, f"n{i}") for i in range(6)], PROFILES)
    copy = pool.copy()
    before = buckets(copy)
    pool.allocate(device_keys(pool))
    pool.remove(pool.nodes[0].agent_id)
    assert buckets(copy) == before
    assert buckets(pool) != before


# --------------------------------------------------------------------------- the store


def _request(nodes: int, per_node: int, group: str | None = None) -> PlacementRequest:
    body = {"index": INDEX, "nodes": nodes, "devices_per_node": per_node}
    return parse_placement_request(body if group is None else {**body, "resource_group": group})


def _devices(outcome: dict[str, Any] | Refusal) -> list[tuple[str, str]]:
    assert isinstance(outcome, dict), getattr(outcome, "reasons", None)
    return [(a["agent_id"], d) for a in outcome["allocations"] for d in a["devices"]]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_the_store_keeps_its_pool_current_without_reading_it(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first plan, this process's own reports, placements and deletions reach the
    pool in memory as they commit: no plan re-reads it, and it equals a fresh read."""
    index = VariantIndex.from_json(INDEX, "index")
    with open_store(kind, tmp_path) as store:
        for i in range(8):
            gpu = (H200_R570, A100_R535)[i % 2]
            store.report_agent(parse_agent_report(agent_body(gpu, 4), f"n{i}"))
        groups = (None, "default", "b")
        for group in groups:  # each group's pool is read once, here
            store.snapshot(group)
        reads: list[str] = []
        for name in ("_load", "_reload_allocations"):
            monkeypatch.setattr(store.cache, name, lambda *_a, name=name: reads.append(name))
        rng = random.Random(5)
        made: list[str] = []
        for step in range(40):
            choice = rng.random()
            if choice < 0.5:
                request = _request(rng.randint(1, 3), rng.randint(0, 3), rng.choice(groups))
                try:
                    outcome = store.place(index, request, lambda c: c.tag)
                except InvalidInputError:  # only the CPU build fits: no device kind named
                    continue
                if isinstance(outcome, dict):
                    made.append(outcome["id"])
            elif choice < 0.75 and made:
                assert store.delete_placement(made.pop(rng.randrange(len(made))))
            elif choice < 0.9:
                gpu = rng.choice([H200_R570, A100_R535, B200_R580])
                body = agent_body(gpu, rng.randint(1, 6), group=rng.choice(["default", "b"]))
                store.report_agent(parse_agent_report(body, f"n{rng.randrange(10)}"))
            elif step % 7 == 0:
                deleted = store.delete_agent(f"n{rng.randrange(10)}")
                made = [p for p in made if p not in (deleted or [])]
        assert reads == []
        assert len(made) > 3
        for group in groups:
            kept = store.snapshot(group)
            fresh = Store.open(store.engine.url.render_as_string(hide_password=False))
            try:
                assert buckets(kept) == buckets(fresh.snapshot(group)), group
            finally:
                fresh.close()
        assert reads == []


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_changes_made_by_another_process_are_seen(kind: str, tmp_path: Path) -> None:
    index = VariantIndex.from_json(gpu_only_index(), "index")
    with open_store(kind, tmp_path) as one:
        other = Store.open(one.engine.url.render_as_string(hide_password=False))
        try:
            one.report_agent(parse_agent_report(agent_body(H200_R570, 2), "node"))
            first = one.place(index, _request(1, 1), lambda c: c.tag)
            assert _devices(first) == [("node", "GPU-0")]
            assert _devices(other.place(index, _request(1, 1), lambda c: c.tag)) == [
                ("node", "GPU-1")
            ]
            full = one.place(index, _request(1, 1), lambda c: c.tag)  # seen, not raced for
            assert isinstance(full, Refusal)
            assert full.reasons["cu128"].endswith("node: only 0 of its 2 fitting devices are free")
            assert isinstance(first, dict) and other.delete_placement(first["id"])
            assert _devices(one.place(index, _request(1, 1), lambda c: c.tag)) == [
                ("node", "GPU-0")
            ]
            other.report_agent(parse_agent_report(agent_body(H200_R570, 3), "node"))
            assert _devices(one.place(index, _request(1, 1), lambda c: c.tag)) == [
                ("node", "GPU-2")
            ]
        finally:
            other.close()


def test_the_agent_ttl_with_heartbeats_sent_to_another_process(tmp_path: Path) -> None:
    """Heartbeats recorded by a replica keep an agent in (it is checked once it seems past
    the TTL) and bring a left-out agent back; silence leaves it out."""
    now = [1_000_000.0]
    index = VariantIndex.from_json(gpu_only_index(), "index")
    with open_store("sqlite", tmp_path, agent_ttl=60, clock=lambda: now[0]) as one:
        url = one.engine.url.render_as_string(hide_password=False)
        other = Store.open(url, agent_ttl=60, clock=lambda: now[0])
        try:
            for agent in ("a", "b"):
                one.report_agent(parse_agent_report(agent_body(H200_R570, 1), agent))
            assert len(one.snapshot().nodes) == 2
            for _ in range(3):  # only "a" is heard from, through the other process
                now[0] += 40
                other.report_agent(parse_agent_report(agent_body(H200_R570, 1), "a"))
                alive = [n.agent_id for n in one.snapshot().nodes]
                assert alive == (["a", "b"] if now[0] - 1_000_000 <= 60 else ["a"])
            refused = one.place(index, _request(2, 1), lambda c: c.tag)
            assert isinstance(refused, Refusal)
            assert refused.reasons["cu128"].endswith("b: no heartbeat for 120 s (agent TTL 60 s)")
            other.report_agent(parse_agent_report(agent_body(H200_R570, 1), "b"))
            assert len(_devices(one.place(index, _request(2, 1), lambda c: c.tag))) == 2
            now[0] += 61  # both silent
            assert one.snapshot().nodes == []
            one.report_agent(parse_agent_report(agent_body(H200_R570, 1), "b"))  # heard here
            assert [n.agent_id for n in one.snapshot().nodes] == ["b"]
        finally:
            other.close()
