"""The HTTP API: agents, placements, errors; on SQLite and on a private PostgreSQL."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, insert
from sqlalchemy.exc import IntegrityError

from conftest import RunningRegistry
from docker_variant.oci.reference import Reference, parse_reference
from docker_variant.scheduler import Store, rows
from docker_variant.scheduler.database import open_engine
from docker_variant.scheduler.documents import parse_placement_request
from docker_variant.scheduler.models import allocations, metadata, placements
from docker_variant.scheduler.store import QuotaExceededError
from docker_variant.variant import VariantIndex
from imaging import ImageBuilder
from test_scheduler_support import (
    A100_R535,
    B200_R580,
    H200_R570,
    INDEX,
    SchedulerServer,
    agent_body,
    agent_report,
    free_port,
    gpu_lists,
    gpu_only_index,
    open_store,
    postgres_cluster,
)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with open_store(request.param, tmp_path) as opened:
        yield opened


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    with open_store("sqlite", tmp_path) as opened:
        yield opened


@pytest.fixture(scope="module")
def shared_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """One server for the tests that change nothing (bad input, health)."""
    root = tmp_path_factory.mktemp("shared")
    with open_store("sqlite", root) as opened, client_for(opened) as client:
        yield client


@contextlib.contextmanager
def client_for(store: Store, fetch: Any = None, **options: Any) -> Iterator[httpx.Client]:
    """The API on a real socket (uvicorn in a thread), and a client for it; ``options``
    go to ``create_app`` (tokens, registries)."""
    with (
        SchedulerServer(store, fetch, **options) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        yield client


@pytest.fixture
def api(store: Store) -> Iterator[httpx.Client]:
    with client_for(store) as client:
        yield client


def put_agent(api: httpx.Client, agent_id: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.put(f"/v1/agents/{agent_id}", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def place(api: httpx.Client, nodes: int, per_node: int, **extra: Any) -> httpx.Response:
    body = {"index": extra.pop("index", INDEX), "nodes": nodes, "devices_per_node": per_node}
    return api.post("/v1/placements", json=body | extra)


def devices_of(api: httpx.Client, agent_id: str) -> dict[str, list[str]]:
    agents = {a["agent_id"]: a for a in api.get("/v1/agents").json()["agents"]}
    result: dict[str, list[str]] = agents[agent_id]["devices"]["cuda"]
    return result


def error_message(response: httpx.Response) -> str:
    errors = response.json()["errors"]
    assert len(errors) == 1
    message: str = errors[0]["message"]
    assert "\n" not in message and "Traceback" not in message
    return message


# --------------------------------------------------------------------------- agents


def test_agent_heartbeat_is_an_upsert_and_lists_devices(api: httpx.Client) -> None:
    first = put_agent(api, "node-1", agent_body(H200_R570, 2, group="gpu"))
    assert first["agent_id"] == "node-1" and first["resource_group"] == "gpu"
    assert first["devices"] == {
        "cuda": {"free": ["GPU-0", "GPU-1"], "allocated": [], "missing": []}
    }
    detail = api.get("/v1/agents/node-1").json()
    assert detail["device_lists"]["cuda"]["GPU-0"] == gpu_lists(H200_R570)
    assert detail["host"] == agent_body(None)["host"]
    again = put_agent(api, "node-1", agent_body(H200_R570, 3, group="gpu"))
    assert again["first_seen"] == first["first_seen"]
    assert again["devices"]["cuda"]["free"] == ["GPU-0", "GPU-1", "GPU-2"]
    put_agent(api, "node-2", agent_body(A100_R535, 1))
    listed = api.get("/v1/agents").json()["agents"]
    assert [a["agent_id"] for a in listed] == ["node-1", "node-2"]
    in_group = api.get("/v1/agents", params={"resource_group": "gpu"}).json()["agents"]
    assert [a["agent_id"] for a in in_group] == ["node-1"]
    assert api.get("/v1/agents/nobody").status_code == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"host": {"Bad": {}}}, "agent node: host: namespace 'Bad' does not match"),
        (
            {"devices": {"cuda": {"GPU-0": {"nvidia": {"sm_arch": ["9.0 "]}}}}},
            "agent node: device cuda/GPU-0: nvidia :: sm_arch: value '9.0 ' does not match",
        ),
        ({"devices": {"cuda": {"GPU 0": {}}}}, "devices.cuda: device id 'GPU 0' is not valid"),
        ({"devices": {"cuda": ["GPU-0"]}}, "devices.cuda must be a JSON object, got list"),
        ({"agent_id": "other"}, "agent_id 'other' in the body does not match 'node' in the path"),
        ({"resource_group": ""}, "resource_group '' is not valid"),
        ({"hots": {}}, "agent report: unknown key 'hots'"),
        ([], "an agent report must be a JSON object, got list"),
    ],
)
def test_bad_agent_reports_are_400_naming_the_value(
    shared_api: httpx.Client, body: Any, message: str
) -> None:
    response = shared_api.put("/v1/agents/node", json=body)
    assert response.status_code == 400
    assert message in error_message(response)
    assert shared_api.get("/v1/agents").json()["agents"] == []


def test_body_that_is_not_json_is_400(shared_api: httpx.Client) -> None:
    response = shared_api.put("/v1/agents/node", content=b"{nope")
    assert response.status_code == 400
    assert error_message(response).startswith("request body: not valid JSON (")


# --------------------------------------------------------------------------- placements


def test_place_get_delete(api: httpx.Client) -> None:
    put_agent(api, "h200-a", agent_body(H200_R570, 4))
    put_agent(api, "h200-b", agent_body(H200_R570, 4))
    response = place(api, 2, 3)
    assert response.status_code == 201, response.text
    placement = response.json()
    assert response.headers["location"] == f"/v1/placements/{placement['id']}"
    assert placement["variant"] == "cu128" and placement["image"] == "2.0-cu128"
    assert placement["homogeneous"] is True
    assert placement["allocations"] == [
        {"agent_id": "h200-a", "device_name": "cuda", "devices": ["GPU-0", "GPU-1", "GPU-2"]},
        {"agent_id": "h200-b", "device_name": "cuda", "devices": ["GPU-0", "GPU-1", "GPU-2"]},
    ]
    assert api.get(f"/v1/placements/{placement['id']}").json() == placement
    assert api.get("/v1/placements").json() == {"placements": [placement]}
    assert devices_of(api, "h200-a") == {
        "free": ["GPU-3"],
        "allocated": ["GPU-0", "GPU-1", "GPU-2"],
        "missing": [],
    }
    assert api.get("/v1/agents/h200-a").json()["placements"] == [placement["id"]]

    assert place(api, 1, 2).status_code == 409  # one free device per node is left
    assert api.delete(f"/v1/placements/{placement['id']}").status_code == 204
    assert api.get(f"/v1/placements/{placement['id']}").status_code == 404
    assert api.delete(f"/v1/placements/{placement['id']}").status_code == 404
    assert devices_of(api, "h200-a")["free"] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert place(api, 2, 4).status_code == 201


def test_refusal_is_409_with_a_reason_per_variant_and_takes_nothing(api: httpx.Client) -> None:
    put_agent(api, "agent-a", agent_body(B200_R580, 4))
    put_agent(api, "agent-b", agent_body(A100_R535, 4))
    response = place(api, 2, 4, index=gpu_only_index())  # no build fits both
    assert response.status_code == 409
    reasons = response.json()["reasons"]
    assert set(reasons) == {"cu130", "cu128", "cu126", "cu122"}
    assert reasons["cu130"] == (
        "needs 2 nodes with 4 free devices fitting it; 1 node has them (agent-a); agent-b: "
        "nvidia :: cuda_version_lower_bound needs one of 13.0; this device supports 12.2, "
        "12.1, 12.0, 12, 11.20, 11.19, ... (26 values)"
    )
    # all or nothing: the node that fitted was not half-taken
    assert devices_of(api, "agent-a")["allocated"] == []
    assert api.get("/v1/placements").json() == {"placements": []}


def test_resource_group_limits_the_nodes(api: httpx.Client) -> None:
    put_agent(api, "b200", agent_body(B200_R580, 4, group="train"))
    put_agent(api, "a100", agent_body(A100_R535, 4, group="infer"))
    response = place(api, 1, 1, resource_group="infer")
    assert response.status_code == 201
    assert response.json()["variant"] == "cu122"
    assert response.json()["resource_group"] == "infer"
    refused = place(api, 1, 1, resource_group="none", index=gpu_only_index())
    assert refused.status_code == 409
    assert refused.json()["reasons"]["cu122"].endswith("no agents in resource group 'none'")


def test_a_gang_stays_in_one_resource_group_unless_it_spreads(api: httpx.Client) -> None:
    put_agent(api, "a-0", agent_body(H200_R570, 4, group="a"))
    put_agent(api, "b-0", agent_body(H200_R570, 4, group="b"))
    refused = place(api, 2, 4, index=gpu_only_index())
    assert refused.status_code == 409, refused.text
    reason = refused.json()["reasons"]["cu128"]
    assert reason.startswith("resource group 'a': needs 2 nodes with 4 free devices")
    assert " | resource group 'b': needs 2 nodes" in reason
    spread = place(api, 2, 4, index=gpu_only_index(), spread=True)
    assert spread.status_code == 201, spread.text
    assert (spread.json()["resource_group"], spread.json()["spread"]) == (None, True)
    assert {a["agent_id"] for a in spread.json()["allocations"]} == {"a-0", "b-0"}
    assert api.delete(f"/v1/placements/{spread.json()['id']}").status_code == 204
    put_agent(api, "b-1", agent_body(H200_R570, 4, group="b"))
    placed = place(api, 2, 4, index=gpu_only_index())
    assert placed.status_code == 201, placed.text
    assert placed.json()["resource_group"] == "b"
    assert {a["agent_id"] for a in placed.json()["allocations"]} == {"b-0", "b-1"}
    both = place(api, 1, 1, resource_group="a", spread=True)
    assert both.status_code == 400
    assert error_message(both).startswith("spread: a gang in resource group 'a' cannot spread")


def test_a_placement_names_its_device_kind_when_the_variant_does_not(api: httpx.Client) -> None:
    put_agent(api, "h200", agent_body(H200_R570, 4))
    put_agent(api, "a100", agent_body(A100_R535, 4))
    response = place(api, 2, 4)  # only the CPU build fits both: which devices?
    assert response.status_code == 400, response.text
    assert error_message(response).startswith("device_name: the variant 'v3' names no")
    assert devices_of(api, "h200")["allocated"] == []
    named = place(api, 2, 4, device_name="cuda")
    assert (named.status_code, named.json()["variant"]) == (201, "v3")


def test_agent_re_report_keeps_allocations(api: httpx.Client) -> None:
    put_agent(api, "node", agent_body(H200_R570, 4))
    placement = place(api, 1, 2).json()
    assert placement["allocations"][0]["devices"] == ["GPU-0", "GPU-1"]
    # a driver upgrade changes every device's lists; GPU-1 fell off the bus; GPU-7 is new
    body = agent_body(H200_R570, 4)
    body["devices"]["cuda"] = {
        i: gpu_lists(((13, 0), (9, 0))) for i in ("GPU-0", "GPU-2", "GPU-3", "GPU-7")
    }
    view = put_agent(api, "node", body)
    assert view["devices"]["cuda"] == {
        "free": ["GPU-2", "GPU-3", "GPU-7"],
        "allocated": ["GPU-0"],
        "missing": ["GPU-1"],
    }
    # the same placement, degraded now that GPU-1 has vanished (docs/reference/scheduler-api.md: state)
    shown = api.get(f"/v1/placements/{placement['id']}").json()
    degraded = shown.pop("degraded")
    assert shown == placement | {"state": "degraded"}
    assert degraded["reason"] == "agent node: device cuda/GPU-1 is no longer reported"
    second = place(api, 1, 3).json()
    assert second["allocations"][0]["devices"] == ["GPU-2", "GPU-3", "GPU-7"]
    assert place(api, 1, 1).status_code == 409  # GPU-0 stays taken, GPU-1 is gone
    assert api.delete(f"/v1/placements/{placement['id']}").status_code == 204
    after = devices_of(api, "node")
    assert after == {"free": ["GPU-0"], "allocated": ["GPU-2", "GPU-3", "GPU-7"], "missing": []}


def test_the_database_refuses_a_device_allocated_twice(store: Store, api: httpx.Client) -> None:
    put_agent(api, "node", agent_body(H200_R570, 2))
    placement = place(api, 1, 2).json()
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(
            insert(allocations).values(
                agent_id="node", device_name="cuda", device_id="GPU-1", placement_id=placement["id"]
            )
        )


def test_a_refusal_of_a_prepared_statement_is_a_lost_race_and_rolls_back(
    store: Store, api: httpx.Client
) -> None:
    # the statements of a placement run on the DBAPI cursor (rows.Prepared): the database's
    # refusal still arrives as SQLAlchemy's error, and the transaction ends with nothing kept
    put_agent(api, "node", agent_body(H200_R570, 2))
    placement = place(api, 1, 1).json()
    again = {"id": placement["id"], "note": "a second placement with the same id"}
    with pytest.raises(IntegrityError) as refused, store.rows.write("placing") as conn:
        rows.insert_placement(conn, again, None, 0.0)
    assert rows.lost_race(refused.value)
    kept = store.get_placement(placement["id"])
    assert kept is not None and "note" not in kept
    assert place(api, 1, 1).status_code == 201  # the write lock went with the transaction


def test_a_plan_made_on_stale_state_does_not_commit_and_is_replanned(store: Store) -> None:
    from docker_variant.planner.placement import Plan, plan
    from docker_variant.scheduler.documents import parse_agent_report, parse_placement_request

    store.report_agent(parse_agent_report(agent_body(H200_R570, 2), "node"))
    index = VariantIndex.from_json(INDEX, "index")
    request = parse_placement_request({"index": INDEX, "nodes": 1, "devices_per_node": 1})
    stale = plan(index, store.snapshot(), 1, 1)
    assert isinstance(stale, Plan)
    first = store.place(index, request, lambda c: c.tag)  # takes GPU-0 meanwhile
    assert isinstance(first, dict) and first["allocations"][0]["devices"] == ["GPU-0"]
    document = {**first, "id": "f" * 32}
    assert stale.allocations[0].devices[0].device_id == "GPU-0"
    assert store._commit(stale, document) is False  # the primary key refused GPU-0
    assert store.get_placement("f" * 32) is None
    second = store.place(index, request, lambda c: c.tag)
    assert isinstance(second, dict) and second["allocations"][0]["devices"] == ["GPU-1"]


def test_cpu_only_placement(api: httpx.Client) -> None:
    put_agent(api, "cpu", agent_body(None, host={"x86_64": {"level": ["v3", "v2", "v1"]}}))
    response = place(api, 1, 0)
    assert response.status_code == 201
    assert response.json()["variant"] == "v3"
    assert response.json()["allocations"] == [
        {"agent_id": "cpu", "device_name": None, "devices": []}
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"nodes": 1, "devices_per_node": 1}, 'give exactly one of "image"'),
        (
            {"image": "r/a:1", "index": INDEX, "nodes": 1, "devices_per_node": 1},
            'give exactly one of "image"',
        ),
        ({"index": INDEX, "nodes": 0, "devices_per_node": 1}, "nodes must be an integer 1..10000"),
        ({"index": INDEX, "nodes": "2", "devices_per_node": 1}, "got '2'"),
        ({"index": INDEX, "nodes": 1}, "devices_per_node is required"),
        ({"index": INDEX, "nodes": 1, "devices_per_node": -1}, "devices_per_node must be"),
        ({"index": {"variants": 3}, "nodes": 1, "devices_per_node": 1}, "index: 'variants'"),
        (
            {"index": {"variants": {"Bad": {}}}, "nodes": 1, "devices_per_node": 1},
            "variant label 'Bad' does not match",
        ),
        (
            {"index": {"variants": {}}, "nodes": 1, "devices_per_node": 1},
            "index: no variant, no bare image and no invalid image",
        ),
        ({"image": "Bad Ref", "nodes": 1, "devices_per_node": 1}, "'Bad Ref'"),
        ({"image": "r/a", "nodes": 1, "devices_per_node": 1}, "a version tag is needed"),
        ({"index": INDEX, "nodes": 1, "devices_per_node": 1, "gpus": 2}, "unknown key 'gpus'"),
    ],
)
def test_bad_placement_requests_are_400(shared_api: httpx.Client, body: Any, message: str) -> None:
    response = shared_api.post("/v1/placements", json=body)
    assert response.status_code == 400, response.text
    assert message in error_message(response)


def test_a_bad_resource_group_query_is_400_as_in_a_body(shared_api: httpx.Client) -> None:
    response = shared_api.get("/v1/agents", params={"resource_group": "bad rg"})
    assert response.status_code == 400, response.text
    assert "resource_group 'bad rg' is not valid" in error_message(response)
    assert shared_api.get("/v1/agents", params={"resource_group": "gpu-a"}).status_code == 200


def test_an_index_of_invalid_images_only_is_a_refusal_naming_each(
    shared_api: httpx.Client,
) -> None:
    """As the same version asked for as {"image": REF}: 409, each invalid image's reason."""
    index = {"variants": {}, "invalid": [{"tag": "1.0-bad", "error": "bad label"}]}
    response = shared_api.post(
        "/v1/placements", json={"index": index, "nodes": 1, "devices_per_node": 1}
    )
    assert response.status_code == 409, response.text
    assert response.json()["reasons"] == {"1.0-bad": "invalid image: bad label"}


