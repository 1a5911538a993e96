"""The nvidia namespace: wheelnext's lists, NVML and nvidia-smi readers, overrides.

Machines are fixtures shaped like the real tools' answers (tests/fixtures/nvidia): ``*.json``
holds what each NVML call returns, ``*.csv`` and ``*-q.txt`` what nvidia-smi prints.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from docker_variant.errors import InvalidInputError
from docker_variant.providers import nvidia
from docker_variant.providers.nvidia import (
    CUDA_ENV,
    SM_ARCH_ENV,
    Gpu,
    NvidiaReport,
    NvidiaSystem,
    cuda_lower_bounds,
    cuda_upper_bounds,
    detect,
    nvidia_features,
    read_nvidia_smi,
    read_nvml,
    sm_arch_values,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia"
MACHINES = sorted(p.stem for p in FIXTURES.glob("*.json"))
LOWER, UPPER, SM = "cuda_version_lower_bound", "cuda_version_upper_bound", "sm_arch"

# wheelnext's catalogue order: majors 15..11, minors 20..0, each major then its bare major.
CATALOGUE = [
    value
    for major in range(15, 10, -1)
    for value in [*(f"{major}.{minor}" for minor in range(20, -1, -1)), f"{major}"]
]


def as_version(value: str) -> tuple[int, int]:
    major, _, minor = value.partition(".")
    return int(major), int(minor or 0)


# --------------------------------------------------------------------------- fakes


class FakeNVMLError(Exception):
    pass


class FakeLibraryNotFound(FakeNVMLError):
    pass


class FakeNvml:
    """Just enough of ``pynvml`` to answer from a machine fixture, with injectable faults."""

    NVMLError = FakeNVMLError
    NVMLError_LibraryNotFound = FakeLibraryNotFound

    def __init__(
        self,
        machine: dict[str, Any] | None,
        *,
        as_bytes: bool = False,
        broken: frozenset[str] = frozenset(),
        broken_devices: frozenset[int] = frozenset(),
    ) -> None:
        self.machine = machine
        self.as_bytes = as_bytes
        self.broken = broken
        self.broken_devices = broken_devices
        self.initialized = False
        self.calls: list[str] = []

    def _enter(self, name: str) -> dict[str, Any]:
        self.calls.append(name)
        if not self.initialized or self.machine is None:
            raise FakeNVMLError("Uninitialized")
        if name in self.broken:
            raise FakeNVMLError("Unknown Error")
        return self.machine

    def _out(self, text: str) -> str | bytes:
        return text.encode() if self.as_bytes else text

    def _device(self, name: str, handle: tuple[str, int]) -> dict[str, Any]:
        machine = self._enter(name)
        if handle[1] in self.broken_devices:
            raise FakeNVMLError("GPU is lost")
        device: dict[str, Any] = machine["devices"][handle[1]]
        return device

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.machine is None:
            raise FakeLibraryNotFound("NVML Shared Library Not Found")
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        if not self.initialized:
            raise FakeNVMLError("Uninitialized")
        self.initialized = False

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._enter("nvmlSystemGetCudaDriverVersion")["nvmlSystemGetCudaDriverVersion"])

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self._out(self._enter("nvmlSystemGetDriverVersion")["nvmlSystemGetDriverVersion"])

    def nvmlDeviceGetCount(self) -> int:
        return int(self._enter("nvmlDeviceGetCount")["nvmlDeviceGetCount"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        if index >= len(self._enter("nvmlDeviceGetHandleByIndex")["devices"]):
            raise FakeNVMLError("Invalid Argument")
        return ("handle", index)

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple[str, int]) -> tuple[int, int]:
        major, minor = self._device("nvmlDeviceGetCudaComputeCapability", handle)[
            "nvmlDeviceGetCudaComputeCapability"
        ]
        return int(major), int(minor)

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str | bytes:
        return self._out(self._device("nvmlDeviceGetName", handle)["nvmlDeviceGetName"])

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> str | bytes:
        return self._out(self._device("nvmlDeviceGetUUID", handle)["nvmlDeviceGetUUID"])


def load(machine: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{machine}.json").read_text())
    return data


def no_nvml() -> FakeNvml:
    return FakeNvml(None)


class FakeSmi:
    """A ``run`` for read_nvidia_smi that answers the two expected command lines from text."""

    def __init__(self, query: str | None, details: str | None) -> None:
        self.answers = {tuple(nvidia.SMI_QUERY): query, tuple(nvidia.SMI_DETAILS): details}
        self.calls: list[list[str]] = []

    @classmethod
    def of(cls, machine: str) -> FakeSmi:
        return cls(
            (FIXTURES / f"{machine}.csv").read_text(),
            (FIXTURES / f"{machine}-q.txt").read_text(),
        )

    def __call__(self, args: list[str]) -> str | None:
        self.calls.append(args)
        assert tuple(args) in self.answers, args
        return self.answers[tuple(args)]


def no_smi() -> FakeSmi:
    return FakeSmi(None, None)


# --------------------------------------------------------------------------- lists


def test_lists_for_12_7_match_wheelnext_example() -> None:
    lower = cuda_lower_bounds((12, 7))
    assert lower[:10] == [
        "12.7",
        "12.6",
        "12.5",
        "12.4",
        "12.3",
        "12.2",
        "12.1",
        "12.0",
        "12",
        "11.20",
    ]
    assert lower[-3:] == ["11.1", "11.0", "11"]
    assert len(lower) == 8 + 1 + 21 + 1

    upper = cuda_upper_bounds((12, 7))
    assert upper[:3] == ["15.20", "15.19", "15.18"]
    assert upper[20:23] == ["15.0", "15", "14.20"]
    assert upper[-4:] == ["12.11", "12.10", "12.9", "12.8"]
    assert "12" not in upper and "13" in upper
    assert len(upper) == 3 * 22 + 13


def test_bounds_partition_the_catalogue() -> None:
    """For every in-range driver the two lists are exactly {v <= D} and {v > D}, in order."""
    for value in (v for v in CATALOGUE if "." in v):
        driver = as_version(value)
        lower = [v for v in CATALOGUE if as_version(v) <= driver]
        upper = [v for v in CATALOGUE if as_version(v) > driver]
        assert cuda_lower_bounds(driver) == lower, value
        assert cuda_upper_bounds(driver) == upper, value


def test_bounds_at_the_ends_of_the_range() -> None:
    assert cuda_lower_bounds((11, 0)) == ["11.0", "11"]
    assert len(cuda_upper_bounds((11, 0))) == 110 - 2
    assert cuda_upper_bounds((15, 20)) == []
    assert cuda_lower_bounds((15, 20)) == CATALOGUE


def test_forced_versions_outside_the_catalogue_follow_wheelnext() -> None:
    # wheelnext's own cases override_16_25 and override_10_9: the bound whose list comes out
    # empty is left out, the other one runs past the catalogue.
    above = nvidia_features((16, 25), (12, 5))
    assert list(above) == [LOWER, SM]
    assert above[LOWER][:2] == ["16.25", "16.24"] and above[LOWER][25:28] == ["16.0", "16", "15.20"]
    assert len(above[LOWER]) == 27 + 110

    below = nvidia_features((10, 9), (12, 5))
    assert list(below) == [UPPER, SM]
    assert below[UPPER][109:] == ["11", "10.20", *(f"10.{n}" for n in range(19, 9, -1))]


@pytest.mark.parametrize(
    ("cc", "expected"),
    [
        ((9, 0), ["90_real", "90_virtual"]),
        ((8, 0), ["80_real", "80_virtual"]),
        ((8, 9), [*(f"8{n}_real" for n in range(9, -1, -1)), "80_virtual"]),
        ((10, 3), ["103_real", "102_real", "101_real", "100_real", "100_virtual"]),
        (
            (12, 5),
            ["125_real", "124_real", "123_real", "122_real", "121_real", "120_real", "120_virtual"],
        ),
    ],
)
def test_sm_arch_values(cc: tuple[int, int], expected: list[str]) -> None:
    assert sm_arch_values(cc) == expected


def test_nvidia_features_keys_and_order() -> None:
    assert list(nvidia_features((12, 8), (9, 0))) == [LOWER, UPPER, SM]
    assert list(nvidia_features((12, 8), None)) == [LOWER, UPPER]
    assert nvidia_features(None, (9, 0)) == {SM: ["90_real", "90_virtual"]}
    assert nvidia_features(None, None) == {}
    # Below 5.0 (Kepler and older) wheelnext leaves sm_arch out.
    assert list(nvidia_features((12, 2), (3, 7))) == [LOWER, UPPER]
    assert nvidia_features((12, 2), (5, 0))[SM] == ["50_real", "50_virtual"]


# --------------------------------------------------------------------------- overrides


def test_forced_12_7_and_12_5_without_gpu_reproduces_wheelnext() -> None:
    nvml = no_nvml()
    smi = no_smi()
    report = detect({CUDA_ENV: "12.7", SM_ARCH_ENV: "12.5"}, nvml=nvml, smi_run=smi)

    assert list(report.host) == [LOWER, UPPER, SM]
    lower, upper, sm = report.host[LOWER], report.host[UPPER], report.host[SM]
    assert (lower[0], lower[-1], len(lower)) == ("12.7", "11", 31)
    assert (upper[0], upper[-1], len(upper)) == ("15.20", "12.8", 79)
    assert (sm[0], sm[-1], len(sm)) == ("125_real", "120_virtual", 7)
    assert report.devices == {}
    assert nvml.calls == ["nvmlInit"]  # no shutdown after a failed init
    assert smi.calls == [nvidia.SMI_QUERY]


def test_cuda_override_alone_without_gpu_gives_cuda_lists_only() -> None:
    report = detect({CUDA_ENV: "12.8"}, nvml=no_nvml(), smi_run=no_smi())
    assert list(report.host) == [LOWER, UPPER]
    assert report.host[LOWER][0] == "12.8"
    assert report.devices == {}


def test_sm_override_alone_without_gpu_gives_nothing() -> None:
    # wheelnext returns no configs at all when it knows no CUDA driver version.
    assert detect({SM_ARCH_ENV: "9.0"}, nvml=no_nvml(), smi_run=no_smi()) == NvidiaReport({}, {})


def test_sm_override_applies_to_host_and_every_device() -> None:
    report = detect({SM_ARCH_ENV: "10.3"}, nvml=FakeNvml(load("l4-h100-r535")), smi_run=no_smi())
    forced = ["103_real", "102_real", "101_real", "100_real", "100_virtual"]
    assert report.host[SM] == forced
    assert len(report.devices) == 2
    assert all(device["nvidia"][SM] == forced for device in report.devices.values())
    assert report.host[LOWER][0] == "12.2"  # the CUDA version still comes from the driver


def test_cuda_override_replaces_driver_version() -> None:
    report = detect({CUDA_ENV: "12.4"}, nvml=FakeNvml(load("h100-r570")), smi_run=no_smi())
    assert report.host[LOWER][0] == "12.4"
    assert report.host[UPPER][-1] == "12.5"
    assert {device["nvidia"][LOWER][0] for device in report.devices.values()} == {"12.4"}
    assert report.host[SM] == ["90_real", "90_virtual"]


def test_empty_override_counts_as_unset() -> None:
    env = {CUDA_ENV: "", SM_ARCH_ENV: " "}
    assert detect(env, nvml=FakeNvml(load("a100-r535")), smi_run=no_smi()) == detect(
        {}, nvml=FakeNvml(load("a100-r535")), smi_run=no_smi()
    )


@pytest.mark.parametrize(
    ("value", "lower"),
    [("12", "12.0"), ("12.7.1", "12.7"), ("v12.7", "12.7"), ("12.07", "12.7"), ("12.8rc1", "12.8")],
)
def test_an_override_is_read_as_the_wheelnext_provider_reads_it(value: str, lower: str) -> None:
    """Any PEP 440 version, its major and minor (12 is 12.0), as packaging reads it there."""
    report = detect({CUDA_ENV: value}, nvml=FakeNvml(load("h100-r570")), smi_run=no_smi())
    assert report.host[LOWER][0] == lower
    report = detect({SM_ARCH_ENV: value}, nvml=FakeNvml(load("h100-r570")), smi_run=no_smi())
    assert report.host[SM][0] == f"{lower.replace('.', '')}_real"


@pytest.mark.parametrize("variable", [CUDA_ENV, SM_ARCH_ENV])
@pytest.mark.parametrize("value", ["abc", "12.x", "-1.0", "12.7\nx", "1" * 61])
def test_invalid_override_raises_naming_the_variable(variable: str, value: str) -> None:
    nvml = FakeNvml(load("h100-r570"))
    with pytest.raises(InvalidInputError) as caught:
        detect({variable: value}, nvml=nvml, smi_run=no_smi())
    message = str(caught.value)
    shown = value if len(value) <= 60 else value[:57] + "..."
    assert variable in message and repr(shown) in message and "MAJOR.MINOR" in message
    assert "\n" not in message
    assert nvml.calls == []  # rejected before touching the hardware


# --------------------------------------------------------------------------- machines

# host sm_arch and the CUDA version of each fixture machine, written out by hand.
HOST_SM = {
    "a100-r535": ["80_real", "80_virtual"],
    "l4-h100-r535": ["90_real", "90_virtual"],
    "h100-r570": ["90_real", "90_virtual"],
    "b200-r570": ["100_real", "100_virtual"],
    "rtx5090-r570": ["120_real", "120_virtual"],
    "h200-r580": ["90_real", "90_virtual"],
    "l4-r580": [*(f"8{n}_real" for n in range(9, -1, -1)), "80_virtual"],
}
# (first lower bound, length, last upper bound, length)
HOST_CUDA = {
    "535": ("12.2", 26, "12.3", 84),
    "570": ("12.8", 32, "12.9", 78),
    "580": ("13.0", 46, "13.1", 64),
}


def test_fixture_set_covers_the_brief() -> None:
    names = {d["nvmlDeviceGetName"] for m in MACHINES for d in load(m)["devices"]}
    assert {
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA L4",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H200",
        "NVIDIA B200",
        "NVIDIA GeForce RTX 5090",
    } <= names
    assert set(HOST_SM) == set(MACHINES)


def check_host(machine: str, report: NvidiaReport) -> None:
    first_lower, n_lower, last_upper, n_upper = HOST_CUDA[machine.rsplit("-r", 1)[1]]
    lower, upper = report.host[LOWER], report.host[UPPER]
    assert (lower[0], len(lower), lower[-1]) == (first_lower, n_lower, "11")
    assert (upper[0], len(upper), upper[-1]) == ("15.20", n_upper, last_upper)
    assert report.host[SM] == HOST_SM[machine]


def check_devices(machine: str, report: NvidiaReport) -> None:
    devices = load(machine)["devices"]
    assert list(report.devices) == [d["nvmlDeviceGetUUID"] for d in devices]
    for device in devices:
        lists = report.devices[device["nvmlDeviceGetUUID"]]
        assert list(lists) == ["nvidia"]
        assert list(lists["nvidia"]) == [LOWER, UPPER, SM]
        assert lists["nvidia"][LOWER] == report.host[LOWER]
        assert lists["nvidia"][UPPER] == report.host[UPPER]
        major, minor = device["nvmlDeviceGetCudaComputeCapability"]
        assert lists["nvidia"][SM][0] == f"{major}{minor}_real"
        assert lists["nvidia"][SM][-1] == f"{major}0_virtual"


@pytest.mark.parametrize("machine", MACHINES)
def test_machine_through_nvml(machine: str) -> None:
    smi = FakeSmi.of(machine)
    nvml = FakeNvml(load(machine))
    report = detect({}, nvml=nvml, smi_run=smi)
    check_host(machine, report)
    check_devices(machine, report)
    assert smi.calls == []  # NVML answered, nvidia-smi was never run
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert not nvml.initialized


@pytest.mark.parametrize("machine", MACHINES)
def test_machine_through_nvidia_smi_when_nvml_is_missing(machine: str) -> None:
    smi = FakeSmi.of(machine)
    report = detect({}, nvml=no_nvml(), smi_run=smi)
    check_host(machine, report)
    check_devices(machine, report)
    assert smi.calls == [nvidia.SMI_QUERY, nvidia.SMI_DETAILS]
    assert report == detect({}, nvml=FakeNvml(load(machine)), smi_run=no_smi())


@pytest.mark.parametrize("reader", ["nvml", "smi"])
def test_mixed_l4_h100_box(reader: str) -> None:
    machine = "l4-h100-r535"
    if reader == "nvml":
        report = detect({}, nvml=FakeNvml(load(machine)), smi_run=no_smi())
    else:
        report = detect({}, nvml=no_nvml(), smi_run=FakeSmi.of(machine))
    l4, h100 = (d["nvmlDeviceGetUUID"] for d in load(machine)["devices"])
    assert report.host[SM] == ["90_real", "90_virtual"]
    assert report.devices[h100]["nvidia"][SM] == ["90_real", "90_virtual"]
    assert report.devices[l4]["nvidia"][SM] == [
        "89_real", "88_real", "87_real", "86_real", "85_real",
        "84_real", "83_real", "82_real", "81_real", "80_real", "80_virtual",
    ]  # fmt: skip
    assert report.host[LOWER][:4] == ["12.2", "12.1", "12.0", "12"]


def test_read_nvml_system() -> None:
    machine = load("h100-r570")
    system = read_nvml(FakeNvml(machine))
    assert system is not None
    assert system.cuda == (12, 8)
    assert system.driver_version == "570.124.06"
    assert system.gpus[0] == Gpu(
        0, machine["devices"][0]["nvmlDeviceGetUUID"], "NVIDIA H100 80GB HBM3", (9, 0)
    )
    assert [gpu.index for gpu in system.gpus] == [0, 1, 2, 3]


def test_read_nvidia_smi_system() -> None:
    system = read_nvidia_smi(FakeSmi.of("rtx5090-r570"))
    assert system == NvidiaSystem(
        (12, 8),
        "570.133.07",
        (
            Gpu(
                0,
                load("rtx5090-r570")["devices"][0]["nvmlDeviceGetUUID"],
                "NVIDIA GeForce RTX 5090",
                (12, 0),
            ),
        ),
    )


def test_old_bindings_returning_bytes_are_decoded() -> None:
    machine = load("b200-r570")
    system = read_nvml(FakeNvml(machine, as_bytes=True))
    assert system is not None
    assert system.driver_version == "570.124.06"
    assert system.gpus[1].name == "NVIDIA B200"
    assert system.gpus[1].uuid == machine["devices"][1]["nvmlDeviceGetUUID"]


# --------------------------------------------------------------------------- failures


def test_absent_hardware_gives_empty_report() -> None:
    nvml, smi = no_nvml(), no_smi()
    assert detect({}, nvml=nvml, smi_run=smi) == NvidiaReport({}, {})
    assert smi.calls == [nvidia.SMI_QUERY]


def test_zero_gpus_is_no_system() -> None:
    machine = {**load("h100-r570"), "nvmlDeviceGetCount": 0, "devices": []}
    nvml = FakeNvml(machine)
    assert read_nvml(nvml) is None
    assert nvml.calls[-1] == "nvmlShutdown"
    assert detect({}, nvml=FakeNvml(machine), smi_run=no_smi()) == NvidiaReport({}, {})


@pytest.mark.parametrize(
    "broken", ["nvmlSystemGetDriverVersion", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"]
)
def test_nvml_error_mid_query_is_none_and_still_shuts_down(broken: str) -> None:
    nvml = FakeNvml(load("a100-r535"), broken=frozenset({broken}))
    assert read_nvml(nvml) is None
    assert nvml.calls[-1] == "nvmlShutdown" and not nvml.initialized


def test_nvml_error_then_nvidia_smi_answers() -> None:
    nvml = FakeNvml(load("a100-r535"), broken=frozenset({"nvmlDeviceGetCount"}))
    report = detect({}, nvml=nvml, smi_run=FakeSmi.of("a100-r535"))
    check_host("a100-r535", report)


def test_unreadable_device_is_skipped() -> None:
    machine = load("l4-h100-r535")
    report = detect({}, nvml=FakeNvml(machine, broken_devices=frozenset({1})), smi_run=no_smi())
    assert list(report.devices) == [machine["devices"][0]["nvmlDeviceGetUUID"]]
    assert report.host[SM][0] == "89_real"


def test_unknown_cuda_version_gives_nothing() -> None:
    nvml = FakeNvml(load("h100-r570"), broken=frozenset({"nvmlSystemGetCudaDriverVersion"}))
    system = read_nvml(nvml)
    assert system is not None and system.cuda is None and len(system.gpus) == 4
    assert detect({}, nvml=FakeNvml(nvml.machine, broken=nvml.broken), smi_run=no_smi()) == (
        NvidiaReport({}, {})
    )


def test_cuda_v2_query_is_preferred_and_v1_is_the_fallback() -> None:
    class WithV2(FakeNvml):
        def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
            self._enter("nvmlSystemGetCudaDriverVersion_v2")
            return 12090

    system = read_nvml(WithV2(load("h100-r570")))
    assert system is not None and system.cuda == (12, 9)
    fallback = WithV2(load("h100-r570"), broken=frozenset({"nvmlSystemGetCudaDriverVersion_v2"}))
    system = read_nvml(fallback)
    assert system is not None and system.cuda == (12, 8)


@pytest.mark.parametrize("cuda_int", [10020, 16000])
def test_detected_driver_outside_wheelnext_range_gives_nothing(cuda_int: int) -> None:
    machine = {**load("a100-r535"), "nvmlSystemGetCudaDriverVersion": cuda_int}
    assert detect({}, nvml=FakeNvml(machine), smi_run=no_smi()) == NvidiaReport({}, {})
    # ... while an override bypasses the range check, as in wheelnext
    forced = detect({CUDA_ENV: "10.2"}, nvml=FakeNvml(machine), smi_run=no_smi())
    assert list(forced.host) == [UPPER, SM]


def test_missing_pynvml_module_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes ``import pynvml`` raise ImportError
    assert read_nvml() is None


H100_LINE = "0, GPU-7a1c2f3e-9b4d-4e21-8c6a-0f5e3d2b1a90, NVIDIA H100 80GB HBM3, 9.0, 570.124.06"


@pytest.mark.parametrize(
    "query",
    [
        "",
        "No devices were found\n",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        'Field "compute_cap" is not a valid field to query.\n',
        "0, GPU-7a1c2f3e-9b4d-4e21-8c6a-0f5e3d2b1a90, NVIDIA H100 80GB HBM3, [N/A], 570.124.06\n",
        "0, GPU-7a1c2f3e-9b4d-4e21-8c6a-0f5e3d2b1a90, NVIDIA H100 80GB HBM3, 9.0\n",
        "\u00b2, GPU-7a1c2f3e-9b4d-4e21-8c6a-0f5e3d2b1a90, NVIDIA H100 80GB HBM3, 9.0, 570.124.06\n",
        "x, GPU-7a1c2f3e-9b4d-4e21-8c6a-0f5e3d2b1a90, NVIDIA H100 80GB HBM3, 9.0, 570.124.06\n",
        "0, not-a-uuid, NVIDIA H100 80GB HBM3, 9.0, 570.124.06\n",
        "0, GPU-7a1c2f3e-9b4d-4e21-8c6a-0f5e3d2b1a90, , 9.0, 570.124.06\n",
        H100_LINE + "\n\x00\xff garbage\n",
        "index, uuid, name, compute_cap, driver_version\n" + H100_LINE + "\n",
    ],
)
def test_malformed_nvidia_smi_output_is_no_system(query: str) -> None:
    smi = FakeSmi(query, (FIXTURES / "h100-r570-q.txt").read_text())
    assert read_nvidia_smi(smi) is None
    assert detect({}, nvml=no_nvml(), smi_run=FakeSmi(query, None)) == NvidiaReport({}, {})


@pytest.mark.parametrize("details", [None, "", "garbage\n", "CUDA Version : N/A\n"])
def test_nvidia_smi_without_cuda_version(details: str | None) -> None:
    smi = FakeSmi(H100_LINE + "\n", details)
    system = read_nvidia_smi(smi)
    assert (
        system is not None and system.cuda is None and system.gpus[0].compute_capability == (9, 0)
    )
    assert detect({}, nvml=no_nvml(), smi_run=FakeSmi(H100_LINE + "\n", details)) == (
        NvidiaReport({}, {})
    )


def test_nvidia_smi_windows_line_endings() -> None:
    smi = FakeSmi(
        H100_LINE + "\r\n", (FIXTURES / "h100-r570-q.txt").read_text().replace("\n", "\r\n")
    )
    system = read_nvidia_smi(smi)
    assert system is not None and system.cuda == (12, 8)


# --------------------------------------------------------------------------- default runner


def fake_binary(directory: Path, script: str) -> str:
    """Put a fake ``nvidia-smi`` first on a PATH that still finds ``cat`` and ``sleep``."""
    path = directory / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return os.pathsep.join([str(directory), "/usr/bin", "/bin"])


@pytest.mark.skipif(os.name != "posix", reason="uses a shell script as nvidia-smi")
def test_default_runner_reads_a_nvidia_smi_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv, details = FIXTURES / "h200-r580.csv", FIXTURES / "h200-r580-q.txt"
    path = fake_binary(tmp_path, f'if [ "$1" = -q ]; then cat "{details}"; else cat "{csv}"; fi\n')
    monkeypatch.setenv("PATH", path)
    system = read_nvidia_smi()
    assert system is not None and system.cuda == (13, 0) and system.gpus[0].name == "NVIDIA H200"


@pytest.mark.skipif(os.name != "posix", reason="uses a shell script as nvidia-smi")
@pytest.mark.parametrize(
    "script", [None, "echo 'NVIDIA-SMI has failed' >&2; exit 9\n", "exec sleep 5\n"]
)
def test_default_runner_failures_are_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str | None
) -> None:
    # Without a script PATH holds only an empty folder, so no real nvidia-smi can be found.
    path = str(tmp_path) if script is None else fake_binary(tmp_path, script)
    monkeypatch.setenv("PATH", path)
    monkeypatch.setattr(nvidia, "_SMI_TIMEOUT_S", 0.3)
    run: Callable[[list[str]], str | None] = nvidia._run_nvidia_smi
    assert run(list(nvidia.SMI_QUERY)) is None
    assert read_nvidia_smi() is None
