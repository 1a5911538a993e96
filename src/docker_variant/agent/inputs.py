"""The providers file the agent may take instead of detection: supported lists (the host
only), or what ``docker-variant providers --devices --json`` prints, optionally with the shares each
device has (``"capacity"``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker_variant.errors import InvalidInputError
from docker_variant.jsondoc import read_json_file
from docker_variant.providers import HostReport, is_report, read_providers_file

__all__ = ["AgentFile", "read_agent_providers_file"]


@dataclass(frozen=True)
class AgentFile:
    """A providers file as the agent reads it: the lists, and the capacity it may state."""

    report: HostReport
    capacity: dict[str, dict[str, float]] = field(default_factory=dict)


def _capacity(
    data: object, devices: Mapping[str, Mapping[str, Any]], what: str
) -> dict[str, dict[str, float]]:
    if not isinstance(data, dict):
        raise InvalidInputError(f"{what}: capacity must be {{device kind: {{device id: shares}}}}")
    capacity: dict[str, dict[str, float]] = {}
    for kind, shares in data.items():
        if not isinstance(shares, dict):
            raise InvalidInputError(f"{what}: capacity.{kind} must map device ids to shares")
        for device_id, value in shares.items():
            if device_id not in devices.get(kind, {}):
                raise InvalidInputError(f"{what}: capacity names {kind}/{device_id}, no device")
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidInputError(
                    f"{what}: capacity of {kind}/{device_id} must be a number > 0, got {value!r}"
                )
            capacity.setdefault(kind, {})[device_id] = float(value)
    return capacity


def read_agent_providers_file(path: Path) -> AgentFile:
    """Supported lists (the host only), or the ``{"host", "devices", "sources"}`` report,
    with ``"capacity"`` where it gives shares."""
    what = f"providers file {str(path)!r}"
    data = read_json_file(path, what)
    if not is_report(data, frozenset({"capacity"})):
        return AgentFile(read_providers_file(path))
    try:
        report = HostReport.from_json(data, what)
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(
            f"{what}: expected {{host: LISTS, devices: {{kind: {{id: LISTS}}}}}} ({exc})"
        ) from None
    return AgentFile(report, _capacity(data.get("capacity", {}), report.devices, what))
