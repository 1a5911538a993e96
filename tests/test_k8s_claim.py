"""`docker-variant k8s claim`: the DRA ResourceClaimTemplate (docs/reference/kubernetes.md).

Every template is checked by the schema of every Kubernetes release the claim supports,
1.34 to 1.37 (strict: unknown fields are errors), and every CEL selector is compiled by cel-python and evaluated, with Kubernetes' semver
semantics (tests/k8s_cel_env.py), against devices as the NVIDIA DRA driver publishes them.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, major_minor

from docker_variant.cli import main
from docker_variant.cli.k8s import claim_name_hint
from docker_variant.cli.select import Target
from docker_variant.errors import InvalidInputError
from docker_variant.k8s import claim as claim_module
from docker_variant.k8s.cel import feature_selector
from docker_variant.k8s.claim import (
    claim_template,
    cli_selectors,
    dns_label,
    dns_subdomain,
    plan_claim,
    selectors_of,
)
from docker_variant.k8s.yamltext import dump_yaml
from docker_variant.providers.nvidia import nvidia_features
from docker_variant.variant import VariantIndex, select
from docker_variant.variant.virtual import newest_first, virtual_host
from k8s_cel_env import (
    DRIVERS,
    PRODUCTS,
    Device,
    Semver,
    compile_selector,
    first_available,
    matches,
    nvidia_gpu,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PYTORCH = EXAMPLES / "pytorch-2.12.0.json"
# resource.k8s.io/v1 is served from 1.34; kubernetes-validate 1.37.0 has schemas to 1.37.
K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = rf"{DNS_LABEL}(\.{DNS_LABEL})*"


def make_index(variants: dict[str, Any], bare: bool = False) -> dict[str, Any]:
    return {
        "default-priorities": {"namespace": ["nvidia", "x86_64"]},
        "variants": variants,
        "images": {label: {"tag": f"1.0.0-{label}", "digest": ""} for label in variants},
        "bare": {"tag": "1.0.0", "digest": ""} if bare else None,
        "invalid": [],
    }


def cuda(lower: str, *sm: str) -> dict[str, Any]:
    features: dict[str, list[str]] = {"cuda_version_lower_bound": [lower]}
    if sm:
        features["sm_arch"] = list(sm)
    return {"nvidia": features}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0), out, err


def claim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, index: dict[str, Any], *args: str
) -> tuple[dict[str, Any], str]:
    path = tmp_path / "index.json"
    path.write_text(json.dumps(index))
    code, out, err = run_cli(capsys, "k8s", "claim", "--index", str(path), *args)
    assert code == 0, err
    document = yaml.safe_load(out)
    assert isinstance(document, dict)
    return document, err


def subrequests(document: dict[str, Any]) -> list[dict[str, Any]]:
    (request,) = document["spec"]["spec"]["devices"]["requests"]
    result: list[dict[str, Any]] = request["firstAvailable"]
    return result


def names(document: dict[str, Any]) -> list[str]:
    return [sub["name"] for sub in subrequests(document)]


def expressions(document: dict[str, Any]) -> list[str]:
    return [
        s["cel"]["expression"] for sub in subrequests(document) for s in sub.get("selectors", [])
    ]


def validate(document: dict[str, Any]) -> None:
    """The schema of each release, and the apiserver's own rules the schema leaves out
    (pkg/apis/resource/validation): names, uniqueness, qualified attribute names, the
    fields a template's spec.metadata may set."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(document, version, strict=True)
    names = [sub["name"] for sub in subrequests(document)]
    assert len(set(names)) == len(names), names
    for sub in subrequests(document):
        assert re.fullmatch(DNS_LABEL, sub["name"]), sub["name"]
        assert len(sub["name"]) <= 63
        assert re.fullmatch(DNS_SUBDOMAIN, sub["deviceClassName"]), sub["deviceClassName"]
        assert len(sub.get("selectors", [])) <= 32
    assert len(subrequests(document)) <= 8
    for constraint in document["spec"]["spec"]["devices"].get("constraints", []):
        domain, _, name = constraint["matchAttribute"].partition("/")
        assert re.fullmatch(DNS_SUBDOMAIN, domain) and re.fullmatch(r"[A-Za-z0-9_.-]+", name)
        for ref in constraint["requests"]:
            request, _, sub = ref.partition("/")
            assert request == "gpu" and (not sub or sub in names), ref
    assert set(document["spec"].get("metadata", {})) <= {"annotations", "labels"}
    for expression in expressions(document):
        assert len(expression.encode()) <= 10 * 1024
        compile_selector(expression)  # parses


