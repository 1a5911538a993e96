"""The pool's index against brute force: on randomized pools, changed step by step with
allocations, releases, new reports, departures and agents left out, the indexed ``plan`` gives
exactly the answer (the plan, or the refusal's every word) of the planner that scans every
node (``scheduler_reference.py``), and the index equals one rebuilt from the nodes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from docker_variant.scheduler.placement import Device, Node, Plan, Pool, plan, profile_key
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
    gpu_lists,
    gpu_only_index,
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
        outcome = plan(index, pool, gang, per_node, device_name=name)
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
            expected = reference_plan(index, pool, gang, per_node, device_name=name)
            got = plan(index, pool, gang, per_node, device_name=name)
            assert got == expected, (seed, gang, per_node, name)


def test_a_copy_is_independent() -> None:
    rng = random.Random(7)
    pool = Pool([random_node(rng, f"n{i}") for i in range(6)], PROFILES)
    copy = pool.copy()
    before = buckets(copy)
    pool.allocate(device_keys(pool))
    pool.remove(pool.nodes[0].agent_id)
    assert buckets(copy) == before
    assert buckets(pool) != before
