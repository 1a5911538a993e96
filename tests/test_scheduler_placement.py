"""Placement logic on in-memory pools: which variant, which nodes and devices, and why not.

GPUs are described by the nvidia provider's own lists for real products and drivers
(H200 = CC 9.0, A100 = 8.0, B200 = 10.0; R535 = CUDA 12.2, R570 = 12.8, R580 = 13.0).
"""

from __future__ import annotations

from typing import Any

import pytest

from docker_variant.agent.health import NVML_KIND
from docker_variant.errors import InvalidInputError
from docker_variant.k8s.claim import virtual_host
from docker_variant.planner.placement import BARE, Judge, Plan, Refusal, plan
from docker_variant.planner.pool import Pool, build_pool
from docker_variant.variant import VariantIndex, select
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
    agent_report,
    gpu_lists,
    gpu_only_index,
)


def index_of(document: dict[str, Any] | None = None) -> VariantIndex:
    return VariantIndex.from_json(document or INDEX, "test index")


def pool_of(
    agents: dict[str, dict[str, Any]], allocated: set[tuple[str, str, str]] | None = None
) -> Pool:
    return build_pool(
        [agent_report(agent_id, body) for agent_id, body in agents.items()], allocated or set()
    )


def placed(outcome: Plan | Refusal) -> Plan:
    assert isinstance(outcome, Plan), f"refused: {getattr(outcome, 'reasons', None)}"
    return outcome


def refused(outcome: Plan | Refusal) -> dict[str, str]:
    assert isinstance(outcome, Refusal), f"placed: {outcome}"
    return outcome.reasons


def nodes_of(result: Plan) -> dict[str, list[str]]:
    return {a.agent_id: [d.device_id for d in a.devices] for a in result.allocations}


def assert_every_device_fits(index: VariantIndex, pool: Pool, result: Plan) -> None:
    """Independently of the planner: each chosen device, judged on its host lists merged
    with its own, ranks the chosen variant as compatible."""
    nodes = {node.agent_id: node for node in pool.nodes}
    for allocation in result.allocations:
        node = nodes[allocation.agent_id]
        for device in allocation.devices:
            assert device.free
            merged = {**pool.profiles[node.host], **pool.profiles[device.profile]}
            ranked = {c.label for c in select(index, merged).ranked}
            assert result.candidate.label in ranked, (allocation.agent_id, device.device_id)


# --------------------------------------------------------------------------- single node


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [(H200_R570, "cu128"), (H200_R580, "cu128"), (A100_R535, "cu122"), (B200_R580, "cu130")],
)
def test_single_node_gets_the_variant_the_device_would_pull(
    gpu: tuple[tuple[int, int], tuple[int, int]], expected: str
) -> None:
    index = index_of()
    pool = pool_of({"node": agent_body(gpu, 4)})
    result = placed(plan(index, pool, 1, 2))
    assert result.candidate.label == expected
    assert result.candidate.tag == f"2.0-{expected}"
    assert nodes_of(result) == {"node": ["GPU-0", "GPU-1"]}
    assert result.homogeneous
    # the same choice as `docker variant pull` on a host with that GPU
    lists = {**X86_V4, **gpu_lists(gpu)}
    best = select(index, lists).best
    assert best is not None and best.label == expected
    assert_every_device_fits(index, pool, result)


def test_across_device_types_the_most_capable_build_wins_then_the_next() -> None:
    index = index_of()
    agents = {
        "a100": agent_body(A100_R535),
        "h200": agent_body(H200_R570),
        "b200": agent_body(B200_R580),
    }
    pool = pool_of(agents)
    first = placed(plan(index, pool, 1, 4))
    assert (first.candidate.label, list(nodes_of(first))) == ("cu130", ["b200"])
    busy = {("b200", "cuda", f"GPU-{i}") for i in range(4)}
    second = placed(plan(index, pool_of(agents, busy), 1, 4))
    assert (second.candidate.label, list(nodes_of(second))) == ("cu128", ["h200"])
    busy |= {("h200", "cuda", f"GPU-{i}") for i in range(4)}
    third = placed(plan(index, pool_of(agents, busy), 1, 4))
    assert (third.candidate.label, list(nodes_of(third))) == ("cu122", ["a100"])


