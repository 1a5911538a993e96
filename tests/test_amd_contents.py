"""``amd :: gfx_arch`` labels checked against an image's HIP offload bundles: the push and
publish check refuses a target some bundle has no code object for (a code object runs on its
own gfx target only, ``vendors.amd``); a value that is no gfx target is bad input."""

from __future__ import annotations

import io
import struct
import subprocess
import tarfile

import pytest

from docker_variant.contents.check import LabelsUnsupportedError, check_contents, needs_check
from docker_variant.contents.offload import BUNDLE_MAGIC
from docker_variant.contents.properties import propose
from docker_variant.contents.walker import ImageContents, merge_layers, scan_layer
from docker_variant.errors import InvalidInputError
from docker_variant.variant.labels import read_labels
from realbinaries import compile_avx2


def bundle(*targets: str) -> bytes:
    ids = [b"host-x86_64-unknown-linux--"]
    ids += [f"hipv4-amdgcn-amd-amdhsa--{t}:xnack-".encode() for t in targets]
    table = b""
    offset = len(BUNDLE_MAGIC) + 8 + sum(24 + len(i) for i in ids)
    for bundle_id in ids:
        table += struct.pack("<QQQ", offset, 16, len(bundle_id)) + bundle_id
        offset += 16
    return BUNDLE_MAGIC + struct.pack("<Q", len(ids)) + table + b"\0" * 16 * len(ids)


@pytest.fixture(scope="module")
def contents(tmp_path_factory: pytest.TempPathFactory) -> ImageContents:
    """Two libraries: one with code for gfx90a and gfx942, one for gfx942 and gfx1100."""
    tmp = tmp_path_factory.mktemp("hip")
    binary = compile_avx2(tmp)
    members = []
    for name, targets in (
        ("libattn.so", ("gfx90a", "gfx942")),
        ("libgemm.so", ("gfx942", "gfx1100")),
    ):
        blob = tmp / f"{name}.bundle"
        blob.write_bytes(bundle(*targets))
        out = tmp / name
        subprocess.run(
            ["objcopy", "--add-section", f".hip_fatbin={blob}", str(binary), str(out)], check=True
        )
        members.append((f"opt/rocm-app/lib/{name}", out.read_bytes()))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return merge_layers([scan_layer(io.BytesIO(buffer.getvalue()), "layer0", None)])


def labels(label: str, gfx: str) -> dict[str, str]:
    return {"dev.pep817.variant-label": label, "dev.pep817.variant.amd.gfx_arch": gfx}


def test_proposal_is_the_targets_every_bundle_has(contents: ImageContents) -> None:
    proposed = [str(p) for p in propose(contents).properties if p.namespace == "amd"]
    assert proposed == ["amd :: gfx_arch :: gfx942"]


def test_a_target_with_code_in_every_bundle_passes(contents: ImageContents) -> None:
    assert needs_check(labels("mi300", "gfx942"))
    verdict = check_contents("app:1-mi300", labels("mi300", "gfx942"), contents)
    assert verdict.errors == [] and verdict.checked == ["amd :: gfx_arch :: gfx942"]


@pytest.mark.parametrize("gfx", ["gfx90a", "gfx1100", "gfx942,gfx950"])
def test_a_target_some_bundle_lacks_is_refused(contents: ImageContents, gfx: str) -> None:
    with pytest.raises(LabelsUnsupportedError) as caught:
        check_contents("app:1-rocm", labels("rocm", gfx), contents)
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert "has code objects for" in message and "--no-verify" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("raw", "needle"),
    [("942", "is not a gfx target"), ("gfx" + "9" * 5000, "is not a gfx target")],
)
def test_a_value_that_is_no_gfx_target_is_bad_input(raw: str, needle: str) -> None:
    with pytest.raises(InvalidInputError, match=needle):
        read_labels(labels("rocm", raw))


def test_rocm_version_takes_one_value() -> None:
    with pytest.raises(InvalidInputError, match="takes one value"):
        read_labels(
            {"dev.pep817.variant-label": "rocm", "dev.pep817.variant.amd.rocm_version": "6.4,6.3"}
        )