def test_a_placement_body_sent_again_is_read_once_and_a_bad_one_fails_each_time(
    shared_api: httpx.Client,
) -> None:
    from docker_variant.errors import InvalidInputError
    from docker_variant.scheduler.documents import parse_placement_body

    body = json.dumps({"index": INDEX, "nodes": 1, "devices_per_node": 1}).encode()
    first = parse_placement_body(body)
    assert parse_placement_body(bytes(bytearray(body))) is first  # equal bytes, another object
    assert first.stored_text == json.dumps(first.to_json())
    other = parse_placement_body(body.replace(b'"nodes": 1', b'"nodes": 2'))
    assert other.nodes == 2 and other.index is first.index  # one index per distinct document
    bad = json.dumps({"index": INDEX, "nodes": 0, "devices_per_node": 1}).encode()
    for _ in range(2):  # an invalid body is never kept: the same line each time
        with pytest.raises(InvalidInputError, match=r"nodes must be an integer 1\.\.10000, got 0"):
            parse_placement_body(bad)
        response = shared_api.post("/v1/placements", content=bad)
        assert response.status_code == 400
        assert error_message(response) == "nodes must be an integer 1..10000, got 0"
        response = shared_api.post("/v1/placements", content=b"{nope")
        assert error_message(response).startswith("request body: not valid JSON (")


