"""PCI devices under the host root: ``sys/bus/pci/devices/<address>/{vendor,device}``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from docker_variant.providers.hostroot import HostRoot

__all__ = ["PCI_DEVICES", "PciDevice", "read_pci_devices"]

PCI_DEVICES = "sys/bus/pci/devices"
_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ID = re.compile(r"0x([0-9a-fA-F]{4})")


@dataclass(frozen=True)
class PciDevice:
    address: str  # 0000:3b:00.0
    vendor: int
    device: int


def _id(root: HostRoot, relative: str) -> int | None:
    line = root.first_line(relative)
    match = None if line is None else _ID.fullmatch(line)
    return None if match is None else int(match[1], 16)


def read_pci_devices(root: HostRoot) -> list[PciDevice]:
    """Every PCI function with readable vendor and device IDs, by address."""
    found: list[PciDevice] = []
    for entry in root.entries(PCI_DEVICES):
        if _ADDRESS.fullmatch(entry.name) is None:
            continue
        vendor = _id(root, f"{PCI_DEVICES}/{entry.name}/vendor")
        device = _id(root, f"{PCI_DEVICES}/{entry.name}/device")
        if vendor is not None and device is not None:
            found.append(PciDevice(entry.name, vendor, device))
    return found
