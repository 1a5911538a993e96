"""Concurrent placements through two scheduler servers sharing one database: no device is
ever in two live placements, on SQLite and on PostgreSQL.

The two servers have separate engines and nothing in common but the database, so what
keeps a device from being allocated twice is the database's primary key, not Python.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from docker_variant.scheduler import Store
from test_scheduler_support import (
    A100_R535,
    H200_R570,
    INDEX,
    SchedulerServer,
    agent_body,
    gpu_only_index,
    open_store,
)

KINDS = ["sqlite", "postgresql"]
DEADLINE_S = 60


@contextlib.contextmanager
def two_servers(kind: str, tmp_path: Path) -> Iterator[list[str]]:
    with open_store(kind, tmp_path) as first:
        second = Store.open(first.engine.url.render_as_string(hide_password=False))
        try:
            with SchedulerServer(first) as one, SchedulerServer(second) as two:
                yield [one.url, two.url]
        finally:
            second.close()


async def storm(calls: list[tuple[str, str, dict[str, Any] | None]]) -> list[httpx.Response]:
    """Send every (method, url, body) at once."""
    limits = httpx.Limits(max_connections=len(calls))
    async with httpx.AsyncClient(limits=limits, timeout=DEADLINE_S) as client:
        requests = [client.request(method, url, json=body) for method, url, body in calls]
        return await asyncio.wait_for(asyncio.gather(*requests), DEADLINE_S)


def allocated_devices(placements: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (a["agent_id"], a["device_name"], device)
        for p in placements
        for a in p["allocations"]
        for device in a["devices"]
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_many_requests_for_one_device_one_wins(kind: str, tmp_path: Path) -> None:
    with two_servers(kind, tmp_path) as urls:
        httpx.put(f"{urls[0]}/v1/agents/only", json=agent_body(H200_R570, 1)).raise_for_status()
        body = {"index": INDEX, "nodes": 1, "devices_per_node": 1}
        answers = asyncio.run(
            storm([("POST", f"{urls[i % 2]}/v1/placements", body) for i in range(40)])
        )
        codes = Counter(a.status_code for a in answers)
        assert codes == {201: 1, 409: 39}, [a.text for a in answers if a.status_code >= 500]
        listed = httpx.get(f"{urls[1]}/v1/placements").json()["placements"]
        assert [p["allocations"] for p in listed] == [
            [{"agent_id": "only", "device_name": "cuda", "devices": ["GPU-0"]}]
        ]


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_placements_and_heartbeats_never_share_a_device(
    kind: str, tmp_path: Path
) -> None:
    agents = {f"h200-{i}": agent_body(H200_R570, 4) for i in range(3)}
    agents |= {f"a100-{i}": agent_body(A100_R535, 4) for i in range(3)}
    with two_servers(kind, tmp_path) as urls:
        for agent_id, body in agents.items():
            httpx.put(f"{urls[0]}/v1/agents/{agent_id}", json=body).raise_for_status()
        shapes = [(1, 1)] * 30 + [(2, 2)] * 15 + [(1, 4)] * 10 + [(3, 3)] * 5
        calls: list[tuple[str, str, dict[str, Any] | None]] = [
            (
                "POST",
                f"{urls[i % 2]}/v1/placements",
                {"index": gpu_only_index(), "nodes": n, "devices_per_node": d},
            )
            for i, (n, d) in enumerate(shapes)
        ]
        # heartbeats re-report every agent while the placements race
        calls += [
            ("PUT", f"{urls[i % 2]}/v1/agents/{agent_id}", body)
            for i, (agent_id, body) in enumerate(list(agents.items()) * 3)
        ]
        answers = asyncio.run(storm(calls))
        assert all(a.status_code in (200, 201, 409) for a in answers), [
            a.text for a in answers if a.status_code >= 500
        ]
        made = [a.json() for a in answers if a.status_code == 201]
        devices = allocated_devices(made)
        assert len(devices) == len(set(devices)), "a device is in two placements"
        assert made, "nothing was placed"
        for placement in made:  # all or nothing, one variant on fitting devices
            assert len(placement["allocations"]) == placement["nodes"]
            for allocation in placement["allocations"]:
                assert len(allocation["devices"]) == placement["devices_per_node"]
                kind_of_node = allocation["agent_id"].split("-")[0]
                expected = {"h200": "cu128", "a100": "cu122"}[kind_of_node]
                assert placement["variant"] == expected
            assert placement["homogeneous"] is True
        # what the database says agrees with what was answered
        listed = httpx.get(f"{urls[1]}/v1/placements").json()["placements"]
        assert sorted(p["id"] for p in listed) == sorted(p["id"] for p in made)
        views = httpx.get(f"{urls[0]}/v1/agents").json()["agents"]
        taken = {(v["agent_id"], d) for v in views for d in v["devices"]["cuda"]["allocated"]}
        assert taken == {(agent, device) for agent, _, device in devices}
        assert all(not v["devices"]["cuda"]["missing"] for v in views)
        # a single-device request is refused only when no device is left, or after losing
        # every retry to a concurrent placement
        if len(taken) < 24:
            single_refusals = [
                a.json()["reasons"]
                for a, (_, _, body) in zip(answers, calls, strict=False)
                if body and body.get("devices_per_node") == 1 and a.status_code == 409
            ]
            assert all("concurrent placements" in str(r) for r in single_refusals)

        # freeing everything at once leaves every device free
        deletes = [
            ("DELETE", f"{urls[i % 2]}/v1/placements/{p['id']}", None) for i, p in enumerate(made)
        ]
        assert {a.status_code for a in asyncio.run(storm(deletes))} == {204}
        views = httpx.get(f"{urls[1]}/v1/agents").json()["agents"]
        assert sum(len(v["devices"]["cuda"]["free"]) for v in views) == 24
        assert httpx.get(f"{urls[0]}/v1/placements").json() == {"placements": []}


# --------------------------------------------------------------------------- failures, shares


def live_devices(placements: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    return Counter(
        (a["agent_id"], d) for p in placements for a in p["allocations"] for d in a["devices"]
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_degraded_gang_is_replaced_while_20_placements_race(kind: str, tmp_path: Path) -> None:
    # 14 nodes: the 20 placements (30 devices) cannot take every whole node, packed best-fit
    agents = {f"h200-{i:02}": agent_body(H200_R570, 4) for i in range(14)}
    with two_servers(kind, tmp_path) as urls:
        for agent_id, body in agents.items():
            httpx.put(f"{urls[0]}/v1/agents/{agent_id}", json=body).raise_for_status()
        body = {"index": gpu_only_index(), "nodes": 2, "devices_per_node": 4}
        gang = httpx.post(f"{urls[0]}/v1/placements", json=body).json()
        victim = gang["allocations"][1]["agent_id"]
        kept = gang["allocations"][0]["agent_id"]
        # failure injection: the agent's next heartbeat says GPU-2 is unhealthy
        sick = agents[victim] | {"unhealthy": {"cuda": ["GPU-2"]}}
        httpx.put(f"{urls[1]}/v1/agents/{victim}", json=sick).raise_for_status()
        degraded = httpx.get(f"{urls[0]}/v1/placements", params={"state": "degraded"}).json()
        assert [p["id"] for p in degraded["placements"]] == [gang["id"]]
        shapes = [(1, 1)] * 10 + [(1, 2)] * 6 + [(2, 1)] * 4
        calls: list[tuple[str, str, dict[str, Any] | None]] = [
            ("POST", f"{urls[0]}/v1/placements/{gang['id']}/replace", None)
        ]
        calls += [
            (
                "POST",
                f"{urls[i % 2]}/v1/placements",
                {"index": gpu_only_index(), "nodes": n, "devices_per_node": d},
            )
            for i, (n, d) in enumerate(shapes)
        ]
        answers = asyncio.run(storm(calls))
        assert all(a.status_code in (201, 409) for a in answers), [a.text for a in answers]
        replaced = answers[0]
        listed = httpx.get(f"{urls[1]}/v1/placements").json()["placements"]
        held = live_devices(listed)
        assert all(n == 1 for n in held.values()), "a device is in two placements"
        assert replaced.status_code == 201, replaced.text
        assert (victim, "GPU-2") not in held  # an unhealthy device is never allocated
        views = httpx.get(f"{urls[0]}/v1/agents").json()["agents"]
        taken = {(v["agent_id"], d) for v in views for d in v["devices"]["cuda"]["allocated"]}
        assert taken == set(held)
        shown = httpx.get(f"{urls[1]}/v1/placements/{gang['id']}").json()
        assert shown == replaced.json() and shown["state"] == "active"
        nodes = [a["agent_id"] for a in shown["allocations"]]  # the kept one, one healthy one
        assert nodes[0] == kept and victim not in nodes and len(set(nodes)) == 2
        assert all(len(a["devices"]) == 4 for a in shown["allocations"])
        assert shown["variant"] == gang["variant"]
        made = [a for a in answers[1:] if a.status_code == 201]
        assert made, "nothing was placed"


@pytest.mark.parametrize("kind", KINDS)
def test_shares_are_never_over_committed(kind: str, tmp_path: Path) -> None:
    with two_servers(kind, tmp_path) as urls:
        body = agent_body(H200_R570, 2) | {"capacity": {"cuda": {"GPU-1": 2}}}
        httpx.put(f"{urls[0]}/v1/agents/only", json=body).raise_for_status()
        fraction = {"index": INDEX, "nodes": 1, "devices_per_node": 1, "shares_per_device": 0.3}
        whole = {"index": INDEX, "nodes": 1, "devices_per_node": 1}
        calls: list[tuple[str, str, dict[str, Any] | None]] = [
            ("POST", f"{urls[i % 2]}/v1/placements", whole if i % 8 == 0 else fraction)
            for i in range(40)
        ]
        answers = asyncio.run(storm(calls))
        assert all(a.status_code in (201, 409) for a in answers), [a.text for a in answers]
        listed = httpx.get(f"{urls[1]}/v1/placements").json()["placements"]
        used: dict[str, float] = {}
        wholes: Counter[str] = Counter()
        for p in listed:
            (allocation,) = p["allocations"]
            (device,) = allocation["devices"]
            if "shares_per_device" in p:
                used[device] = used.get(device, 0.0) + p["shares_per_device"]
            else:
                wholes[device] += 1
        capacity = {"GPU-0": 1.0, "GPU-1": 2.0}
        for device, shares in used.items():
            assert shares <= capacity[device] + 1e-9, (device, shares)
            assert not wholes[device], f"{device} is shared and taken whole"
        assert all(n == 1 for n in wholes.values())
        # the pool is full: what is free is too little for another 0.3 share or a whole GPU
        figures = httpx.get(f"{urls[0]}/v1/agents").json()["pool"]
        assert figures["free_shares"] == pytest.approx(
            3.0 - sum(used.values()) - sum(capacity[d] for d in wholes)
        )
        assert all(
            r < 0.3 for r in [capacity[d] - used.get(d, 0.0) for d in capacity if d not in wholes]
        )


@pytest.mark.parametrize("kind", KINDS)
def test_a_storm_of_one_clients_placements_stops_at_its_quota(kind: str, tmp_path: Path) -> None:
    """Two servers on one database, 30 host-only placements (they take no device) at once:
    exactly the quota is placed, every other one is 429, whichever server answered."""
    with open_store(kind, tmp_path, max_placements=5) as first:
        url = first.engine.url.render_as_string(hide_password=False)
        second = Store.open(url, max_placements=5)
        try:
            with SchedulerServer(first) as one, SchedulerServer(second) as two:
                urls = [one.url, two.url]
                httpx.put(f"{urls[0]}/v1/agents/cpu", json=agent_body(None)).raise_for_status()
                body = {"index": INDEX, "nodes": 1, "devices_per_node": 0}
                answers = asyncio.run(
                    storm([("POST", f"{urls[i % 2]}/v1/placements", body) for i in range(30)])
                )
                codes = Counter(a.status_code for a in answers)
                assert codes == {201: 5, 429: 25}, [a.text for a in answers if a.status_code >= 500]
                listed = httpx.get(f"{urls[1]}/v1/placements").json()["placements"]
                assert len(listed) == 5
        finally:
            second.close()