# --------------------------------------------------------------------------- images


def test_a_placement_image_is_parsed_once_into_a_reference() -> None:
    """documents.py reads the text; the layers above take the typed value, and the request
    kept for replace reads back the same."""
    body = {"image": "reg.example:5000/ml/app:2.0", "nodes": 1, "devices_per_node": 0}
    request = parse_placement_request(body)
    assert request.image == Reference("reg.example:5000", "ml/app", "2.0")
    assert parse_placement_request(json.loads(request.stored_text)) == request
    hub = parse_placement_request(body | {"image": "app:1"})
    assert hub.image == parse_reference("docker.io/library/app:1")


def test_image_reference_is_resolved_through_the_fetcher(sqlite_store: Store) -> None:
    seen: list[Reference] = []

    def fetch(ref: Reference) -> tuple[Reference, VariantIndex]:
        seen.append(ref)  # the Reference documents.py parsed: no text to parse again
        return ref, VariantIndex.from_json(INDEX, str(ref))

    with client_for(sqlite_store, fetch, registries=["reg.example:5000"]) as api:
        put_agent(api, "b200", agent_body(B200_R580, 2))
        response = api.post(
            "/v1/placements",
            json={"image": "reg.example:5000/ml/app:2.0", "nodes": 1, "devices_per_node": 2},
        )
    assert response.status_code == 201
    assert response.json()["image"] == "reg.example:5000/ml/app:2.0-cu130"
    assert response.json()["digest"] == INDEX["images"]["cu130"]["digest"]
    assert seen == [Reference("reg.example:5000", "ml/app", "2.0")]


