"""Where a placement goes: pure logic over a snapshot of the pool, on top of ``select``.

Every device is judged on its node's host lists merged with the device's own lists (the
device's namespaces replace the host's), exactly as ``docker variant pull`` would judge a host
with those lists: ``select`` ranks the index's variants for it (1 = the variant that device
would pull itself), then ``null``, then the bare image. Devices whose lists agree on every
namespace the index uses form one *device class*; each class is compiled once per placement.

A placement is one variant on ``nodes`` nodes, each giving ``devices_per_node`` free devices
of one device name that all fit that variant (``devices_per_node == 0``: the node's host lists
must fit it, no device is taken). Among the placements possible, the first in this order wins:

1. homogeneous: every chosen device is of one class, running that class's own first choice;
2. otherwise mixed: the variant whose worst rank over the chosen devices is lowest, so that
   every device runs a variant as close as possible to the one it would pull itself;
3. ties between variants (two classes each with their own first choice, e.g. H200 nodes for
   ``cu128`` and A100 nodes for ``cu122``) go to the variant ranked first on the *virtual
   host* that supports every variant of the index, each feature's values newest first: the
   order ``docker-variant k8s claim`` gives its subrequests (``variant.virtual.virtual_host``), so
   the newest build the free hardware can run wins;
4. nodes: those left with the fewest free devices (best fit, keeping whole nodes free for
   large gangs), then by agent id; devices by id.

Nothing is placed unless all ``nodes`` nodes are found. A refusal says, per variant, how many
nodes could take it and why the others cannot.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from docker_variant.scheduler.documents import AgentReport
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists
from docker_variant.variant.platform import Platform, platform_of_lists
from docker_variant.variant.selection import Candidate, select
from docker_variant.variant.virtual import virtual_host

__all__ = [
    "BARE",
    "Device",
    "DeviceClass",
    "Judge",
    "Node",
    "NodeAllocation",
    "Plan",
    "Pool",
    "ProfileKey",
    "Refusal",
    "build_pool",
    "natural_key",
    "plan",
    "profile_key",
]

#: How the bare (non-variant) image is named among candidates and reasons; not a valid label.
BARE = "(bare)"
ProfileKey = str  # a content hash of one supported-lists document
_SHOWN_AGENTS = 3
_SHOWN_GROUPS = 5


class Device(NamedTuple):  # a tuple: a pool holds tens of thousands
    device_id: str
    profile: ProfileKey  # the device's own lists
    free: bool = True


@dataclass(frozen=True)
class Node:
    """One agent as the placement sees it: its host lists and its devices by device name."""

    agent_id: str
    host: ProfileKey
    devices: Mapping[str, Sequence[Device]] = field(default_factory=dict)
    platform: str | None = None  # as reported; None: the host lists' CPU namespace says


@dataclass(frozen=True)
class Pool:
    """A consistent snapshot: live agents, the lists their profiles name, and the agents
    left out (``agent_id -> why``, e.g. no heartbeat) so that refusals can mention them."""

    nodes: Sequence[Node]
    profiles: Mapping[ProfileKey, SupportedLists]
    unavailable: Mapping[str, str] = field(default_factory=dict)
    scope: str = ""  # e.g. ' in resource group "gpu"', for messages


@dataclass(frozen=True)
class NodeAllocation:
    agent_id: str
    host: ProfileKey
    device_name: str | None  # None when no device is taken
    devices: tuple[Device, ...] = ()
    platform: str | None = None  # the node's, reported or implied by its lists


@dataclass(frozen=True)
class Plan:
    candidate: Candidate  # the chosen variant, ``null``, or the bare image
    allocations: tuple[NodeAllocation, ...]
    homogeneous: bool


@dataclass(frozen=True)
class Refusal:
    reasons: dict[str, str]  # candidate (label, or BARE) -> why it cannot be placed


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

    nodes = [
        Node(
            report.agent_id,
            key(report.host),
            {
                name: [
                    Device(
                        device_id, key(lists), (report.agent_id, name, device_id) not in allocated
                    )
                    for device_id, lists in members.items()
                ]
                for name, members in report.devices.items()
            },
            report.platform,
        )
        for report in reports
    ]
    return Pool(nodes, profiles)


def candidate_key(candidate: Candidate) -> str:
    return candidate.label if candidate.label is not None else BARE


# --------------------------------------------------------------------------- classes


@dataclass(frozen=True)
class DeviceClass:
    """The ranking of one index on one set of lists (those of the namespaces it uses)."""

    key: str  # the lists that matter, as compact JSON: equal keys, identical devices
    ranks: Mapping[str, int]  # candidate key -> rank, 1 = best
    reasons: Mapping[str, str]  # candidate key -> why it does not fit

    @property
    def first_choice(self) -> str:
        return min(self.ranks, key=self.ranks.__getitem__)


class Judge:
    """Classifies (host profile, device profile) pairs; each distinct class is ranked once."""

    def __init__(self, index: VariantIndex, profiles: Mapping[ProfileKey, SupportedLists]):
        self.index = index
        self.profiles = profiles
        self._namespaces = sorted({ns for v in index.variants.values() for ns in v.namespaces})
        self._by_pair: dict[tuple[ProfileKey, ProfileKey | None, str | None], DeviceClass] = {}
        self._by_key: dict[str, DeviceClass] = {}
        self._implied: dict[ProfileKey, str | None] = {}

    def lists(self, host: ProfileKey, device: ProfileKey | None) -> SupportedLists:
        """The lists a device is judged on: the host's, its own namespaces replacing them."""
        merged = dict(self.profiles[host])
        if device is not None:
            merged.update(self.profiles[device])
        return merged

    def platform(self, node: Node) -> str | None:
        """The node's platform: as reported, else what its host lists' CPU namespace says
        (worked out once per host profile: a pool has few)."""
        if node.platform is not None:
            return node.platform
        if node.host not in self._implied:
            implied = platform_of_lists(self.profiles[node.host])
            self._implied[node.host] = str(implied) if implied is not None else None
        return self._implied[node.host]

    def classify(
        self, host: ProfileKey, device: ProfileKey | None = None, platform: str | None = None
    ) -> DeviceClass:
        found = self._by_pair.get((host, device, platform))
        if found is None:
            merged = self.lists(host, device)
            relevant = {ns: merged[ns] for ns in self._namespaces if ns in merged}
            key = json.dumps([platform, relevant], separators=(",", ":"))
            found = self._by_key.get(key)
            if found is None:
                found = self._by_key[key] = self._compile(key, relevant, platform)
            self._by_pair[(host, device, platform)] = found
        return found

    def _compile(self, key: str, lists: SupportedLists, platform: str | None) -> DeviceClass:
        # Images for other platforms are rejected with the reason ("no linux/arm64 image").
        on = Platform.parse(platform) if platform is not None else None
        selection = select(self.index, lists, on)
        ranks = {candidate_key(c): c.rank for c in selection.ranked if c.rank is not None}
        reasons = {
            candidate_key(c): c.reason or "does not fit"
            for c in selection.rejected
            if c.kind != "invalid"
        }
        return DeviceClass(key, ranks, reasons)

    @property
    def classes(self) -> Mapping[str, DeviceClass]:
        """Every class met so far, by key."""
        return self._by_key


