"""DRA's CEL environment for device selectors, on cel-python, faithful to Kubernetes.

- ``semver(string)``, ``isSemver(string)`` and the ``Semver`` methods ``compareTo``,
  ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``, ``patch``: Kubernetes'
  ``k8s.io/apiserver/pkg/cel/library/semverlib.go`` over ``github.com/blang/semver/v4``
  (strict parsing: ``MAJOR.MINOR.PATCH[-PRE][+BUILD]``, no leading zeros; build metadata
  does not take part in comparisons; a pre-release sorts before its release).
- ``device``: ``{"driver", "attributes", "capacity"}`` where ``attributes[domain]`` is the
  map of that domain's attributes and an unknown domain gives an empty map
  (``dynamic-resource-allocation/cel/compile.go``); ``version`` attributes are ``Semver``.
- A selector must evaluate to a bool; an error (an unknown attribute, a bad version) aborts
  the allocation, so here it raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache, total_ordering
from typing import Any

import celpy
from celpy import celtypes

_NUM = r"(0|[1-9][0-9]*)"
_IDENT = r"[0-9A-Za-z-]+"
_SEMVER_RE = re.compile(
    rf"{_NUM}\.{_NUM}\.{_NUM}(?:-({_IDENT}(?:\.{_IDENT})*))?(?:\+({_IDENT}(?:\.{_IDENT})*))?"
)


@total_ordering
@dataclass(frozen=True, eq=False)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Semver:
        match = _SEMVER_RE.fullmatch(text)
        if match is None:
            raise ValueError(f"{text!r} is not a semantic version")
        pre = tuple(match[4].split(".")) if match[4] else ()
        for part in pre:
            if part.isdigit() and len(part) > 1 and part.startswith("0"):
                raise ValueError(f"{text!r}: numeric pre-release identifier with a leading zero")
        return cls(int(match[1]), int(match[2]), int(match[3]), pre)

    def compare(self, other: Semver) -> int:
        """blang/semver ``Version.Compare``."""
        for mine, theirs in (
            (self.major, other.major),
            (self.minor, other.minor),
            (self.patch, other.patch),
        ):
            if mine != theirs:
                return 1 if mine > theirs else -1
        if not self.pre or not other.pre:
            return (len(other.pre) > 0) - (len(self.pre) > 0)  # a release beats a pre-release
        for mine_id, theirs_id in zip(self.pre, other.pre, strict=False):
            if mine_id == theirs_id:
                continue
            mine_num, theirs_num = mine_id.isdigit(), theirs_id.isdigit()
            if mine_num and theirs_num:
                return 1 if int(mine_id) > int(theirs_id) else -1
            if mine_num != theirs_num:
                return -1 if mine_num else 1  # numeric identifiers sort first
            return 1 if mine_id > theirs_id else -1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __lt__(self, other: Semver) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))


def _semver_arg(value: object) -> Semver:
    if not isinstance(value, Semver):
        raise TypeError("no such overload")
    return value


def _semver(text: object) -> Semver:
    if not isinstance(text, str):
        raise TypeError("no such overload")
    return Semver.parse(str(text))


def _is_semver(text: object) -> celtypes.BoolType:
    try:
        _semver(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


FUNCTIONS: dict[str, Any] = {
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": lambda a, b: celtypes.IntType(_semver_arg(a).compare(_semver_arg(b))),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_semver_arg(a).compare(_semver_arg(b)) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_semver_arg(a).compare(_semver_arg(b)) < 0),
    "major": lambda a: celtypes.IntType(_semver_arg(a).major),
    "minor": lambda a: celtypes.IntType(_semver_arg(a).minor),
    "patch": lambda a: celtypes.IntType(_semver_arg(a).patch),
}


class _DomainMap(celtypes.MapType):
    """``device.attributes``: an unknown domain is an empty map, as in DRA."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


def _cel_value(value: object) -> Any:
    if isinstance(value, Semver):
        return value
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    raise TypeError(f"unsupported attribute {value!r}")


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice: ``attributes`` are ``{"domain/name": value}`` or, for
    the driver's own domain, ``{"name": value}``; version attributes as ``Semver``."""

    name: str
    driver: str
    attributes: Mapping[str, object]

    def activation(self) -> dict[str, Any]:
        grouped: dict[str, dict[Any, Any]] = {}
        for qualified, value in self.attributes.items():
            domain, _, ident = qualified.rpartition("/")
            grouped.setdefault(domain or self.driver, {})[celtypes.StringType(ident)] = _cel_value(
                value
            )
        attributes = _DomainMap(
            {celtypes.StringType(d): celtypes.MapType(a) for d, a in grouped.items()}
        )
        return {
            "device": celtypes.MapType(
                {
                    celtypes.StringType("driver"): celtypes.StringType(self.driver),
                    celtypes.StringType("attributes"): attributes,
                    celtypes.StringType("capacity"): _DomainMap({}),
                }
            )
        }