@pytest.fixture
def pytorch(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "k8s", "claim", "--index", str(PYTORCH))
    assert code == 0, err
    assert err == ""
    document = yaml.safe_load(out)
    assert isinstance(document, dict)
    return document


# --------------------------------------------------------------------------- shape


def test_pytorch_template_is_valid_kubernetes_and_ranks_like_select(
    pytorch: dict[str, Any],
) -> None:
    validate(pytorch)
    assert pytorch["apiVersion"] == "resource.k8s.io/v1"
    assert pytorch["kind"] == "ResourceClaimTemplate"
    assert pytorch["metadata"]["name"] == "pytorch-2.12.0"  # from the index file's name
    assert names(pytorch) == ["cu130", "cu128", "cu126", "cu122", "null"]
    # v3 (a CPU property), null and the bare image all take any device: one last subrequest
    members = json.loads(pytorch["metadata"]["annotations"]["variant.pep817.dev/subrequests"])
    assert members == {
        "cu130": ["cu130"],
        "cu128": ["cu128"],
        "cu126": ["cu126"],
        "cu122": ["cu122"],
        "null": ["v3", "null", None],
    }
    last = subrequests(pytorch)[-1]
    assert "selectors" not in last
    for sub in subrequests(pytorch):
        assert sub["deviceClassName"] == "gpu.nvidia.com"
        assert sub["count"] == 1
    assert "constraints" not in pytorch["spec"]["spec"]["devices"]

    # The order is select()'s on the virtual host, not another ordering.
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    ranked = [c.label for c in select(index, virtual_host(index)).ranked]
    assert ranked == ["cu130", "cu128", "cu126", "cu122", "v3", "null", None]
    assert names(pytorch)[:4] == ranked[:4]


def test_every_claim_carries_its_variants_in_spec_metadata(pytorch: dict[str, Any]) -> None:
    """The ResourceClaim controller copies only spec.metadata (labels, annotations) into a
    claim: there the subrequest -> variant mapping sits beside the allocation result."""
    claim_meta = pytorch["spec"]["metadata"]
    assert set(claim_meta) == {"annotations"}
    annotations = claim_meta["annotations"]
    assert annotations == pytorch["metadata"]["annotations"]  # the template says it too
    members = json.loads(annotations["variant.pep817.dev/subrequests"])
    tags = json.loads(annotations["variant.pep817.dev/tags"])
    assert tags == {
        "cu130": ["2.12.0-cu130"],
        "cu128": ["2.12.0-cu128"],
        "cu126": ["2.12.0-cu126"],
        "cu122": ["2.12.0-cu122"],
        "null": ["2.12.0-v3", "2.12.0-null", "2.12.0"],
    }
    assert {name: len(labels) for name, labels in members.items()} == {
        name: len(t) for name, t in tags.items()
    }
    assert annotations["variant.pep817.dev/source"] == str(PYTORCH)
    # what a pod reads: results[].request is "<request>/<subrequest>"
    result = {"request": f"gpu/{names(pytorch)[1]}", "driver": "gpu.nvidia.com"}
    subrequest = result["request"].split("/", 1)[1]
    assert members[subrequest] == ["cu128"] and tags[subrequest] == ["2.12.0-cu128"]


def test_selectors_of_is_every_expression_the_template_writes(pytorch: dict[str, Any]) -> None:
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    plan = plan_claim(index)
    assert list(selectors_of(plan)) == list(dict.fromkeys(expressions(pytorch)))
    # NVIDIA's class admits only whole GPUs: --amd-partitions changes nothing here
    assert cli_selectors(index) == selectors_of(plan)


