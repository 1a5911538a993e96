"""Transparent resolution with an unmodified client: containerd (as a kubelet runs it) pulls
`app:1.0.0` through variant-proxy with a hosts.toml that sends this node's
`X-Variant-Properties`, and gets the best variant (docs/reference/proxy-api.md; REFERENCE: containerd sends
the header on its first request, a HEAD, then fetches by digest); alone, and behind the
shipped nginx front."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import devstack
from conftest import RunningRegistry
from docker_variant.providers.nvidia import nvidia_features
from imaging import ImageBuilder, variant_labels

pytestmark = pytest.mark.e2e
REPO = "ctrd/app"
H200 = {"nvidia": nvidia_features((12, 8), (9, 0)), "x86_64": {"level": ["v4", "v3", "v2", "v1"]}}
OLD_CPU = {"x86_64": {"level": ["v2", "v1"]}}
# an H200 and an L4 on one node, described per device (providers --devices --json)
MIXED = json.loads((Path(__file__).parent.parent / "examples/hosts/h200-l4.json").read_text())


@pytest.fixture(scope="module", params=["alone", "nginx"])
def proxy(
    registry: RunningRegistry,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[devstack.Service]:
    """The proxy alone, and behind the shipped nginx front (which pulls go to)."""
    service = devstack.start_proxy(registry.url, tmp_path_factory.mktemp("ctrd-proxy"))
    front = None
    if request.param == "nginx":
        front = devstack.start_nginx_front(
            registry.host, service.address, tmp_path_factory.mktemp("ctrd-nginx")
        )
    yield front or service
    if front is not None:
        front.stop()
    service.stop()


@pytest.fixture(scope="module")
def digests(registry: RunningRegistry, image_builder: ImageBuilder) -> dict[str, str]:
    pushed = {
        "cu128": variant_labels(
            "cu128", nvidia__cuda_version_lower_bound="12.8", nvidia__sm_arch="90_real"
        ),
        # code for the L4 (sm_89) and the H200 (sm_90): ranks below cu128 on an H200 alone
        "cu126": variant_labels(
            "cu126",
            nvidia__cuda_version_lower_bound="12.6",
            nvidia__sm_arch="80_real,86_real,89_real,90_real",
        ),
        "v3": variant_labels("v3", x86_64__level="v3"),
        "null": variant_labels("null"),
    }
    found = {
        label: image_builder.build_and_push(f"{registry.host}/{REPO}:1.0.0-{label}", labels)
        for label, labels in pushed.items()
    }
    found["bare"] = image_builder.build_and_push(f"{registry.host}/{REPO}:1.0.0", {})
    return found


def ctr_pull(
    containerd: devstack.Service, proxy: devstack.Service, host: dict[str, object], tmp: Path
) -> str:
    """`ctr images pull` through the proxy with the hosts.toml `docker-variant k8s
    containerd-hosts` writes for a node with these lists; returns the digest containerd
    recorded for `app:1.0.0`."""
    tmp.mkdir(parents=True)
    providers = tmp / "host.json"
    providers.write_text(json.dumps(host))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "docker_variant",
            "k8s",
            "containerd-hosts",
            proxy.address,
            "--providers-file",
            str(providers),
            "--output",
            str(tmp / "hosts"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    written = tomllib.loads((tmp / "hosts" / proxy.address / "hosts.toml").read_text())
    assert written["server"] == f"http://{proxy.address}"  # loopback: plain HTTP
    header = written["host"][written["server"]]["header"]["X-Variant-Properties"]
    if "devices" not in host:  # a flat list: sent as it is
        assert json.loads(header) == host
    sock = containerd.address.removeprefix("unix://")
    ref = f"{proxy.address}/{REPO}:1.0.0"
    subprocess.run(
        [
            "ctr",
            "-a",
            sock,
            "images",
            "pull",
            "--hosts-dir",
            str(tmp / "hosts"),
            "--snapshotter",
            "native",
            ref,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    listing = subprocess.run(
        ["ctr", "-a", sock, "images", "ls"], check=True, capture_output=True, text=True
    ).stdout
    subprocess.run(["ctr", "-a", sock, "images", "rm", ref], check=True, capture_output=True)
    line = next(line for line in listing.splitlines() if line.startswith(ref + " "))
    return next(word for word in line.split() if word.startswith("sha256:"))


def test_containerd_pulls_the_best_variant_through_the_proxy(
    containerd: devstack.Service, proxy: devstack.Service, digests: dict[str, str], tmp_path: Path
) -> None:
    assert ctr_pull(containerd, proxy, H200, tmp_path / "h200") == digests["cu128"]
    assert ctr_pull(containerd, proxy, OLD_CPU, tmp_path / "old") == digests["null"]
    # a node whose GPUs differ: cu126 runs on both; cu128 (sm_90 only) not on the L4
    assert ctr_pull(containerd, proxy, MIXED, tmp_path / "mixed") == digests["cu126"]
    # the proxy chose on the HEAD and labelled it
    head = httpx.head(
        f"{proxy.url}/v2/{REPO}/manifests/1.0.0",
        headers={
            "X-Variant-Properties": json.dumps(H200),
            "Accept": "application/vnd.oci.image.manifest.v1+json",
        },
    )
    assert head.headers["x-variant-label"] == "cu128"
    assert head.headers["docker-content-digest"] == digests["cu128"]
