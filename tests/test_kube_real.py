"""The Kubernetes path on a real v1.37.2 control plane (devtools/kubecluster.py): every object
the ``k8s`` commands print is created with ``fieldValidation=Strict``, pods using the
generated claims are bound by the real kube-scheduler, and their claims are allocated by the
real DRA allocator, on nodes and ResourceSlices shaped as the NVIDIA and AMD DRA drivers
publish them (tests/fixtures/k8s/).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

import kubecluster
import kubeplane
from kubeplane import (
    ApiError,
    allocation,
    device_of,
    load_nodes,
    namespace_of,
    pod,
    product_of,
    results,
    unschedulable,
    variant_of,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
PYTORCH = EXAMPLES / "pytorch-2.12.0.json"
KUBECTL = REPO / ".cache" / "k8s-tools" / "kubectl"

pytestmark = pytest.mark.kube


# --- the control plane itself -------------------------------------------------------------


def test_kube_up_serves_v1_37_2_and_kube_down_stops_it(tmp_path: Path) -> None:
    """``scripts/kube-up DIR`` prints a kubeconfig on which kubectl meets v1.37.2;
    ``scripts/kube-down DIR`` stops every component by its pid."""
    if not KUBECTL.is_file():
        pytest.skip("kubectl comes from scripts/k8s-tools (run by scripts/setup)")
    root = tmp_path / "cluster"
    up = subprocess.run(
        ["bash", str(REPO / "scripts" / "kube-up"), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert up.returncode == 0, up.stderr
    kubeconfig = Path(up.stdout.strip())
    pids = [int((root / f"{name}.pid").read_text()) for name in kubecluster.COMPONENTS]
    try:
        assert kubeconfig == (root / "kubeconfig").resolve()
        version = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(kubeconfig), "version", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert version.returncode == 0, version.stderr
        assert json.loads(version.stdout)["serverVersion"]["gitVersion"] == "v1.37.2"
        served = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(kubeconfig), "api-versions"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        assert "resource.k8s.io/v1" in served
        assert "scheduling.k8s.io/v1beta1" in served
    finally:
        down = subprocess.run(
            ["bash", str(REPO / "scripts" / "kube-down"), str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_kube_up_refuses_a_used_directory(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    up = subprocess.run(
        ["bash", str(REPO / "scripts" / "kube-up"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 1
    assert "not empty" in up.stderr


# --- what the apiserver accepts and refuses -----------------------------------------------


def test_every_generated_claim_is_accepted_strictly(kube_api: httpx.Client) -> None:
    ns = namespace_of(kube_api)
    for count in ("1", "4"):
        for template in kubeplane.printed(
            "k8s", "claim", "--index", str(PYTORCH), "--count", count
        ):
            template["metadata"]["name"] += f"-{count}"
            created = kubeplane.create(kube_api, template, ns)
            assert created["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]


def _broken(template: dict[str, Any], how: str) -> dict[str, Any]:
    broken = json.loads(json.dumps(template))
    broken["metadata"]["name"] = f"broken-{how}"
    devices = broken["spec"]["spec"]["devices"]
    subrequests = devices["requests"][0]["firstAvailable"]
    if how == "duplicate-subrequests":
        subrequests[1]["name"] = subrequests[0]["name"]
    elif how == "unknown-constraint-request":
        devices["constraints"] = [
            {"requests": ["gpu/nope"], "matchAttribute": "gpu.nvidia.com/productName"}
        ]
    elif how == "unparsable-cel":
        subrequests[0]["selectors"][0]["cel"]["expression"] = (
            'device.attributes["gpu.nvidia.com"].('
        )
    elif how == "device-class-not-dns":
        subrequests[0]["deviceClassName"] = "Not_A_DNS"
    elif how == "unknown-field":
        subrequests[0]["colour"] = "green"
    return broken


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("duplicate-subrequests", "Duplicate value"),
        ("unknown-constraint-request", "gpu/nope"),
        ("unparsable-cel", "compilation failed"),
        ("device-class-not-dns", "Not_A_DNS"),
        ("unknown-field", "colour"),
    ],
)
def test_the_real_apiserver_refuses_broken_claims(
    kube_api: httpx.Client, how: str, said: str
) -> None:
    """What kubernetes-validate let through (issue: a claim broken on purpose) the apiserver
    refuses, so the real control plane is the proof of every object we print."""
    (template,) = kubeplane.printed("k8s", "claim", "--index", str(PYTORCH), "--count", "2")
    with pytest.raises(ApiError) as refused:
        kubeplane.create(kube_api, _broken(template, how), namespace_of(kube_api))
    assert refused.value.status in (400, 422)
    assert said in refused.value.message


# --- the real allocator gives the right devices ---------------------------------------------


def _template(*args: str) -> dict[str, Any]:
    (template,) = kubeplane.printed("k8s", "claim", *args)
    return template


def test_pytorch_claim_gives_h100_cu128_and_a100_cu126(kube_api: httpx.Client) -> None:
    """The pytorch example's claim on an H100 node (CUDA 12.8 driver) and an A100 node (12.6):
    the real allocator takes subrequest cu128 on the first, cu126 on the second, and each
    claim carries the subrequest -> variant mapping from the template's spec.metadata."""
    load_nodes(kube_api, "h100-cuda128", "a100-cuda126")
    ns = namespace_of(kube_api)
    template = _template("--index", str(PYTORCH), "--count", "1")
    kubeplane.create(kube_api, template, ns)
    name = template["metadata"]["name"]
    kubeplane.create(kube_api, pod("on-h100", name, "h100-cuda128"), ns)
    kubeplane.create(kube_api, pod("on-a100", name, "a100-cuda126"), ns)
    expected = {
        "on-h100": ("h100-cuda128", "cu128", "H100"),
        "on-a100": ("a100-cuda126", "cu126", "A100"),
    }
    for pod_name, (node, variant, product) in expected.items():
        bound, claim = allocation(kube_api, pod_name)
        assert bound == node
        (result,) = results(claim)
        assert result["request"] == f"gpu/{variant}"
        assert result["pool"] == node
        assert product in product_of(kube_api, result)
        assert variant_of(claim, variant) == variant


