"""AMD: the ``amd`` namespace's rules, everywhere they are asked.

Features are the wheelnext AMD provider's: ``gfx_arch`` (multi-value: the gfx targets of the
host's GPUs, e.g. ``gfx942``) and ``rocm_version`` (``major.minor``, newest first).

- **gfx targets.** The kernel's KFD topology gives each GPU a decimal ``gfx_target_version``
  = major*10000 + minor*100 + stepping; the target is ``gfx<major><minor hex><stepping hex>``
  (90402 -> ``gfx942``, 90010 -> ``gfx90a``, 110000 -> ``gfx1100``). A code object for one
  target runs on GPUs of exactly that target.
- **ROCm releases a kernel driver runs.** AMD's "User and AMD GPU Driver (amdgpu) support
  matrix" (ROCm docs, install-on-linux, reference/user-kernel-space-compat-matrix, revision of
  2025-09-17) lists, per driver release, the ROCm user-space releases it supports; the amdgpu
  driver docs' compatibility matrix (ROCm/amdgpu-docs) adds 30.30.x. The driver release
  is read from the amdgpu module's version (``/sys/module/amdgpu/version``), which for the
  DKMS driver is the ``amdgpu-dkms`` package's version: 6.3.6 shipped with ROCm 6.0 (package
  6.3.6.60000), 6.7.0 with 6.1, 6.8.5 with 6.2, 6.10.5 with 6.3, 6.12.12 with 6.4, 6.14.14
  is driver 30.10 (ROCm 7.0, package 6.14.14.30100000), 6.16.6 driver 30.20 (ROCm 7.1,
  package 6.16.6.30200000) and 6.16.13 driver 30.30 (ROCm 7.2, package 6.16.13.30300000).
  Driver 30.20's row is the ROCm side's: the ROCm 7.2.x and 7.1.0 compatibility matrices
  list 30.20.x among the drivers they run on; 7.0, 6.4 and 6.3 as for 30.30.x (AMD supports
  driver and user space up to a year apart). A version between two rows counts as the older
  row, one above the newest as the newest (it runs at least what that row runs); one below
  the oldest, or none (the in-tree kernel driver has no version file), lists no release.
- **Device IDs.** The AMD GPU DRA driver (``gpu.amd.com``) publishes ``deviceID`` (the PCI
  device ID), ``productName`` and ``driverVersion`` (absent with the in-tree kernel driver:
  a ``rocm_version`` selector then fits no device) but no gfx target: ``DEVICES`` maps PCI
  device IDs to targets. Source: ``pci.ids`` (Debian package ``pci.ids`` 2023-04-11,
  ``/usr/share/misc/pci.ids``) for the parts it has; parts newer than that file (MI300 and
  MI350 series, Navi 32, Navi 48, PRO W7900) from later PCI ID listings, marked
  ``pci_ids=False``: a missing or wrong ID only makes a claim miss that product.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from docker_variant.numtext import DIGITS
from docker_variant.vendors.base import (
    DraMapping,
    NamespaceRules,
    ValueRule,
    clauses_in_order,
    shown,
)
from docker_variant.vendors.evidence import OFFLOAD, ROCM_VERSION, ImageEvidence, Proposed, Verdict
from docker_variant.vendors.vendor import ContentsRules, Described, Detector, Vendor

__all__ = [
    "DEVICES",
    "DRA_DOMAIN",
    "DRA_KIND_ATTRIBUTE",
    "DRA_TYPE_GPU",
    "DRA_TYPE_PARTITION",
    "DRA_TYPE_VFIO",
    "DRIVER_RELEASES",
    "FEATURES",
    "FIRST_ROCM",
    "HOMOGENEOUS_ATTRIBUTE",
    "NAMESPACE",
    "PCI_VENDOR",
    "ROCM_SUPPORT",
    "RULES",
    "VENDOR",
    "AmdDevice",
    "describe",
    "device_ids",
    "device_product",
    "device_runs",
    "dra_kind_selector",
    "driver_release",
    "gfx_name",
    "gfx_of",
    "gfx_value",
    "newest_first",
    "product_name",
    "propose",
    "releases_for",
    "rocm_releases",
    "rocm_value",
    "target_of_device",
    "verify",
]

NAMESPACE = "amd"
FEATURES = ("gfx_arch", "rocm_version")
PCI_VENDOR = 0x1002

Gfx = tuple[int, int, int]  # major, minor, stepping
Version = tuple[int, ...]

_GFX_RE = re.compile(r"gfx([1-9]|[1-9][0-9])([0-9a-f])([0-9a-f])")
_ROCM_RE = re.compile(rf"({DIGITS})\.({DIGITS})")
_GFX_RULE = ValueRule(_GFX_RE, "a gfx target such as gfx942, gfx90a or gfx1100")
_ROCM_RULE = ValueRule(_ROCM_RE, "a ROCm release major.minor such as 6.4")


@dataclass(frozen=True)
class AmdDevice:
    """One PCI device ID: its gfx target and product, and whether ``pci.ids`` names it."""

    device_id: int
    gfx: str
    product: str
    pci_ids: bool = True


# gfx target -> its products' PCI device IDs (see the module docstring for the source).
DEVICES: tuple[AmdDevice, ...] = (
    AmdDevice(0x66A0, "gfx906", "Radeon Instinct MI50/MI60"),
    AmdDevice(0x66A1, "gfx906", "Radeon Pro VII / Radeon Instinct MI50 32GB"),
    AmdDevice(0x66AF, "gfx906", "Radeon VII"),
    AmdDevice(0x738C, "gfx908", "Instinct MI100"),
    AmdDevice(0x738E, "gfx908", "Instinct MI100"),
    AmdDevice(0x7408, "gfx90a", "Instinct MI250X"),
    AmdDevice(0x740C, "gfx90a", "Instinct MI250X/MI250"),
    AmdDevice(0x740F, "gfx90a", "Instinct MI210"),
    AmdDevice(0x74A0, "gfx942", "Instinct MI300A", pci_ids=False),
    AmdDevice(0x74A1, "gfx942", "Instinct MI300X", pci_ids=False),
    AmdDevice(0x74A2, "gfx942", "Instinct MI308X", pci_ids=False),
    AmdDevice(0x74A5, "gfx942", "Instinct MI325X", pci_ids=False),
    AmdDevice(0x74B5, "gfx942", "Instinct MI300X VF", pci_ids=False),
    AmdDevice(0x75A0, "gfx950", "Instinct MI350X", pci_ids=False),
    AmdDevice(0x75A3, "gfx950", "Instinct MI355X", pci_ids=False),
    AmdDevice(0x744C, "gfx1100", "Radeon RX 7900 XT/7900 XTX"),
    AmdDevice(0x7448, "gfx1100", "Radeon PRO W7900", pci_ids=False),
    AmdDevice(0x747E, "gfx1101", "Radeon RX 7800 XT/7700 XT", pci_ids=False),
    AmdDevice(0x7480, "gfx1102", "Radeon RX 7600/7700S/7600S"),
    AmdDevice(0x7483, "gfx1102", "Radeon RX 7600M/7600M XT"),
    AmdDevice(0x7550, "gfx1201", "Radeon RX 9070/9070 XT", pci_ids=False),
)
_BY_ID = {device.device_id: device for device in DEVICES}

# Driver release -> the ROCm user-space releases it supports, newest first (AMD's matrix).
ROCM_SUPPORT: dict[str, tuple[str, ...]] = {
    "30.30": ("7.2", "7.1", "7.0", "6.4", "6.3"),
    "30.20": ("7.2", "7.1", "7.0", "6.4", "6.3"),
    "30.10": ("7.0", "6.4", "6.3", "6.2"),
    "6.4": ("7.0", "6.4", "6.3", "6.2", "6.1"),
    "6.3": ("7.0", "6.4", "6.3", "6.2", "6.1"),
    "6.2": ("7.0", "6.4", "6.3", "6.2", "6.1", "6.0"),
    "6.1": ("6.4", "6.3", "6.2", "6.1", "6.0", "5.7"),
    "6.0": ("6.2", "6.1", "6.0", "5.7", "5.6"),
}
# gfx target -> the first ROCm release that runs it, for targets newer than the oldest
# releases the driver table lists (ROCm release notes: 7.0.0 added the Instinct MI350 series,
# 6.4.1 the Radeon RX 9000 series). A driver that runs ROCm 6.2 does not make 6.2 run there.
FIRST_ROCM: dict[str, tuple[int, int]] = {"gfx950": (7, 0), "gfx1201": (6, 4)}

# amdgpu module version (the DKMS package's) -> driver release, oldest first.
DRIVER_RELEASES: tuple[tuple[Version, str], ...] = (
    ((6, 3, 6), "6.0"),
    ((6, 7, 0), "6.1"),
    ((6, 8, 5), "6.2"),
    ((6, 10, 5), "6.3"),
    ((6, 12, 12), "6.4"),
    ((6, 14, 14), "30.10"),
    ((6, 16, 6), "30.20"),
    ((6, 16, 13), "30.30"),
)


# --------------------------------------------------------------------------- values


def gfx_name(target_version: int) -> str | None:
    """KFD's ``gfx_target_version`` as a target name; ``None`` for 0 (a CPU node) or a
    number that names no target."""
    major, rest = divmod(target_version, 10000)
    minor, stepping = divmod(rest, 100)
    if not 1 <= major <= 99 or minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def gfx_value(value: str) -> Gfx | None:
    """``"gfx90a"`` -> (9, 0, 10); ``"gfx1100"`` -> (11, 0, 0)."""
    match = _GFX_RE.fullmatch(value)
    if match is None:
        return None
    return int(match[1]), int(match[2], 16), int(match[3], 16)


def rocm_value(value: str) -> tuple[int, int] | None:
    """``"6.4"`` -> (6, 4)."""
    match = _ROCM_RE.fullmatch(value)
    return None if match is None else (int(match[1]), int(match[2]))


def _order_key(feature: str, value: str) -> tuple[int, ...] | None:
    """Newest first: gfx targets by (major, minor, stepping), ROCm releases numerically."""
    if feature == "gfx_arch":
        return gfx_value(value)
    if feature == "rocm_version":
        return rocm_value(value)
    return None


def newest_first(feature: str, values: Iterable[str]) -> list[str]:
    return RULES.newest_first(feature, values)


# --------------------------------------------------------------------------- driver


def driver_release(module_version: Version) -> str | None:
    """The driver release (``6.4``, ``30.10``) of an amdgpu module version, by the rule in
    the module docstring."""
    found = None
    for version, release in DRIVER_RELEASES:
        if module_version >= version:
            found = release
    return found


def rocm_releases(module_version: Version | None) -> list[str]:
    """The ROCm releases a kernel driver of ``module_version`` runs, newest first."""
    release = None if module_version is None else driver_release(module_version)
    return list(ROCM_SUPPORT.get(release, ())) if release else []


def releases_for(gfx: str, releases: Sequence[str]) -> list[str]:
    """Of ``releases`` (newest first), those that run a GPU of target ``gfx``."""
    first = FIRST_ROCM.get(gfx)
    if first is None:
        return list(releases)
    return [r for r in releases if (v := rocm_value(r)) is not None and v >= first]


def device_runs(feature: str, value: str, gfx: str, module_version: Version | None) -> bool:
    """Whether a GPU of target ``gfx`` on a driver of ``module_version`` lists ``value``."""
    if feature == "gfx_arch":
        return value == gfx
    if feature == "rocm_version":
        return value in releases_for(gfx, rocm_releases(module_version))
    return False


# --------------------------------------------------------------------------- names


def target_of_device(device_id: int) -> str | None:
    """The gfx target of a PCI device ID (``0x74a1`` -> ``gfx942``)."""
    device = _BY_ID.get(device_id)
    return None if device is None else device.gfx


def device_ids(gfx: str) -> list[int]:
    """The PCI device IDs of a gfx target's products, in the table's order."""
    return [device.device_id for device in DEVICES if device.gfx == gfx]


def product_name(gfx: str) -> str | None:
    """The products of a gfx target (``gfx942`` -> ``Instinct MI300A, MI300X, ...``)."""
    products = list(dict.fromkeys(d.product for d in DEVICES if d.gfx == gfx))
    if not products:
        return None
    first = products[0].split(" ", 1)[0]  # "Instinct MI300A, MI300X, ...": the family once
    if len(products) > 1 and all(p.startswith(first + " ") for p in products):
        return first + " " + ", ".join(p[len(first) + 1 :] for p in products)
    return ", ".join(products)


def device_product(device_id: int) -> str | None:
    """The product of one PCI device ID (``0x740f`` -> ``Instinct MI210``)."""
    device = _BY_ID.get(device_id)
    return None if device is None else device.product


def gfx_of(lists: Mapping[str, Sequence[str]]) -> str | None:
    """The first gfx target an ``amd`` list names (a device's own target)."""
    targets = lists.get("gfx_arch", [])
    return targets[0] if targets else None


def describe(lists: Mapping[str, Sequence[str]]) -> Described:
    """What a device's ``amd`` lists say of it: ``gfx942 (Instinct MI300A, MI300X, ...)``
    and ``ROCm 6.4``."""
    product = None
    if gfx := gfx_of(lists):
        known = product_name(gfx) if gfx_value(gfx) else None
        product = shown(gfx) + (f" ({known})" if known else "")
    rocm = lists.get("rocm_version", ())
    return Described(product, f"ROCm {shown(rocm[0])}" if rocm else None)


# --------------------------------------------------------------------------- binaries


def propose(evidence: ImageEvidence) -> Proposed:
    """``gfx_arch``: the targets every offload bundle has (a code object runs only on its
    own target); ``rocm_version``: the bundled ROCm's ``major.minor``."""
    sets = [set(f.targets) for f in evidence.of_kind(OFFLOAD) if f.targets]
    values = [("gfx_arch", target) for target in sorted(set.intersection(*sets))] if sets else []
    rocm = [f for f in evidence.of_kind(ROCM_VERSION) if len(f.version) >= 2]
    if rocm:
        best = max(rocm, key=lambda f: f.version[:2])
        values.append(("rocm_version", f"{best.version[0]}.{best.version[1]}"))
    return Proposed(tuple(values))


def verify(
    evidence: ImageEvidence, features: Mapping[str, Sequence[str]], verdict: Verdict
) -> None:
    """A ``gfx_arch`` label naming a target some offload bundle lacks is refused."""
    bundles = [f for f in evidence.of_kind(OFFLOAD) if f.targets]
    for value in features.get("gfx_arch", ()):
        if not bundles or gfx_value(value) is None:
            continue
        verdict.checked.append(f"amd :: gfx_arch :: {value}")
        for bundle in bundles:
            if value not in bundle.targets:
                verdict.errors.append(
                    f"amd :: gfx_arch :: {value}: {bundle.path} ({bundle.section}) has code "
                    f"objects for {', '.join(bundle.targets)} only"
                )


def label_part(feature: str, value: str) -> str | None:
    """``rocm62`` for ROCm 6.2."""
    return "rocm" + value.replace(".", "") if feature == "rocm_version" else None


# --------------------------------------------------------------------------- DRA

DRA_DOMAIN = "gpu.amd.com"
_ATTRIBUTES = f'device.attributes["{DRA_DOMAIN}"]'
HOMOGENEOUS_ATTRIBUTE = f"{DRA_DOMAIN}/productName"
# The driver's device types (its ``type`` attribute). Its ``gpu.amd.com`` class admits all
# of them: a whole GPU, a partition of one (several share one GPU: eight CPX partitions
# would meet ``--count 8`` on a single MI300X), and a VFIO passthrough device (a PF or an
# SR-IOV VF such as the MI300X VF 0x74b5) that a container cannot run code on.
DRA_TYPE_GPU = "amdgpu"
DRA_TYPE_PARTITION = "amdgpu-partition"
DRA_TYPE_VFIO = "vfio"
DRA_KIND_ATTRIBUTE = f"{DRA_DOMAIN}/type"
_GUARDS = {"gfx_arch": "deviceID", "rocm_version": "driverVersion"}


def _attribute(name: str) -> str:
    return f"{_ATTRIBUTES}.{name}"


def dra_guard(feature: str) -> str | None:
    name = _GUARDS.get(feature)
    return None if name is None else f"has({_attribute(name)})"


def _semver(version: Version) -> str:
    padded = (*version, 0, 0, 0)[:3]
    return f'semver("{padded[0]}.{padded[1]}.{padded[2]}")'


def _driver_ranges(rocm: str) -> list[tuple[Version, Version | None]]:
    """The module-version ranges [low, high) whose driver release runs ``rocm``."""
    ranges: list[tuple[Version, Version | None]] = []
    rows = list(DRIVER_RELEASES)
    for i, (version, release) in enumerate(rows):
        if rocm not in ROCM_SUPPORT.get(release, ()):
            continue
        high = rows[i + 1][0] if i + 1 < len(rows) else None
        if ranges and ranges[-1][1] == version:
            ranges[-1] = (ranges[-1][0], high)  # adjacent rows: one range
        else:
            ranges.append((version, high))
    return ranges


def _rocm_clause(value: str) -> str | None:
    if rocm_value(value) is None:
        return None
    driver = _attribute("driverVersion")
    alternatives = []
    for low, high in _driver_ranges(value):
        clause = f"{driver}.compareTo({_semver(low)}) >= 0"
        if high is not None:
            clause += f" && {driver}.compareTo({_semver(high)}) < 0"
        alternatives.append(clause)
    if not alternatives:
        return None
    return " || ".join(f"({a})" for a in alternatives) if len(alternatives) > 1 else alternatives[0]


def _gfx_clause(value: str) -> str | None:
    ids = device_ids(value)
    if not ids:
        return None
    listed = ", ".join(f'"0x{device_id:04x}"' for device_id in ids)
    return f"{_attribute('deviceID')} in [{listed}]"


def dra_kind_selector(partitions: bool) -> str:
    """Whole GPUs; with ``partitions``, their partitions too; never VFIO devices."""
    kind = _attribute("type")
    if partitions:
        return f'has({kind}) && {kind} in ["{DRA_TYPE_GPU}", "{DRA_TYPE_PARTITION}"]'
    return f'has({kind}) && {kind} == "{DRA_TYPE_GPU}"'


def dra_clauses(feature: str, values: Sequence[str], limit: int) -> tuple[list[str], list[str]]:
    """``gfx_arch`` values as the PCI device IDs of their products; ``rocm_version`` values
    as the ranges of driver versions whose release runs them."""
    make = {"gfx_arch": _gfx_clause, "rocm_version": _rocm_clause}.get(feature)
    if make is None:
        return [], []
    return clauses_in_order(newest_first(feature, values), make, limit)


def dra_device_lists(attributes: Mapping[str, str]) -> dict[str, list[str]] | None:
    """A ``gpu.amd.com`` device's lists, as the provider writes them: its gfx target (from
    ``deviceID``) and the ROCm releases its driver runs on it (from ``driverVersion``; none
    with the in-tree driver, which publishes no version). ``None`` for what is not a whole
    GPU (a partition, a VFIO device: claims take neither by default) or an unknown ID."""
    if attributes.get("type") != DRA_TYPE_GPU:
        return None
    try:
        gfx = target_of_device(int(attributes.get("deviceID", ""), 16))
    except ValueError:
        return None
    if gfx is None:
        return None
    driver = attributes.get("driverVersion")
    version = None
    if driver is not None and re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,9}){0,3}", driver):
        version = tuple(int(part) for part in driver.split("."))
    lists = {"gfx_arch": [gfx]}
    if runs := releases_for(gfx, rocm_releases(version)):
        lists["rocm_version"] = runs
    return lists


RULES = NamespaceRules(
    NAMESPACE,
    FEATURES,
    multi_value=frozenset({"gfx_arch"}),
    values={"gfx_arch": _GFX_RULE, "rocm_version": _ROCM_RULE},
    order_key=_order_key,
    dra=DraMapping(
        DRA_DOMAIN,
        HOMOGENEOUS_ATTRIBUTE,
        dra_guard,
        dra_clauses,
        kind_selector=dra_kind_selector,
        kind_attribute=DRA_KIND_ATTRIBUTE,
        device_lists=dra_device_lists,
    ),
    provider=("amd-variant-provider", None),  # wheelnext's (not on PyPI yet)
)

VENDOR = Vendor(
    RULES,
    describe=describe,
    contents=ContentsRules(frozenset({"gfx_arch"}), propose, verify, label_part),
    detector=Detector("docker_variant.providers.amd:detect", "KFD sysfs under {root}"),
)
