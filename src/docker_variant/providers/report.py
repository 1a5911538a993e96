"""What a host supports: the aggregate pip/uv would see, and each device's own lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from docker_variant.errors import InvalidInputError
from docker_variant.variant.model import SupportedLists, check_namespace, parse_supported_lists

__all__ = ["HostReport"]


@dataclass(frozen=True)
class HostReport:
    host: SupportedLists
    #: device kind (a namespace, e.g. ``nvidia``) -> device id (a GPU UUID, a PCI address)
    #: -> lists
    devices: dict[str, dict[str, SupportedLists]] = field(default_factory=dict)
    #: namespace -> which provider answered (``built-in (...)``, ``descriptor FILE``,
    #: ``plugin NS``); ``*`` for a providers file
    sources: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"host": self.host, "devices": self.devices}
        if self.sources:
            data["sources"] = self.sources
        return data

    @classmethod
    def from_json(cls, data: Any, source: str) -> HostReport:
        if not isinstance(data, dict) or not isinstance(data.get("host"), dict):
            raise InvalidInputError(f'{source}: expected {{"host": LISTS, "devices": ...}}')
        host = parse_supported_lists(data["host"], f"{source}: host")
        raw_devices = data.get("devices") or {}
        if not isinstance(raw_devices, dict) or not all(
            isinstance(ids, dict) for ids in raw_devices.values()
        ):
            raise InvalidInputError(
                f"{source}: devices must be {{namespace: {{device id: LISTS}}}}"
            )
        devices = {
            check_namespace(kind, f"{source}: devices"): {
                str(dev): parse_supported_lists(lists, f"{source}: {kind}/{dev}")
                for dev, lists in ids.items()
            }
            for kind, ids in raw_devices.items()
        }
        sources = data.get("sources") or {}
        if not isinstance(sources, dict):
            raise InvalidInputError(f"{source}: sources must be an object")
        return cls(host, devices, {str(k): str(v) for k, v in sources.items()})