def test_device_lists_override_the_host_lists_for_that_device() -> None:
    # The host claims a Blackwell; the device itself says Hopper: it is judged as a Hopper.
    host = {**X86_V4, **gpu_lists(B200_R580)}
    pool = pool_of({"node": agent_body(H200_R570, 2, host=host)})
    result = placed(plan(index_of(gpu_only_index()), pool, 1, 2))
    assert result.candidate.label == "cu128"


def test_cpu_only_placement_judges_the_host_lists_and_takes_no_device() -> None:
    index = index_of()
    agents = {
        "old-cpu": agent_body(None, host={"x86_64": {"level": ["v2", "v1"]}}),
        "gpu-box": agent_body(H200_R570, 8, host=X86_V3),
        "cpu-box": agent_body(None, host=X86_V3),
    }
    result = placed(plan(index, pool_of(agents), 1, 0))
    # the host lists know no nvidia namespace: the CPU build; the node without free devices
    # is the best fit, keeping the GPU box for GPU work
    assert result.candidate.label == "v3"
    assert nodes_of(result) == {"cpu-box": []}
    two = placed(plan(index, pool_of(agents), 2, 0))
    assert two.candidate.label == "v3" and set(nodes_of(two)) == {"cpu-box", "gpu-box"}
    three = placed(plan(index, pool_of(agents), 3, 0))
    assert three.candidate.label == "null" and not three.homogeneous


def test_null_and_bare_are_the_last_resort() -> None:
    npu = {"resource_group": "default", "host": {}, "devices": {"npu": {"0": {}, "1": {}}}}
    index = index_of()
    chosen = plan(index, pool_of({"n": npu}), 1, 2, device_name="npu")
    assert placed(chosen).candidate.label == "null"
    no_null = {**INDEX, "variants": dict(INDEX["variants"]), "images": dict(INDEX["images"])}
    del no_null["variants"]["null"], no_null["images"]["null"]
    result = placed(plan(index_of(no_null), pool_of({"n": npu}), 1, 2, device_name="npu"))
    assert result.candidate.label is None and result.candidate.kind == "bare"
    assert result.candidate.tag == "2.0"


def test_a_device_kind_is_never_guessed() -> None:
    """Devices follow the accelerator namespace of the chosen variant; when it names none
    (a CPU build, ``null``, the bare image), the request must say which devices to take."""
    npu = {"resource_group": "default", "host": {}, "devices": {"npu": {"0": {}, "1": {}}}}
    no_null = {**INDEX, "variants": dict(INDEX["variants"]), "images": dict(INDEX["images"])}
    del no_null["variants"]["null"], no_null["images"]["null"]
    for index, chosen in ((index_of(), "variant 'null'"), (index_of(no_null), "bare image")):
        with pytest.raises(InvalidInputError, match=rf"^device_name: the {chosen} names no"):
            plan(index, pool_of({"n": npu}), 1, 2)
    agents = {"h200": agent_body(H200_R570), "a100": agent_body(A100_R535)}
    for body in agents.values():  # as agents report NVIDIA GPUs
        body["devices"] = {NVML_KIND: body["devices"].pop("cuda")}
    with pytest.raises(InvalidInputError, match="'v3' names no accelerator namespace") as hint:
        plan(index_of(), pool_of(agents), 2, 4)  # only the CPU build fits both
    # the hint offers the device name the agents report, and following it places
    assert f'device name the agents report: "{NVML_KIND}")' in str(hint.value)
    assert "nvidia.com" not in str(hint.value)
    assert placed(plan(index_of(), pool_of(agents), 2, 4, device_name=NVML_KIND))
    assert placed(plan(index_of(), pool_of(agents), 2, 0)).candidate.label == "v3"


