"""The pool index: the live nodes and their devices in memory, kept ready for planning.

A device is judged with its node's host lists (``placement.py`` does the judging); this
module only keeps what each node has and what each device has in use. Devices may be shared
(Backend.AI's ``cuda.shares``): each has a capacity in shares (one by default), and what a
device has in use (shares in millionths, or ``WHOLE`` when taken whole) sets whether it is
``free`` (healthy and nothing uses it: it takes a whole-device request) and its ``room``
(shares left). Unhealthy devices have no room and are never free.

Nodes are indexed by :func:`signature`, so that a planner works per signature (a pool of
tens of thousands of nodes has few) and visits single nodes only to pick their devices.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from docker_variant.variant.model import SupportedLists

__all__ = [
    "SHARE",
    "WHOLE",
    "AgentReport",
    "Device",
    "DeviceKey",
    "Node",
    "Pool",
    "ProfileKey",
    "Shares",
    "Signature",
    "build_pool",
    "device_in_use",
    "pool_shares",
    "profile_key",
    "room_left",
    "signature",
]

ProfileKey = str  # a content hash of one supported-lists document

#: Shares are counted in millionths of a share, as integers, so that sums are exact (three
#: placements of 1/3 fill a device and a fourth never fits by rounding).
SHARE = 1_000_000

#: What a device taken whole counts as used (more than any capacity).
WHOLE = 1 << 62


class Device(NamedTuple):  # a tuple: a pool holds tens of thousands
    device_id: str
    profile: ProfileKey  # the device's own lists
    free: bool = True  # healthy and nothing uses it: it takes a whole-device request
    room: int = SHARE  # shares left (millionths): capacity less use; 0 when unhealthy
    capacity: int = SHARE  # shares in all (millionths)
    healthy: bool = True  # as its agent reports: never allocated when False


@dataclass(frozen=True)
class AgentReport:
    """One node as an agent reports it (a heartbeat, or a Kubernetes node's ResourceSlices):
    the host's lists and each device's own lists, by device name and id."""

    agent_id: str
    resource_group: str
    host: SupportedLists
    devices: Mapping[str, Mapping[str, SupportedLists]]
    platform: str | None = None  # os/arch[/variant]; None: from the host lists' CPU namespace
    # (device name, device id) -> shares in millionths; a device not named has one share
    capacity: Mapping[tuple[str, str], int] = field(default_factory=dict)
    unhealthy: frozenset[tuple[str, str]] = frozenset()  # (device name, device id)


def room_left(capacity: int, used: int, healthy: bool) -> int:
    """The shares a device has left with ``used`` in use (``WHOLE``: taken whole); an
    unhealthy device has none."""
    return max(0, capacity - used) if healthy else 0


def device_in_use(
    device_id: str, profile: ProfileKey, capacity: int, healthy: bool, used: int
) -> Device:
    """A device with ``used`` in use: free only when healthy and nothing uses it."""
    room = room_left(capacity, used, healthy)
    return Device(device_id, profile, healthy and used == 0, room, capacity, healthy)


@dataclass(frozen=True)
class Node:
    """One agent as the placement sees it: its host lists and its devices by device name."""

    agent_id: str
    host: ProfileKey
    devices: Mapping[str, Sequence[Device]] = field(default_factory=dict)
    platform: str | None = None  # as reported; None: the host lists' CPU namespace says


Rooms = tuple[tuple[tuple[int, bool], int], ...]  # ((room, free), devices), sorted
Signature = tuple[
    ProfileKey,  # host lists
    str | None,  # platform, as reported
    # per name: (profile, devices, free ones, the room on those with some)
    tuple[tuple[str, tuple[tuple[ProfileKey, int, int, Rooms], ...]], ...],
]
DeviceKey = tuple[str, str, str]  # (agent_id, device_name, device_id)


def signature(node: Node) -> Signature:
    """What the planner sees of a node but its agent id: its host lists and platform and, per
    device name, how many devices of each profile it has, how many of them are free, and
    how many have how much room (shares) left."""
    names = []
    for name in sorted(node.devices):
        counts: dict[ProfileKey, tuple[list[int], dict[tuple[int, bool], int]]] = {}
        for device in node.devices[name]:
            count, rooms = counts.setdefault(device.profile, ([0, 0], {}))
            count[0] += 1
            count[1] += device.free
            if device.room:
                room = (device.room, device.free)
                rooms[room] = rooms.get(room, 0) + 1
        names.append(
            (
                name,
                tuple(
                    sorted(
                        (p, n, free, tuple(sorted(rooms.items())))
                        for p, ([n, free], rooms) in counts.items()
                    )
                ),
            )
        )
    return (node.host, node.platform, tuple(names))


class Pool:
    """The live agents, the lists their profiles name, and the agents left out
    (``agent_id -> why``, e.g. no heartbeat) so that refusals can mention them.

    Nodes are indexed by :func:`signature`: nodes with one signature differ only in agent id,
    so each signature is one bucket of agent ids, kept sorted. A pool has few signatures (a
    GPU kind times its free count, in a fleet of whole nodes), however many nodes: the planner
    works per signature and visits single nodes only to pick their devices. ``allocate``,
    ``release``, ``set_usage``, ``put``, ``remove`` and ``park`` keep the index up to date, at
    the cost of the nodes they touch; ``plan`` only reads it.

    What each device has in use is kept by the pool (``usage``: shares in millionths, or
    ``WHOLE``), and sets the devices' ``free`` and ``room``.
    """

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        profiles: Mapping[ProfileKey, SupportedLists] | None = None,
        unavailable: Mapping[str, str] | None = None,
        scope: str = "",  # e.g. ' in resource group "gpu"', for messages
    ) -> None:
        # the caller's mapping itself, even while empty (the store's grows as agents report)
        self.profiles: Mapping[ProfileKey, SupportedLists] = {} if profiles is None else profiles
        self.scope = scope
        self._unavailable: dict[str, str] = dict(unavailable or {})
        self._nodes: dict[str, Node] = {}  # live: planned on
        self._parked: dict[str, Node] = {}  # left out (see ``unavailable``), kept for later
        # agent -> (name, id) -> shares in use (millionths; WHOLE: taken whole)
        self._taken: dict[str, dict[tuple[str, str], int]] = {}
        self._signatures: dict[str, Signature] = {}  # live agent -> its signature
        self._members: dict[Signature, list[str]] = {}  # signature -> agent ids, sorted
        for node in nodes:
            held = self._taken[node.agent_id] = _held(node)
            self._nodes[node.agent_id] = _with_free(node, held)
        for agent, node in self._nodes.items():
            key = self._signatures[agent] = signature(node)
            self._members.setdefault(key, []).append(agent)
        for members in self._members.values():
            members.sort()

    # ----------------------------------------------------------------------- reading

    @property
    def nodes(self) -> list[Node]:
        """The live nodes (a new list: a pool may hold tens of thousands; plan never asks)."""
        return list(self._nodes.values())

    @property
    def unavailable(self) -> Mapping[str, str]:
        return self._unavailable

    def node(self, agent_id: str) -> Node:
        return self._nodes[agent_id]

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._nodes or agent_id in self._parked

    def device_names(self) -> list[str]:
        """The device names the live nodes report, sorted (read from the signatures)."""
        return sorted({name for key in self._members for name, _ in key[2]})

    def buckets(self) -> Iterator[tuple[Signature, Sequence[str]]]:
        """Each signature with its live agents, sorted; do not change the pool meanwhile."""
        return iter(self._members.items())

    def allocations(self) -> Iterator[DeviceKey]:
        """Every allocated device of the pool's agents, live or parked, reported or not."""
        for agent, held in self._taken.items():
            for name, device_id in held:
                yield agent, name, device_id

    def usage(self) -> dict[DeviceKey, int]:
        """What each allocated device has in use: shares (millionths), or ``WHOLE``."""
        return {
            (agent, name, device_id): used
            for agent, held in self._taken.items()
            for (name, device_id), used in held.items()
        }

    def trouble(self, agent_id: str, device_name: str | None, ids: Iterable[str]) -> str | None:
        """Why the agent's devices ``ids`` (of ``device_name``) can no longer serve a gang:
        the agent is left out or gone, a device is unhealthy or no longer reported; None
        when they still can."""
        if agent_id in self._parked:
            return f"agent {agent_id}: {self._unavailable.get(agent_id, 'left out')}"
        node = self._nodes.get(agent_id)
        if node is None:
            return f"agent {agent_id} is not in the pool{self.scope}"
        present = {d.device_id: d for d in node.devices.get(device_name or "", ())}
        for device_id in ids:
            device = present.get(device_id)
            if device is None:
                return f"agent {agent_id}: device {device_name}/{device_id} is no longer reported"
            if not device.healthy:
                return f"agent {agent_id}: device {device_name}/{device_id} is unhealthy"
        return None

    def copy(self) -> Pool:
        """An independent pool with the same state (nodes are immutable: shared)."""
        other = Pool((), self.profiles, self._unavailable, self.scope)
        other._nodes = dict(self._nodes)
        other._parked = dict(self._parked)
        other._taken = {agent: dict(held) for agent, held in self._taken.items()}
        other._signatures = dict(self._signatures)
        other._members = {key: list(members) for key, members in self._members.items()}
        return other

    # ----------------------------------------------------------------------- changing

    def put(
        self,
        node: Node,
        taken: Mapping[tuple[str, str], int] | Iterable[tuple[str, str]] | None = None,
    ) -> None:
        """Add or replace a live node. ``taken``: its allocated (device name, device id),
        taken whole, or a mapping of them to the shares in use, which decide its devices'
        ``free`` and ``room``; by default the devices' own ``free`` and ``room`` decide."""
        agent = node.agent_id
        if taken is None:
            held = _held(node)
        elif isinstance(taken, Mapping):
            held = dict(taken)
        else:
            held = dict.fromkeys(taken, WHOLE)
        node = _with_free(node, held)
        self.remove(agent)
        self._nodes[agent] = node
        self._taken[agent] = held
        self._index(agent, node)

    def remove(self, agent_id: str) -> None:
        """Forget the agent (live or parked); nothing when it is not in the pool."""
        self._unindex(agent_id)
        self._nodes.pop(agent_id, None)
        if self._parked.pop(agent_id, None) is not None:
            self._unavailable.pop(agent_id, None)
        self._taken.pop(agent_id, None)

    def park(self, agent_id: str, why: str) -> None:
        """Leave the agent out of plans (refusals say ``why``) but keep it for ``unpark``."""
        node = self._nodes.pop(agent_id, None)
        if node is not None:
            self._unindex(agent_id)
            self._parked[agent_id] = node
        if agent_id in self._parked:
            self._unavailable[agent_id] = why

    def unpark(self, agent_id: str) -> None:
        node = self._parked.pop(agent_id, None)
        if node is not None:
            self._unavailable.pop(agent_id, None)
            self._nodes[agent_id] = node
            self._index(agent_id, node)

    def allocate(self, keys: Iterable[DeviceKey], shares: int | None = None) -> None:
        """Mark devices allocated, whole or ``shares`` (millionths) of each; devices of agents
        not in the pool are ignored, and so are repeats of whole devices. A device its agent
        no longer reports stays allocated if it returns."""
        self._mark(keys, shares, taken=True)

    def release(self, keys: Iterable[DeviceKey], shares: int | None = None) -> None:
        """Free devices taken whole, or ``shares`` of each."""
        self._mark(keys, shares, taken=False)

    def set_usage(self, usage: Mapping[DeviceKey, int]) -> None:
        """Set what devices have in use (shares, ``WHOLE``, or 0: nothing)."""
        by_agent: dict[str, dict[tuple[str, str], int]] = {}
        for (agent, name, device_id), used in usage.items():
            by_agent.setdefault(agent, {})[(name, device_id)] = used
        for agent, changes in by_agent.items():
            self._change(agent, changes)

    def _mark(self, keys: Iterable[DeviceKey], shares: int | None, *, taken: bool) -> None:
        by_agent: dict[str, dict[tuple[str, str], int]] = {}
        for agent, name, device_id in keys:
            held = self._taken.get(agent)
            if held is None:
                continue
            changes = by_agent.setdefault(agent, {})
            key = (name, device_id)
            used = changes.get(key, held.get(key, 0))
            if shares is None:
                changes[key] = WHOLE if taken else 0
            else:
                changes[key] = used + shares if taken else max(0, used - shares)
        for agent, changes in by_agent.items():
            self._change(agent, changes)

    def _change(self, agent: str, changes: Mapping[tuple[str, str], int]) -> None:
        held = self._taken.get(agent)
        if held is None:
            return
        for key, used in changes.items():
            if used > 0:
                held[key] = used
            else:
                held.pop(key, None)
        live = agent in self._nodes
        node = self._nodes[agent] if live else self._parked[agent]
        marked = _with_free(node, held, {name for name, _ in changes})
        if marked is node:
            return
        if live:
            self._unindex(agent)
            self._nodes[agent] = marked
            self._index(agent, marked)
        else:
            self._parked[agent] = marked

    def _index(self, agent: str, node: Node) -> None:
        key = self._signatures[agent] = signature(node)
        bisect.insort(self._members.setdefault(key, []), agent)

    def _unindex(self, agent: str) -> None:
        key = self._signatures.pop(agent, None)
        if key is None:
            return
        members = self._members[key]
        del members[bisect.bisect_left(members, agent)]
        if not members:
            del self._members[key]


def _held(node: Node) -> dict[tuple[str, str], int]:
    """What the node's healthy devices have in use, by their ``free`` and ``room`` (a device
    that is not free but has all its room was marked taken the plain way: whole)."""
    held = {}
    for name, members in node.devices.items():
        for d in members:
            if d.healthy and not d.free:
                held[(name, d.device_id)] = WHOLE if d.room >= d.capacity else d.capacity - d.room
    return held


def _marked(device: Device, used: int) -> Device:
    """``device`` with ``used`` in use; the device itself when that changes nothing."""
    free = device.healthy and used == 0
    if device.free == free and device.room == room_left(device.capacity, used, device.healthy):
        return device
    return device_in_use(device.device_id, device.profile, device.capacity, device.healthy, used)


def _with_free(
    node: Node, held: Mapping[tuple[str, str], int], names: Iterable[str] | None = None
) -> Node:
    """The node with ``free`` and ``room`` set from ``held`` (on the devices of ``names``;
    default all); the node itself when nothing changes."""
    devices = dict(node.devices)
    changed = False
    for name in devices if names is None else names:
        members = devices.get(name, ())
        marked = [_marked(d, held.get((name, d.device_id), 0)) for d in members]
        if all(a is b for a, b in zip(marked, members, strict=True)):
            continue
        devices[name] = marked
        changed = True
    return replace(node, devices=devices) if changed else node


def profile_key(lists: SupportedLists) -> ProfileKey:
    """The content hash naming a supported-lists document; key order is kept, since the
    order of features (and of values) is the host's preference."""
    return hashlib.sha256(json.dumps(lists, separators=(",", ":")).encode()).hexdigest()


def build_pool(
    reports: Iterable[AgentReport], allocated: Container[tuple[str, str, str]] = ()
) -> Pool:
    """A pool from agent reports; ``allocated`` holds (agent_id, device_name, device_id)."""
    profiles: dict[ProfileKey, SupportedLists] = {}

    def key(lists: SupportedLists) -> ProfileKey:
        name = profile_key(lists)
        profiles.setdefault(name, lists)
        return name

    def device(report: AgentReport, name: str, device_id: str, lists: SupportedLists) -> Device:
        capacity = report.capacity.get((name, device_id), SHARE)
        healthy = (name, device_id) not in report.unhealthy
        used = WHOLE if (report.agent_id, name, device_id) in allocated else 0
        return device_in_use(device_id, key(lists), capacity, healthy, used)

    nodes = [
        Node(
            report.agent_id,
            key(report.host),
            {
                name: [device(report, name, device_id, lists) for device_id, lists in ids.items()]
                for name, ids in report.devices.items()
            },
            report.platform,
        )
        for report in reports
    ]
    return Pool(nodes, profiles)


@dataclass(frozen=True)
class Shares:
    """The shares of a pool's live, healthy devices (millionths)."""

    capacity: int
    free: int  # room left, on every device
    stranded: int  # room left on devices partly used: no whole-device request can use it

    @property
    def fragmentation(self) -> float:
        """The share of free capacity that no whole-device request can use."""
        return self.stranded / self.free if self.free else 0.0


def pool_shares(pool: Pool) -> Shares:
    """Free and stranded shares over the live nodes (a visit of every device: for views)."""
    capacity = free = stranded = 0
    for node in pool.nodes:
        for members in node.devices.values():
            for d in members:
                if d.healthy:
                    capacity += d.capacity
                    free += d.room
                    if not d.free:
                        stranded += d.room
    return Shares(capacity, free, stranded)
