"""A vendor is one module: ``fakevendor`` (a made-up NPU) registered alone shows up in
detection, ``ls``, the contents checks, placements, the fleet page, ``k8s claim`` and the
node labels, with no other edit; unregistered, every layer treats ``fakenpu`` as an unknown namespace."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest

import fakevendor
from docker_variant import vendors
from docker_variant.cli.app import main
from docker_variant.contents.check import LabelsUnsupportedError, check_contents, needs_check
from docker_variant.contents.evidence import ELF, Finding
from docker_variant.contents.properties import propose
from docker_variant.contents.walker import ImageContents
from docker_variant.k8s.claim import claim_template, plan_claim
from docker_variant.k8s.labels import host_lists, node_affinity, node_labels
from docker_variant.numtext import natural_key
from docker_variant.providers import detect_host
from docker_variant.scheduler import fleet
from docker_variant.variant import VariantIndex
from test_k8s_claim import K8S_VERSIONS
from test_scheduler_api import api, put_agent, sqlite_store, store
from test_scheduler_support import X86_V4

__all__ = ["api", "sqlite_store", "store"]  # the fixtures, used by name

NPU3 = fakevendor.lists_of(3, "2.1")
NPU2 = fakevendor.lists_of(2, None)
VARIANTS = {
    "npu3": {"fakenpu": {"gen": ["g3"], "runtime": ["2.1"]}},
    "npu2": {"fakenpu": {"gen": ["g2"]}},
    "null": {},
}
INDEX = {
    "default-priorities": {"namespace": ["fakenpu", "x86_64"]},
    "variants": VARIANTS,
    "images": {label: {"tag": f"1.0-{label}", "digest": ""} for label in VARIANTS},
}


@pytest.fixture
def fake_vendor() -> Iterator[vendors.Vendor]:
    vendors.register(fakevendor.VENDOR)
    try:
        yield fakevendor.VENDOR
    finally:
        vendors.unregister(fakevendor.NAMESPACE)


@pytest.fixture
def npu_host(tmp_path: Path) -> Path:
    """A host root with two NPUs: ``npu0`` of generation 3 (runtime 2.1), ``npu1`` of 2."""
    root = tmp_path / "root"
    for name, generation, runtime in (("npu0", "3", "2.1"), ("npu1", "2", None)):
        device = root / "sys" / "class" / "fakenpu" / name
        device.mkdir(parents=True)
        (device / "generation").write_text(generation + "\n")
        if runtime:
            (device / "runtime").write_text(runtime + "\n")
    return root


def _detect(root: Path, tmp_path: Path) -> Any:
    return detect_host(env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, host_root=root)


def test_detection_runs_the_registered_detector(
    npu_host: Path, tmp_path: Path, fake_vendor: vendors.Vendor
) -> None:
    report = _detect(npu_host, tmp_path)
    assert report.host["fakenpu"] == NPU3
    assert report.devices["fakenpu"] == {"npu0": {"fakenpu": NPU3}, "npu1": {"fakenpu": NPU2}}
    assert report.sources["fakenpu"] == f"built-in (fake sysfs under {npu_host})"
    vendors.unregister("fakenpu")
    assert "fakenpu" not in _detect(npu_host, tmp_path).host


def test_ls_names_the_devices_in_the_vendors_words(
    npu_host: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fake_vendor: vendors.Vendor,
) -> None:
    for name in ("DOCKER_VARIANT_PROVIDERS_FILE", "DOCKER_VARIANT_HOST_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    index = tmp_path / "index.json"
    index.write_text(json.dumps(INDEX))
    argv = ["--host-root", str(npu_host), "ls", "--index", str(index), "--gpus", "all"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code in (0, None), err
    assert "for GPUs 0 (gen 3: Fake N3), 1 (gen 2: Fake N2)" in out + err


def _npu_elf(generation: int) -> ImageContents:
    finding = Finding(ELF, "/opt/npu/kernels.so", "ELF header", f"fakenpu-g{generation}")
    return ImageContents((finding,), (), 1, 0)


def test_the_contents_checks_ask_the_vendor(fake_vendor: vendors.Vendor) -> None:
    proposal = propose(_npu_elf(3))
    assert [str(p) for p in proposal.properties] == ["fakenpu :: gen :: g3"]
    assert proposal.label == "npu3"
    labels = {"dev.pep817.variant-label": "npu2", "dev.pep817.variant.fakenpu.gen": "g2"}
    assert needs_check(labels)
    with pytest.raises(LabelsUnsupportedError, match=r"kernels\.so needs generation 3"):
        check_contents("app:1-npu2", labels, _npu_elf(3))
    verdict = check_contents("app:1-npu2", labels, _npu_elf(2))
    assert verdict.checked == ["fakenpu :: gen :: g2"]


def test_unregistered_the_contents_say_nothing_of_it() -> None:
    assert propose(_npu_elf(3)).properties == ()
    labels = {"dev.pep817.variant-label": "npu2", "dev.pep817.variant.fakenpu.gen": "g2"}
    assert not needs_check(labels)


def test_placements_and_the_fleet_page_use_the_vendor(
    api: httpx.Client, fake_vendor: vendors.Vendor
) -> None:
    devices = {"npu0": {"fakenpu": NPU3}, "npu1": {"fakenpu": NPU2}}
    put_agent(api, "edge", {"host": {**X86_V4, "fakenpu": NPU3}, "devices": {"fakenpu": devices}})
    one = api.post("/v1/placements", json={"index": INDEX, "nodes": 1, "devices_per_node": 1})
    assert one.status_code == 201, one.text
    assert one.json()["variant"] == "npu3"
    assert one.json()["allocations"][0]["devices"] == ["npu0"]
    # the vendor's value rule holds for placements too
    bad = {**INDEX, "variants": {**VARIANTS, "npu3": {"fakenpu": {"gen": ["three"]}}}}
    refused = api.post("/v1/placements", json={"index": bad, "nodes": 1, "devices_per_node": 1})
    assert refused.status_code == 400 and "a generation such as g3" in refused.text
    described = fleet.describe({**X86_V4, "fakenpu": NPU3})
    assert (described.product, described.driver) == ("gen 3 (Fake N3)", "FakeRT 2.1")
    page = api.get("/ui")
    assert page.status_code == 200 and "gen 2 (Fake N2)" in page.text


def test_the_claim_asks_the_vendors_dra_driver(fake_vendor: vendors.Vendor) -> None:
    plan = plan_claim(VariantIndex.from_json(INDEX, "test"))
    assert [(sub.name, sub.vendor) for sub in plan.subrequests] == [
        ("npu3", "fakenpu"),
        ("npu2", "fakenpu"),
        ("null", "fakenpu"),
    ]
    assert plan.subrequests[1].selectors == (
        'has(device.attributes["npu.fake.example"].generation) && '
        'device.attributes["npu.fake.example"].generation >= 2',
    )
    doc = claim_template(plan, name="npu", count=2)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)
    devices = doc["spec"]["spec"]["devices"]
    assert {sub["deviceClassName"] for sub in devices["requests"][0]["firstAvailable"]} == {
        "npu.fake.example"
    }
    assert devices["constraints"][0]["matchAttribute"] == "npu.fake.example/productName"


def test_unregistered_the_claim_leaves_the_namespace_out() -> None:
    plan = plan_claim(VariantIndex.from_json(INDEX, "test"))
    assert set(plan.left_out) == {"npu3", "npu2"}
    assert "not the device attributes of a DRA driver" in plan.left_out["npu2"]


PREFIX = "variant.pep817.dev/"


def test_the_node_labels_say_a_list_by_the_vendors_shape_of_it(
    fake_vendor: vendors.Vendor,
) -> None:
    """The vendor's ``Threshold`` for ``gen``: one label says a generation-3 node's three
    values, reads back to them, and a variant needing g2 holds where the label is above 1."""
    labels = node_labels({"fakenpu": NPU3}).labels
    assert labels == {f"{PREFIX}fakenpu.gen": "3", f"{PREFIX}fakenpu.runtime.2.1": "true"}
    assert host_lists(labels) == {"fakenpu": NPU3}
    affinity = node_affinity({"fakenpu": {"gen": ["g2"]}})
    assert affinity["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": f"{PREFIX}fakenpu.gen", "operator": "Gt", "values": ["1"]}]}
    ]


def test_unregistered_the_node_labels_say_each_value() -> None:
    labels = node_labels({"fakenpu": NPU3}).labels
    assert set(labels) == {
        f"{PREFIX}fakenpu.gen.g3", f"{PREFIX}fakenpu.gen.g2", f"{PREFIX}fakenpu.gen.g1",
        f"{PREFIX}fakenpu.runtime.2.1",
    }  # fmt: skip


def test_one_natural_order_for_ids_and_values() -> None:
    """Device ids sort by it; values without a vendor's rule order by it, newest first."""
    ids = ["gpu10", "gpu2", "0000:0c:00.0", "0000:03:00.0"]
    assert sorted(ids, key=natural_key) == ["0000:03:00.0", "0000:0c:00.0", "gpu2", "gpu10"]
    values = ["v9", "v10", "10", "v9a"]
    assert vendors.newest_first("furiosa", "arch", values) == sorted(
        values, key=natural_key, reverse=True
    )
    assert vendors.newest_first("furiosa", "arch", values) == ["10", "v10", "v9a", "v9"]