def natural_key(value: str) -> tuple[tuple[int, int | str], ...]:
    """Numbers compared as numbers: ``gpu2`` before ``gpu10``, ``12.8`` before ``12.10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.findall(r"\d+|\D+", value)
    )


# --------------------------------------------------------------------------- units


@dataclass(frozen=True)
class _Unit:
    """What one node offers under one device name (or, taking no device, its host)."""

    node: Node
    device_name: str | None  # None when no device is taken
    devices: Sequence[Device]  # every device of that name, free or not
    class_of: Mapping[ProfileKey, str]  # device profile -> class key, on this node's host
    free: Mapping[str, int]  # class key -> free devices of that class
    host_class: str  # the class of the host lists alone
    spare: int  # free devices on the node under every name: the best-fit measure
    platform: str | None  # reported, or implied by the host lists (Judge.platform)

    def free_of(self, class_key: str) -> list[Device]:
        return [d for d in self.devices if d.free and self.class_of[d.profile] == class_key]


def _device_order(device: Device) -> tuple[tuple[int, int | str], ...]:
    return natural_key(device.device_id)


def _first(devices: Sequence[Device], count: int) -> tuple[Device, ...]:
    """The first ``count`` devices in id order (``GPU-2`` before ``GPU-10``)."""
    return tuple(sorted(devices, key=_device_order)[:count])


def _units(pool: Pool, judge: Judge, per_node: int, device_name: str | None) -> list[_Unit]:
    """Each node's offer under each device name: one pass over every device, the hot loop
    of a placement, so it only counts free devices per class; a class is looked up once
    per distinct device profile on a node."""
    units: list[_Unit] = []
    classify = judge.classify
    for node in pool.nodes:
        platform = judge.platform(node)
        host_class = classify(node.host, None, platform).key
        if per_node == 0:
            spare = sum(1 for ds in node.devices.values() for d in ds if d.free)
            units.append(_Unit(node, None, (), {}, {host_class: 0}, host_class, spare, platform))
            continue
        class_of: dict[ProfileKey, str] = {}
        spare = 0
        offers = []
        for name, devices in sorted(node.devices.items()):
            if device_name is not None and name != device_name:
                spare += sum(1 for d in devices if d.free)
                continue
            free: dict[str, int] = {}
            for device in devices:
                class_key = class_of.get(device.profile)
                if class_key is None:
                    class_key = classify(node.host, device.profile, platform).key
                    class_of[device.profile] = class_key
                if device.free:
                    spare += 1
                    free[class_key] = free.get(class_key, 0) + 1
            offers.append((name, devices, free))
        units += [
            _Unit(node, n, ds, class_of, f, host_class, spare, platform) for n, ds, f in offers
        ]
    return units


# --------------------------------------------------------------------------- plan


def plan(
    index: VariantIndex,
    pool: Pool,
    nodes: int,
    devices_per_node: int,
    *,
    device_name: str | None = None,
) -> Plan | Refusal:
    """The placement the rule in this module's docstring picks, or why there is none."""
    judge = Judge(index, pool.profiles)
    units = _units(pool, judge, devices_per_node, device_name)
    reference = select(index, virtual_host(index)).ranked
    search = _Search(units, judge.classes, reference, nodes, devices_per_node)
    found = search.homogeneous() or search.mixed()
    if found is not None:
        return _on_platform(found, index)
    return Refusal(search.reasons(index, pool, device_name))


