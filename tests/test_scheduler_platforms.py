"""Platforms in the scheduler (docs/reference/image-index.md): a node runs only images for its platform,
reported in the heartbeat or implied by its host lists' CPU namespace (``x86_64``: amd64,
``aarch64``: arm64), and a refusal says why."""

from __future__ import annotations

from typing import Any

import pytest

from docker_variant.errors import InvalidInputError
from docker_variant.planner.placement import Plan, Refusal, plan
from docker_variant.planner.pool import build_pool
from docker_variant.scheduler import Store
from docker_variant.scheduler.documents import parse_agent_report
from docker_variant.variant import VariantIndex
from test_scheduler_api import client_for, put_agent, store
from test_scheduler_support import H200_R570, X86_V4, agent_body, agent_report

__all__ = ["store"]  # the fixture, used by name

GRACE = {"aarch64": {"version": ["9.0a", "8a"]}}
CU128 = {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}}

#: The same CUDA build for both platforms (GH200 and H200), and an amd64-only CPU build.
INDEX: dict[str, Any] = {
    "variants": {"cu128": CU128, "cpu": {"x86_64": {"level": ["v1"]}}},
    "images": {
        "cu128": {
            "tag": "1.0-cu128",
            "digest": "sha256:" + "a" * 64,
            "platforms": {"linux/amd64": "sha256:" + "a" * 64, "linux/arm64": "sha256:" + "b" * 64},
        },
        "cpu": {
            "tag": "1.0-cpu",
            "digest": "sha256:" + "c" * 64,
            "platforms": {"linux/amd64": "sha256:" + "c" * 64},
        },
    },
}


def _index(document: dict[str, Any]) -> VariantIndex:
    return VariantIndex.from_json(document, "test index")


def _gh200(platform: str | None = "linux/arm64") -> dict[str, Any]:
    body = agent_body(H200_R570, 4, host=GRACE)
    if platform is not None:
        body["platform"] = platform
    return body


def test_arm64_nodes_get_the_arm64_manifest() -> None:
    pool = build_pool([agent_report("gh200-a", _gh200()), agent_report("gh200-b", _gh200(None))])
    result = plan(_index(INDEX), pool, 2, 4)
    assert isinstance(result, Plan), getattr(result, "reasons", None)
    assert result.candidate.label == "cu128"
    assert result.candidate.digest == "sha256:" + "b" * 64  # the arm64 manifest
    assert {a.agent_id for a in result.allocations} == {"gh200-a", "gh200-b"}


def test_no_gang_on_nodes_without_an_image_for_their_platform() -> None:
    amd_only = {**INDEX, "images": {**INDEX["images"]}}
    amd_only["images"]["cu128"] = {
        "tag": "1.0-cu128",
        "digest": "sha256:" + "a" * 64,
        "platforms": {"linux/amd64": "sha256:" + "a" * 64},
    }
    pool = build_pool(
        [
            agent_report("gh200-a", _gh200()),
            agent_report("gh200-b", _gh200(None)),  # arm64 from its aarch64 lists
            agent_report("h200-a", agent_body(H200_R570, 4, host=X86_V4)),
        ]
    )
    result = plan(_index(amd_only), pool, 2, 4)
    assert isinstance(result, Refusal)
    assert "no linux/arm64 image" in result.reasons["cu128"]
    assert "gh200-a" in result.reasons["cu128"] and "gh200-b" in result.reasons["cu128"]
    # one node: the amd64 H200 takes it
    single = plan(_index(amd_only), pool, 1, 4)
    assert isinstance(single, Plan)
    assert [a.agent_id for a in single.allocations] == ["h200-a"]


def test_heartbeat_platform_is_checked() -> None:
    report = parse_agent_report(_gh200("linux/aarch64"), "gh200-a")
    assert report.platform == "linux/arm64"  # normalised as Docker spells it
    with pytest.raises(InvalidInputError, match="platform"):
        parse_agent_report(_gh200("arm64"), "gh200-a")


def test_platform_over_http_on_sqlite_and_postgresql(store: Store) -> None:
    with client_for(store) as api:
        put_agent(api, "gh200-a", _gh200())
        put_agent(api, "h200-a", agent_body(H200_R570, 4, host=X86_V4))
        agents = {a["agent_id"]: a for a in api.get("/v1/agents").json()["agents"]}
        assert agents["gh200-a"]["platform"] == "linux/arm64"
        assert agents["h200-a"]["platform"] is None  # not reported: its lists say amd64
        answer = api.post(
            "/v1/placements", json={"index": INDEX, "nodes": 2, "devices_per_node": 4}
        )
        assert answer.status_code == 201, answer.text  # cu128 exists for both platforms
        assert answer.json()["variant"] == "cu128"
        assert answer.json()["platform"] is None  # a mixed gang: each node its own manifest
        api.delete(f"/v1/placements/{answer.json()['id']}")
        only_arm = api.post(
            "/v1/placements",
            json={"index": INDEX, "nodes": 1, "devices_per_node": 0, "resource_group": "default"},
        )
        assert only_arm.status_code == 201, only_arm.text
        # a bad platform in a heartbeat is a 400 naming it
        bad = api.put("/v1/agents/x", json=_gh200("linux"))
        assert bad.status_code == 400 and "'linux'" in bad.text
