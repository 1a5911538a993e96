"""Device health and failures (docs/reference/scheduler-api.md: ``unhealthy``, ``state``, ``replace``): failures are
injected the way an agent reports them, by heartbeat, and by an agent that stops beating (a
clock the test moves, not sleeps). On SQLite and on a private PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from docker_variant.errors import InvalidInputError
from docker_variant.scheduler import Store, rows
from docker_variant.scheduler.documents import SHARE
from docker_variant.scheduler.tokens import load_tokens
from test_scheduler_api import client_for, error_message, place, put_agent
from test_scheduler_security import TOKENS_TOML, bearer
from test_scheduler_support import A100_R535, H200_R570, agent_body, gpu_only_index, open_store

GPU_INDEX = gpu_only_index()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with open_store(request.param, tmp_path) as opened:
        yield opened


@pytest.fixture
def api(store: Store) -> Iterator[httpx.Client]:
    with client_for(store) as client:
        yield client


@pytest.fixture(scope="module")
def shared_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("health")
    with open_store("sqlite", root) as opened, client_for(opened) as client:
        yield client


def sick(gpu: Any, count: int, *ids: str) -> dict[str, Any]:
    """A heartbeat with ``ids`` reported unhealthy."""
    return agent_body(gpu, count) | {"unhealthy": {"cuda": list(ids)}}


def gang(api: httpx.Client, nodes: int, per_node: int, **extra: Any) -> dict[str, Any]:
    response = place(api, nodes, per_node, index=GPU_INDEX, **extra)
    assert response.status_code == 201, response.text
    document: dict[str, Any] = response.json()
    return document


def held(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(a["agent_id"], d) for a in document["allocations"] for d in a["devices"]}


def allocated(api: httpx.Client) -> set[tuple[str, str]]:
    return {
        (view["agent_id"], device)
        for view in api.get("/v1/agents").json()["agents"]
        for device in view["devices"].get("cuda", {}).get("allocated", [])
    }


def degraded_count(api: httpx.Client) -> int:
    text = api.get("/metrics").text
    line = next(
        x
        for x in text.splitlines()
        if x.startswith('variant_scheduler_placements{state="degraded"}')
    )
    return int(float(line.split()[-1]))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"unhealthy": {"cuda": ["GPU-9"]}},
            "unhealthy.cuda: device 'GPU-9' is not among the reported cuda devices",
        ),
        (
            {"unhealthy": {"npu": ["x"]}},
            "unhealthy: device name 'npu' is not among the reported devices",
        ),
        ({"unhealthy": {"cuda": "GPU-0"}}, "unhealthy.cuda must be a list of device ids, got str"),
        ({"unhealthy": []}, "unhealthy must be a JSON object, got list"),
        (
            {"capacity": {"cuda": {"GPU-0": 0}}},
            "capacity.cuda.GPU-0 must be a number of shares > 0 and <= 1024, got 0",
        ),
        ({"capacity": {"cuda": {"GPU-0": -1.5}}}, "got -1.5"),
        (
            {"capacity": {"cuda": {"GPU-0": "1"}}},
            "capacity.cuda.GPU-0 must be a number of shares > 0 and <= 1024, got '1'",
        ),
        ({"capacity": {"cuda": {"GPU-0": True}}}, "got True"),
        ({"capacity": {"cuda": {"GPU-0": 2000}}}, "got 2000"),
        ({"capacity": {"cuda": {"GPU-0": 1e-9}}}, "got 1e-09"),
        (
            {"capacity": {"cuda": {"GPU-7": 1}}},
            "capacity.cuda: device 'GPU-7' is not among the reported cuda devices",
        ),
        ({"capacity": {"cuda": []}}, "capacity.cuda must be a JSON object, got list"),
    ],
)
def test_bad_capacity_and_unhealthy_are_400_naming_the_value(
    shared_api: httpx.Client, extra: dict[str, Any], message: str
) -> None:
    response = shared_api.put("/v1/agents/node", json=agent_body(H200_R570, 2) | extra)
    assert response.status_code == 400
    assert message in error_message(response)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"shares_per_device": 0}, "shares_per_device must be a number > 0 and <= 1, got 0"),
        ({"shares_per_device": 1.5}, "got 1.5"),
        ({"shares_per_device": "0.5"}, "got '0.5'"),
        ({"shares_per_device": None}, "got None"),
        ({"shares_per_device": False}, "got False"),
    ],
)
def test_bad_shares_per_device_is_400_naming_the_value(
    shared_api: httpx.Client, extra: dict[str, Any], message: str
) -> None:
    response = place(shared_api, 1, 1, **extra)
    assert response.status_code == 400
    assert message in error_message(response)


def test_shares_need_devices(shared_api: httpx.Client) -> None:
    response = place(shared_api, 1, 0, shares_per_device=0.5)
    assert response.status_code == 400
    assert "shares_per_device needs devices_per_node >= 1" in error_message(response)


def test_bad_state_filter_is_400(shared_api: httpx.Client) -> None:
    response = shared_api.get("/v1/placements", params={"state": "broken"})
    assert response.status_code == 400
    assert error_message(response) == "state 'broken' is not one of active, degraded"


# --------------------------------------------------------------------------- heartbeats


def test_an_unhealthy_device_degrades_its_placement_and_is_never_allocated(
    api: httpx.Client,
) -> None:
    put_agent(api, "a", agent_body(H200_R570, 2))
    first = gang(api, 1, 1)
    assert first["state"] == "active" and held(first) == {("a", "GPU-0")}
    assert degraded_count(api) == 0
    view = put_agent(api, "a", sick(H200_R570, 2, "GPU-0"))
    assert view["unhealthy"] == {"cuda": ["GPU-0"]}
    shown = api.get(f"/v1/placements/{first['id']}").json()
    assert shown["state"] == "degraded"
    assert shown["degraded"]["reason"] == "agent a: device cuda/GPU-0 is unhealthy"
    assert shown["degraded"]["since"].endswith("Z")
    listed = api.get("/v1/placements", params={"state": "degraded"}).json()["placements"]
    assert [p["id"] for p in listed] == [first["id"]]
    assert api.get("/v1/placements", params={"state": "active"}).json()["placements"] == []
    assert degraded_count(api) == 1
    # GPU-1 is healthy and free; a second device is unhealthy: only GPU-1 can be taken
    put_agent(api, "a", sick(H200_R570, 3, "GPU-0", "GPU-2"))
    assert place(api, 1, 2, index=GPU_INDEX).status_code == 409
    assert held(gang(api, 1, 1)) == {("a", "GPU-1")}
    assert place(api, 1, 1, index=GPU_INDEX).status_code == 409
    free = api.get("/v1/agents").json()["agents"][0]["devices"]["cuda"]["free"]
    assert free == []  # GPU-2 is unhealthy, not free


def test_a_vanished_device_degrades_its_placement(api: httpx.Client) -> None:
    put_agent(api, "a", agent_body(H200_R570, 2))
    first = gang(api, 1, 2)
    body = agent_body(H200_R570, 2)
    del body["devices"]["cuda"]["GPU-1"]
    put_agent(api, "a", body)
    shown = api.get(f"/v1/placements/{first['id']}").json()
    assert shown["degraded"]["reason"] == "agent a: device cuda/GPU-1 is no longer reported"


def test_replace_keeps_the_variant_and_the_healthy_nodes(api: httpx.Client) -> None:
    for agent in ("a", "b", "c"):
        put_agent(api, agent, agent_body(H200_R570, 2))
    first = gang(api, 2, 2)
    assert {a["agent_id"] for a in first["allocations"]} == {"a", "b"}
    assert api.post(f"/v1/placements/{first['id']}/replace").status_code == 409  # active
    put_agent(api, "b", sick(H200_R570, 2, "GPU-1"))
    response = api.post(f"/v1/placements/{first['id']}/replace")
    assert response.status_code == 201, response.text
    moved = response.json()
    assert moved["id"] == first["id"] and moved["state"] == "active"
    assert "degraded" not in moved
    assert moved["variant"] == first["variant"] == "cu128"
    assert held(moved) == {("a", "GPU-0"), ("a", "GPU-1"), ("c", "GPU-0"), ("c", "GPU-1")}
    assert moved["replaced"]["agents"] == ["b"]
    assert moved["replaced"]["reason"] == "agent b: device cuda/GPU-1 is unhealthy"
    assert api.get(f"/v1/placements/{first['id']}").json() == moved
    assert allocated(api) == held(moved)  # b's devices were freed
    assert degraded_count(api) == 0
    # b's healthy GPU-0 is free again; its unhealthy GPU-1 is not
    assert held(gang(api, 1, 1)) == {("b", "GPU-0")}


def test_replace_reuses_the_healthy_devices_of_a_troubled_node(api: httpx.Client) -> None:
    put_agent(api, "a", agent_body(H200_R570, 4))
    first = gang(api, 1, 2)
    put_agent(api, "a", sick(H200_R570, 4, "GPU-1"))
    moved = api.post(f"/v1/placements/{first['id']}/replace").json()
    assert held(moved) == {("a", "GPU-0"), ("a", "GPU-2")}  # GPU-0 stays, GPU-2 for GPU-1
    assert allocated(api) == held(moved)


def test_replace_chooses_again_when_the_variant_cannot_be_kept(api: httpx.Client) -> None:
    put_agent(api, "h1", agent_body(H200_R570, 1))
    put_agent(api, "h2", agent_body(H200_R570, 1))
    put_agent(api, "x1", agent_body(A100_R535, 1))
    put_agent(api, "x2", agent_body(A100_R535, 1))
    first = gang(api, 2, 1)
    assert first["variant"] == "cu128"
    put_agent(api, "h2", sick(H200_R570, 1, "GPU-0"))
    response = api.post(f"/v1/placements/{first['id']}/replace")
    assert response.status_code == 201, response.text
    moved = response.json()
    assert moved["variant"] == "cu122" and moved["image"] == "2.0-cu122"
    assert held(moved) == {("x1", "GPU-0"), ("x2", "GPU-0")}
    assert sorted(moved["replaced"]["agents"]) == ["h1", "h2"]
    assert allocated(api) == held(moved)


def test_a_replace_that_cannot_fit_changes_nothing(api: httpx.Client) -> None:
    put_agent(api, "a", agent_body(H200_R570, 1))
    put_agent(api, "b", agent_body(H200_R570, 1))
    first = gang(api, 2, 1)
    put_agent(api, "b", sick(H200_R570, 1, "GPU-0"))
    response = api.post(f"/v1/placements/{first['id']}/replace")
    assert response.status_code == 409
    assert "needs 2 nodes" in response.json()["reasons"]["cu128"]
    shown = api.get(f"/v1/placements/{first['id']}").json()
    assert shown["state"] == "degraded" and held(shown) == held(first)
    assert allocated(api) == held(first)  # the old devices are still held
    assert api.post("/v1/placements/nothing/replace").status_code == 404


# --------------------------------------------------------------------------- agent TTL


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_an_agent_that_stops_beating_degrades_its_placements_after_the_ttl(
    kind: str, tmp_path: Path
) -> None:
    clock = Clock()
    with (
        open_store(kind, tmp_path, agent_ttl=30, clock=clock) as store,
        client_for(store) as api,
    ):
        for agent in ("a", "b", "c"):
            put_agent(api, agent, agent_body(H200_R570, 1))
        first = gang(api, 2, 1)
        assert {a["agent_id"] for a in first["allocations"]} == {"a", "b"}
        clock.now += 20
        put_agent(api, "a", agent_body(H200_R570, 1))
        put_agent(api, "c", agent_body(H200_R570, 1))
        clock.now += 15  # b is 35 s silent, past the 30 s TTL; a and c beat 15 s ago
        shown = api.get(f"/v1/placements/{first['id']}").json()
        assert shown["state"] == "degraded"
        assert shown["degraded"] == {
            "reason": "agent b: no heartbeat for 35 s (agent TTL 30 s)",
            "since": "2027-01-15T08:00:30Z",  # when the TTL lapsed, not when it was noticed
        }
        assert degraded_count(api) == 1
        moved = api.post(f"/v1/placements/{first['id']}/replace").json()
        assert held(moved) == {("a", "GPU-0"), ("c", "GPU-0")}
        assert moved["state"] == "active"


def test_a_placement_of_hosts_only_degrades_too(tmp_path: Path) -> None:
    clock = Clock()
    with (
        open_store("sqlite", tmp_path, agent_ttl=30, clock=clock) as store,
        client_for(store) as api,
    ):
        put_agent(api, "cpu-1", agent_body(None))
        first = place(api, 1, 0).json()
        assert first["allocations"] == [{"agent_id": "cpu-1", "device_name": None, "devices": []}]
        assert api.get("/v1/agents").json()["agents"][0]["devices"] == {}
        assert api.get("/v1/agents/cpu-1").json()["placements"] == [first["id"]]
        clock.now += 31
        shown = api.get(f"/v1/placements/{first['id']}").json()
        assert shown["degraded"]["reason"] == "agent cpu-1: no heartbeat for 31 s (agent TTL 30 s)"
        put_agent(api, "cpu-2", agent_body(None))
        moved = api.post(f"/v1/placements/{first['id']}/replace").json()
        assert moved["allocations"] == [{"agent_id": "cpu-2", "device_name": None, "devices": []}]
        assert api.get("/v1/agents/cpu-1").json()["placements"] == []
        drained = api.delete("/v1/agents/cpu-2").json()
        assert drained["placements_deleted"] == [first["id"]]


def test_metrics_and_replace_keep_the_token_rules(tmp_path: Path) -> None:
    (tmp_path / "tokens.toml").write_text(TOKENS_TOML)
    tokens = load_tokens(tmp_path / "tokens.toml")
    with open_store("sqlite", tmp_path) as store, client_for(store, tokens=tokens) as api:
        assert api.get("/metrics").status_code == 401
        assert api.get("/metrics", headers=bearer("agent0")).status_code == 200
        body = agent_body(H200_R570, 2) | {"unhealthy": {"cuda": ["GPU-0"]}}
        assert api.put("/v1/agents/h200-0", json=body, headers=bearer("agent0")).status_code == 200
        body = {"index": GPU_INDEX, "nodes": 1, "devices_per_node": 1}
        made = api.post("/v1/placements", json=body, headers=bearer("alice")).json()
        assert made["allocations"][0]["devices"] == ["GPU-1"]  # GPU-0 is unhealthy
        replace = f"/v1/placements/{made['id']}/replace"
        assert api.post(replace, headers=bearer("bob")).status_code == 403  # alice's
        assert api.post(replace, headers=bearer("agent0")).status_code == 403  # not a client
        assert api.post(replace, headers=bearer("alice")).status_code == 409  # active


def test_a_database_from_before_shares_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # the allocations table as it was
        conn.execute(
            "CREATE TABLE allocations (agent_id VARCHAR(255), device_name VARCHAR(255), "
            "device_id VARCHAR(255), placement_id VARCHAR(32), "
            "PRIMARY KEY (agent_id, device_name, device_id))"
        )
    with pytest.raises(InvalidInputError, match="made by an older variant-scheduler"):
        Store.open(f"sqlite:///{path}")


# --------------------------------------------------------------------------- degraded_by


def _states(**healthy: bool) -> dict[tuple[str, str], rows.DeviceState]:
    return {("cuda", d): rows.DeviceState("profile", SHARE, ok) for d, ok in healthy.items()}


def test_degraded_by_names_the_first_failed_device_of_each_placement() -> None:
    held = [
        ("cuda", "GPU-0", "p1"),
        ("cuda", "GPU-1", "p1"),  # also failed: p1 keeps the first reason
        ("cuda", "GPU-2", "p2"),
        ("cuda", "GPU-3", "p3"),  # healthy: p3 is not degraded
        (rows.HOST_ROW, rows.HOST_ROW, "p4"),  # a host-only placement holds no device
    ]
    reported = _states(**{"GPU-0": False, "GPU-1": False, "GPU-3": True})  # GPU-2 is gone
    assert rows.degraded_by("node", held, reported) == {
        "p1": "agent node: device cuda/GPU-0 is unhealthy",
        "p2": "agent node: device cuda/GPU-2 is no longer reported",
    }


def test_degraded_by_is_empty_while_every_held_device_is_healthy() -> None:
    held = [("cuda", "GPU-0", "p1"), ("cuda", "GPU-1", "p2")]
    assert rows.degraded_by("node", held, _states(**{"GPU-0": True, "GPU-1": True})) == {}
    assert rows.degraded_by("node", [], {}) == {}
