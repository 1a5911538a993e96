"""What agents and clients send the scheduler, validated (docs/reference/scheduler-api.md).

Every check raises ``InvalidInputError`` with one line that names the offending value, so
the HTTP layer answers 400 with it unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from docker_variant.api.names import DEFAULT_RESOURCE_GROUP, DEVICE_NAME, ID, check_agent_id
from docker_variant.errors import InvalidInputError
from docker_variant.jsondoc import load_json
from docker_variant.oci.reference import Reference, versioned_reference
from docker_variant.planner.kept import Kept
from docker_variant.planner.pool import SHARE, AgentReport
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists, parse_supported_lists
from docker_variant.variant.platform import Platform

__all__ = [
    "MAX_CAPACITY",
    "MAX_NODES",
    "SHARE",
    "AgentReport",
    "PlacementRequest",
    "parse_agent_report",
    "parse_image",
    "parse_placement_body",
    "parse_placement_request",
]

MAX_NODES = 10_000
MAX_DEVICES_PER_NODE = 1_024
MAX_CAPACITY = 1_024  # shares one device may report


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _unknown_keys(data: Mapping[str, Any], known: set[str], what: str) -> None:
    if unknown := sorted(set(data) - known):
        raise InvalidInputError(
            f"{what}: unknown key {unknown[0]!r} (expected {', '.join(sorted(known))})"
        )


def _shares(value: object, what: str, maximum: float, rule: str) -> int:
    """A number of shares (0 < value <= maximum) in millionths."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= maximum
        or round(value * SHARE) < 1
    ):
        raise InvalidInputError(f"{what} must be {rule}, got {value!r}")
    return round(value * SHARE)


def _reported(
    devices: Mapping[str, Mapping[str, object]], name: object, device_id: object, what: str
) -> tuple[str, str]:
    if not isinstance(name, str) or name not in devices:
        raise InvalidInputError(f"{what}: device name {name!r} is not among the reported devices")
    if not isinstance(device_id, str) or device_id not in devices[name]:
        raise InvalidInputError(
            f"{what}.{name}: device {device_id!r} is not among the reported {name} devices"
        )
    return name, device_id


def _capacity(
    data: object, devices: Mapping[str, Mapping[str, object]]
) -> dict[tuple[str, str], int]:
    """``{"<device_name>": {"<device_id>": shares}}``; one share where not given."""
    capacity: dict[tuple[str, str], int] = {}
    for name, members in _object(data, "capacity").items():
        for device_id, shares in _object(members, f"capacity.{name}").items():
            key = _reported(devices, name, device_id, "capacity")
            rule = f"a number of shares > 0 and <= {MAX_CAPACITY}"
            units = _shares(shares, f"capacity.{name}.{device_id}", MAX_CAPACITY, rule)
            if units != SHARE:  # the default is not stored
                capacity[key] = units
    return capacity


def _unhealthy(
    data: object, devices: Mapping[str, Mapping[str, object]]
) -> frozenset[tuple[str, str]]:
    """``{"<device_name>": ["<device_id>", ...]}``."""
    unhealthy: set[tuple[str, str]] = set()
    for name, ids in _object(data, "unhealthy").items():
        if not isinstance(ids, list):
            raise InvalidInputError(
                f"unhealthy.{name} must be a list of device ids, got {type(ids).__name__}"
            )
        unhealthy.update(_reported(devices, name, device_id, "unhealthy") for device_id in ids)
    return frozenset(unhealthy)


def parse_agent_report(data: object, path_agent_id: str) -> AgentReport:
    """``{"agent_id", "resource_group", "host", "devices"}`` as PUT to ``/v1/agents/{id}``,
    with optional ``platform``, ``capacity`` and ``unhealthy`` (docs/reference/scheduler-api.md)."""
    report = _object(data, "an agent report")
    known = {"agent_id", "resource_group", "host", "devices", "platform", "capacity", "unhealthy"}
    _unknown_keys(report, known, "agent report")
    agent_id = check_agent_id(path_agent_id)
    if "agent_id" in report and report["agent_id"] != agent_id:
        raise InvalidInputError(
            f"agent_id {report['agent_id']!r} in the body does not match {agent_id!r} in the path"
        )
    group = report.get("resource_group", DEFAULT_RESOURCE_GROUP)
    group = ID.check(group, "resource_group")
    host = parse_supported_lists(report.get("host", {}), f"agent {agent_id}: host")
    devices: dict[str, dict[str, SupportedLists]] = {}
    for name, members in _object(report.get("devices", {}), "devices").items():
        DEVICE_NAME.check(name, "device name")
        devices[name] = {}
        for device_id, lists in _object(members, f"devices.{name}").items():
            ID.check(device_id, f"devices.{name}: device id")
            where = f"agent {agent_id}: device {name}/{device_id}"
            devices[name][device_id] = parse_supported_lists(lists, where)
    platform = report.get("platform")
    if platform is not None:
        platform = str(Platform.parse(platform, f"agent {agent_id}: platform"))
    capacity = _capacity(report.get("capacity", {}), devices)
    unhealthy = _unhealthy(report.get("unhealthy", {}), devices)
    return AgentReport(agent_id, group, host, devices, platform, capacity, unhealthy)