def test_the_next_subrequest_when_the_better_device_is_taken(kube_api: httpx.Client) -> None:
    """On the H200 + L4 node the first pod gets the H200 (cu128); the second, the H200 taken,
    falls back to cu126 on the L4: firstAvailable in order, on the real allocator."""
    load_nodes(kube_api, "h200-l4")
    ns = namespace_of(kube_api)
    template = _template("--index", str(PYTORCH), "--count", "1")
    kubeplane.create(kube_api, template, ns)
    name = template["metadata"]["name"]
    kubeplane.create(kube_api, pod("first", name), ns)
    _, claim = allocation(kube_api, "first")
    (result,) = results(claim)
    assert result["request"] == "gpu/cu128"
    assert "H200" in product_of(kube_api, result)
    kubeplane.create(kube_api, pod("second", name), ns)
    _, claim = allocation(kube_api, "second")
    (result,) = results(claim)
    assert result["request"] == "gpu/cu126"
    assert "L4" in product_of(kube_api, result)
    assert variant_of(claim, "cu126") == "cu126"
    kubeplane.create(kube_api, pod("third", name), ns)
    assert "cannot allocate all claims" in unschedulable(kube_api, "third")


ROCM_APP = EXAMPLES / "rocm-app-1.0.0.json"


def test_amd_partitions_and_vfs_are_not_taken_by_default(kube_api: httpx.Client) -> None:
    """A CPX-partitioned MI300X and an MI300X VF offer gfx942 devices, but not whole GPUs:
    by default the claim waits; with --amd-partitions it takes partitions, never a VF."""
    load_nodes(kube_api, "mi300x-cpx", "mi300x-vf")
    ns = namespace_of(kube_api)
    whole = _template("--index", str(ROCM_APP), "--count", "1", "--name", "whole")
    kubeplane.create(kube_api, whole, ns)
    kubeplane.create(kube_api, pod("whole-cpx", "whole", "mi300x-cpx"), ns)
    kubeplane.create(kube_api, pod("whole-vf", "whole", "mi300x-vf"), ns)
    assert "cannot allocate all claims" in unschedulable(kube_api, "whole-cpx")
    assert "cannot allocate all claims" in unschedulable(kube_api, "whole-vf")
    parts = _template(
        "--index", str(ROCM_APP), "--count", "1", "--name", "parts", "--amd-partitions"
    )
    kubeplane.create(kube_api, parts, ns)
    kubeplane.create(kube_api, pod("parts-cpx", "parts", "mi300x-cpx"), ns)
    kubeplane.create(kube_api, pod("parts-vf", "parts", "mi300x-vf"), ns)
    node, claim = allocation(kube_api, "parts-cpx")
    (result,) = results(claim)
    assert node == "mi300x-cpx"
    assert device_of(kube_api, result)["attributes"]["type"]["string"] == "amdgpu-partition"
    assert "cannot allocate all claims" in unschedulable(kube_api, "parts-vf")


def test_amd_whole_gpus_by_rocm_release_and_the_in_tree_driver(kube_api: httpx.Client) -> None:
    """Whole MI300X on a ROCm 7.2 driver take rocm72; an MI210 on a 6.12 driver rocm64; an
    MI210 on the in-tree amdgpu driver publishes no driverVersion, so no rocm_version
    selector holds there and the gfx-only variant (hip) is what it gets."""
    load_nodes(kube_api, "mi300x", "mi210", "amd-intree")
    ns = namespace_of(kube_api)
    template = _template("--index", str(ROCM_APP), "--count", "1")
    kubeplane.create(kube_api, template, ns)
    name = template["metadata"]["name"]
    expected = {"mi300x": "rocm72", "mi210": "rocm64", "amd-intree": "hip"}
    for node in expected:
        kubeplane.create(kube_api, pod(f"on-{node}", name, node), ns)
    for node, variant in expected.items():
        bound, claim = allocation(kube_api, f"on-{node}")
        (result,) = results(claim)
        assert (bound, result["request"]) == (node, f"gpu/{variant}")
        assert device_of(kube_api, result)["attributes"]["type"]["string"] == "amdgpu"


