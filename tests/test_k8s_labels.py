"""`docker-variant k8s node-labels`: one valid Kubernetes label per supported property."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docker_variant.cli import main
from docker_variant.k8s.labels import LABEL_PREFIX, is_label_name, is_label_value, node_labels
from docker_variant.providers import nvidia
from docker_variant.providers.nvidia import nvidia_features
from test_nvidia_provider import FakeNvml, load

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
H200 = EXAMPLES / "hosts" / "h200-r570.json"

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
    code, out, err = run_cli(capsys, "k8s", "node-labels", "--providers-file", str(H200))
    assert code == 0, err
    assert err == ""
    lines = out.splitlines()
    pairs = [line.split("=", 1) for line in lines]
    for key, value in pairs:
        assert_valid_label(key, value)
        assert key.startswith(f"{LABEL_PREFIX}/")
        assert value == "true"
    host = json.loads(H200.read_text())
    expected = [
        f"{LABEL_PREFIX}/{ns}.{feature}.{value}"
        for ns, features in host.items()
        for feature, values in features.items()
        for value in values
    ]
    assert [key for key, _ in pairs] == expected  # every property, in the host's order
    assert len(lines) == len(set(lines))
    for needle in (
        "variant.pep817.dev/nvidia.sm_arch.90_real=true",
        "variant.pep817.dev/nvidia.sm_arch.90_virtual=true",
        "variant.pep817.dev/nvidia.cuda_version_lower_bound.12.8=true",
        "variant.pep817.dev/nvidia.cuda_version_upper_bound.12.9=true",
        "variant.pep817.dev/x86_64.level.v4=true",
    ):
        assert needle in lines
    assert "variant.pep817.dev/nvidia.cuda_version_lower_bound.12.9=true" not in lines
    assert "variant.pep817.dev/nvidia.sm_arch.100_real=true" not in lines


def test_json_is_the_same_labels(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(capsys, "k8s", "node-labels", "--providers-file", str(H200))
    code, out_json, _ = run_cli(
        capsys, "--json", "k8s", "node-labels", "--providers-file", str(H200)
    )
    assert code == 0
    labels = json.loads(out_json)
    assert labels == dict(line.split("=", 1) for line in out.splitlines())


def test_labels_from_nvml_detection() -> None:
    """Labels from a detected H200 (an NVML fixture, R580: CUDA 13.0)."""
    report = nvidia.detect({}, nvml=FakeNvml(load("h200-r580")), smi_run=lambda _args: None)
    assert report.host == nvidia_features((13, 0), (9, 0))
    labels = node_labels({"nvidia": report.host}).labels
    for key, value in labels.items():
        assert_valid_label(key, value)
    assert f"{LABEL_PREFIX}/nvidia.cuda_version_lower_bound.13.0" in labels
    assert f"{LABEL_PREFIX}/nvidia.cuda_version_upper_bound.13.0" not in labels


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
