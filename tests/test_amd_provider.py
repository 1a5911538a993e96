"""The built-in ``amd`` provider over host-root fixtures shaped like real KFD sysfs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from docker_variant import vendors
from docker_variant.errors import InvalidInputError
from docker_variant.providers import HostRoot, detect_host
from docker_variant.providers.amd import detect, parse_properties, read_gpus
from docker_variant.vendors import amd as amd_rules

HOSTS = Path(__file__).parent / "fixtures" / "hostroot"
NO_CONFIG = {"HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent"}
MI300X_ROCM = ["6.4", "7.0", "6.3", "6.2", "6.1"]  # host ROCm 6.4.1 first, then driver 6.12.12's


def amd_of(host: str, **env: str) -> tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    report = detect(HostRoot(HOSTS / host), env)
    return report.host, {dev: lists["amd"] for dev, lists in report.devices.items()}


@pytest.mark.parametrize(
    ("target_version", "name"),
    [(90402, "gfx942"), (90010, "gfx90a"), (110000, "gfx1100"), (90500, "gfx950"), (0, None)],
)
def test_gfx_target_names(target_version: int, name: str | None) -> None:
    assert vendors.amd.gfx_name(target_version) == name


def test_mi300x_host_and_devices() -> None:
    host, devices = amd_of("mi300x")
    assert host == {"gfx_arch": ["gfx942"], "rocm_version": MI300X_ROCM}
    assert len(devices) == 8
    assert next(iter(devices)) == "0000:05:00.0"  # the node's domain and location_id
    assert all(lists == host for lists in devices.values())


def test_heterogeneous_host_lists_each_gpu_with_its_own_target() -> None:
    host, devices = amd_of("mi210-navi31")
    rocm = ["7.0", "6.4", "6.3", "6.2", "6.1"]  # driver 6.10.5 (ROCm 6.3's), no host ROCm
    assert host == {"gfx_arch": ["gfx1100", "gfx90a"], "rocm_version": rocm}
    assert devices == {
        "0000:03:00.0": {"gfx_arch": ["gfx90a"], "rocm_version": rocm},
        "0000:0c:00.0": {"gfx_arch": ["gfx1100"], "rocm_version": rocm},
    }


def test_mi355x_and_mi250x() -> None:
    host, devices = amd_of("mi355x")
    # driver 30.10 runs ROCm 6.2 to 7.0, but the MI350 series needs 7.0 (the host's ROCm 7.0)
    assert host == {"gfx_arch": ["gfx950"], "rocm_version": ["7.0"]}
    assert len(devices) == 8
    assert all(lists["rocm_version"] == ["7.0"] for lists in devices.values())
    host, devices = amd_of("mi250x")
    assert host["gfx_arch"] == ["gfx90a"] and len(devices) == 2  # two GCDs, two devices
    assert host["rocm_version"] == ["7.0", "6.4", "6.3", "6.2", "6.1", "6.0"]  # driver 6.8.5


@pytest.mark.parametrize("host", ["empty", "warboy"])
def test_no_amd_gpu_is_an_empty_namespace(host: str) -> None:
    assert amd_of(host) == ({}, {})


def test_the_cpu_node_and_big_ids_are_read_like_real_files() -> None:
    text = (HOSTS / "mi300x/sys/class/kfd/kfd/topology/nodes/2/properties").read_text()
    props = parse_properties(text)
    assert props["gfx_target_version"] == 90402 and props["device_id"] == 0x74A1
    assert "hive_id" not in props  # 19 digits: beyond what is read, skipped, not a crash
    gpus = read_gpus(HostRoot(HOSTS / "mi300x"))
    assert [g.node for g in gpus] == list(range(2, 10))  # nodes 0 and 1 are the CPUs


def test_overrides(tmp_path: Path) -> None:
    host, devices = amd_of("mi300x", AMD_VARIANT_PROVIDER_GFX_ARCH="gfx90a,gfx942")
    assert host["gfx_arch"] == ["gfx90a", "gfx942"]  # as given
    assert all(lists["gfx_arch"] == ["gfx90a", "gfx942"] for lists in devices.values())
    host, _ = amd_of("mi300x", AMD_VARIANT_PROVIDER_ROCM_VERSION="6.2.1")
    assert host["rocm_version"] == ["6.2"]
    host, _ = amd_of("empty", AMD_VARIANT_PROVIDER_GFX_ARCH="gfx1100")
    assert host["gfx_arch"] == ["gfx1100"]  # like NV_VARIANT_PROVIDER_FORCE_SM_ARCH
    with pytest.raises(InvalidInputError, match="AMD_VARIANT_PROVIDER_GFX_ARCH"):
        amd_of("mi300x", AMD_VARIANT_PROVIDER_GFX_ARCH="942")
    with pytest.raises(InvalidInputError, match="AMD_VARIANT_PROVIDER_ROCM_VERSION"):
        amd_of("mi300x", AMD_VARIANT_PROVIDER_ROCM_VERSION="1" * 5000)


def test_driver_versions_between_and_beyond_the_table(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(HOSTS / "mi210-navi31", root)
    version = root / "sys/module/amdgpu/version"
    version.write_text("6.11.3\n")  # between 6.10.5 (ROCm 6.3) and 6.12.12: the older row
    assert detect(HostRoot(root), {}).host["rocm_version"] == ["7.0", "6.4", "6.3", "6.2", "6.1"]
    version.write_text("6.14.14\n")  # driver 30.10 (ROCm 7.0)
    assert detect(HostRoot(root), {}).host["rocm_version"] == ["7.0", "6.4", "6.3", "6.2"]
    for module in ("6.16.6", "6.16.13"):  # drivers 30.20 (ROCm 7.1) and 30.30 (ROCm 7.2)
        version.write_text(module + "\n")
        assert detect(HostRoot(root), {}).host["rocm_version"] == [
            "7.2",
            "7.1",
            "7.0",
            "6.4",
            "6.3",
        ]
    version.write_text("6.99.0\n")  # newer than the newest known: runs what 30.30 runs
    assert detect(HostRoot(root), {}).host["rocm_version"] == ["7.2", "7.1", "7.0", "6.4", "6.3"]
    version.unlink()  # the in-tree driver: no version, no release known
    assert detect(HostRoot(root), {}).host == {"gfx_arch": ["gfx1100", "gfx90a"]}
    version.write_text("9" * 5000 + "\n")
    assert "rocm_version" not in detect(HostRoot(root), {}).host


def test_detect_host_reads_under_the_host_root_and_says_who_answered() -> None:
    report = detect_host(env=NO_CONFIG, host_root=HOSTS / "mi300x", use_cache=False)
    assert report.host["amd"]["gfx_arch"] == ["gfx942"]
    assert len(report.devices["amd"]) == 8
    assert report.sources["amd"].startswith("built-in (KFD sysfs")
    env = {**NO_CONFIG, "DOCKER_VARIANT_HOST_ROOT": str(HOSTS / "mi210-navi31")}
    assert detect_host(env=env, use_cache=False).host["amd"]["gfx_arch"] == ["gfx1100", "gfx90a"]
    with pytest.raises(InvalidInputError, match="--host-root"):
        detect_host(env=NO_CONFIG, host_root=HOSTS / "nowhere", use_cache=False)


def test_a_target_lists_only_the_releases_that_run_it() -> None:
    releases = ["7.0", "6.4", "6.3", "6.2"]
    assert amd_rules.releases_for("gfx950", releases) == ["7.0"]
    assert amd_rules.releases_for("gfx1201", releases) == ["7.0", "6.4"]
    assert amd_rules.releases_for("gfx942", releases) == releases
    assert not amd_rules.device_runs("rocm_version", "6.4", "gfx950", (6, 14, 14))
    assert amd_rules.device_runs("rocm_version", "6.4", "gfx942", (6, 14, 14))