def test_virtual_host_lists_each_feature_newest_first() -> None:
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    host = virtual_host(index)
    assert host == {
        "nvidia": {
            "cuda_version_lower_bound": ["13.0", "12.8", "12.6", "12.2"],
            "sm_arch": ["120_real", "100_real", "90_real", "89_real", "86_real", "80_real"],
        },
        "x86_64": {"level": ["v3"]},
    }
    # numeric, not lexical; the provider's own orders
    assert newest_first(
        "nvidia", "cuda_version_lower_bound", ["9.2", "12", "12.10", "12.0", "12.9"]
    ) == [
        "12.10",
        "12.9",
        "12.0",
        "12",
        "9.2",
    ]
    assert newest_first(
        "nvidia", "sm_arch", ["89_real", "90_virtual", "100_real", "90_real", "86_real"]
    ) == [
        "100_real",
        "90_real",
        "90_virtual",
        "89_real",
        "86_real",
    ]
    assert newest_first("x86_64", "level", ["v2", "v4", "v3"]) == ["v4", "v3", "v2"]
    # the provider's lists are already newest first
    lists = nvidia_features((12, 8), (9, 0))
    for feature, values in lists.items():
        assert newest_first("nvidia", feature, values) == values


def test_count_above_one_makes_devices_homogeneous(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document, _ = claim(capsys, tmp_path, json.loads(PYTORCH.read_text()), "--count", "4")
    validate(document)
    assert {sub["count"] for sub in subrequests(document)} == {4}
    assert document["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/productName"}
    ]


def test_json_output_is_the_same_document(
    capsys: pytest.CaptureFixture[str], pytorch: dict[str, Any]
) -> None:
    code, out, _ = run_cli(capsys, "k8s", "claim", "--index", str(PYTORCH), "--json")
    assert code == 0
    assert json.loads(out) == pytorch
    code, out, _ = run_cli(capsys, "--json", "k8s", "claim", "--index", str(PYTORCH))
    assert json.loads(out) == pytorch


def test_name_and_device_class_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    document, _ = claim(
        capsys,
        tmp_path,
        json.loads(PYTORCH.read_text()),
        "--name",
        "torch.gpus",
        "--device-class",
        "mig.nvidia.com",
    )
    validate(document)
    assert document["metadata"]["name"] == "torch.gpus"
    assert {sub["deviceClassName"] for sub in subrequests(document)} == {"mig.nvidia.com"}


def test_the_validator_bites(pytorch: dict[str, Any]) -> None:
    """The schema check above would catch a malformed template."""
    for version in K8S_VERSIONS:
        broken = json.loads(json.dumps(pytorch))
        subrequests(broken)[0]["selector"] = subrequests(broken)[0].pop("selectors")
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)
        broken = json.loads(json.dumps(pytorch))
        subrequests(broken)[0]["count"] = "1"
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)
        broken = json.loads(json.dumps(pytorch))
        del broken["spec"]["spec"]["devices"]["requests"][0]["name"]
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)
        broken = json.loads(json.dumps(pytorch))
        broken["spec"]["metadata"]["annotationz"] = {}
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)


def test_the_versions_checked_are_the_newest_kubernetes_validate_has() -> None:
    """A kubernetes-validate that knows a newer release makes this fail: add it above."""
    # each version's own schemas, never an older release's in its place
    known = [major_minor(version) for version in all_versions()]
    assert set(K8S_VERSIONS) <= set(known)
    assert known[-1] == K8S_VERSIONS[-1], known[-1]


# --------------------------------------------------------------------------- CEL on devices