def test_registry_down_is_502(sqlite_store: Store) -> None:
    registry = f"127.0.0.1:{free_port()}"
    with client_for(sqlite_store, registries=[registry]) as api:
        response = api.post(
            "/v1/placements",
            json={"image": f"{registry}/ml/app:2.0", "nodes": 1, "devices_per_node": 1},
        )
    assert response.status_code == 502
    message = error_message(response)
    assert message.startswith("the registry is unavailable:") and "ml/app" in message


@pytest.mark.e2e
def test_placement_of_an_image_in_a_real_registry(
    registry: RunningRegistry, image_builder: ImageBuilder, store: Store
) -> None:
    repo = "scheduler/app"
    for label, cuda, sm in (("cu128", "12.8", "90_real"), ("cu122", "12.2", "80_real")):
        image_builder.build_and_push(
            f"{registry.host}/{repo}:3.0-{label}",
            {
                "dev.pep817.variant-label": label,
                "dev.pep817.variant.nvidia.cuda_version_lower_bound": cuda,
                "dev.pep817.variant.nvidia.sm_arch": sm,
            },
        )
    with client_for(store, registries=[registry.host]) as api:
        put_agent(api, "a100", agent_body(A100_R535, 1))
        body = {"image": f"{registry.host}/{repo}:3.0", "nodes": 1, "devices_per_node": 1}
        response = api.post("/v1/placements", json=body)
        missing = api.post("/v1/placements", json=body | {"image": f"{registry.host}/{repo}:9"})
    assert response.status_code == 201, response.text
    assert response.json()["image"] == f"{registry.host}/{repo}:3.0-cu122"
    assert response.json()["digest"].startswith("sha256:")
    assert missing.status_code == 404
    assert "no image tagged 9" in error_message(missing)


