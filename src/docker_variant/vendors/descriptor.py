"""Device descriptors: a namespace described as data, for accelerators without a provider.

A descriptor (TOML) names a PEP 825 namespace that no built-in provider answers for, the
PCI devices it covers and what one such device supports; optionally features whose value is
the first line of a file under the host root::

    namespace = "furiosa"
    [[device]]
    pci_vendor = "0x1ed2"
    pci_device = ["0x0000"]            # optional: every device of the vendor when absent
    features = { arch = ["warboy"] }   # most preferred first
    [[file]]
    feature = "driver_version"
    path = "sys/module/furiosa/version"

``parse_descriptor`` is pure: it validates a parsed document and names the file and the key
of the first problem (an unknown key, an invalid value, a built-in namespace).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.vendors.base import NamespaceRules

__all__ = ["DescribedDevice", "Descriptor", "FileFeature", "parse_descriptor"]

_NAME = re.compile(r"[a-z0-9_]+")  # PEP 825 namespace and feature names
_VALUE = re.compile(r"[a-z0-9_.]+")
_PCI_ID = re.compile(r"0x[0-9a-fA-F]{4}")
_TOP_KEYS = ("namespace", "device", "file")
_DEVICE_KEYS = ("pci_vendor", "pci_device", "features")
_FILE_KEYS = ("feature", "path")
MAX_DEVICES = 256
MAX_VALUES = 256


@dataclass(frozen=True)
class DescribedDevice:
    pci_vendor: int
    pci_devices: frozenset[int] | None  # None: every device of the vendor
    features: Mapping[str, tuple[str, ...]]

    def matches(self, vendor: int, device: int) -> bool:
        return vendor == self.pci_vendor and (
            self.pci_devices is None or device in self.pci_devices
        )


@dataclass(frozen=True)
class FileFeature:
    feature: str
    path: str  # relative to the host root


@dataclass(frozen=True)
class Descriptor:
    namespace: str
    source: str  # the file it was read from
    devices: tuple[DescribedDevice, ...]
    files: tuple[FileFeature, ...] = ()
    rules: NamespaceRules = field(init=False)

    def __post_init__(self) -> None:
        features = [f for d in self.devices for f in d.features] + [f.feature for f in self.files]
        object.__setattr__(
            self,
            "rules",
            NamespaceRules(self.namespace, tuple(dict.fromkeys(features)), builtin=False),
        )


class _Where:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> InvalidInputError:
        return InvalidInputError(f"descriptor {self.source}: {key}: {problem}")


def _table(value: object, where: _Where, key: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.fail(key, f"expected a table, got {type(value).__name__}")
    for name in value:
        if name not in known:
            raise where.fail(
                f"{key}.{name}" if key else str(name),
                f"unknown key (a descriptor knows {', '.join(known)})",
            )
    return value


def _name(value: object, where: _Where, key: str) -> str:
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise where.fail(key, f"{one_line(repr(value), 80)} is not a name of [a-z0-9_]+")
    return value


def _pci_id(value: object, where: _Where, key: str) -> int:
    if not isinstance(value, str) or _PCI_ID.fullmatch(value) is None:
        raise where.fail(
            key, f"{one_line(repr(value), 80)} is not a PCI ID of the form 0x1ed2 (4 hex digits)"
        )
    return int(value, 16)


def _values(value: object, where: _Where, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise where.fail(key, "expected a non-empty list of values, most preferred first")
    if len(value) > MAX_VALUES:
        raise where.fail(key, f"{len(value)} values; at most {MAX_VALUES}")
    for item in value:
        if not isinstance(item, str) or _VALUE.fullmatch(item) is None:
            raise where.fail(key, f"{one_line(repr(item), 80)} is not a value of [a-z0-9_.]+")
    if len(set(value)) != len(value):
        raise where.fail(key, "repeats a value")
    return tuple(value)


def _device(raw: object, where: _Where, key: str) -> DescribedDevice:
    table = _table(raw, where, key, _DEVICE_KEYS)
    if "pci_vendor" not in table:
        raise where.fail(f"{key}.pci_vendor", "missing (the PCI vendor ID, e.g. 0x1ed2)")
    vendor = _pci_id(table["pci_vendor"], where, f"{key}.pci_vendor")
    devices: frozenset[int] | None = None
    if "pci_device" in table:
        listed = table["pci_device"]
        if not isinstance(listed, list) or not listed:
            raise where.fail(f"{key}.pci_device", "expected a non-empty list of PCI device IDs")
        devices = frozenset(
            _pci_id(item, where, f"{key}.pci_device[{i}]") for i, item in enumerate(listed)
        )
    raw_features = table.get("features")
    if not isinstance(raw_features, dict) or not raw_features:
        raise where.fail(f"{key}.features", "expected a table of feature = [values]")
    features = {
        _name(name, where, f"{key}.features.{name}"): _values(
            values, where, f"{key}.features.{name}"
        )
        for name, values in raw_features.items()
    }
    return DescribedDevice(vendor, devices, features)


def _file(raw: object, where: _Where, key: str) -> FileFeature:
    table = _table(raw, where, key, _FILE_KEYS)
    for name in _FILE_KEYS:
        if name not in table:
            raise where.fail(f"{key}.{name}", "missing")
    feature = _name(table["feature"], where, f"{key}.feature")
    path = table["path"]
    if not isinstance(path, str) or not path.strip("/") or "\0" in path:
        raise where.fail(f"{key}.path", "expected a path relative to the host root")
    if ".." in path.split("/"):
        raise where.fail(f"{key}.path", f"{path!r} leaves the host root ('..')")
    return FileFeature(feature, path.lstrip("/"))


def _list(value: object, where: _Where, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise where.fail(key, f"expected [[{key}]] tables, got {type(value).__name__}")
    if len(value) > MAX_DEVICES:
        raise where.fail(key, f"{len(value)} entries; at most {MAX_DEVICES}")
    return value


def parse_descriptor(data: object, source: str, builtin: frozenset[str]) -> Descriptor:
    """Validate one parsed descriptor read from ``source``; ``builtin`` are the namespaces a
    descriptor may not claim."""
    where = _Where(source)
    table = _table(data, where, "", _TOP_KEYS)
    if "namespace" not in table:
        raise where.fail("namespace", "missing (the PEP 825 namespace this file describes)")
    namespace = _name(table["namespace"], where, "namespace")
    if namespace in builtin:
        raise where.fail(
            "namespace",
            f"{namespace!r} is a built-in namespace (its provider answers for it); "
            "a descriptor describes a namespace without one",
        )
    devices = tuple(
        _device(raw, where, f"device[{i}]")
        for i, raw in enumerate(_list(table.get("device", []), where, "device"))
    )
    if not devices:
        raise where.fail("device", "missing: at least one [[device]] with pci_vendor and features")
    files = tuple(
        _file(raw, where, f"file[{i}]")
        for i, raw in enumerate(_list(table.get("file", []), where, "file"))
    )
    return Descriptor(namespace, source, devices, files)
