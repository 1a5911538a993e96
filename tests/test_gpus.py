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
    # the spec's sentence first, as scripts read it; then whom it was chosen for
    assert done.stdout.strip() == (
        f'Selected variant "cu128sm89" of {ref.rsplit(":", 1)[0]} version 1.0.0'
        " for GPU 1 (sm 8.9: L4, L40S, RTX 40)"
    )
    done = run_cli(*base, "--gpus", "device=0", tmp=tmp_path)
    assert '"cu128sm90"' in done.stdout, done.stderr
    # both devices: only the build with code for both runs on each of them
    done = run_cli(*base, "--gpus", "all", tmp=tmp_path)
    assert '"cu126fat"' in done.stdout, done.stderr


def test_without_gpus_ls_chooses_for_every_gpu_as_docker_run_gpus_all(
    files: dict[str, str], tmp_path: Path
) -> None:
    """No --gpus is --gpus all: a variant with code for one GPU only is not compatible (the
    reason names the device it does not fit), and the output says whom it chose for."""
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
    assert data["chosen"]["label"] == "cu126fat"
    assert data["gpus"] == ["0 (sm 9.0: H100, H200, GH200)", "1 (sm 8.9: L4, L40S, RTX 40)"]
    reasons = {c["label"]: c.get("reason") for c in data["variants"] if not c["compatible"]}
    assert reasons["cu128sm90"].startswith(f"does not fit device 1 ({L4_UUID}): nvidia :: sm_arch")
    assert reasons["cu128sm89"].startswith(
        f"does not fit device 0 ({H200_UUID}): nvidia :: sm_arch"
    )
    text = run_cli(
        "--providers-file", files["h200_l4"], "ls", "--index", files["nvidia_set"], tmp=tmp_path
    )
    assert "for GPUs 0 (sm 9.0: H100, H200, GH200), 1 (sm 8.9: L4, L40S, RTX 40)" in text.stdout


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