# --- every CEL selector the CLI can emit, through the real DRA CEL compiler ----------------


def _selector_indexes() -> list[dict[str, Any]]:
    """One small index per property the CLI maps to a selector, and per worst case: each
    feature with 8 values (the most a selector ORs), and all features at once."""
    from docker_variant.vendors import amd, nvidia

    lower = nvidia.cuda_lower_bounds((15, 20))
    upper = nvidia.cuda_upper_bounds((11, 0))
    sm = [v for major in range(3, 13) for v in nvidia.sm_arch_values((major, 9))]
    gfx = list(dict.fromkeys(device.gfx for device in amd.DEVICES))
    rocm = list(dict.fromkeys(r for releases in amd.ROCM_SUPPORT.values() for r in releases))
    properties: list[dict[str, dict[str, list[str]]]] = []
    for feature, values in (
        ("cuda_version_lower_bound", lower),
        ("cuda_version_upper_bound", upper),
        ("sm_arch", sm),
    ):
        properties += [{"nvidia": {feature: [value]}} for value in values]
    # only a multi-value feature ORs several values in one selector
    assert nvidia.RULES.multi_value == {"sm_arch"}
    properties.append({"nvidia": {"sm_arch": sm[:8]}})
    properties.append(
        {
            "nvidia": {
                "cuda_version_lower_bound": lower[-1:],
                "sm_arch": sm[:8],
                "cuda_version_upper_bound": upper[-1:],
            }
        }
    )
    for feature, values in (("gfx_arch", gfx), ("rocm_version", rocm)):
        properties += [{"amd": {feature: [value]}} for value in values]
        if feature in amd.RULES.multi_value:
            properties.append({"amd": {feature: values[:8]}})
    many = {
        f: (v[:8] if f in amd.RULES.multi_value else v[:1])
        for f, v in (("gfx_arch", gfx), ("rocm_version", rocm))
    }
    properties.append({"amd": many})
    return [
        {
            "default-priorities": {"namespace": list(props)},
            "variants": {"v": props, "null": {}},
            "images": {"v": {"tag": "1-v", "digest": ""}, "null": {"tag": "1-null", "digest": ""}},
            "bare": None,
            "invalid": [],
        }
        for props in properties
    ]


def test_every_selector_compiles_within_the_cost_limit() -> None:
    """Each expression ``k8s claim`` can write goes through k8s.io/dynamic-resource-allocation's
    compiler, as the apiserver does, and its worst-case cost stays under the API's limit."""
    from docker_variant.k8s.claim import cli_selectors
    from docker_variant.variant import VariantIndex

    expressions: dict[str, None] = {}
    for document in _selector_indexes():
        expressions.update(dict.fromkeys(cli_selectors(VariantIndex.from_json(document, "test"))))
    assert len(expressions) > 300
    broken = 'device.attributes["gpu.nvidia.com"].cudaDriverVersion.compareTo('
    checked = subprocess.run(
        [str(kubecluster.build()), "cel-check"],
        input=json.dumps([*expressions, broken]),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    verdicts = {v["expression"]: v for v in json.loads(checked.stdout)}
    assert verdicts.pop(broken)["error"], "the real compiler must refuse a broken expression"
    failed = {e: v["error"] for e, v in verdicts.items() if v.get("error")}
    assert not failed
    costly = {e: v["max_cost"] for e, v in verdicts.items() if v["max_cost"] > v["cost_limit"]}
    assert not costly
    assert len(verdicts) == len(expressions)


def test_a_pod_learns_its_variant_as_the_docs_say(
    kube: Any, kube_api: httpx.Client, tmp_path: Path
) -> None:
    """The commands of "Which variant a pod got", run verbatim with kubectl against the real
    control plane, name the image tag of the variant the pod's devices were allocated for."""
    if not KUBECTL.is_file():
        pytest.skip("kubectl comes from scripts/k8s-tools (run by scripts/setup)")
    load_nodes(kube_api, "mi300x")
    ns = namespace_of(kube_api)
    rocm_app = EXAMPLES / "rocm-app-1.0.0.json"
    (template,) = kubeplane.printed("k8s", "claim", "--index", str(rocm_app), "--count", "1")
    kubeplane.create(kube_api, template, ns)
    kubeplane.create(kube_api, pod("app", template["metadata"]["name"]), ns)
    allocation(kube_api, "app")
    config = json.loads(kube.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = ns
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(KUBECTL)
    commands = kubeplane.sh_block("### Which variant a pod got")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "POD": "app",
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        },
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpu/rocm72"
    assert json.loads(lines[1])["rocm72"] == ["1.0.0-rocm72"]
    assert lines[2] == "1.0.0-rocm72"
