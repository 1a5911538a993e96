"""`docker-variant k8s node-labels` and `node_affinity`: a compact set of valid labels, and
node-selector terms that hold on a node exactly when the variant fits the node's host lists
(checked with an evaluator of Kubernetes' nodeSelector semantics here; the real
kube-scheduler is the integration test's)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from docker_variant.cli import main
from docker_variant.errors import InvalidInputError
from docker_variant.k8s.labels import (
    LABEL_PREFIX,
    MAX_TERMS,
    host_lists,
    is_label_name,
    is_label_value,
    node_affinity,
    node_labels,
)
from docker_variant.providers import nvidia, read_providers_file
from docker_variant.providers.nvidia import nvidia_features
from docker_variant.variant import HostMatcher, SupportedLists, Variant, VariantIndex, select
from docker_variant.variant.ordering import Rejection
from docker_variant.vendors import nvidia as nvidia_rules
from test_nvidia_provider import FakeNvml, load

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
H200 = EXAMPLES / "hosts" / "h200-r570.json"
HOSTS = sorted((EXAMPLES / "hosts").glob("*.json"))
PYTORCH = EXAMPLES / "pytorch-2.12.0.json"

# Kubernetes' rules (apimachinery validation: IsQualifiedName, IsValidLabelValue, IsDNS1123Subdomain)
NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
PREFIX_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def assert_valid_label(key: str, value: str) -> None:
    prefix, slash, name = key.rpartition("/")
    assert slash, key
    assert len(prefix) <= 253 and PREFIX_RE.fullmatch(prefix), key
    assert len(name) <= 63 and NAME_RE.fullmatch(name), key
    assert value == "" or (len(value) <= 63 and NAME_RE.fullmatch(value)), value


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0), out, err


def test_h200_node_labels(capsys: pytest.CaptureFixture[str]) -> None:
    """An H200 node: four labels, where one per value was 116."""
    code, out, err = run_cli(capsys, "k8s", "node-labels", "--providers-file", str(H200))
    assert code == 0, err
    assert err == ""
    pairs = [line.split("=", 1) for line in out.splitlines()]
    for key, value in pairs:
        assert_valid_label(key, value)
    assert dict(pairs) == {
        f"{LABEL_PREFIX}/nvidia.cuda_version_lower_bound": "1208",
        f"{LABEL_PREFIX}/nvidia.cuda_version_upper_bound": "1208",
        f"{LABEL_PREFIX}/nvidia.sm_arch.9": "0",
        f"{LABEL_PREFIX}/x86_64.level": "4",
    }


@pytest.mark.parametrize("name", ["h200-r570", "h200-l4"])
def test_a_gpu_node_has_at_most_20_labels(name: str) -> None:
    report = read_providers_file(EXAMPLES / "hosts" / f"{name}.json")
    result = node_labels(report.host)
    assert len(result.labels) <= 20
    assert result.skipped == {}
    assert _as_sets(host_lists(result.labels)) == _as_sets(report.host)


def test_labels_from_nvml_detection() -> None:
    """Labels from a detected H200 (an NVML fixture, R580: CUDA 13.0)."""
    report = nvidia.detect({}, nvml=FakeNvml(load("h200-r580")), smi_run=lambda _args: None)
    assert report.host == nvidia_features((13, 0), (9, 0))
    labels = node_labels({"nvidia": report.host}).labels
    for key, value in labels.items():
        assert_valid_label(key, value)
    assert labels[f"{LABEL_PREFIX}/nvidia.cuda_version_lower_bound"] == "1300"
    assert labels[f"{LABEL_PREFIX}/nvidia.cuda_version_upper_bound"] == "1300"
    assert labels[f"{LABEL_PREFIX}/nvidia.sm_arch.9"] == "0"


def test_properties_no_label_can_carry_are_skipped_with_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    host = {
        "npu": {"arch": ["rngd", "x_"], "f" * 60: ["long"]},
        "_lead": {"feature": ["on"]},
        "nvidia": {},
    }
    path = tmp_path / "host.json"
    path.write_text(json.dumps(host))
    code, out, err = run_cli(capsys, "k8s", "node-labels", "--providers-file", str(path))
    assert code == 0
    assert out == f"{LABEL_PREFIX}/npu.arch.rngd=true\n"
    assert "npu :: arch :: x_" in err
    assert f"npu :: {'f' * 60} :: long" in err
    assert "_lead :: feature :: on" in err
    assert len(err.strip().splitlines()) == 1


def test_label_rules() -> None:
    assert is_label_name("nvidia.sm_arch.90_real")
    assert not is_label_name("a" * 64)
    assert not is_label_name("-a") and not is_label_name("a_") and not is_label_name("")
    assert is_label_value("") and is_label_value("true")


def test_unreadable_providers_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "k8s", "node-labels", "--providers-file", "/nonexistent/host.json"
    )
    assert code == 2
    assert out == ""
    assert "/nonexistent/host.json" in err


# --------------------------------------------------------------------------- nodeSelector
# Kubernetes' semantics (k8s.io/component-helpers scheduling/corev1/nodeaffinity): terms OR,
# a term's expressions AND, an empty term matches nothing; Gt/Lt parse the label's value
# and their one value as integers, and fail on a missing label or one that does not parse.


def _as_sets(lists: Mapping[str, Mapping[str, list[str]]]) -> dict[str, dict[str, set[str]]]:
    return {ns: {f: set(vs) for f, vs in fs.items() if vs} for ns, fs in lists.items() if fs}


def _integer(text: str) -> int | None:
    return int(text) if re.fullmatch(r"-?[0-9]+", text) else None


def _expression_holds(expression: dict[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        assert not values
        return key in labels
    if operator == "DoesNotExist":
        assert not values
        return key not in labels
    assert operator in ("Gt", "Lt"), operator
    (limit,) = values  # the apiserver refuses anything but one integer
    assert _integer(limit) is not None, limit
    have = _integer(labels[key]) if key in labels else None
    if have is None:
        return False
    return have > int(limit) if operator == "Gt" else have < int(limit)


def selector_matches(selector: dict[str, Any] | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return True
    assert selector["nodeSelectorTerms"], "the apiserver refuses an empty list"
    return any(
        term["matchExpressions"]
        and all(_expression_holds(e, labels) for e in term["matchExpressions"])
        for term in selector["nodeSelectorTerms"]
    )


def _check_selector(selector: dict[str, Any] | None) -> None:
    for term in (selector or {}).get("nodeSelectorTerms", []):
        for expression in term["matchExpressions"]:
            assert_valid_label(expression["key"], "")
            for value in expression.get("values", []):
                assert is_label_value(value)


def _host(path: Path) -> SupportedLists:
    return read_providers_file(path).host


def _index() -> VariantIndex:
    return VariantIndex.from_json(json.loads(PYTORCH.read_text()), str(PYTORCH))


@pytest.mark.parametrize("path", HOSTS, ids=lambda p: p.stem)
def test_affinity_matches_a_node_iff_the_variant_fits_its_host(path: Path) -> None:
    """For every variant of the example index on every example host: the node's labels
    satisfy the variant's affinity exactly when selection finds the variant compatible."""
    host = _host(path)
    labels = node_labels(host).labels
    index = _index()
    compatible = {c.label for c in select(index, host).ranked if c.kind == "variant"}
    seen = 0
    for variant in index.variants.values():
        if variant.is_null:
            continue
        selector = node_affinity(variant.properties)
        _check_selector(selector)
        assert selector_matches(selector, labels) == (variant.label in compatible), variant
        seen += 1
    assert seen == 5