_ENV = celpy.Environment()


@lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Any:
    """Parse ``expression`` (raises ``celpy.CELParseError``) into a runnable program; a
    program is reused across devices (the tests evaluate one selector on many)."""
    return _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)


def matches(expression: str, device: Device) -> bool:
    """The selector's verdict on ``device``; an evaluation error raises, as it aborts DRA."""
    result = compile_selector(expression).evaluate(device.activation())
    if not isinstance(result, celtypes.BoolType):
        raise TypeError(f"{expression!r} gave {result!r}, not a bool")
    return bool(result)


# --------------------------------------------------------------------------- NVIDIA products

#: (product, compute capability, architecture), as NVIDIA's CUDA GPUs list gives them
PRODUCTS = {
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0), "Ampere"),
    "L4": ("NVIDIA L4", (8, 9), "Ada Lovelace"),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), "Hopper"),
    "H200": ("NVIDIA H200", (9, 0), "Hopper"),
    "B200": ("NVIDIA B200", (10, 0), "Blackwell"),
    "B300": ("NVIDIA B300 SXM6 AC", (10, 3), "Blackwell"),
    "RTX5090": ("NVIDIA GeForce RTX 5090", (12, 0), "Blackwell"),
}
#: driver branch -> (driver version, highest CUDA version), from the CUDA release notes
DRIVERS = {
    "R535": ("535.261.03", (12, 2)),
    "R550": ("550.163.01", (12, 4)),
    "R570": ("570.172.08", (12, 8)),
    "R580": ("580.82.07", (13, 0)),
}


def nvidia_gpu(product: str, driver: str, index: int = 0) -> Device:
    """A ``gpu.nvidia.com`` GPU as the NVIDIA DRA driver publishes it."""
    name, (major, minor), architecture = PRODUCTS[product]
    driver_version, (cuda_major, cuda_minor) = DRIVERS[driver]
    d_major, d_minor, d_patch = (int(part) for part in driver_version.split("."))
    return Device(
        f"gpu-{index}",
        "gpu.nvidia.com",
        {
            "type": "gpu",
            "uuid": f"GPU-{index:08x}-0000-0000-0000-000000000000",
            "productName": name,
            "brand": "Nvidia",
            "architecture": architecture,
            "cudaComputeCapability": Semver(major, minor, 0),
            # The driver parses it leniently and publishes the canonical form (570.172.8).
            "driverVersion": Semver(d_major, d_minor, d_patch),
            "cudaDriverVersion": Semver(cuda_major, cuda_minor, 0),
            "resource.kubernetes.io/pciBusID": f"0000:{index + 0x17:02x}:00.0",
        },
    )


def first_available(subrequests: list[dict[str, Any]], device: Device) -> str | None:
    """The subrequest the scheduler takes for one such device: the first whose selectors
    all hold (one without selectors takes any device of its class)."""
    for sub in subrequests:
        selectors = [s["cel"]["expression"] for s in sub.get("selectors", [])]
        if all(matches(expression, device) for expression in selectors):
            return str(sub["name"])
    return None


# --------------------------------------------------------------------------- AMD products


def amd_gpu(device_id: int, product: str, driver_version: str, index: int = 0) -> Device:
    """A ``gpu.amd.com`` GPU as the AMD GPU DRA driver publishes it: ``deviceID`` the PCI
    device ID, ``productName``, ``driverVersion`` the amdgpu driver's version; no gfx target."""
    return Device(
        f"gpu-{index}",
        "gpu.amd.com",
        {
            "type": "amdgpu",
            "deviceID": f"0x{device_id:04x}",
            "productName": product,
            "driverVersion": Semver.parse(driver_version),
            "partitionProfile": "spx_nps1",
            "numaNode": 0,
            "resource.kubernetes.io/pciBusID": f"0000:{index + 0x05:02x}:00.0",
        },
    )


def first_available_of_class(subrequests: list[dict[str, Any]], device: Device) -> str | None:
    """As ``first_available``, among the subrequests whose device class is the device's
    driver (a DeviceClass selects its driver's devices)."""
    return first_available(
        [sub for sub in subrequests if sub["deviceClassName"] == device.driver], device
    )
