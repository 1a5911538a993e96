"""`docker-variant k8s claim REF`: the template for an image in a live registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from clirun import run_cli
from conftest import RunningRegistry
from docker_variant.oci.source import fetch_index
from imaging import ImageBuilder, variant_labels
from k8s_cel_env import first_available, nvidia_gpu

pytestmark = pytest.mark.e2e
REPO = "k8s/team/app"


@pytest.fixture(scope="module")
def pushed(registry: RunningRegistry, image_builder: ImageBuilder) -> str:
    images = {
        "cu128": variant_labels(
            "cu128", nvidia__cuda_version_lower_bound="12.8", nvidia__sm_arch="90_real"
        ),
        "cu126": variant_labels("cu126", nvidia__cuda_version_lower_bound="12.6"),
        "v3": variant_labels("v3", x86_64__level="v3"),
        "null": variant_labels("null"),
    }
    for label, image_labels in images.items():
        image_builder.build_and_push(f"{registry.host}/{REPO}:1.0.0-{label}", image_labels)
    image_builder.build_and_push(f"{registry.host}/{REPO}:1.0.0", {})
    return f"{registry.host}/{REPO}:1.0.0"


def test_claim_for_a_reference(pushed: str) -> None:
    result = run_cli("k8s", "claim", pushed, "--count", "2")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = yaml.safe_load(result.stdout)
    for version in ("1.34", "1.35", "1.36", "1.37"):
        kubernetes_validate.validate(document, version, strict=True)
    assert document["metadata"]["name"] == "app-1.0.0"
    annotations = document["metadata"]["annotations"]
    assert annotations["variant.pep817.dev/source"] == pushed
    assert document["spec"]["metadata"]["annotations"] == annotations  # copied into claims
    assert json.loads(annotations["variant.pep817.dev/subrequests"]) == {
        "cu128": ["cu128"],
        "cu126": ["cu126"],
        "null": ["v3", "null", None],
    }
    (request,) = document["spec"]["spec"]["devices"]["requests"]
    subs = request["firstAvailable"]
    assert first_available(subs, nvidia_gpu("H200", "R570")) == "cu128"
    assert first_available(subs, nvidia_gpu("A100", "R570")) == "cu126"
    assert first_available(subs, nvidia_gpu("A100", "R535")) == "null"


def test_reference_and_index_give_the_same_claim(pushed: str, tmp_path: Path) -> None:
    """REF and --index of the same version make the same requests (the name and source differ)."""
    from_ref = yaml.safe_load(run_cli("k8s", "claim", pushed).stdout)
    _, index = fetch_index(pushed)
    path = tmp_path / "app.json"
    path.write_text(index.dumps())
    from_index = yaml.safe_load(run_cli("k8s", "claim", "--index", str(path)).stdout)
    assert from_index["spec"]["spec"] == from_ref["spec"]["spec"]
    for document in (from_ref, from_index):  # the claim's copy names its own source
        document["spec"]["metadata"]["annotations"].pop("variant.pep817.dev/source")
    assert from_index["spec"]["metadata"] == from_ref["spec"]["metadata"]
    assert from_index["metadata"]["name"] == "app"


def test_missing_repository_exits_3(registry: RunningRegistry) -> None:
    result = run_cli("k8s", "claim", f"{registry.host}/k8s/nothing-here:1.0.0")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