def test_cu128_on_hopper_matches_an_h200_on_cuda_12_8_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document, _ = claim(
        capsys,
        tmp_path,
        make_index({"cu128": cuda("12.8", "90_real"), "cu126": cuda("12.6"), "null": {}}),
    )
    validate(document)
    assert names(document) == ["cu128", "cu126", "null"]
    cu128 = [s["cel"]["expression"] for s in subrequests(document)[0]["selectors"]]

    def fits(device: Device) -> bool:
        return all(matches(e, device) for e in cu128)

    assert fits(nvidia_gpu("H200", "R570"))
    assert fits(nvidia_gpu("H100", "R580"))  # CUDA 13.0 >= 12.8
    assert not fits(nvidia_gpu("A100", "R570"))  # 8.0: not Hopper
    assert not fits(nvidia_gpu("H200", "R550"))  # CUDA 12.4 < 12.8
    assert not fits(nvidia_gpu("B200", "R570"))  # 90_real is not for 10.0
    subs = subrequests(document)
    assert first_available(subs, nvidia_gpu("H200", "R570")) == "cu128"
    assert first_available(subs, nvidia_gpu("H200", "R550")) == "null"
    assert first_available(subs, nvidia_gpu("A100", "R570")) == "cu126"
    assert first_available(subs, nvidia_gpu("A100", "R535")) == "null"


@pytest.mark.parametrize(
    ("product", "driver", "expected"),
    [
        ("A100", "R535", "cu122"),
        ("A100", "R570", "cu126"),
        ("L4", "R580", "cu126"),
        ("H100", "R550", "null"),
        ("H200", "R570", "cu128"),
        ("H200", "R580", "cu128"),
        ("B200", "R580", "cu130"),
        ("B300", "R570", "cu128"),
        ("B300", "R580", "cu130"),
        ("RTX5090", "R570", "null"),
        ("RTX5090", "R580", "cu130"),
    ],
)
def test_pytorch_subrequest_taken_for_real_products(
    pytorch: dict[str, Any], product: str, driver: str, expected: str
) -> None:
    assert first_available(subrequests(pytorch), nvidia_gpu(product, driver)) == expected


def test_scheduler_choice_equals_select_for_every_product_and_driver(
    pytorch: dict[str, Any],
) -> None:
    """On a GPU node, the first subrequest DRA can satisfy is the variant ``select`` picks
    for a host with that GPU and driver (CPU properties aside: they are the node's)."""
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    members = json.loads(pytorch["metadata"]["annotations"]["variant.pep817.dev/subrequests"])
    for product, driver in itertools.product(PRODUCTS, DRIVERS):
        _, cc, _ = PRODUCTS[product]
        _, cuda_version = DRIVERS[driver]
        host = {"nvidia": nvidia_features(cuda_version, cc)}
        best = select(index, host).best
        assert best is not None
        taken = first_available(subrequests(pytorch), nvidia_gpu(product, driver))
        assert taken is not None
        assert best.label in members[taken], (product, driver, best.label, taken)


