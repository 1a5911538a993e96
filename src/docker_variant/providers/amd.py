"""The built-in ``amd`` namespace, from the kernel's KFD topology under the host root.

No ROCm user space is needed (container hosts carry only the kernel driver): each GPU is a
KFD topology node ``sys/class/kfd/kfd/topology/nodes/<n>/properties`` whose
``gfx_target_version`` is not 0 (node 0 is usually the CPU). The node's ``domain`` and
``location_id`` (PCI bus << 8 | device << 3 | function) give the GPU's PCI address, its
device id in ``providers --devices``. ``rocm_version`` lists the ROCm releases the kernel
driver (``sys/module/amdgpu/version``) runs, by AMD's published compatibility
(``vendors.amd``), a host ROCm (``opt/rocm/.info/version``) first.

Overrides, as the wheelnext AMD provider's: ``AMD_VARIANT_PROVIDER_GFX_ARCH``
(comma-separated targets) and ``AMD_VARIANT_PROVIDER_ROCM_VERSION`` (``major.minor``); the
provider's later ``..._FORCE_...`` names are accepted too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from docker_variant.errors import InvalidInputError
from docker_variant.numtext import DIGITS, is_number, parse_version
from docker_variant.providers.hostroot import HostRoot
from docker_variant.vendors import amd as rules

__all__ = [
    "GFX_ENV",
    "ROCM_ENV",
    "AmdGpu",
    "AmdReport",
    "detect",
    "host_rocm",
    "kernel_driver",
    "parse_properties",
    "read_gpus",
]

GFX_ENV = "AMD_VARIANT_PROVIDER_GFX_ARCH"
ROCM_ENV = "AMD_VARIANT_PROVIDER_ROCM_VERSION"
_ALIASES = {
    GFX_ENV: "AMD_VARIANT_PROVIDER_FORCE_GFX_ARCH",
    ROCM_ENV: "AMD_VARIANT_PROVIDER_FORCE_ROCM_VERSION",
}
TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"
DRIVER_VERSION = "sys/module/amdgpu/version"
ROCM_VERSION_FILE = "opt/rocm/.info/version"

_LINE = re.compile(rf"([a-z_0-9]+)[ \t]+({DIGITS}|0x[0-9a-fA-F]{{1,16}})")
_ROCM_FILE = re.compile(rf"({DIGITS})\.({DIGITS})(?:[.-][0-9A-Za-z.-]*)?")


@dataclass(frozen=True)
class AmdGpu:
    node: int  # the KFD topology node
    gfx: str
    device_id: int  # PCI device ID
    pci_address: str | None  # 0000:0c:00.0

    @property
    def name(self) -> str:
        """The id the GPU goes by in ``providers --devices`` and heartbeats."""
        return self.pci_address or f"kfd-node-{self.node}"


@dataclass(frozen=True)
class AmdReport:
    host: dict[str, list[str]]
    devices: dict[str, dict[str, dict[str, list[str]]]]  # PCI address -> {"amd": features}
    driver_version: str | None = None


def parse_properties(text: str) -> dict[str, int]:
    """A KFD ``properties`` file: ``key value`` lines of decimal numbers (``hive_id`` and
    ``unique_id`` may be large, so only bounded numbers are read; the rest are skipped)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = _LINE.fullmatch(line.strip())
        if match is None:
            continue
        raw = match[2]
        values[match[1]] = int(raw, 16) if raw.startswith("0x") else int(raw)
    return values


def _pci_address(props: Mapping[str, int]) -> str | None:
    location, domain = props.get("location_id"), props.get("domain", 0)
    if not location:
        return None
    bus, devfn = divmod(location, 256)
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


def read_gpus(root: HostRoot) -> list[AmdGpu]:
    """The KFD nodes that are GPUs, in node order."""
    gpus: list[AmdGpu] = []
    nodes = [(int(p.name), p) for p in root.entries(TOPOLOGY) if is_number(p.name)]
    for node, path in sorted(nodes):
        text = root.read_text(path / "properties")
        if text is None:
            continue
        props = parse_properties(text)
        gfx = rules.gfx_name(props.get("gfx_target_version", 0))
        if gfx is None:
            continue  # a CPU node, or a number that names no target
        gpus.append(AmdGpu(node, gfx, props.get("device_id", 0), _pci_address(props)))
    return gpus


def kernel_driver(root: HostRoot) -> tuple[str, tuple[int, ...]] | None:
    """The amdgpu module's version, as text and numbers; ``None`` without a version file."""
    line = root.first_line(DRIVER_VERSION)
    if line is None:
        return None
    match = re.fullmatch(rf"({DIGITS}(?:\.{DIGITS}){{0,3}})(?:[-+_~].*)?", line)
    if match is None:
        return None
    return line, parse_version(match[1], DRIVER_VERSION)


def host_rocm(root: HostRoot) -> str | None:
    """``major.minor`` of a ROCm installed on the host (``opt/rocm/.info/version``)."""
    line = root.first_line(ROCM_VERSION_FILE)
    match = None if line is None else _ROCM_FILE.fullmatch(line)
    return None if match is None else f"{int(match[1])}.{int(match[2])}"


def _override(env: Mapping[str, str], name: str) -> str | None:
    for key in (name, _ALIASES[name]):
        raw = env.get(key, "").strip()
        if raw:
            return raw
    return None


def _forced_targets(raw: str) -> list[str]:
    targets = [t.strip() for t in raw.split(",") if t.strip()]
    for target in targets:
        rules.RULES.values["gfx_arch"].check(rules.NAMESPACE, "gfx_arch", target, GFX_ENV)
    return list(dict.fromkeys(targets))


def _forced_rocm(raw: str) -> str:
    # the wheelnext provider takes major.minor.patch; the feature is major.minor
    match = _ROCM_FILE.fullmatch(raw)
    if match is None:
        raise InvalidInputError(
            f"{ROCM_ENV}={raw[:60]!r} is not a ROCm release of the form MAJOR.MINOR"
        )
    return f"{int(match[1])}.{int(match[2])}"


def detect(root: HostRoot, env: Mapping[str, str]) -> AmdReport:
    """Host aggregate and per-GPU lists; ``AmdReport({}, {})`` without an AMD GPU."""
    forced_gfx = _override(env, GFX_ENV)
    forced_rocm = _override(env, ROCM_ENV)
    targets = _forced_targets(forced_gfx) if forced_gfx else None
    rocm = _forced_rocm(forced_rocm) if forced_rocm else None
    gpus = read_gpus(root)
    driver = kernel_driver(root)
    if rocm is not None:
        releases = [rocm]
    else:
        own = host_rocm(root) if gpus or targets else None
        supported = rules.rocm_releases(driver[1] if driver else None)
        releases = list(dict.fromkeys([*([own] if own else []), *supported]))

    def features(gfx_list: list[str]) -> dict[str, list[str]]:
        lists: dict[str, list[str]] = {}
        if gfx_list:
            lists["gfx_arch"] = gfx_list
        # a forced release is the user's word; else only releases that run one of the targets
        runs = (
            releases
            if rocm is not None
            else [
                r for r in releases if any(r in rules.releases_for(g, releases) for g in gfx_list)
            ]
        )
        if runs and gfx_list:
            lists["rocm_version"] = runs
        return lists

    # a forced list keeps its order; detected targets go newest first
    host_targets = targets or rules.newest_first("gfx_arch", [gpu.gfx for gpu in gpus])
    devices = {
        gpu.name: {"amd": features(targets if targets is not None else [gpu.gfx])} for gpu in gpus
    }
    return AmdReport(features(host_targets), devices, driver[0] if driver else None)