# --------------------------------------------------------------------------- health


def test_dead_database_is_503_in_one_line() -> None:
    dead = Store(open_engine(f"postgresql+psycopg://u@127.0.0.1:{free_port()}/db"))
    with client_for(dead) as api:
        for response in (
            api.get("/v1/agents"),
            api.put("/v1/agents/node", json=agent_body(H200_R570, 1)),
            api.post("/v1/placements", json={"index": INDEX, "nodes": 1, "devices_per_node": 1}),
            api.get("/healthz"),
        ):
            assert response.status_code == 503
            message = error_message(response)
            assert "is unavailable" in message and "Connection refused" in message
    dead.close()


def test_healthz(shared_api: httpx.Client) -> None:
    response = shared_api.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_agents_without_heartbeat_are_left_out(tmp_path: Path) -> None:
    now = [1_000_000.0]
    opened = open_store("sqlite", tmp_path, agent_ttl=60, clock=lambda: now[0])
    with opened as store, client_for(store) as api:
        put_agent(api, "old", agent_body(H200_R570, 1))
        now[0] += 90
        put_agent(api, "new", agent_body(A100_R535, 1))
        alive = {a["agent_id"]: a["alive"] for a in api.get("/v1/agents").json()["agents"]}
        assert alive == {"old": False, "new": True}
        response = place(api, 2, 1)
        assert response.status_code == 409
        assert response.json()["reasons"]["null"] == (
            "needs 2 nodes with 1 free device fitting it; 1 node has them (new); "
            "old: no heartbeat for 90 s (agent TTL 60 s)"
        )
        assert json.dumps(place(api, 1, 1).json()["allocations"]).count("new") == 1
        put_agent(api, "old", agent_body(H200_R570, 1))  # a heartbeat brings it back
        assert place(api, 1, 1).json()["allocations"][0]["agent_id"] == "old"