def test_a_gang_takes_devices_of_one_name() -> None:
    """Two nodes report H200s under different device names: the best plan over every name
    would mix them, so each name is planned alone, and a gang of two is refused until one
    name has two nodes."""
    other = agent_body(H200_R570)
    other["devices"] = {"gpu": other["devices"]["cuda"]}
    agents = {"a": agent_body(H200_R570), "b": other}
    reasons = refused(plan(index_of(), pool_of(agents), 2, 4))
    assert reasons["cu128"].startswith("the gang would take devices of several kinds (cuda, gpu)")
    assert "device_name 'gpu': needs 2 nodes" in reasons["cu128"]
    agents["c"] = other
    result = placed(plan(index_of(), pool_of(agents), 2, 4))
    assert result.candidate.label == "cu128"
    assert {a.device_name for a in result.allocations} == {"gpu"}
    assert set(nodes_of(result)) == {"b", "c"}


def test_device_name_restricts_the_devices_taken() -> None:
    body = agent_body(H200_R570, 2)
    body["devices"]["npu"] = {"npu0": {}, "npu1": {}, "npu2": {}}
    pool = pool_of({"node": body})
    index = index_of()
    result = placed(plan(index, pool, 1, 2, device_name="npu"))
    assert result.candidate.label == "v3"  # the NPUs' host lists fit the CPU build
    assert result.allocations[0].device_name == "npu"
    reasons = refused(plan(index, pool, 1, 1, device_name="tpu"))
    assert reasons["cu128"].endswith("node: no tpu devices")


# --------------------------------------------------------------------------- gangs


def test_gang_uses_one_variant_on_identical_devices() -> None:
    index = index_of()
    agents = {f"h200-{i}": agent_body(H200_R570) for i in range(3)}
    agents |= {f"a100-{i}": agent_body(A100_R535) for i in range(3)}
    pool = pool_of(agents)
    result = placed(plan(index, pool, 3, 4))
    assert result.candidate.label == "cu128" and result.homogeneous
    assert set(nodes_of(result)) == {"h200-0", "h200-1", "h200-2"}
    assert all(len(a.devices) == 4 for a in result.allocations)
    assert_every_device_fits(index, pool, result)


def test_homogeneous_set_is_preferred_to_a_mixed_one_with_a_newer_build() -> None:
    # cu128 fits H200 and B200 (mixed), cu122 fits two identical A100 nodes: identical wins
    agents = {
        "h200": agent_body(H200_R570),
        "b200": agent_body(B200_R580),
        "a100-0": agent_body(A100_R535),
        "a100-1": agent_body(A100_R535),
    }
    result = placed(plan(index_of(), pool_of(agents), 2, 4))
    assert (result.candidate.label, result.homogeneous) == ("cu122", True)
    assert set(nodes_of(result)) == {"a100-0", "a100-1"}


def test_mixed_only_when_no_homogeneous_set_exists() -> None:
    # the same GPU on two driver branches: different lists, so no two nodes are identical
    agents = {"r570": agent_body(H200_R570), "r580": agent_body(H200_R580)}
    pool = pool_of(agents)
    index = index_of()
    result = placed(plan(index, pool, 2, 4))
    assert (result.candidate.label, result.homogeneous) == ("cu128", False)
    assert set(nodes_of(result)) == {"r570", "r580"}
    assert_every_device_fits(index, pool, result)