def test_known_limit_one_list_cannot_follow_every_host(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """README: a fixed list is ranked for a host with every architecture; an 8.6 host ranks
    by its own first value. Both variants fit the device; only the order differs."""
    raw = make_index(
        {
            "a": {"nvidia": {"sm_arch": ["120_real", "80_real"]}},
            "b": {"nvidia": {"sm_arch": ["86_real"]}},
        }
    )
    document, _ = claim(capsys, tmp_path, raw)
    rtx3090 = Device(
        "gpu-0",
        "gpu.nvidia.com",
        {"cudaComputeCapability": Semver(8, 6, 0), "cudaDriverVersion": Semver(12, 8, 0)},
    )
    assert first_available(subrequests(document), rtx3090) == "a"
    best = select(
        VariantIndex.from_json(raw, "x"), {"nvidia": nvidia_features((12, 8), (8, 6))}
    ).best
    assert best is not None and best.label == "b"


def test_selectors_guard_devices_without_the_attributes(pytorch: dict[str, Any]) -> None:
    """A device of another driver (or without the attribute) is not a match, and no error:
    in DRA an unknown attribute aborts the allocation."""
    other = Device("npu-0", "npu.example.com", {"arch": "rngd"})
    for expression in expressions(pytorch):
        assert matches(expression, other) is False
    assert first_available(subrequests(pytorch), other) == "null"


def test_cuda_upper_bound_and_virtual_arch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    index = make_index(
        {
            "legacy": {"nvidia": {"cuda_version_upper_bound": ["12.5"], "sm_arch": ["80_virtual"]}},
            "ptx90": {"nvidia": {"sm_arch": ["90_virtual"]}},
        }
    )
    document, _ = claim(capsys, tmp_path, index)
    validate(document)
    subs = subrequests(document)
    assert names(document) == ["legacy", "ptx90"]
    assert first_available(subs, nvidia_gpu("A100", "R550")) == "legacy"  # 12.4 < 12.5, 8.0
    assert first_available(subs, nvidia_gpu("L4", "R550")) == "legacy"  # 8.9: major 8
    assert first_available(subs, nvidia_gpu("A100", "R570")) is None  # 12.8: not < 12.5
    assert first_available(subs, nvidia_gpu("H200", "R570")) == "ptx90"
    assert first_available(subs, nvidia_gpu("B200", "R570")) is None  # PTX 9.0 is major 9 only


def test_sm_arch_minor_and_merge() -> None:
    selector = feature_selector(
        "sm_arch", ["86_real", "89_real", "90_virtual", "90_real"], "nvidia"
    )
    assert selector.expression is not None
    # majors newest first; one alternative per major, the lowest minor's
    assert selector.expression.count("major()") == 2
    assert selector.expression.index("major() == 9") < selector.expression.index("major() == 8")
    assert "minor() >= 6" in selector.expression
    assert "minor() >= 9" not in selector.expression
    for product, expected in [
        ("A100", False),  # 8.0 < 8.6
        ("L4", True),  # 8.9
        ("H100", True),
        ("B200", False),
    ]:
        assert matches(selector.expression, nvidia_gpu(product, "R570")) is expected, product
    # values no host ever lists fit no device
    assert feature_selector("sm_arch", ["91_virtual", "5_real"], "nvidia").expression is None
    assert feature_selector("cuda_version_lower_bound", ["12.08"], "nvidia").expression is None


def test_kubernetes_semver_semantics() -> None:
    assert Semver.parse("12.8.0").compare(Semver.parse("12.10.0")) == -1  # numeric
    assert Semver.parse("1.0.0-rc.1").compare(Semver.parse("1.0.0")) == -1
    assert Semver.parse("1.0.0-alpha").compare(Semver.parse("1.0.0-alpha.1")) == -1
    assert Semver.parse("1.0.0-2").compare(Semver.parse("1.0.0-10")) == -1
    assert Semver.parse("1.0.0+build.5") == Semver.parse("1.0.0")
    for bad in ("12.8", "v1.0.0", "01.0.0", "1.0.0-01"):
        with pytest.raises(ValueError):
            Semver.parse(bad)
    h200 = nvidia_gpu("H200", "R570")
    assert matches(
        'device.attributes["gpu.nvidia.com"].cudaDriverVersion.isGreaterThan(semver("12.4.0"))'
        ' && device.attributes["gpu.nvidia.com"].cudaComputeCapability.major() == 9',
        h200,
    )
    with pytest.raises(celpy.CELEvalError):  # an unknown attribute is an error, not false
        matches('device.attributes["gpu.nvidia.com"].nope == 1', h200)
    with pytest.raises(celpy.CELEvalError):  # strict semver, as Kubernetes parses it
        matches(
            'device.attributes["gpu.nvidia.com"].cudaDriverVersion.compareTo(semver("12.8")) >= 0',
            h200,
        )


# --------------------------------------------------------------------------- special cases


def test_more_than_eight_variants_are_cut_with_one_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    versions = ["13.0", "12.9", "12.8", "12.6", "12.4", "12.2", "12.1", "12.0", "11.8", "11.7"]
    variants = {f"cu{v.replace('.', '')}": cuda(v) for v in versions}
    document, err = claim(capsys, tmp_path, make_index({**variants, "null": {}}))
    validate(document)
    assert names(document) == [
        "cu130",
        "cu129",
        "cu128",
        "cu126",
        "cu124",
        "cu122",
        "cu121",
        "null",
    ]
    warnings = err.strip().splitlines()
    assert len(warnings) == 1
    assert "at most 8 subrequests" in warnings[0]
    assert "cu120, cu118, cu117" in warnings[0]

    document, err = claim(capsys, tmp_path, make_index(variants))  # no fallback: 8 variants
    validate(document)
    assert names(document) == [f"cu{v.replace('.', '')}" for v in versions[:8]]
    assert len(err.strip().splitlines()) == 1
    assert "cu118, cu117" in err


def test_a_feature_with_more_than_eight_values_keeps_the_newest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    archs = [f"{major}0_real" for major in range(5, 14)]  # 9 majors
    document, err = claim(capsys, tmp_path, make_index({"wide": {"nvidia": {"sm_arch": archs}}}))
    validate(document)
    (expression,) = expressions(document)
    assert expression.count("major()") == 8
    assert "major() == 5" not in expression
    assert "major() == 13" in expression
    assert "left out 50_real" in err and len(err.strip().splitlines()) == 1


def test_only_cpu_variants_ask_any_device(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    levels = {f"v{n}": {"x86_64": {"level": [f"v{n}"]}} for n in (2, 3, 4)}
    document, err = claim(capsys, tmp_path, make_index(levels))
    validate(document)
    # said, since such a claim takes a GPU that none of the variants needs
    assert "no variant asks anything of a device" in err and "any nvidia device" in err
    (only,) = subrequests(document)
    assert only["name"] == "v4"  # the best: no universal fallback in this index
    assert "selectors" not in only
    members = json.loads(document["metadata"]["annotations"]["variant.pep817.dev/subrequests"])
    assert members == {"v4": ["v4", "v3", "v2"]}

    document, _ = claim(capsys, tmp_path, make_index({**levels, "null": {}}, bare=True))
    assert names(document) == ["null"]


def test_bare_image_alone_and_null_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document, _ = claim(capsys, tmp_path, make_index({}, bare=True))
    validate(document)
    assert names(document) == ["bare"]
    document, _ = claim(capsys, tmp_path, make_index({"cu128": cuda("12.8")}, bare=True))
    assert names(document) == ["cu128", "bare"]
    document, _ = claim(capsys, tmp_path, make_index({"null": {}}))
    assert names(document) == ["null"]


def test_cpu_properties_are_left_out_of_device_selectors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    index = make_index(
        {
            "cu128v4": {
                "nvidia": {"cuda_version_lower_bound": ["12.8"]},
                "x86_64": {"level": ["v4"]},
            },
            "cu128": cuda("12.8"),
            "cu126": cuda("12.6"),
        }
    )
    document, _ = claim(capsys, tmp_path, index)
    validate(document)
    # same devices: the CPU variant cu128v4 ranks first and stands for both
    assert names(document) == ["cu128v4", "cu126"]
    assert all("x86_64" not in e and "level" not in e for e in expressions(document))
    members = json.loads(document["metadata"]["annotations"]["variant.pep817.dev/subrequests"])
    assert members["cu128v4"] == ["cu128v4", "cu128"]


def test_other_namespaces_are_left_out_with_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    index = make_index(
        {
            "npu": {"furiosa": {"arch": ["rngd"]}},
            "odd": {"nvidia": {"sm_arch": ["91_virtual"]}},
            "cu128": cuda("12.8"),
            "null": {},
        }
    )
    document, err = claim(capsys, tmp_path, index)
    validate(document)
    assert names(document) == ["cu128", "null"]
    (warning,) = err.strip().splitlines()
    assert "left out" in warning and "npu (furiosa properties" in warning
    assert "odd (no gpu.nvidia.com device can have nvidia :: sm_arch :: 91_virtual)" in warning

    path = tmp_path / "npu-only.json"
    path.write_text(json.dumps(make_index({"npu": {"furiosa": {"arch": ["rngd"]}}})))
    code, out, err = run_cli(capsys, "k8s", "claim", "--index", str(path))
    assert code == 1
    assert out == ""
    assert "npu: furiosa properties" in err


def test_subrequest_names_are_unique_dns_labels() -> None:
    index = VariantIndex.from_json(
        make_index(
            {
                "cu12.8": cuda("12.8"),
                "cu12_8": cuda("12.8", "90_real"),
                "_x.": cuda("12.6"),
                "a" * 64: cuda("12.4"),
            }
        ),
        "names",
    )
    plan = plan_claim(index)
    found = [sub.name for sub in plan.subrequests]
    assert len(set(found)) == len(found) == 4
    assert found[0] == "cu12-8"  # cu12_8 ranks first (one more property)
    assert found[1] == "cu12-8-2"
    assert "x" in found
    for name in found:
        assert re.fullmatch(DNS_LABEL, name) and len(name) <= 63
    assert dns_label("...", "variant") == "variant"
    validate(claim_template(plan, name="names", count=1))


def test_limits_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    monkeypatch.setattr(claim_module, "MAX_EXPRESSION_BYTES", 100)
    with pytest.raises(InvalidInputError, match=r"CEL expression of \d+ bytes; DRA allows 100"):
        plan_claim(index)
    monkeypatch.setattr(claim_module, "MAX_EXPRESSION_BYTES", 10 * 1024)
    monkeypatch.setattr(claim_module, "MAX_SELECTORS", 1)
    with pytest.raises(InvalidInputError, match="2 selectors; DRA allows 1"):
        plan_claim(index)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "give exactly one of REF"),
        (["reg.example/app:1.0", "--index", str(PYTORCH)], "give exactly one of REF"),
        (["--index", "/nonexistent/index.json"], "cannot read it"),
        (["--index", str(PYTORCH), "--count", "0"], "--count"),
        (["--index", str(PYTORCH), "--count", "33"], "--count"),
        (["--index", str(PYTORCH), "--name", "Not_A_Name"], "--name 'Not_A_Name'"),
        (["--index", str(PYTORCH), "--device-class", "gpu/nvidia"], "--device-class"),
    ],
)
def test_bad_input_exits_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, out, err = run_cli(capsys, "k8s", "claim", *args)
    assert code == 2, err
    assert out == ""
    assert needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"variants": {"cu128": {"nvidia": {"sm_arch": ["9.0"]}}}}), "sm_arch"),
        (json.dumps({"variants": {"BAD": {}}}), "BAD"),
    ],
)
def test_invalid_index_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    code, out, err = run_cli(capsys, "k8s", "claim", "--index", str(path))
    assert code == 2
    assert out == ""
    assert needle in err