def _on_platform(found: Plan, index: VariantIndex) -> Plan:
    """The chosen image's manifest for the gang's platform, when all its nodes share one."""
    chosen = found.candidate
    image = index.bare if chosen.label is None else index.images.get(chosen.label)
    platforms = {a.platform for a in found.allocations}
    if image is None or len(platforms) != 1 or None in platforms:
        return found
    picked = image.on(Platform.parse(str(platforms.pop())))
    if picked is None:
        return found
    return replace(found, candidate=replace(chosen, digest=picked[0], platform=picked[1]))


@dataclass(frozen=True, order=True)
class _Pick:
    """One node's best offer for a candidate; sorts best first."""

    cost: int  # the worst rank of the candidate over the chosen devices
    classes: int  # distinct device classes among them
    spare: int
    agent_id: str
    unit: _Unit = field(compare=False)
    devices: tuple[Device, ...] = field(compare=False)


class _Search:
    def __init__(
        self,
        units: Sequence[_Unit],
        classes: Mapping[str, DeviceClass],
        reference: Sequence[Candidate],
        nodes: int,
        per_node: int,
    ) -> None:
        self.units = units
        self.classes = classes
        self.reference = reference
        self.order = {candidate_key(c): i for i, c in enumerate(reference)}
        self.candidates = {candidate_key(c): c for c in reference}
        self.nodes = nodes
        self.per_node = per_node

    def _plan(self, key: str, picks: Sequence[_Pick], homogeneous: bool) -> Plan:
        allocations = tuple(
            NodeAllocation(
                p.unit.node.agent_id,
                p.unit.node.host,
                p.unit.device_name,
                p.devices,
                p.unit.platform,
            )
            for p in picks
        )
        return Plan(self.candidates[key], allocations, homogeneous)

    def homogeneous(self) -> Plan | None:
        """Nodes whose chosen devices are all of one class, with that class's first choice."""
        groups: dict[tuple[str, str], list[_Unit]] = {}
        for unit in self.units:
            for class_key, free in unit.free.items():
                if free >= self.per_node:
                    groups.setdefault((unit.device_name or "", class_key), []).append(unit)
        options = []
        for (name, class_key), members in groups.items():
            cls = self.classes[class_key]
            if len(members) >= self.nodes and cls.ranks:
                options.append((self.order[cls.first_choice], name, class_key))
        if not options:
            return None
        _, name, class_key = min(options)
        members = sorted(groups[(name, class_key)], key=lambda u: (u.spare, u.node.agent_id))
        picks = [
            _Pick(1, 1, u.spare, u.node.agent_id, u, _first(u.free_of(class_key), self.per_node))
            for u in members[: self.nodes]
        ]
        return self._plan(self.classes[class_key].first_choice, picks, True)

    def _offer(self, key: str, unit: _Unit) -> _Pick | None:
        """The node's best devices for candidate ``key``: lowest ranks, fewest classes."""
        if self.per_node == 0:
            rank = self.classes[unit.host_class].ranks.get(key)
            if rank is None:
                return None
            return _Pick(rank, 1, unit.spare, unit.node.agent_id, unit, ())
        ranks = {k: self.classes[k].ranks.get(key) for k in unit.free}
        if sum(n for k, n in unit.free.items() if ranks[k] is not None) < self.per_node:
            return None
        fitting = sorted(
            (rank, -unit.free[class_key], class_key, _device_order(d), d)
            for d in unit.devices
            if d.free and (rank := ranks[class_key := unit.class_of[d.profile]]) is not None
        )
        chosen = fitting[: self.per_node]
        classes = len({class_key for _, _, class_key, _, _ in chosen})
        devices = tuple(d for *_, d in chosen)
        return _Pick(chosen[-1][0], classes, unit.spare, unit.node.agent_id, unit, devices)

    def mixed(self) -> Plan | None:
        """The candidate whose worst rank over the chosen devices is lowest."""
        best: tuple[int, str, list[_Pick]] | None = None
        for candidate in self.reference:  # on an equal worst rank, the first one wins
            key = candidate_key(candidate)
            per_agent: dict[str, _Pick] = {}
            for unit in self.units:
                offer = self._offer(key, unit)
                agent = unit.node.agent_id
                if offer is not None and (agent not in per_agent or offer < per_agent[agent]):
                    per_agent[agent] = offer
            if len(per_agent) < self.nodes:
                continue
            picks = sorted(per_agent.values())[: self.nodes]
            if best is None or picks[-1].cost < best[0]:
                best = (picks[-1].cost, key, picks)
                if best[0] == 1:
                    break
        if best is None:
            return None
        _, key, picks = best
        if self.per_node == 0:
            used = {p.unit.host_class for p in picks}
        else:
            used = {p.unit.class_of[d.profile] for p in picks for d in p.devices}
        return self._plan(key, picks, len(used) <= 1)

    # ----------------------------------------------------------------------- refusals

    def _why_not(self, key: str, units: Sequence[_Unit], device_name: str | None) -> str | None:
        """None when the node can take the candidate, else why it cannot."""
        if not units:
            return f"no {device_name} devices" if device_name else "no devices"
        if self.per_node == 0:
            cls = self.classes[units[0].host_class]
            return None if key in cls.ranks else cls.reasons.get(key, "does not fit")
        best: tuple[int, int, _Unit] | None = None
        for unit in units:
            fits = [d for d in unit.devices if key in self.classes[unit.class_of[d.profile]].ranks]
            free = sum(d.free for d in fits)
            if free >= self.per_node:
                return None
            if best is None or (free, len(fits)) > best[:2]:
                best = (free, len(fits), unit)
        assert best is not None
        free, fitting, unit = best
        if fitting == 0:
            counts = Counter(unit.class_of[d.profile] for d in unit.devices)
            common = max(counts, key=lambda k: (counts[k], k))
            reason = self.classes[common].reasons.get(key, "does not fit")
            return reason.replace("this host", "this device")
        if fitting < self.per_node:
            return f"only {_plural(fitting, 'device')} fit{'s' if fitting == 1 else ''} it"
        return f"only {free} of its {fitting} fitting devices are free"

    def reasons(self, index: VariantIndex, pool: Pool, device_name: str | None) -> dict[str, str]:
        by_agent: dict[str, list[_Unit]] = {node.agent_id: [] for node in pool.nodes}
        for unit in self.units:
            if unit.devices or self.per_node == 0:
                by_agent[unit.node.agent_id].append(unit)
        reasons: dict[str, str] = {}
        for candidate in sorted(self.reference, key=candidate_key):
            key = candidate_key(candidate)
            able: list[str] = []
            why: dict[str, list[str]] = {}
            for agent, units in sorted(by_agent.items()):
                text = self._why_not(key, units, device_name)
                if text is None:
                    able.append(agent)
                else:
                    why.setdefault(text, []).append(agent)
            for agent, text in sorted(pool.unavailable.items()):
                why.setdefault(text, []).append(agent)
            reasons[key] = self._sentence(able, why, pool.scope)
        for image in index.invalid:
            reasons[image.tag] = f"invalid image: {image.error}"
        return reasons

    def _sentence(self, able: Sequence[str], why: Mapping[str, Sequence[str]], scope: str) -> str:
        if self.per_node == 0:
            need = f"needs {_plural(self.nodes, 'node')} whose host fits it"
        else:
            devices = _plural(self.per_node, "free device")
            need = f"needs {_plural(self.nodes, 'node')} with {devices} fitting it"
        if not able and not why:
            return f"{need}; there are no agents{scope}"
        if able:
            verb = "has" if len(able) == 1 else "have"
            have = f"{_plural(len(able), 'node')} {verb} them ({_agents(able)})"
        else:
            have = "no node has them"
        groups = sorted(why.items(), key=lambda item: (-len(item[1]), item[0]))
        parts = [f"{_agents(agents)}: {text}" for text, agents in groups[:_SHOWN_GROUPS]]
        if rest := sum(len(agents) for _, agents in groups[_SHOWN_GROUPS:]):
            parts.append(f"{_plural(rest, 'more agent')} for other reasons")
        return "; ".join([need, have, *parts])


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _agents(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_SHOWN_AGENTS])
    extra = len(ids) - _SHOWN_AGENTS
    return f"{shown} and {extra} more" if extra > 0 else shown
