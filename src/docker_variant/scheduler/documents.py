"""What agents and clients send the scheduler, validated (SPEC section 8).

Every check raises ``InvalidInputError`` with one line that names the offending value, so
the HTTP layer answers 400 with it unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from docker_variant.errors import InvalidInputError
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists, parse_supported_lists
from docker_variant.variant.platform import Platform

__all__ = [
    "DEFAULT_RESOURCE_GROUP",
    "MAX_NODES",
    "AgentReport",
    "PlacementRequest",
    "check_agent_id",
    "parse_agent_report",
    "parse_placement_request",
]

DEFAULT_RESOURCE_GROUP = "default"
MAX_NODES = 10_000
MAX_DEVICES_PER_NODE = 1_024

# Agent ids travel in URL paths: no '/'. Device names may look like "nvidia.com/gpu".
_AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,254}")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,254}")
_DEVICE_ID = _AGENT_ID
_RULE = "letters, digits and . _ : @ + -, starting with a letter or digit, at most 255"


def _check_name(value: object, pattern: re.Pattern[str], what: str, extra: str = "") -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise InvalidInputError(f"{what} {value!r} is not valid: {_RULE}{extra}")
    return value


def check_agent_id(value: object) -> str:
    return _check_name(value, _AGENT_ID, "agent_id")


@dataclass(frozen=True)
class AgentReport:
    """One heartbeat: the host's lists and each device's own lists, by device name and id."""

    agent_id: str
    resource_group: str
    host: SupportedLists
    devices: Mapping[str, Mapping[str, SupportedLists]]
    platform: str | None = None  # os/arch[/variant]; None: from the host lists' CPU namespace


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _unknown_keys(data: Mapping[str, Any], known: set[str], what: str) -> None:
    if unknown := sorted(set(data) - known):
        raise InvalidInputError(
            f"{what}: unknown key {unknown[0]!r} (expected {', '.join(sorted(known))})"
        )


def parse_agent_report(data: object, path_agent_id: str) -> AgentReport:
    """``{"agent_id", "resource_group", "host", "devices"}`` as PUT to ``/v1/agents/{id}``."""
    report = _object(data, "an agent report")
    known = {"agent_id", "resource_group", "host", "devices", "platform"}
    _unknown_keys(report, known, "agent report")
    agent_id = check_agent_id(path_agent_id)
    if "agent_id" in report and report["agent_id"] != agent_id:
        raise InvalidInputError(
            f"agent_id {report['agent_id']!r} in the body does not match {agent_id!r} in the path"
        )
    group = report.get("resource_group", DEFAULT_RESOURCE_GROUP)
    group = _check_name(group, _AGENT_ID, "resource_group")
    host = parse_supported_lists(report.get("host", {}), f"agent {agent_id}: host")
    devices: dict[str, dict[str, SupportedLists]] = {}
    for name, members in _object(report.get("devices", {}), "devices").items():
        _check_name(name, _DEVICE_NAME, "device name", " (and /)")
        devices[name] = {}
        for device_id, lists in _object(members, f"devices.{name}").items():
            _check_name(device_id, _DEVICE_ID, f"devices.{name}: device id")
            where = f"agent {agent_id}: device {name}/{device_id}"
            devices[name][device_id] = parse_supported_lists(lists, where)
    platform = report.get("platform")
    if platform is not None:
        platform = str(Platform.parse(platform, f"agent {agent_id}: platform"))
    return AgentReport(agent_id, group, host, devices, platform)


@dataclass(frozen=True)
class PlacementRequest:
    """Where to run ``image`` (a reference) or ``index`` (a section 5 document): ``nodes``
    nodes with ``devices_per_node`` devices each (0: judged on the host lists alone)."""

    nodes: int
    devices_per_node: int
    image: str | None = None
    index: VariantIndex | None = None
    resource_group: str | None = None
    device_name: str | None = None


def _count(data: Mapping[str, Any], key: str, minimum: int, maximum: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInputError(f"{key} must be an integer {minimum}..{maximum}, got {value!r}")
    return value


def parse_placement_request(data: object) -> PlacementRequest:
    request = _object(data, "a placement request")
    known = {"image", "index", "nodes", "devices_per_node", "resource_group", "device_name"}
    _unknown_keys(request, known, "placement request")
    if ("image" in request) == ("index" in request):
        raise InvalidInputError(
            'give exactly one of "image" (registry/name:version) or "index" (a variant index)'
        )
    image = request.get("image")
    if image is not None and (not isinstance(image, str) or not image):
        raise InvalidInputError(f"image must be a reference such as reg/app:1.0, got {image!r}")
    index = None
    if "index" in request:
        index = VariantIndex.from_json(request["index"], "index")
        if not index.variants and index.bare is None:
            invalid = f" ({len(index.invalid)} invalid images)" if index.invalid else ""
            raise InvalidInputError(f"index: no variant and no bare image to place{invalid}")
    if "nodes" not in request:
        raise InvalidInputError("nodes is required (an integer >= 1)")
    if "devices_per_node" not in request:
        raise InvalidInputError("devices_per_node is required (an integer >= 0)")
    group = request.get("resource_group")
    if group is not None:
        group = _check_name(group, _AGENT_ID, "resource_group")
    device_name = request.get("device_name")
    if device_name is not None:
        device_name = _check_name(device_name, _DEVICE_NAME, "device_name", " (and /)")
    return PlacementRequest(
        nodes=_count(request, "nodes", 1, MAX_NODES),
        devices_per_node=_count(request, "devices_per_node", 0, MAX_DEVICES_PER_NODE),
        image=image,
        index=index,
        resource_group=group,
        device_name=device_name,
    )