def test_mixed_gang_picks_the_variant_closest_to_every_devices_own_choice() -> None:
    # H200 ranks cu128 first; B200 ranks cu130 first and cu128 second; A100 fits cu122 only.
    # H200 + B200: cu128 (worst rank 2) beats v3 (worst rank 3 on H200, 3 on B200).
    index = index_of()
    agents = {"h200": agent_body(H200_R570), "b200": agent_body(B200_R580)}
    result = placed(plan(index, pool_of(agents), 2, 4))
    assert (result.candidate.label, result.homogeneous) == ("cu128", False)
    # adding the A100: only the CPU build fits all three
    agents["a100"] = agent_body(A100_R535)
    assert placed(plan(index, pool_of(agents), 3, 4, device_name="cuda")).candidate.label == "v3"
    # without a build that fits everything, the gang is refused
    reasons = refused(plan(index_of(gpu_only_index()), pool_of(agents), 3, 4))
    assert set(reasons) == {"cu130", "cu128", "cu126", "cu122"}


def test_within_a_node_devices_of_one_kind_are_preferred() -> None:
    body = agent_body(H200_R570, 2)
    body["devices"]["cuda"] |= {f"L4-{i}": gpu_lists(L4_R535) for i in range(3)}
    index = index_of()
    pool = pool_of({"node": body})
    result = placed(plan(index, pool, 1, 2))
    assert (result.candidate.label, nodes_of(result)) == ("cu128", {"node": ["GPU-0", "GPU-1"]})
    three = placed(plan(index, pool, 1, 3))
    assert (three.candidate.label, nodes_of(three)) == ("cu122", {"node": ["L4-0", "L4-1", "L4-2"]})
    four = placed(plan(index, pool, 1, 4, device_name="cuda"))  # the CPU build fits both kinds
    assert (four.candidate.label, four.homogeneous) == ("v3", False)
    assert_every_device_fits(index, pool, four)


def test_nodes_are_packed_best_fit_first() -> None:
    agents = {"empty": agent_body(H200_R570, 8), "half": agent_body(H200_R570, 8)}
    busy = {("half", "cuda", f"GPU-{i}") for i in range(4)}
    result = placed(plan(index_of(), pool_of(agents, busy), 1, 2))
    assert nodes_of(result) == {"half": ["GPU-4", "GPU-5"]}


def test_allocated_devices_are_never_chosen() -> None:
    agents = {"a": agent_body(H200_R570, 4)}
    busy = {("a", "cuda", "GPU-0"), ("a", "cuda", "GPU-2")}
    result = placed(plan(index_of(), pool_of(agents, busy), 1, 2))
    assert nodes_of(result) == {"a": ["GPU-1", "GPU-3"]}
    assert refused(plan(index_of(), pool_of(agents, busy), 1, 3))


def test_devices_named_by_pci_address_go_in_address_order() -> None:
    """PCI addresses are hex: bus 0x03 before 0x0c before 0x83 (a natural sort read the
    0 of "0c" as a number and put it first)."""
    body = agent_body(H200_R570, 4)
    lists = next(iter(body["devices"]["cuda"].values()))
    addresses = ["0000:0c:00.0", "0000:83:00.0", "0000:03:00.0", "0000:C3:00.0"]
    body["devices"] = {"cuda": dict.fromkeys(addresses, lists)}
    result = placed(plan(index_of(), pool_of({"a": body}), 1, 3))
    assert nodes_of(result) == {"a": ["0000:03:00.0", "0000:0c:00.0", "0000:83:00.0"]}


# --------------------------------------------------------------------------- refusals


def test_refusal_explains_each_variant() -> None:
    document = gpu_only_index()
    del document["variants"]["cu128"], document["images"]["cu128"]  # the one both would fit
    agents = {"agent-a": agent_body(B200_R580), "agent-b": agent_body(H200_R570)}
    reasons = refused(plan(index_of(document), pool_of(agents), 2, 4))
    assert set(reasons) == {"cu130", "cu126", "cu122"}
    assert reasons["cu130"] == (
        "needs 2 nodes with 4 free devices fitting it; 1 node has them (agent-a); "
        "agent-b: nvidia :: cuda_version_lower_bound needs one of 13.0; this device supports "
        "12.8, 12.7, 12.6, 12.5, 12.4, 12.3, ... (32 values)"
    )
    assert reasons["cu126"] == (
        "needs 2 nodes with 4 free devices fitting it; 1 node has them (agent-b); "
        "agent-a: nvidia :: sm_arch needs one of 80_real, 90_real; this device supports "
        "100_real, 100_virtual"
    )
    assert reasons["cu122"].startswith("needs 2 nodes with 4 free devices fitting it; no node")


