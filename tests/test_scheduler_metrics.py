"""``GET /metrics`` of variant-scheduler (scheduler/metrics.py): agents alive and stale by
resource group, devices free, allocated and unhealthy by device name and product,
placements by state, requests by outcome, and the plan, commit and what-if latencies,
read back with prometheus_client's own parser after real requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_scheduler_api import client_for, put_agent
from test_scheduler_support import A100_R535, H200_R570, INDEX, agent_body, open_store

H200 = "sm 9.0 (H100, H200, GH200)"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def samples(api: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = api.get("/metrics")
    assert response.status_code == 200
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[httpx.Client]:
    with (
        open_store(request.param, tmp_path, agent_ttl=90, clock=clock) as store,
        client_for(store) as client,
    ):
        yield client


def test_the_fleet_is_counted(api: httpx.Client, clock: Clock) -> None:
    put_agent(api, "old-a100", agent_body(A100_R535, 2, group="ampere"))
    clock.now += 120  # past --agent-ttl: old-a100 is stale
    put_agent(api, "h200-a", agent_body(H200_R570, 4) | {"unhealthy": {"cuda": ["GPU-3"]}})
    put_agent(api, "cpu-1", agent_body(None))
    placed = api.post("/v1/placements", json={"index": INDEX, "nodes": 1, "devices_per_node": 2})
    assert placed.status_code == 201, placed.text

    found = samples(api)
    assert value(found, "variant_scheduler_agents", resource_group="default", state="alive") == 2
    assert value(found, "variant_scheduler_agents", resource_group="default", state="stale") == 0
    assert value(found, "variant_scheduler_agents", resource_group="ampere", state="alive") == 0
    assert value(found, "variant_scheduler_agents", resource_group="ampere", state="stale") == 1
    devices = {
        state: value(
            found, "variant_scheduler_devices", device_name="cuda", product=H200, state=state
        )
        for state in ("free", "allocated", "unhealthy")
    }
    assert devices == {"free": 1, "allocated": 2, "unhealthy": 1}
    # the stale agent's devices are not in the live pool
    assert not [k for k in found if k[0] == "variant_scheduler_devices" and "8.0" in str(k[1])]
    assert value(found, "variant_scheduler_placements", state="active") == 1


def test_requests_are_counted_by_outcome_and_timed(api: httpx.Client) -> None:
    put_agent(api, "h200-a", agent_body(H200_R570, 4))
    before = samples(api)
    assert value(before, "variant_scheduler_placement_requests_total", operation="place",
                 outcome="placed") == 0  # fmt: skip
    assert value(before, "variant_scheduler_commit_seconds_count") == 0

    body = {"index": INDEX, "nodes": 1, "devices_per_node": 2}
    assert api.post("/v1/placements", json=body).status_code == 201
    assert api.post("/v1/placements", json=body | {"nodes": 3}).status_code == 409
    assert api.post("/v1/placements", json=body | {"nodes": 0}).status_code == 400
    what_if = {"request": body | {"nodes": 2}, "templates": []}
    assert api.post("/v1/what-if", json=what_if).status_code == 200
    assert api.post("/v1/placements/nope/replace").status_code == 404

    found = samples(api)

    def requests(operation: str, outcome: str) -> float:
        return value(found, "variant_scheduler_placement_requests_total",
                     operation=operation, outcome=outcome)  # fmt: skip

    assert (requests("place", "placed"), requests("place", "refused")) == (1, 1)
    assert requests("place", "invalid") == 1
    assert requests("what_if", "answered") == 1
    assert requests("replace", "not_found") == 1
    assert requests("place", "failed") == 0
    # the placed and the refused request each planned once; only the placed one committed
    assert value(found, "variant_scheduler_plan_seconds_count") == 2
    assert value(found, "variant_scheduler_commit_seconds_count") == 1
    assert value(found, "variant_scheduler_commit_seconds_sum") > 0
    assert value(found, "variant_scheduler_what_if_seconds_count") == 1