@dataclass(frozen=True)
class PlacementRequest:
    """Where to run ``image`` (a tagged reference) or ``index`` (an index document): ``nodes``
    nodes with ``devices_per_node`` devices each (0: judged on the host lists alone)."""

    nodes: int
    devices_per_node: int
    image: Reference | None = None
    index: VariantIndex | None = None
    resource_group: str | None = None
    device_name: str | None = None
    shares: int | None = None  # of each device, in millionths (``SHARE``); None: whole devices
    spread: bool = False  # may a gang take nodes of several resource groups (none named)

    def to_json(self) -> dict[str, Any]:
        """The request as a client would send it (kept with a placement, for ``replace``)."""
        document: dict[str, Any] = {"nodes": self.nodes, "devices_per_node": self.devices_per_node}
        if self.image is not None:
            document["image"] = str(self.image)
        if self.index is not None:
            document["index"] = _index_document(self.index)
        for key, value in (
            ("resource_group", self.resource_group),
            ("device_name", self.device_name),
            ("shares_per_device", None if self.shares is None else self.shares / SHARE),
        ):
            if value is not None:
                document[key] = value
        if self.spread:
            document["spread"] = True
        return document

    @functools.cached_property
    def stored_text(self) -> str:
        """``to_json()`` as JSON text, worked out once per request object (one kept by
        ``parse_placement_body`` serves every placement its body asks for)."""
        return json.dumps(self.to_json())


def _count(data: Mapping[str, Any], key: str, minimum: int, maximum: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInputError(f"{key} must be an integer {minimum}..{maximum}, got {value!r}")
    return value


_DOCUMENTS: dict[int, tuple[VariantIndex, dict[str, Any]]] = {}  # theirs, by id: to_json()
_INDEXES: Kept[str, VariantIndex] = Kept(32, lambda dropped: _DOCUMENTS.pop(id(dropped), None))


def _index_document(index: VariantIndex) -> dict[str, Any]:
    """``index.to_json()``, worked out once for the indexes ``_index`` keeps."""
    kept = _DOCUMENTS.get(id(index))
    if kept is not None and kept[0] is index:
        return kept[1]
    return index.to_json()


def _index(data: object) -> VariantIndex:
    """The index document ``data``, read once per distinct document: clients place the same
    index again and again, and one ``VariantIndex`` per document lets the planner keep its
    judge (``placement.JudgeCache``). Only valid documents are kept."""
    key = json.dumps(data, separators=(",", ":"), sort_keys=True)
    found = _INDEXES.get(key)
    if found is not None:
        return found
    index = VariantIndex.from_json(data, "index")
    if index.is_empty:
        # (invalid images alone are a refusal that names each, as for {"image": REF})
        raise InvalidInputError("index: no variant, no bare image and no invalid image")
    _DOCUMENTS[id(index)] = (index, index.to_json())
    return _INDEXES.put(key, index)  # one read meanwhile by another thread is dropped


def parse_image(value: object) -> Reference:
    """``{"image": REF}``: a reference with a version tag. The one place its text is read:
    the layers above take the ``Reference``."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"image must be a reference such as reg/app:1.0, got {value!r}")
    return versioned_reference(value)


def parse_placement_request(data: object) -> PlacementRequest:
    request = _object(data, "a placement request")
    known = {"image", "index", "nodes", "devices_per_node", "resource_group", "device_name"}
    known |= {"shares_per_device", "spread"}
    _unknown_keys(request, known, "placement request")
    if ("image" in request) == ("index" in request):
        raise InvalidInputError(
            'give exactly one of "image" (registry/name:version) or "index" (a variant index)'
        )
    image = parse_image(request["image"]) if "image" in request else None
    index = None
    if "index" in request:
        index = _index(request["index"])
    if "nodes" not in request:
        raise InvalidInputError("nodes is required (an integer >= 1)")
    if "devices_per_node" not in request:
        raise InvalidInputError("devices_per_node is required (an integer >= 0)")
    group = request.get("resource_group")
    if group is not None:
        group = ID.check(group, "resource_group")
    device_name = request.get("device_name")
    if device_name is not None:
        device_name = DEVICE_NAME.check(device_name, "device_name")
    spread = request.get("spread", False)
    if not isinstance(spread, bool):
        raise InvalidInputError(f"spread must be true or false, got {spread!r}")
    if spread and group is not None:
        raise InvalidInputError(
            f"spread: a gang in resource group {group!r} cannot spread over others; "
            "name no resource_group to spread"
        )
    nodes = _count(request, "nodes", 1, MAX_NODES)
    per_node = _count(request, "devices_per_node", 0, MAX_DEVICES_PER_NODE)
    shares = None
    if "shares_per_device" in request:
        shares = _shares(
            request["shares_per_device"], "shares_per_device", 1, "a number > 0 and <= 1"
        )
        if per_node == 0:
            raise InvalidInputError(
                "shares_per_device needs devices_per_node >= 1 (shares of which devices?)"
            )
    return PlacementRequest(
        nodes=nodes,
        devices_per_node=per_node,
        image=image,
        index=index,
        resource_group=group,
        device_name=device_name,
        shares=shares,
        spread=spread,
    )


_REQUESTS: Kept[bytes, PlacementRequest] = Kept(32)  # by the body's SHA-256


def parse_placement_body(body: bytes, what: str = "request body") -> PlacementRequest:
    """``parse_placement_request`` of the JSON document ``body``, read once per distinct
    body: a client sends the same bytes again and again, and the request read from them is
    immutable, so the bounded JSON reading (``load_json``) and the checks are skipped when
    the same bytes come again. Only valid requests are kept; an invalid body fails each time
    with the same one line."""
    key = hashlib.sha256(body).digest()
    found = _REQUESTS.get(key)
    if found is not None:
        return found
    return _REQUESTS.put(key, parse_placement_request(load_json(body, what)))