def test_alike_gpus_are_named_once(tmp_path: Path) -> None:
    """Eight MI300X are one run of numbers with one description, not eight; the JSON still
    names each device."""
    rocm_app = str(Path(__file__).resolve().parent.parent / "examples" / "rocm-app-1.0.0.json")
    root = ("--host-root", str(HOSTS / "mi300x"))
    done = run_cli(*root, "resolve", "--index", rocm_app, "--gpus", "all", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    (note,) = [line for line in done.stderr.splitlines() if "for GPUs" in line]
    assert note.endswith(
        "for GPUs 0-7 (gfx942: Instinct MI300A, MI300X, MI308X, MI325X, MI300X VF)"
    )
    done = run_cli(*root, "resolve", "--index", rocm_app, "--gpus", "device=0,2,3", tmp=tmp_path)
    assert "for GPUs 0, 2, 3 (gfx942:" in done.stderr
    done = run_cli(*root, "resolve", "--index", rocm_app, "--json", tmp=tmp_path)
    assert len(json.loads(done.stdout)["gpus"]) == 8


def test_providers_names_each_amd_device_and_ls_notes_partial_fits(
    files: dict[str, str], tmp_path: Path
) -> None:
    root = str(HOSTS / "mi210-navi31")
    done = run_cli("--host-root", root, "providers", "--devices", tmp=tmp_path)
    assert "amd device 0000:03:00.0: gfx90a (Instinct" in done.stdout
    assert "amd device 0000:0c:00.0: gfx1100 (Radeon RX 7900" in done.stdout
    done = run_cli("--host-root", root, "ls", "--index", files["amd_set"], "--json", tmp=tmp_path)
    data = json.loads(done.stdout)
    assert data["chosen"]["label"] == "null"  # neither build runs on both GPUs
    (gfx1100,) = [c for c in data["variants"] if c["label"] == "rocm63gfx1100"]
    assert gfx1100["reason"].startswith(
        "does not fit device 0 (0000:03:00.0): amd :: gfx_arch needs one of gfx1100"
    )


# --- the H200 + L4 host of examples/hosts and the pytorch example ---------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MIXED = str(EXAMPLES / "hosts" / "h200-l4.json")
PYTORCH = str(EXAMPLES / "pytorch-2.12.0.json")
BOTH = "for GPUs 0 (sm 9.0: H100, H200, GH200), 1 (sm 8.9: L4, L40S, RTX 40)"


@pytest.mark.parametrize(
    ("gpus", "label"),
    [
        ((), "cu126"),  # default: every GPU, as docker run --gpus all
        (("--gpus", "all"), "cu126"),
        (("--gpus", "2"), "cu126"),
        (("--gpus", "device=0,1"), "cu126"),
        (("--gpus", '"device=0,1"'), "cu126"),
        (("--gpus", "device=0"), "cu128"),  # the H200 alone: its own best
        (("--gpus", f"device={H200_UUID}"), "cu128"),
        (("--gpus", "1"), "cu128"),  # the first device: the H200
        (("--gpus", "device=1"), "cu126"),  # the L4 alone
    ],
)
def test_mixed_host_resolve_chooses_for_the_gpus_the_container_gets(
    gpus: tuple[str, ...], label: str, tmp_path: Path
) -> None:
    """pytorch's cu128 has sm_90/sm_100 code only: on the H200 + L4 host it runs on the H200,
    not the L4; cu126 (sm_80 ... sm_90) runs on both."""
    done = run_cli("--providers-file", MIXED, "resolve", "--index", PYTORCH, *gpus, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"2.12.0-{label}\n"  # stdout stays the reference alone
    assert f"docker-variant: chose {label} for GPU" in done.stderr


def test_mixed_host_pull_says_which_gpus_it_chose_for(tmp_path: Path) -> None:
    ref = "reg.example/app:1.0.0"
    base = ("--providers-file", MIXED, "pull", ref, "--index", PYTORCH, "--dry-run")
    done = run_cli(*base, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f'Selected variant "cu126" of reg.example/app version 1.0.0 {BOTH}\n'
    done = run_cli(*base, "--gpus", "device=0", tmp=tmp_path)
    assert done.stdout == (
        'Selected variant "cu128" of reg.example/app version 1.0.0'
        " for GPU 0 (sm 9.0: H100, H200, GH200)\n"
    )
    done = run_cli("--json", *base, tmp=tmp_path)
    data = json.loads(done.stdout)
    assert (data["label"], data["chosen"]["reference"]) == ("cu126", "reg.example/app:2.12.0-cu126")
    assert len(data["gpus"]) == 2


def test_mixed_host_ls_marks_cu128_as_not_running_on_the_l4(tmp_path: Path) -> None:
    done = run_cli("--providers-file", MIXED, "ls", "--index", PYTORCH, "--json", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["chosen"]["label"] == "cu126"
    (cu128,) = [c for c in data["variants"] if c["label"] == "cu128"]
    assert not cu128["compatible"]
    assert cu128["reason"].startswith(f"does not fit device 1 ({L4_UUID})")
    quiet = run_cli("--providers-file", MIXED, "ls", "--index", PYTORCH, "-q", tmp=tmp_path)
    assert "2.12.0-cu128" not in quiet.stdout.split()
    assert quiet.stdout.split()[0] == "2.12.0-cu126"
    narrowed = run_cli(
        "--providers-file", MIXED, "ls", "--index", PYTORCH, "--gpus", "device=0", "--json",
        tmp=tmp_path,
    )  # fmt: skip
    assert json.loads(narrowed.stdout)["chosen"]["label"] == "cu128"


def test_a_host_whose_gpus_are_alike_chooses_as_before(tmp_path: Path) -> None:
    """One kind of GPU: no note on stderr, the same choice as the host's own lists."""
    one = tmp_path / "h200.json"
    one.write_text(json.dumps(HostReport({**CPU, **H200}, {"nvidia": {H200_UUID: H200}}).to_json()))
    done = run_cli("--providers-file", str(one), "resolve", "--index", PYTORCH, tmp=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "2.12.0-cu128\n", "")
    flat = run_cli(
        "--providers-file", str(EXAMPLES / "hosts" / "h200-r570.json"), "pull",
        "reg.example/app:1.0.0", "--index", PYTORCH, "--dry-run", tmp=tmp_path,
    )  # fmt: skip
    # no devices described: the spec's sentence alone
    assert flat.stdout == 'Selected variant "cu128" of reg.example/app version 1.0.0\n'


def test_a_cuda_build_is_judged_on_the_nvidia_gpus_only() -> None:
    """On a host with an NVIDIA and an AMD GPU, all GPUs: a CUDA build must run on each
    NVIDIA GPU, a ROCm build on each AMD one; neither on the other vendor's."""
    from docker_variant.variant import VariantIndex, select

    mi210 = {"amd": {"gfx_arch": ["gfx90a"], "rocm_version": ["6.3", "6.2"]}}
    report = HostReport(
        {**CPU, **H200, **mi210},
        {"nvidia": {H200_UUID: H200}, "amd": {"0000:03:00.0": mi210}},
    )
    chosen = choose_devices(report)
    index = VariantIndex.from_json(
        index_of(
            {
                "cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}},
                "rocm63": {"amd": {"gfx_arch": ["gfx90a"], "rocm_version": ["6.3"]}},
                "null": {},
            }
        ),
        "test",
    )
    selection = select(index, chosen.host, None, chosen.devices)
    assert [c.label for c in selection.ranked] == ["cu128", "rocm63", "null"]
    assert not selection.rejected