def test_name_hints() -> None:
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    target = Target(index)
    assert claim_name_hint(target, "/data/pytorch-2.12.0.json") == "pytorch-2.12.0"
    assert (
        claim_name_hint(target, "http://proxy:5080/v2/team/torch/_variants/2.12.0")
        == "torch-2.12.0"
    )
    from docker_variant.oci.reference import parse_reference

    ref = parse_reference("reg.example:5000/team/my__app:2.12.0-Ubuntu_24.04")
    hint = claim_name_hint(Target(index, ref), None)
    assert hint == "my__app-2.12.0-Ubuntu_24.04"
    assert dns_subdomain(hint, "variants") == "my-app-2.12.0-ubuntu-24.04"
    assert dns_subdomain("..._", "variants") == "variants"


def test_yaml_writer_round_trips_awkward_strings() -> None:
    awkward = [
        "null",
        "Null",
        "on",
        "Off",
        "y",
        "12.8",
        "1e3",
        ".inf",
        "-",
        "- x",
        "a: b",
        "#c",
        "it's",
        'say "hi"',
        "",
        " lead",
        "trail ",
        "tab\there",
        "line\nbreak",
        "é",
        "~",
        "[x]",
        "{x}",
        "*ref",
        "&anchor",
        "!tag",
        "%dir",
        "@at",
        "`tick",
        "|",
        ">",
    ]
    document: dict[str, Any] = {
        "list": awkward,
        "map": {text or "empty": text for text in awkward},
        "nested": [{"a": [1, True, None, {}, []]}, [["deep"]]],
        "ints": [0, -1, 10**12],
    }
    assert yaml.safe_load(dump_yaml(document)) == document