def test_affinity_on_generated_hosts_agrees_with_selection() -> None:
    """Hosts a provider writes: CUDA drivers 10.0 to 16.3 and GPUs of every capability
    (one or two per node), against variants naming CUDA bounds and sm_arch values around
    them, one or several values each; and x86-64 levels."""
    drivers = [(m, n) for m in range(10, 17) for n in (0, 1, 2, 8, 9, 20, 21)]
    gpus = [(5, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0)]
    hosts: list[SupportedLists] = []
    for i, cuda in enumerate(drivers):
        ccs = {gpus[i % len(gpus)], gpus[(i * 5 + 2) % len(gpus)]}
        lists: dict[str, list[str]] = {}
        for cc in sorted(ccs):
            for feature, values in nvidia_rules.supported_features(cuda, cc).items():
                lists.setdefault(feature, [])
                lists[feature] += [v for v in values if v not in lists[feature]]
        hosts.append(
            {"nvidia": lists, "x86_64": {"level": [f"v{k}" for k in range(i % 4 + 1, 0, -1)]}}
        )
    cudas = [f"{m}.{n}" for m in range(9, 18) for n in (0, 1, 8, 9, 20, 21, 25)]
    cudas += [str(m) for m in range(9, 18)]
    arches = ["50_real", "75_real", "80_real", "86_real", "89_real", "90_real", "90_virtual",
              "86_virtual", "100_real", "103_real", "120_real", "120_virtual", "5_real"]  # fmt: skip
    variants: list[dict[str, dict[str, list[str]]]] = []
    for i, low in enumerate(cudas):
        high = cudas[(i * 7 + 3) % len(cudas)]
        sm = [arches[i % len(arches)], arches[(i * 3 + 1) % len(arches)]]
        variants += [
            {"nvidia": {"cuda_version_lower_bound": [low]}},
            {"nvidia": {"cuda_version_upper_bound": [high]}},
            {"nvidia": {"cuda_version_lower_bound": [low], "cuda_version_upper_bound": [high]}},
            {"nvidia": {"cuda_version_lower_bound": [low, high], "sm_arch": sm}},
            {"nvidia": {"sm_arch": sm[:1]}, "x86_64": {"level": [f"v{i % 5 + 1}"]}},
        ]
    matched = refused = 0
    for host in hosts:
        result = node_labels(host)
        assert result.skipped == {}
        assert len(result.labels) <= 6
        assert _as_sets(host_lists(result.labels)) == _as_sets(host)
        matcher = HostMatcher(host, [])
        for properties in variants:
            # built directly: a multi-valued CUDA bound is not a valid variant, yet ORs
            variant = Variant(
                "x", {ns: {f: tuple(v) for f, v in fs.items()} for ns, fs in properties.items()}
            )
            fits = not isinstance(matcher.evaluate(variant), Rejection)
            selector = node_affinity(properties)
            _check_selector(selector)
            assert selector_matches(selector, result.labels) == fits, (host, properties)
            matched += fits
            refused += not fits
    assert matched > 1000 and refused > 1000  # both answers are exercised


