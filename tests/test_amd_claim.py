"""``k8s claim`` for a set with ROCm and CUDA variants: the AMD GPU DRA driver's attributes
(``type``, ``deviceID``, ``productName``, ``driverVersion``), checked with kubernetes-validate
and, on every AMD GPU of the host-root fixtures, against what the ``amd`` provider reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from docker_variant.k8s.claim import claim_template, plan_claim, selectors_of
from docker_variant.providers import HostRoot
from docker_variant.providers.amd import detect, kernel_driver, parse_properties
from docker_variant.variant import VariantIndex, select
from docker_variant.variant.ordering import HostMatcher, Rejection
from docker_variant.vendors import amd
from k8s_cel_env import Device, Semver, amd_gpu, first_available_of_class, matches, nvidia_gpu

HOSTS = Path(__file__).parent / "fixtures" / "hostroot"
AMD_HOSTS = ("mi300x", "mi210-navi31", "mi355x", "mi250x")
K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")

VARIANTS: dict[str, Any] = {
    "rocm70gfx950": {"amd": {"gfx_arch": ["gfx950"], "rocm_version": ["7.0"]}},
    "rocm64gfx942": {"amd": {"gfx_arch": ["gfx942"], "rocm_version": ["6.4"]}},
    "rocm63": {"amd": {"gfx_arch": ["gfx90a", "gfx942"], "rocm_version": ["6.3"]}},
    "rocm60gfx90a": {"amd": {"gfx_arch": ["gfx90a"], "rocm_version": ["6.0"]}},
    "rocm63gfx1100": {"amd": {"gfx_arch": ["gfx1100"], "rocm_version": ["6.3"]}},
    "cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}},
    "null": {},
}


def index() -> VariantIndex:
    return VariantIndex.from_json(
        {
            "default-priorities": {"namespace": ["amd", "nvidia", "x86_64"]},
            "variants": VARIANTS,
            "images": {label: {"tag": f"1.0.0-{label}", "digest": ""} for label in VARIANTS},
        },
        "test",
    )


def document(count: int = 1) -> dict[str, Any]:
    return claim_template(plan_claim(index()), name="mixed", count=count)


def subrequests(doc: dict[str, Any]) -> list[dict[str, Any]]:
    (request,) = doc["spec"]["spec"]["devices"]["requests"]
    result: list[dict[str, Any]] = request["firstAvailable"]
    return result


def fixture_devices() -> list[tuple[str, Device, dict[str, list[str]]]]:
    """(host/node, the GPU as the DRA driver publishes it, its lists from the provider)."""
    found = []
    for host in AMD_HOSTS:
        root = HostRoot(HOSTS / host)
        driver = kernel_driver(root)
        assert driver is not None
        report = detect(root, {})
        nodes = HOSTS / host / "sys/class/kfd/kfd/topology/nodes"
        for path in sorted(nodes.iterdir(), key=lambda p: int(p.name)):
            props = parse_properties((path / "properties").read_text())
            if not props["gfx_target_version"]:
                continue
            bus = props["location_id"] >> 8
            lists = report.devices[f"{props['domain']:04x}:{bus:02x}:00.0"]["amd"]
            product = amd.device_product(props["device_id"]) or "unknown"
            found.append(
                (f"{host}/{path.name}", amd_gpu(props["device_id"], product, driver[0]), lists)
            )
    return found


def test_the_claim_validates_and_asks_each_vendor_its_class() -> None:
    for count in (1, 4):
        for partitions in (False, True):
            doc = claim_template(
                plan_claim(index(), partitions=partitions), name="mixed", count=count
            )
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
    classes = {sub["name"]: sub["deviceClassName"] for sub in subrequests(document())}
    assert classes["cu128"] == "gpu.nvidia.com"
    assert {classes[label] for label in VARIANTS if label.startswith("rocm")} == {"gpu.amd.com"}
    # the null fallback takes any device of the best subrequest's class
    assert classes["null"] == "gpu.amd.com"
    constraints = document(4)["spec"]["spec"]["devices"]["constraints"]
    assert {c["matchAttribute"] for c in constraints} == {
        "gpu.amd.com/productName",
        "gpu.nvidia.com/productName",
    }
    amd_constraint = next(c for c in constraints if c["matchAttribute"].startswith("gpu.amd"))
    assert "gpu/cu128" not in amd_constraint["requests"]
    assert "gpu/rocm64gfx942" in amd_constraint["requests"]


@pytest.mark.parametrize(("where", "device", "lists"), fixture_devices())
def test_cel_agrees_with_the_provider_on_every_fixture_gpu(
    where: str, device: Device, lists: dict[str, list[str]]
) -> None:
    variant_index = index()
    members = json.loads(document()["metadata"]["annotations"]["variant.pep817.dev/subrequests"])
    matcher = HostMatcher({"amd": lists}, variant_index.namespace_order)
    for sub in subrequests(document()):
        if sub["deviceClassName"] != "gpu.amd.com" or "selectors" not in sub:
            continue
        cel = all(matches(s["cel"]["expression"], device) for s in sub["selectors"])
        for label in members[sub["name"]]:
            provider = not isinstance(matcher.evaluate(variant_index.variants[label]), Rejection)
            assert cel == provider, (where, label, cel, provider)
    best = select(variant_index, {"amd": lists}).best
    assert best is not None
    taken = first_available_of_class(subrequests(document()), device)
    assert taken is not None and best.label in members[taken], (where, best.label, taken)


def test_expected_choices_on_the_fixture_hosts() -> None:
    taken = {
        where: first_available_of_class(subrequests(document()), device)
        for where, device, _ in fixture_devices()
    }
    assert taken["mi300x/2"] == "rocm64gfx942"
    assert taken["mi355x/2"] == "rocm70gfx950"
    assert taken["mi210-navi31/1"] == "rocm63"  # gfx90a on driver 6.10.5 (ROCm 6.3)
    assert taken["mi210-navi31/2"] == "rocm63gfx1100"
    assert taken["mi250x/1"] == "rocm63"
    # an NVIDIA GPU never takes an AMD subrequest
    subs = subrequests(document())
    assert first_available_of_class(subs, nvidia_gpu("H200", "R570")) == "cu128"


def test_a_gfx_target_with_no_known_device_fits_none() -> None:
    odd = VariantIndex.from_json(
        {
            "variants": {"g": {"amd": {"gfx_arch": ["gfx1036"]}}, "null": {}},
            "images": {"g": {"tag": "1-g", "digest": ""}, "null": {"tag": "1-null", "digest": ""}},
        },
        "odd",
    )
    plan = plan_claim(odd)
    assert "g" in plan.left_out and "gpu.amd.com" in plan.left_out["g"]


# --------------------------------------------------------------------------- device kinds


def kind(device: Device, kind_name: str, **attributes: object) -> Device:
    """``device`` as another of the driver's device types (a partition, a VFIO device)."""
    return Device(
        device.name, device.driver, {**device.attributes, "type": kind_name, **attributes}
    )