def test_refusal_counts_free_devices() -> None:
    agents = {"a": agent_body(H200_R570, 4), "b": agent_body(H200_R570, 2)}
    busy = {("a", "cuda", "GPU-0")}
    reasons = refused(plan(index_of(gpu_only_index()), pool_of(agents, busy), 1, 4))
    assert reasons["cu128"] == (
        "needs 1 node with 4 free devices fitting it; no node has them; "
        "b: only 2 devices fit it; a: only 3 of its 4 fitting devices are free"
    )


def test_refusal_lists_agents_left_out_and_an_empty_pool() -> None:
    pool = Pool([], {}, {"gone": "no heartbeat for 90 s (agent TTL 60 s)"}, "")
    reasons = refused(plan(index_of(gpu_only_index()), pool, 1, 1))
    assert reasons["cu128"] == (
        "needs 1 node with 1 free device fitting it; no node has them; "
        "gone: no heartbeat for 90 s (agent TTL 60 s)"
    )
    empty = Pool([], {}, {}, " in resource group 'gpu'")
    reasons = refused(plan(index_of(), empty, 1, 1))
    assert reasons[BARE] == (
        "needs 1 node with 1 free device fitting it; there are no agents in resource group 'gpu'"
    )


def test_refusal_groups_many_agents() -> None:
    agents = {f"a100-{i:02d}": agent_body(A100_R535) for i in range(20)}
    reasons = refused(plan(index_of(gpu_only_index()), pool_of(agents), 21, 1))
    assert reasons["cu122"] == (
        "needs 21 nodes with 1 free device fitting it; "
        "20 nodes have them (a100-00, a100-01, a100-02 and 17 more)"
    )
    assert reasons["cu128"].startswith(
        "needs 21 nodes with 1 free device fitting it; no node has them; "
        "a100-00, a100-01, a100-02 and 17 more: nvidia :: cuda_version_lower_bound needs one "
        "of 12.8"
    )


def test_invalid_images_are_reported_with_the_refusal() -> None:
    document = {**gpu_only_index(), "invalid": [{"tag": "2.0-bad", "error": "bad label"}]}
    reasons = refused(plan(index_of(document), pool_of({}), 1, 1))
    assert reasons["2.0-bad"] == "invalid image: bad label"


# --------------------------------------------------------------------------- classes


def test_identical_devices_are_compiled_once() -> None:
    agents = {f"h{i}": agent_body(H200_R570, 8) for i in range(50)}
    agents |= {f"a{i}": agent_body(A100_R535, 8) for i in range(50)}
    pool = pool_of(agents)
    judge = Judge(index_of(), pool.profiles)
    for node in pool.nodes:
        for device in node.devices["cuda"]:
            judge.classify(node.host, device.profile)
    assert len(judge.classes) == 2


def test_ties_between_device_types_follow_the_k8s_claim_order() -> None:
    # one free node each of B200, H200 and A100: each would run its own first choice; the
    # tie goes to the order `docker-variant k8s claim` gives its subrequests
    index = index_of(gpu_only_index())
    order = [c.label for c in select(index, virtual_host(index)).ranked]
    assert order == ["cu130", "cu128", "cu126", "cu122"]
    agents = {"a": agent_body(A100_R535), "h": agent_body(H200_R570), "b": agent_body(B200_R580)}
    assert placed(plan(index, pool_of(agents), 1, 1)).candidate.label == "cu130"
