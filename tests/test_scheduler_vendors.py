"""Every accelerator through the scheduler, not only NVIDIA: the accelerator namespace a
variant names decides which devices a placement takes. The AMD heartbeats are built by the
built-in ``amd`` provider from host-root fixtures shaped like real KFD sysfs (an MI300X node:
eight gfx942 GPUs by PCI address; MI355X: gfx950), as an agent would send them."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from docker_variant.providers import HostRoot
from docker_variant.providers.amd import detect
from docker_variant.scheduler import Store
from test_scheduler_api import api, client_for, put_agent, sqlite_store, store
from test_scheduler_support import H200_R570, X86_V4, gpu_lists

__all__ = ["api", "sqlite_store", "store"]  # the fixtures, used by name

HOSTS = Path(__file__).parent / "fixtures" / "hostroot"


def amd_heartbeat(host: str, **extra: Any) -> dict[str, Any]:
    """What an agent on the fixture host reports: its CPU and AMD lists, and each GPU under
    ``devices.amd`` by PCI address."""
    report = detect(HostRoot(HOSTS / host), {})
    assert report.devices, host
    devices = {address: lists for address, lists in report.devices.items()}
    body = {"host": {**X86_V4, "amd": report.host}, "devices": {"amd": devices}}
    return body | extra


def nvidia_heartbeat(count: int = 8) -> dict[str, Any]:
    lists = gpu_lists(H200_R570)
    return {
        "host": {**X86_V4, **lists},
        "devices": {"cuda": {f"GPU-{i}": lists for i in range(count)}},
    }


def _digest(label: str) -> str:
    return "sha256:" + hashlib.sha256(label.encode()).hexdigest()


def index_of(variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "default-priorities": {"namespace": ["nvidia", "amd", "x86_64"]},
        "variants": variants,
        "images": {label: {"tag": f"1.0-{label}", "digest": _digest(label)} for label in variants},
        "bare": None,
    }


ROCM942 = {"amd": {"gfx_arch": ["gfx942"], "rocm_version": ["6.2"]}}
ROCM_ANY = {"amd": {"gfx_arch": ["gfx942", "gfx950"]}}  # one build with code for both targets
CU128 = {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}}


def lists_of(api: httpx.Client, agent_id: str, name: str, device_id: str) -> dict[str, Any]:
    lists: dict[str, Any] = api.get(f"/v1/agents/{agent_id}").json()["device_lists"][name][
        device_id
    ]
    return lists


def test_a_64_node_gang_of_mi300x_nodes_places_homogeneously(api: httpx.Client) -> None:
    """64 MI300X nodes beside 32 MI355X nodes, and a build that runs on both: the gang of
    64 x 8 takes one device class, gfx942 on every device."""
    for i in range(64):
        put_agent(api, f"mi300x-{i:02d}", amd_heartbeat("mi300x"))
    for i in range(32):
        put_agent(api, f"mi355x-{i:02d}", amd_heartbeat("mi355x"))
    body = {"index": index_of({"rocm": ROCM_ANY}), "nodes": 64, "devices_per_node": 8}
    placed = api.post("/v1/placements", json=body)
    assert placed.status_code == 201, placed.text
    document = placed.json()
    assert document["variant"] == "rocm" and document["homogeneous"] is True
    allocations = document["allocations"]
    assert len(allocations) == 64
    assert {a["agent_id"].split("-")[0] for a in allocations} == {"mi300x"}
    assert {a["device_name"] for a in allocations} == {"amd"}
    assert all(len(a["devices"]) == 8 for a in allocations)
    first = allocations[0]
    assert lists_of(api, first["agent_id"], "amd", first["devices"][0])["amd"]["gfx_arch"] == [
        "gfx942"
    ]
    # the MI355X nodes are still free for a gang of 32; a 33rd node is not there
    again = api.post("/v1/placements", json=body | {"nodes": 32})
    assert again.status_code == 201, again.text
    assert {a["agent_id"].split("-")[0] for a in again.json()["allocations"]} == {"mi355x"}
    refused = api.post("/v1/placements", json=body | {"nodes": 1})
    assert refused.status_code == 409, refused.text


def test_a_mixed_pool_places_each_variant_on_its_own_vendors_devices(api: httpx.Client) -> None:
    for i in range(4):
        put_agent(api, f"h200-{i}", nvidia_heartbeat())
        put_agent(api, f"mi300x-{i}", amd_heartbeat("mi300x"))
    for variants, vendor, name in (
        ({"cu128": CU128}, "h200", "cuda"),
        ({"rocm942": ROCM942}, "mi300x", "amd"),
    ):
        body = {"index": index_of(variants), "nodes": 2, "devices_per_node": 8}
        placed = api.post("/v1/placements", json=body)
        assert placed.status_code == 201, placed.text
        allocations = placed.json()["allocations"]
        assert {a["agent_id"].split("-")[0] for a in allocations} == {vendor}
        assert {a["device_name"] for a in allocations} == {name}
    # both in one index: the gang of four nodes takes one vendor's, the rest the other's
    both = {"index": index_of({"cu128": CU128, "rocm942": ROCM942}), "devices_per_node": 8}
    first = api.post("/v1/placements", json=both | {"nodes": 2}).json()
    second = api.post("/v1/placements", json=both | {"nodes": 2}).json()
    assert {first["variant"], second["variant"]} == {"cu128", "rocm942"}
    for document in (first, second):
        vendor = "h200" if document["variant"] == "cu128" else "mi300x"
        assert {a["agent_id"].split("-")[0] for a in document["allocations"]} == {vendor}


def test_an_accelerator_namespace_counts_only_from_the_device(api: httpx.Client) -> None:
    """A node with one H200 beside eight MI300X GPUs reports nvidia in its host lists (the
    aggregate of its GPUs): a CUDA build asking for two devices a node must not take the
    AMD GPUs, and a ROCm build takes only them."""
    mixed = amd_heartbeat("mi300x")
    mixed["host"] = {**mixed["host"], **gpu_lists(H200_R570)}
    mixed["devices"]["cuda"] = {"GPU-0": gpu_lists(H200_R570)}
    put_agent(api, "mixed", mixed)
    cuda = api.post(
        "/v1/placements",
        json={"index": index_of({"cu128": CU128}), "nodes": 1, "devices_per_node": 2},
    )
    assert cuda.status_code == 409, cuda.text
    assert "only 1 device fits it" in cuda.json()["reasons"]["cu128"]
    rocm = api.post(
        "/v1/placements",
        json={"index": index_of({"rocm942": ROCM942}), "nodes": 1, "devices_per_node": 8},
    )
    assert rocm.status_code == 201, rocm.text
    assert rocm.json()["allocations"][0]["device_name"] == "amd"
    one = api.post(
        "/v1/placements",
        json={"index": index_of({"cu128": CU128}), "nodes": 1, "devices_per_node": 1},
    )
    assert one.status_code == 201, one.text
    assert one.json()["allocations"][0]["devices"] == ["GPU-0"]


def test_what_if_answers_for_an_amd_template(sqlite_store: Store) -> None:
    heartbeat = amd_heartbeat("mi300x")
    mi300x = {"name": "mi300x", "cost": 30.0, **heartbeat}
    mi355x = {"name": "mi355x", "cost": 12.0, **amd_heartbeat("mi355x")}
    h200 = {"name": "h200", "cost": 40.0, **nvidia_heartbeat()}
    request = {"index": index_of({"rocm942": ROCM942}), "nodes": 4, "devices_per_node": 8}
    with client_for(sqlite_store) as api:
        put_agent(api, "mi300x-0", heartbeat)  # one node today: three more are needed
        answer = api.post(
            "/v1/what-if", json={"request": request, "templates": [mi300x, mi355x, h200]}
        )
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["fits_now"] is False
        assert result["options"] == [{"template": "mi300x", "nodes": 3, "variant": "rocm942"}]
        assert result["cheapest"] == "mi300x"
        assert set(result["reasons"]) == {"mi355x", "h200"}, result
        assert "no variant fits a node of it (rocm942" in result["reasons"]["mi355x"], result
        assert "no variant fits a node of it (rocm942" in result["reasons"]["h200"], result
        # the prediction holds: three such heartbeats, and the gang places on gfx942
        for i in range(1, 4):
            put_agent(api, f"mi300x-{i}", heartbeat)
        placed = api.post("/v1/placements", json=request)
        assert placed.status_code == 201, placed.text
        assert placed.json()["variant"] == "rocm942"


@pytest.mark.parametrize("host", ["mi210-navi31"])
def test_a_heterogeneous_amd_node_offers_each_gpu_for_its_own_target(
    sqlite_store: Store, host: str
) -> None:
    """An MI210 (gfx90a) beside a Navi 31 (gfx1100) on one node: a gfx1100 build takes the
    Navi 31 only, and two devices of one target are not there."""
    navi = {"amd": {"gfx_arch": ["gfx1100"]}}
    with client_for(sqlite_store) as api:
        put_agent(api, "ws", amd_heartbeat(host))
        body = {"index": index_of({"navi": navi}), "nodes": 1, "devices_per_node": 1}
        placed = api.post("/v1/placements", json=body)
        assert placed.status_code == 201, placed.text
        device = placed.json()["allocations"][0]["devices"][0]
        assert lists_of(api, "ws", "amd", device)["amd"]["gfx_arch"] == ["gfx1100"]
        two = api.post("/v1/placements", json=body | {"devices_per_node": 2})
        assert two.status_code == 409, two.text


def test_a_descriptor_namespace_places_like_any_accelerator(api: httpx.Client) -> None:
    """A FuriosaAI Warboy described by a descriptor (namespace ``furiosa``, devices by PCI
    address) beside an H200 on one node: a Warboy build takes the NPU, a CUDA build the GPU,
    and two NPUs are not there."""
    warboy = {"furiosa": {"arch": ["warboy"]}}
    body = nvidia_heartbeat(1)
    body["host"] = {**body["host"], **warboy}
    body["devices"]["furiosa"] = {"0000:01:00.0": warboy}
    put_agent(api, "edge", body)
    npu = {"index": index_of({"warboy": warboy}), "nodes": 1, "devices_per_node": 1}
    placed = api.post("/v1/placements", json=npu)
    assert placed.status_code == 201, placed.text
    assert placed.json()["allocations"][0]["device_name"] == "furiosa"
    assert placed.json()["allocations"][0]["devices"] == ["0000:01:00.0"]
    gpu = api.post(
        "/v1/placements",
        json={"index": index_of({"cu128": CU128}), "nodes": 1, "devices_per_node": 1},
    )
    assert gpu.status_code == 201, gpu.text
    assert gpu.json()["allocations"][0]["device_name"] == "cuda"
    assert api.post("/v1/placements", json=npu).status_code == 409  # its one NPU is taken