def test_amd_subrequests_take_whole_gpus_unless_partitions_are_asked_for() -> None:
    """The gpu.amd.com class admits every device of the driver: each AMD subrequest (the
    selector-free fallback too) first selects whole GPUs; never a VFIO device, whose
    0x74b5 (MI300X VF) is in gfx942's table."""
    mi300x = amd_gpu(0x74A1, "AMD_Instinct_MI300X_OAM", "6.12.12")
    partition = kind(mi300x, "amdgpu-partition", partitionProfile="cpx_nps1")
    vf = kind(amd_gpu(0x74B5, "AMD_Instinct_MI300X_OAM", "6.12.12"), "vfio", isVF=True)
    default, with_partitions = (
        subrequests(claim_template(plan_claim(index(), partitions=p), name="m", count=1))
        for p in (False, True)
    )
    assert first_available_of_class(default, mi300x) == "rocm64gfx942"
    assert first_available_of_class(default, partition) is None
    assert first_available_of_class(default, vf) is None
    assert first_available_of_class(with_partitions, partition) == "rocm64gfx942"
    assert first_available_of_class(with_partitions, vf) is None
    for sub in default:
        if sub["deviceClassName"] == "gpu.amd.com":
            first = sub["selectors"][0]["cel"]["expression"]
            assert first == amd.dra_kind_selector(False), sub["name"]
        else:  # NVIDIA's class admits whole GPUs only: nothing added
            assert not any('"type"' in s["cel"]["expression"] for s in sub.get("selectors", []))


