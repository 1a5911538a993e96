"""``--gpus`` (Docker's syntax) on heterogeneous hosts: choose for exactly those devices."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from clirun import run_cli
from docker_variant.errors import InvalidInputError
from docker_variant.providers import HostReport
from docker_variant.providers.gpus import GpuRequest, choose_devices, parse_gpus
from docker_variant.vendors import nvidia

HOSTS = Path(__file__).parent / "fixtures" / "hostroot"
CPU = {"x86_64": {"level": ["v3", "v2", "v1"]}}
H200 = {"nvidia": nvidia.supported_features((12, 8), (9, 0))}
L4 = {"nvidia": nvidia.supported_features((12, 8), (8, 9))}
H200_UUID = "GPU-5a2f7c1e-0d3b-4e8a-9c61-2f0b7d4e9a10"
L4_UUID = "GPU-8c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"


def index_of(variants: dict[str, Any]) -> dict[str, Any]:
    return {
        "default-priorities": {"namespace": ["nvidia", "amd", "x86_64"]},
        "variants": variants,
        "images": {
            label: {
                "tag": f"1.0.0-{label}",
                "digest": "sha256:" + hashlib.sha256(label.encode()).hexdigest(),
            }
            for label in variants
        },
    }


NVIDIA_SET = index_of(
    {
        "cu128sm90": {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}},
        "cu128sm89": {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["89_real"]}},
        # code for both GPUs, built against an older CUDA: ranks below either on one GPU
        "cu126fat": {
            "nvidia": {"cuda_version_lower_bound": ["12.6"], "sm_arch": ["89_real", "90_real"]}
        },
        "null": {},
    }
)
AMD_SET = index_of(
    {
        "rocm63gfx90a": {"amd": {"gfx_arch": ["gfx90a"], "rocm_version": ["6.3"]}},
        "rocm63gfx1100": {"amd": {"gfx_arch": ["gfx1100"], "rocm_version": ["6.3"]}},
        "null": {},
    }
)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    host = HostReport(
        {
            "nvidia": {
                f: list(dict.fromkeys([*H200["nvidia"][f], *L4["nvidia"][f]]))
                for f in H200["nvidia"]
            },
            **CPU,
        },
        {"nvidia": {H200_UUID: H200, L4_UUID: L4}},
    )
    paths = {
        "h200_l4": host.to_json(),
        "nvidia_set": NVIDIA_SET,
        "amd_set": AMD_SET,
    }
    out = {}
    for name, data in paths.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        out[name] = str(path)
    return out


@pytest.mark.parametrize(
    ("text", "request_"),
    [
        ("all", GpuRequest()),
        ("2", GpuRequest(2)),
        ("count=1", GpuRequest(1)),
        ("device=0,2", GpuRequest(None, ("0", "2"))),
        ('"device=0,1"', GpuRequest(None, ("0", "1"))),
        (f"device={H200_UUID}", GpuRequest(None, (H200_UUID,))),
        ("all,capabilities=utility", GpuRequest()),
    ],
)
def test_docker_gpus_syntax(text: str, request_: GpuRequest) -> None:
    assert parse_gpus(text) == request_


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "expected all"),
        ("bogus=1", "unknown option 'bogus'"),
        ("9" * 5000, "not a decimal number"),
        ("0", "count of 0"),
        ("2,device=1", "not both"),
    ],
)
def test_bad_gpus_values(text: str, needle: str) -> None:
    with pytest.raises(InvalidInputError, match=needle):
        parse_gpus(text)


def test_choose_devices_by_index_id_and_count() -> None:
    report = HostReport(
        {**CPU, "nvidia": H200["nvidia"]}, {"nvidia": {H200_UUID: H200, L4_UUID: L4}}
    )
    chosen = choose_devices(report, parse_gpus("device=1"), "device=1")
    assert chosen.host == {**CPU, **L4}
    assert list(chosen.devices) == [f"1 ({L4_UUID})"]
    assert choose_devices(report, parse_gpus(f"device={H200_UUID}"), "x").host == {**CPU, **H200}
    assert len(choose_devices(report, parse_gpus("all"), "all").devices) == 2
    for text, needle in (
        ("device=2", "does not exist"),
        ("3", "3 devices asked"),
        ("device=GPU-0", "no device 'GPU-0'"),
    ):
        with pytest.raises(InvalidInputError, match=needle):
            choose_devices(report, parse_gpus(text), text)
    with pytest.raises(InvalidInputError, match="no accelerator devices"):
        choose_devices(HostReport(CPU), parse_gpus("all"), "all")


def test_pull_gpus_device_1_picks_the_variant_for_that_device(
    files: dict[str, str], tmp_path: Path
) -> None:
    ref = "localhost:5000/app:1.0.0"
    base = (
        "--providers-file",
        files["h200_l4"],
        "pull",
        ref,
        "--index",
        files["nvidia_set"],
        "--dry-run",
    )
    done = run_cli(*base, "--gpus", "device=1", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == f'Selected variant "cu128sm89" of {ref.rsplit(":", 1)[0]} version 1.0.0'
    )
    done = run_cli(*base, "--gpus", "device=0", tmp=tmp_path)
    assert '"cu128sm90"' in done.stdout, done.stderr
    # both devices: only the build with code for both runs on each of them
    done = run_cli(*base, "--gpus", "all", tmp=tmp_path)
    assert '"cu126fat"' in done.stdout, done.stderr


def test_without_gpus_ls_says_which_variants_fit_only_some_devices(
    files: dict[str, str], tmp_path: Path
) -> None:
    done = run_cli(
        "--providers-file",
        files["h200_l4"],
        "ls",
        "--index",
        files["nvidia_set"],
        "--json",
        tmp=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["selected"]["label"] == "cu128sm90"  # the host's aggregate lists, as before
    notes = data["some_devices"]
    assert set(notes) == {"cu128sm90", "cu128sm89"}
    assert notes["cu128sm90"].startswith(f"fits 1 of 2 devices (not 1 ({L4_UUID})")
    text = run_cli(
        "--providers-file", files["h200_l4"], "ls", "--index", files["nvidia_set"], tmp=tmp_path
    )
    assert "note: cu128sm89: fits 1 of 2 devices" in text.stdout


def test_heterogeneous_amd_host_root(files: dict[str, str], tmp_path: Path) -> None:
    root = ("--host-root", str(HOSTS / "mi210-navi31"))
    resolve = (*root, "resolve", "--index", files["amd_set"])
    for gpus, label in (("device=0", "rocm63gfx90a"), ("device=1", "rocm63gfx1100")):
        done = run_cli(*resolve, "--gpus", gpus, tmp=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"1.0.0-{label}"
    done = run_cli(*resolve, "--gpus", "all", "--json", tmp=tmp_path)
    assert json.loads(done.stdout)["label"] == "null"  # neither build runs on both GPUs
    done = run_cli(*root, "ls", "--index", files["amd_set"], "--gpus", "all", tmp=tmp_path)
    assert "does not fit device" in done.stdout
    done = run_cli(*resolve, "--gpus", "device=7", tmp=tmp_path)
    assert done.returncode == 2 and "device 7 does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_providers_names_each_amd_device_and_ls_notes_partial_fits(
    files: dict[str, str], tmp_path: Path
) -> None:
    root = str(HOSTS / "mi210-navi31")
    done = run_cli("--host-root", root, "providers", "--devices", tmp=tmp_path)
    assert "amd device 0000:03:00.0: gfx90a (Instinct" in done.stdout
    assert "amd device 0000:0c:00.0: gfx1100 (Radeon RX 7900" in done.stdout
    done = run_cli("--host-root", root, "ls", "--index", files["amd_set"], "--json", tmp=tmp_path)
    data = json.loads(done.stdout)
    assert data["selected"]["label"] == "rocm63gfx1100"  # gfx1100 first in the host's list
    assert data["some_devices"]["rocm63gfx1100"].startswith(
        "fits 1 of 2 devices (not 0 (0000:03:00.0): amd :: gfx_arch needs one of gfx1100"
    )
