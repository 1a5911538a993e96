"""Agents as ``GET /v1/agents`` shows them: pure, from the rows of ``rows.agent_rows``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from docker_variant.numtext import natural_key
from docker_variant.planner.pool import ProfileKey, room_left
from docker_variant.scheduler.documents import SHARE
from docker_variant.scheduler.rows import HOST_ROW, iso, usage_of
from docker_variant.variant.model import SupportedLists

__all__ = ["agent_views", "shares_out"]


def shares_out(units: int) -> float:
    """Millionths of a share as the number a client reads."""
    return round(units / SHARE, 6)


def _sorted(ids: Sequence[str]) -> list[str]:
    return sorted(ids, key=natural_key)


def agent_views(
    agent_rows: Sequence[Any],
    device_rows: Sequence[Any],
    allocation_rows: Sequence[Any],
    alive: Callable[[float], bool],
    cordoned: Mapping[str, float],
    profiles: Mapping[ProfileKey, SupportedLists] | None = None,
) -> list[dict[str, Any]]:
    """Each agent with its devices (free, allocated, missing), unhealthy devices, shares
    and whether it is cordoned (``cordoned``: agent id -> since when); with ``profiles``, also its lists and the placements holding its devices."""
    reported: dict[str, dict[str, dict[str, Any]]] = {}
    for row in device_rows:
        reported.setdefault(row.agent_id, {}).setdefault(row.device_name, {})[row.device_id] = row
    taken: dict[str, dict[str, dict[str, list[str]]]] = {}
    usage = usage_of((r.agent_id, r.device_name, r.device_id, r.shares) for r in allocation_rows)
    for row in allocation_rows:
        # a node whose host alone is taken: in "placements", not "devices"
        held_by = taken.setdefault(row.agent_id, {}).setdefault(row.device_name, {})
        held_by.setdefault(row.device_id, []).append(row.placement_id)
    views = []
    for row in agent_rows:
        mine, busy = reported.get(row.agent_id, {}), taken.get(row.agent_id, {})
        summary = {}
        unhealthy: dict[str, list[str]] = {}
        shares: dict[str, dict[str, Any]] = {}
        for name in sorted((set(mine) | set(busy)) - {HOST_ROW}, key=natural_key):
            ids, held = mine.get(name, {}), busy.get(name, {})
            sick = [i for i, device in ids.items() if not device.healthy]
            summary[name] = {
                "free": _sorted([i for i in ids if i not in held and i not in sick]),
                "allocated": _sorted([i for i in ids if i in held]),
                "missing": _sorted([i for i in held if i not in ids]),
            }
            if sick:
                unhealthy[name] = _sorted(sick)
            if not ids:
                continue
            capacity = free = 0
            partly: dict[str, float] = {}
            for device_id, device in ids.items():
                in_use = usage.get((row.agent_id, name, device_id), 0)
                room = room_left(device.capacity, in_use, device.healthy)
                capacity += device.capacity
                free += room
                if in_use and room:
                    partly[device_id] = shares_out(room)
            shares[name] = {
                "capacity": shares_out(capacity),
                "free": shares_out(free),
                "partly_used": {i: partly[i] for i in _sorted(list(partly))},
            }
        view: dict[str, Any] = {
            "agent_id": row.agent_id,
            "resource_group": row.resource_group,
            "first_seen": iso(row.first_seen),
            "last_seen": iso(row.last_seen),
            "alive": alive(row.last_seen),
            "cordoned": row.agent_id in cordoned,
            "platform": row.platform,
            "devices": summary,
            "unhealthy": unhealthy,
            "shares": shares,
        }
        if profiles is not None:
            view["host"] = profiles[row.host_profile]
            view["device_lists"] = {
                name: {i: profiles[d.profile] for i, d in sorted(ids.items())}
                for name, ids in sorted(mine.items())
            }
            view["placements"] = sorted(
                {p for held in busy.values() for ps in held.values() for p in ps}
            )
        views.append(view)
    return views