def test_partitions_of_one_claim_are_one_kind() -> None:
    constraints = claim_template(plan_claim(index(), partitions=True), name="m", count=8)["spec"][
        "spec"
    ]["devices"]["constraints"]
    amd_attributes = {
        c["matchAttribute"] for c in constraints if "gpu.amd.com" in c["matchAttribute"]
    }
    assert amd_attributes == {"gpu.amd.com/productName", "gpu.amd.com/type"}
    default = claim_template(plan_claim(index()), name="m", count=8)
    assert "gpu.amd.com/type" not in json.dumps(default)


def test_rocm_7_releases_have_drivers() -> None:
    """ROCm 7.1 and 7.2 run on drivers 30.20 (amdgpu 6.16.6) and 30.30 (6.16.13)."""
    rocm72 = VariantIndex.from_json(
        {
            "variants": {"rocm72": {"amd": {"gfx_arch": ["gfx942"], "rocm_version": ["7.2"]}}},
            "images": {"rocm72": {"tag": "1-rocm72", "digest": ""}},
        },
        "rocm72",
    )
    plan = plan_claim(rocm72)
    assert not plan.left_out, plan.left_out
    (sub,) = plan.subrequests
    assert sub.name == "rocm72"
    for driver, fits in [
        ("6.14.14", False),  # 30.10: ROCm 7.0 at most
        ("6.16.6", True),
        ("6.16.13", True),
        ("6.19.14", True),  # newer than the table: runs what 30.30 runs
    ]:
        device = amd_gpu(0x74A1, "AMD_Instinct_MI300X_OAM", driver)
        assert all(matches(e, device) for e in sub.selectors) is fits, driver
    assert amd.rocm_releases((6, 16, 13))[:2] == ["7.2", "7.1"]


def test_the_in_tree_driver_publishes_no_driver_version() -> None:
    """A rocm_version selector fits no device there (false, not an error); a variant naming
    only gfx targets still fits."""
    device = amd_gpu(0x740F, "AMD_Instinct_MI210", "6.12.12")
    in_tree = Device(
        device.name,
        device.driver,
        {k: v for k, v in device.attributes.items() if k != "driverVersion"},
    )
    gfx_only = VariantIndex.from_json(
        {
            "variants": {
                "rocm64": {"amd": {"gfx_arch": ["gfx90a"], "rocm_version": ["6.4"]}},
                "hip": {"amd": {"gfx_arch": ["gfx90a"]}},
            },
            "images": {label: {"tag": f"1-{label}", "digest": ""} for label in ("rocm64", "hip")},
        },
        "in-tree",
    )
    subs = subrequests(claim_template(plan_claim(gfx_only), name="t", count=1))
    assert [s["name"] for s in subs] == ["rocm64", "hip"]
    assert first_available_of_class(subs, device) == "rocm64"
    assert first_available_of_class(subs, in_tree) == "hip"
    rocm = next(e for e in selectors_of(plan_claim(gfx_only)) if "driverVersion" in e)
    assert matches(rocm, in_tree) is False
    assert isinstance(device.attributes["driverVersion"], Semver)
