"""What a host supports: the aggregate pip/uv would see, and each device's own lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from docker_variant.variant.model import SupportedLists, parse_supported_lists

__all__ = ["HostReport"]


@dataclass(frozen=True)
class HostReport:
    host: SupportedLists
    #: device kind (a namespace, e.g. ``nvidia``) -> device id (e.g. a GPU UUID) -> lists
    devices: dict[str, dict[str, SupportedLists]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "devices": self.devices}

    @classmethod
    def from_json(cls, data: Any, source: str) -> HostReport:
        host = parse_supported_lists(data["host"], f"{source}: host")
        devices = {
            kind: {
                dev: parse_supported_lists(lists, f"{source}: {kind}/{dev}")
                for dev, lists in ids.items()
            }
            for kind, ids in data.get("devices", {}).items()
        }
        return cls(host, devices)
