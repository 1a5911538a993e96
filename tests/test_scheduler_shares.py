"""Fractional devices (docs/reference/scheduler-api.md: ``capacity``, ``shares_per_device``): shares pack best-fit onto
devices already partly used, whole devices stay whole, the pool's free shares add up, and
fragmentation stays below first-fit's on the same sequence of requests."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError

from docker_variant.planner.placement import Judge, Plan, Refusal, plan
from docker_variant.planner.pool import Pool, build_pool, pool_shares
from docker_variant.scheduler.documents import SHARE, AgentReport, parse_agent_report
from docker_variant.scheduler.models import device_usage
from docker_variant.variant import VariantIndex
from test_scheduler_api import client_for, place, put_agent
from test_scheduler_support import (
    A100_R535,
    H200_R570,
    agent_body,
    agent_report,
    gpu_only_index,
    open_store,
)

GPU_INDEX = gpu_only_index()
INDEX = VariantIndex.from_json(GPU_INDEX, "index")


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    with open_store(request.param, tmp_path) as store, client_for(store) as client:
        yield client


def shares_body(count: int, capacity: dict[str, float] | None = None) -> dict[str, Any]:
    body = agent_body(H200_R570, count)
    if capacity:
        body["capacity"] = {"cuda": capacity}
    return body


def placed(api: httpx.Client, nodes: int, per_node: int, shares: float | None) -> httpx.Response:
    extra = {} if shares is None else {"shares_per_device": shares}
    return place(api, nodes, per_node, index=GPU_INDEX, **extra)


def devices(response: httpx.Response) -> list[tuple[str, str]]:
    assert response.status_code == 201, response.text
    return [(a["agent_id"], d) for a in response.json()["allocations"] for d in a["devices"]]


def pool_view(api: httpx.Client) -> dict[str, Any]:
    answer: dict[str, Any] = api.get("/v1/agents").json()["pool"]
    return answer


# --------------------------------------------------------------------------- packing


def test_shares_pack_onto_partly_used_devices_and_leave_whole_ones_free(
    api: httpx.Client,
) -> None:
    put_agent(api, "a", shares_body(2))
    put_agent(api, "b", shares_body(2))
    assert devices(placed(api, 1, 1, 0.5)) == [("a", "GPU-0")]
    assert devices(placed(api, 1, 1, 0.25)) == [("a", "GPU-0")]  # the partly used one
    assert devices(placed(api, 1, 1, 0.5)) == [("a", "GPU-1")]  # 0.25 left on GPU-0: too little
    assert devices(placed(api, 1, 1, 0.25)) == [("a", "GPU-0")]  # best fit: the fullest
    # b is untouched: a whole-node request for two whole devices still fits
    assert devices(placed(api, 1, 2, None)) == [("b", "GPU-0"), ("b", "GPU-1")]
    figures = pool_view(api)
    assert figures["free_shares"] == 0.5 and figures["stranded_shares"] == 0.5
    assert figures["fragmentation"] == 1.0
    agents = {v["agent_id"]: v for v in api.get("/v1/agents").json()["agents"]}
    assert agents["a"]["shares"]["cuda"] == {
        "capacity": 2.0,
        "free": 0.5,
        "partly_used": {"GPU-1": 0.5},
    }
    assert agents["a"]["devices"]["cuda"]["allocated"] == ["GPU-0", "GPU-1"]
    assert placed(api, 1, 1, 0.75).status_code == 409
    assert "1 device fitting it, 0.75 shares free on each" in str(
        placed(api, 1, 1, 0.75).json()["reasons"]
    )


def test_a_whole_device_request_never_takes_a_partly_used_device(api: httpx.Client) -> None:
    put_agent(api, "a", shares_body(1))
    first = placed(api, 1, 1, 0.1)
    assert placed(api, 1, 1, None).status_code == 409
    assert api.delete(f"/v1/placements/{first.json()['id']}").status_code == 204
    whole = placed(api, 1, 1, None)
    assert devices(whole) == [("a", "GPU-0")]
    assert placed(api, 1, 1, 0.1).status_code == 409  # a whole device takes no share


def test_capacity_counts_shares_and_survives_a_smaller_report(api: httpx.Client) -> None:
    put_agent(api, "a", shares_body(1, {"GPU-0": 2}))
    for _ in range(4):
        assert devices(placed(api, 1, 1, 0.5)) == [("a", "GPU-0")]
    assert placed(api, 1, 1, 0.5).status_code == 409
    assert pool_view(api)["capacity_shares"] == 2.0
    # the agent now says 1.5: what is in use stays, nothing more fits until it is freed
    put_agent(api, "a", shares_body(1, {"GPU-0": 1.5}))
    assert placed(api, 1, 1, 0.1).status_code == 409
    assert pool_view(api)["free_shares"] == 0.0


def test_the_pool_plans_shares_best_fit_without_the_database() -> None:
    reports = [agent_report(f"n{i}", shares_body(2)) for i in range(2)]
    pool = build_pool(reports)
    outcome = plan(INDEX, pool, 1, 1, shares=SHARE // 2)
    assert isinstance(outcome, Plan) and outcome.shares == SHARE // 2
    first = (outcome.allocations[0].agent_id, outcome.allocations[0].devices[0].device_id)
    pool.allocate([(first[0], "cuda", first[1])], SHARE // 2)
    again = plan(INDEX, pool, 1, 1, shares=SHARE // 2)
    assert isinstance(again, Plan)
    assert (again.allocations[0].agent_id, again.allocations[0].devices[0].device_id) == first
    assert pool_shares(pool).stranded == SHARE // 2
    pool.allocate([(first[0], "cuda", first[1])], SHARE // 2)
    assert pool_shares(pool).stranded == 0  # one device, half used twice: full, not stranded


# --------------------------------------------------------------------------- 100 requests

# 16 nodes of 4 GPUs (one share each) and 2 nodes of 2 GPUs of 2 shares each
POOL: dict[str, dict[str, Any]] = {f"n{i:02}": shares_body(4) for i in range(16)}
POOL |= {f"m{i}": shares_body(2, {"GPU-0": 2, "GPU-1": 2}) for i in range(2)}


def sequence(seed: int) -> list[tuple[str, Any]]:
    """100 placement requests (fractions and whole devices), with deletions in between of the
    placement made by an earlier request (a no-op where it was refused or is gone)."""
    rng = random.Random(seed)
    steps: list[tuple[str, Any]] = []
    made = 0
    while made < 100:
        if made and rng.random() < 0.5:
            steps.append(("delete", rng.randrange(made)))
            continue
        shares = rng.choice([None, None, 0.1, 0.25, 0.3, 0.5, 0.5, 0.75])
        steps.append(("place", (rng.choice([1, 1, 1, 2]), rng.choice([1, 1, 2]), shares)))
        made += 1
    return steps


def capacity_of(report: AgentReport, device_id: str) -> int:
    return report.capacity.get(("cuda", device_id), SHARE)


def first_fit(
    pool: Pool, nodes: int, per_node: int, shares: int | None
) -> list[tuple[str, str, str]] | None:
    """The baseline: the first agents (by id) with room, their first devices (by id)."""
    chosen: list[tuple[str, str, str]] = []
    for node in sorted(pool.nodes, key=lambda n: n.agent_id):
        usable = [
            d.device_id
            for d in sorted(node.devices["cuda"], key=lambda d: d.device_id)
            if (d.free if shares is None else d.room >= shares)
        ]
        if len(usable) >= per_node:
            chosen += [(node.agent_id, "cuda", d) for d in usable[:per_node]]
            if len({agent for agent, _, _ in chosen}) == nodes:
                return chosen
    return None


def test_100_random_requests_add_up_and_fragment_less_than_first_fit(
    api: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = {agent: parse_agent_report(body, agent) for agent, body in POOL.items()}
    for agent, body in POOL.items():
        put_agent(api, agent, body)
    baseline = build_pool(reports.values())
    ours: dict[int, dict[str, Any]] = {}  # request number -> placement
    theirs: dict[int, tuple[list[tuple[str, str, str]], int | None]] = {}
    ours_figures, theirs_figures = [], []
    requests = placed_ours = placed_theirs = 0
    for step, argument in sequence(seed=0):
        if step == "delete":
            if (document := ours.pop(argument, None)) is not None:
                assert api.delete(f"/v1/placements/{document['id']}").status_code == 204
            if (taken := theirs.pop(argument, None)) is not None:
                baseline.release(*taken)
        else:
            nodes, per_node, shares = argument
            response = placed(api, nodes, per_node, shares)
            assert response.status_code in (201, 409), response.text
            if response.status_code == 201:
                ours[requests] = response.json()
                placed_ours += 1
            units = None if shares is None else round(shares * SHARE)
            keys = first_fit(baseline, nodes, per_node, units)
            if keys is not None:
                baseline.allocate(keys, units)
                theirs[requests] = (keys, units)
                placed_theirs += 1
            requests += 1
        ours_figures.append(pool_view(api)["fragmentation"])
        theirs_figures.append(pool_shares(baseline).fragmentation)

    # the free shares are the pool's less what the live placements hold, to the millionth
    total = sum(capacity_of(r, d) for r in reports.values() for d in r.devices["cuda"])
    held = 0
    for document in api.get("/v1/placements").json()["placements"]:
        for allocation in document["allocations"]:
            report = reports[allocation["agent_id"]]
            for device_id in allocation["devices"]:
                shares = document.get("shares_per_device")
                held += capacity_of(report, device_id) if shares is None else round(shares * SHARE)
    assert {d["id"] for d in api.get("/v1/placements").json()["placements"]} == {
        d["id"] for d in ours.values()
    }
    assert round(pool_view(api)["free_shares"] * SHARE) == total - held

    ours_end, theirs_end = ours_figures[-1], theirs_figures[-1]
    ours_mean = sum(ours_figures) / len(ours_figures)
    theirs_mean = sum(theirs_figures) / len(theirs_figures)
    with capsys.disabled():
        print(
            f"\nfragmentation after 100 requests ({placed_ours} placed; first-fit "
            f"{placed_theirs}): best-fit {ours_end:.3f}, first-fit {theirs_end:.3f}; "
            f"mean over the run: best-fit {ours_mean:.3f}, first-fit {theirs_mean:.3f}"
        )
    assert ours_end < theirs_end
    assert ours_mean < theirs_mean


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_the_database_refuses_shares_past_a_devices_capacity(kind: str, tmp_path: Path) -> None:
    with open_store(kind, tmp_path) as store, client_for(store) as api:
        put_agent(api, "a", shares_body(1))
        assert devices(placed(api, 1, 1, 0.75)) == [("a", "GPU-0")]
        key = {"agent_id": "a", "device_name": "cuda", "device_id": "GPU-0"}
        with pytest.raises(IntegrityError), store.engine.begin() as conn:  # past the capacity
            conn.execute(
                update(device_usage)
                .where(*(device_usage.c[k] == v for k, v in key.items()))
                .values(used=device_usage.c.used + SHARE // 2)
            )
        with pytest.raises(IntegrityError), store.engine.begin() as conn:  # a second row
            conn.execute(insert(device_usage).values(**key, used=SHARE, capacity=SHARE, whole=True))


# --------------------------------------------------------------------------- randomized


def random_pool(rng: random.Random) -> Pool:
    """Nodes of H200s and A100s, some devices of 2 shares, some unhealthy."""
    reports = []
    for i in range(rng.randint(1, 12)):
        body = agent_body(rng.choice([H200_R570, A100_R535]), rng.choice([1, 2, 4]))
        ids = list(body["devices"]["cuda"])
        body["capacity"] = {"cuda": {d: 2 for d in ids if rng.random() < 0.2}}
        body["unhealthy"] = {"cuda": [d for d in ids if rng.random() < 0.1]}
        reports.append(parse_agent_report(body, f"n{i}"))
    return build_pool(reports)


@pytest.mark.parametrize("seed", range(8))
def test_random_share_plans_fit_and_the_index_stays_whole(seed: int) -> None:
    """Shares and whole devices placed and freed at random: every plan takes healthy devices
    with room, one variant that each of them fits, and the index equals one rebuilt."""
    rng = random.Random(seed)
    pool = random_pool(rng)
    live: list[tuple[list[tuple[str, str, str]], int | None]] = []
    judge = Judge(INDEX, pool.profiles)
    for _ in range(60):
        if live and rng.random() < 0.3:
            pool.release(*live.pop(rng.randrange(len(live))))
            continue
        nodes, per_node = rng.choice([1, 1, 2]), rng.choice([1, 2])
        shares = rng.choice([None, SHARE // 10, SHARE // 4, SHARE // 2, SHARE])
        outcome = plan(INDEX, pool, nodes, per_node, shares=shares)
        if isinstance(outcome, Refusal):
            continue
        keys = []
        assert len({a.agent_id for a in outcome.allocations}) == nodes
        for allocation in outcome.allocations:
            node = pool.node(allocation.agent_id)
            assert len(allocation.devices) == per_node
            for device in allocation.devices:
                assert device.healthy
                assert device.free if shares is None else device.room >= shares
                cls = judge.classify(node.host, device.profile, judge.platform(node))
                assert outcome.candidate.label in cls.ranks
                keys.append((allocation.agent_id, "cuda", device.device_id))
        pool.allocate(keys, shares)
        live.append((keys, shares))
        rebuilt = Pool(pool.nodes, pool.profiles)
        assert dict(pool.buckets()) == dict(rebuilt.buckets())
    for node in pool.nodes:  # nothing over its capacity, nothing on an unhealthy device
        for device in node.devices["cuda"]:
            assert 0 <= device.room <= device.capacity
            assert device.healthy or (device.room == 0 and not device.free)
