"""``k8s claim`` for a set with ROCm and CUDA variants: the AMD GPU DRA driver's attributes
(``deviceID``, ``productName``, ``driverVersion``), checked with kubernetes-validate and, on
every AMD GPU of the host-root fixtures, against what the ``amd`` provider reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from docker_variant.k8s.claim import claim_template, plan_claim
from docker_variant.providers import HostRoot
from docker_variant.providers.amd import detect, kernel_driver, parse_properties
from docker_variant.variant import VariantIndex, select
from docker_variant.variant.ordering import HostMatcher, Rejection
from docker_variant.vendors import amd
from k8s_cel_env import Device, amd_gpu, first_available_of_class, matches, nvidia_gpu

HOSTS = Path(__file__).parent / "fixtures" / "hostroot"
AMD_HOSTS = ("mi300x", "mi210-navi31", "mi355x", "mi250x")
K8S_VERSION = "1.35"

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
        doc = document(count)
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
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