def test_labels_never_claim_what_a_hand_written_host_does_not_list(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A providers file whose lists are not a provider's: what a compact label cannot say
    is left out (a warning), and every label read back is listed."""
    host = {
        "nvidia": {
            "cuda_version_lower_bound": ["12.8", "12.6", "12.5", "12", "11.0"],  # no 12.7
            "cuda_version_upper_bound": ["13.0", "12.9"],
            "sm_arch": ["90_virtual", "89_real", "88_real"],
        },
        "x86_64": {"level": ["v3", "v1"]},
    }
    result = node_labels(host)
    back = _as_sets(host_lists(result.labels))
    given = _as_sets(host)
    for ns, features in back.items():
        for feature, values in features.items():
            assert values <= given[ns][feature], (feature, values - given[ns][feature])
    assert result.labels[f"{LABEL_PREFIX}/x86_64.level"] == "1"
    assert f"{LABEL_PREFIX}/nvidia.cuda_version_lower_bound" not in result.labels
    assert "nvidia :: sm_arch :: 90_virtual" in result.skipped
    assert "x86_64 :: level :: v3" in result.skipped
    path = tmp_path / "host.json"
    path.write_text(json.dumps(host))
    code, _out, err = run_cli(capsys, "k8s", "node-labels", "--providers-file", str(path))
    assert code == 0
    assert "x86_64 :: level :: v3" in err and "nvidia :: sm_arch :: 88_real" in err


def test_the_affinity_of_cu128_and_of_x86_64_v3() -> None:
    """The documented examples: values of one feature OR (one term per GPU major), the CUDA
    bound ANDs into each; a level is Gt the one below."""
    cu128 = _index().variants["cu128"]
    lower = {"key": f"{LABEL_PREFIX}/nvidia.cuda_version_lower_bound", "operator": "Gt",
             "values": ["1207"]}  # fmt: skip
    assert node_affinity(cu128.properties) == {
        "nodeSelectorTerms": [
            {"matchExpressions": [lower, {"key": f"{LABEL_PREFIX}/nvidia.sm_arch.10",
                                          "operator": "Exists"}]},
            {"matchExpressions": [lower, {"key": f"{LABEL_PREFIX}/nvidia.sm_arch.9",
                                          "operator": "Exists"}]},
        ]
    }  # fmt: skip
    assert node_affinity({"x86_64": {"level": ["v3"]}}) == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": f"{LABEL_PREFIX}/x86_64.level", "operator": "Gt",
                                   "values": ["2"]}]}
        ]
    }  # fmt: skip
    assert node_affinity({}) is None


def test_values_of_one_threshold_feature_join_into_one_term() -> None:
    selector = node_affinity({"nvidia": {"cuda_version_lower_bound": ["12.8", "12.2", "13"]}})
    assert selector is not None
    (term,) = selector["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["1201"]


def test_a_value_no_node_lists_gives_a_term_no_node_satisfies() -> None:
    selector = node_affinity({"nvidia": {"sm_arch": ["89_virtual"]}})
    _check_selector(selector)
    for path in HOSTS:
        assert not selector_matches(selector, node_labels(_host(path)).labels)
    assert not selector_matches(selector, {})


def test_too_many_terms_is_refused_by_name() -> None:
    features = {f"f{i}": ["a", "b", "c"] for i in range(5)}  # 3 ** 5 = 243 terms
    with pytest.raises(InvalidInputError, match=f"more than {MAX_TERMS} nodeSelectorTerms"):
        node_affinity({"npu": features})


def test_cpu_flags_are_labelled_only_when_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    host = {"x86_64": {"level": ["v3", "v2", "v1"], "avx2": ["on"], "fma": ["on"]}}
    assert node_labels(host).labels == {f"{LABEL_PREFIX}/x86_64.level": "3"}
    flagged = node_labels(host, cpu_flags=True).labels
    assert flagged[f"{LABEL_PREFIX}/x86_64.avx2.on"] == "true"
    selector = node_affinity({"x86_64": {"avx2": ["on"]}})
    assert selector_matches(selector, flagged)
    assert not selector_matches(selector, node_labels(host).labels)
    path = tmp_path / "host.json"
    path.write_text(json.dumps(host))
    _code, out, _err = run_cli(
        capsys, "k8s", "node-labels", "--cpu-flags", "--providers-file", str(path)
    )
    assert f"{LABEL_PREFIX}/x86_64.fma.on=true" in out.splitlines()