def test_only_reports_that_change_something_invalidate_the_pool(store: Store) -> None:
    from sqlalchemy import select

    from docker_variant.scheduler.documents import parse_agent_report
    from docker_variant.scheduler.models import pool_version

    def version() -> int:
        with store.engine.connect() as conn:
            return int(conn.execute(select(pool_version.c.version)).scalar_one())

    body = agent_body(H200_R570, 2)
    store.report_agent(parse_agent_report(body, "node"))
    first = version()
    assert len(store.snapshot().nodes[0].devices["cuda"]) == 2
    store.report_agent(parse_agent_report(body, "node"))  # a plain heartbeat
    assert version() == first
    store.report_agent(parse_agent_report(agent_body(H200_R570, 3), "node"))
    assert version() == first + 1
    assert len(store.snapshot().nodes[0].devices["cuda"]) == 3
    store.report_agent(parse_agent_report(agent_body(H200_R570, 3, group="other"), "node"))
    assert version() == first + 2
    assert store.snapshot("default").nodes == []


def test_placement_gives_up_after_losing_every_race(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from docker_variant.planner.placement import Refusal
    from docker_variant.scheduler.documents import parse_agent_report, parse_placement_request

    sqlite_store.report_agent(parse_agent_report(agent_body(H200_R570, 2), "node"))
    monkeypatch.setattr(sqlite_store, "attempts", 2)

    def outraced(*_args: Any) -> None:  # as when another writer took the devices first
        raise rows.Stale()

    monkeypatch.setattr(rows, "take", outraced)
    request = parse_placement_request({"index": INDEX, "nodes": 1, "devices_per_node": 1})
    outcome = sqlite_store.place(VariantIndex.from_json(INDEX, "i"), request, lambda c: c.tag)
    assert isinstance(outcome, Refusal)
    assert outcome.reasons == {
        "cu128": "the devices it was given were taken by concurrent placements 2 times in a "
        "row; try again"
    }


# --------------------------------------------------------------------------- huge numbers

HUGE = "1" * 5000  # past Python's int-string limit (4,300 digits)


def _with_value(namespace: str, feature: str, value: str) -> dict[str, Any]:
    index: dict[str, Any] = json.loads(json.dumps(INDEX))
    index["variants"]["cu128"][namespace] = {feature: [value]}
    return index


@pytest.mark.parametrize(
    ("namespace", "feature", "value"),
    [
        ("nvidia", "cuda_version_lower_bound", HUGE),
        ("nvidia", "cuda_version_lower_bound", f"12.{HUGE}"),
        ("nvidia", "sm_arch", f"{HUGE}_real"),
        ("x86_64", "level", f"v{HUGE}"),
        ("amd", "gfx_arch", f"gfx{HUGE}"),
        ("amd", "rocm_version", f"6.{HUGE}"),
    ],
)
def test_an_index_with_a_5000_digit_number_is_400_in_one_line(
    api: httpx.Client, namespace: str, feature: str, value: str
) -> None:
    put_agent(api, "node", agent_body(H200_R570, 2))
    index = _with_value(namespace, feature, value)
    request = {"index": index, "nodes": 1, "devices_per_node": 1}
    for answer in (
        api.post("/v1/placements", json=request),
        api.post("/v1/what-if", json={"request": request, "templates": []}),
    ):
        assert answer.status_code == 400, answer.text
        message = error_message(answer)
        assert len(message) < 400 and f"{namespace} :: {feature}" in message


def test_a_5000_digit_number_elsewhere_never_makes_a_500(api: httpx.Client) -> None:
    """Where a value has no numeric rule (a namespace of its own) it is a plain string, and
    device ids of 255 digits are ordered without int(): placements answer as usual."""
    body = agent_body(H200_R570, 0)
    body["devices"] = {"cuda": {"9" * 255: gpu_lists(H200_R570), "1" * 255: gpu_lists(H200_R570)}}
    body["host"] = {**body["host"], "acme": {"arch": [HUGE]}}
    put_agent(api, "node", body)
    placed = api.post(
        "/v1/placements",
        json={"index": _with_value("acme", "arch", HUGE), "nodes": 1, "devices_per_node": 2},
    )
    assert placed.status_code == 201, placed.text
    assert placed.json()["allocations"][0]["devices"] == ["1" * 255, "9" * 255]
    assert api.get("/v1/agents/node").status_code == 200


def test_replace_is_400_when_the_registry_now_holds_a_5000_digit_number(
    store: Store,
) -> None:
    """The index is fetched again for a replace: one the registry now serves with such a
    number is refused in one line (the old placement stays as it was)."""
    served = [INDEX]

    def fetch(reference: Any) -> tuple[Reference, VariantIndex]:
        return parse_reference(str(reference)), VariantIndex.from_json(served[0], "index")

    with client_for(store, fetch) as api:
        put_agent(api, "node", agent_body(H200_R570, 2))
        placed = api.post(
            "/v1/placements",
            json={"image": "registry.example/app:2.0", "nodes": 1, "devices_per_node": 1},
        )
        assert placed.status_code == 201, placed.text
        put_agent(api, "node", agent_body(H200_R570, 2) | {"unhealthy": {"cuda": ["GPU-0"]}})
        served[0] = _with_value("nvidia", "cuda_version_lower_bound", HUGE)
        answer = api.post(f"/v1/placements/{placed.json()['id']}/replace")
        assert answer.status_code == 400, answer.text
        assert "nvidia :: cuda_version_lower_bound" in error_message(answer)
        assert api.get(f"/v1/placements/{placed.json()['id']}").json()["state"] == "degraded"


def test_unknown_routes_and_methods_answer_in_the_api_error_body(
    shared_api: httpx.Client,
) -> None:
    missing = shared_api.get("/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.json()["errors"][0]["code"] == "ROUTE_UNKNOWN"
    assert "/v1/nothing-here" in missing.json()["errors"][0]["message"]
    wrong = shared_api.patch("/v1/placements")
    assert wrong.status_code == 405
    assert wrong.json()["errors"][0]["code"] == "UNSUPPORTED"
    assert wrong.headers["allow"]  # the router's Allow header is kept


# --------------------------------------------------------------------------- storage bounds


def _bulky_index(variants: int) -> dict[str, Any]:
    """A valid index of ``variants`` CPU builds (and null): about 150 bytes each stored."""
    labels = [f"v{i}" for i in range(variants)]
    return {
        "variants": {label: {"x86_64": {"level": ["v1"]}} for label in labels} | {"null": {}},
        "images": {
            label: {"tag": f"2.0-{label}", "digest": "sha256:" + "a" * 64}
            for label in [*labels, "null"]
        },
    }


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_clients_placements_stop_at_its_quota_and_a_delete_frees_one(
    kind: str, tmp_path: Path
) -> None:
    """``devices_per_node: 0`` takes no device, so only the quota bounds how many one client
    stores; another client is unaffected, and a deleted placement no longer counts."""
    with open_store(kind, tmp_path, max_placements=3) as store:
        store.report_agent(agent_report("cpu-0", agent_body(None)))
        request = parse_placement_request({"index": INDEX, "nodes": 1, "devices_per_node": 0})
        assert request.index is not None
        index = request.index

        def place(owner: str) -> dict[str, Any]:
            made = store.place(index, request, lambda c: c.tag, owner)
            assert isinstance(made, dict), made
            return made

        ids = [place("ci")["id"] for _ in range(3)]
        quota = "client 'ci' keeps 3 placements, the most one client may keep"
        with pytest.raises(QuotaExceededError, match=quota):
            place("ci")
        place("nightly")  # another client's count is its own
        assert store.delete_placement(ids[0])
        place("ci")
        with pytest.raises(QuotaExceededError):
            place("ci")
        assert len(store.list_placements()) == 4


def test_a_stored_request_over_the_bound_is_413_and_nothing_is_kept(
    sqlite_store: Store,
) -> None:
    with client_for(sqlite_store) as api:
        put_agent(api, "cpu-0", agent_body(None))
        under = place(api, 1, 0, index=_bulky_index(300))  # ~45 KB: a large real index
        assert under.status_code == 201, under.text
        over = place(api, 1, 0, index=_bulky_index(600))
        assert over.status_code == 413, over.text
        assert over.json()["errors"][0]["code"] == "REQUEST_TOO_LARGE"
        message = error_message(over)
        assert "the placement request is" in message and "over 65536 bytes" in message
        assert "--max-placement-request" in message
        assert [p["id"] for p in api.get("/v1/placements").json()["placements"]] == [
            under.json()["id"]
        ]


def test_deleted_placements_give_their_space_back(tmp_path: Path) -> None:
    """SQLite: incremental auto-vacuum; the file shrinks once the placements are deleted
    (sizes read with the store closed: WAL checkpointed into the file)."""
    path = tmp_path / "scheduler.db"
    url = f"sqlite:///{path}"
    request = parse_placement_request(
        {"index": _bulky_index(400), "nodes": 1, "devices_per_node": 0}
    )
    assert request.index is not None
    index = request.index
    store = Store.open(url)
    try:
        store.report_agent(agent_report("cpu-0", agent_body(None)))
        made = [store.place(index, request, lambda c: c.tag, f"c{i % 2}") for i in range(100)]
    finally:
        store.close()
    full = path.stat().st_size
    assert full > 100 * 50_000  # each keeps its request of ~60 KB
    store = Store.open(url)
    try:
        for placement in made:
            assert isinstance(placement, dict) and store.delete_placement(placement["id"])
    finally:
        store.close()
    assert path.stat().st_size < full / 4, (full, path.stat().st_size)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_an_older_database_gains_owners_and_incremental_vacuum(kind: str, tmp_path: Path) -> None:
    """A database made before: no ``owner`` column (SQLite: no auto-vacuum either). Opened,
    its placements' owners are read from their documents and count against the quota;
    SQLite's file is vacuumed once into incremental auto-vacuum."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        old = create_engine(url)  # plain: no auto_vacuum, as before
    else:
        url = postgres_cluster().new_database()
        old = open_engine(url)
    metadata.create_all(old)
    document = {"id": "a" * 32, "owner": "ci", "allocations": []}
    with old.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_placements_owner")
        conn.exec_driver_sql("ALTER TABLE placements DROP COLUMN owner")
        conn.execute(
            insert(placements).values(
                id="a" * 32, created_at=0.0, document=json.dumps(document), state="active"
            )
        )
    old.dispose()
    store = Store.open(url, max_placements=1)
    try:
        if kind == "sqlite":
            with store.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2  # incremental
        store.report_agent(agent_report("cpu-0", agent_body(None)))
        request = parse_placement_request({"index": INDEX, "nodes": 1, "devices_per_node": 0})
        assert request.index is not None
        with pytest.raises(QuotaExceededError, match="client 'ci' keeps 1 placements"):
            store.place(request.index, request, lambda c: c.tag, "ci")
        assert isinstance(store.place(request.index, request, lambda c: c.tag, "cd"), dict)
    finally:
        store.close()
