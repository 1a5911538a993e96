"""The planner as it was before its index: every node scanned on every plan.

Kept, verbatim but for names, as the brute-force reference that
``tests/test_scheduler_index.py`` compares the indexed ``plan`` with: it walks
``pool.nodes`` and every device on them, so it knows nothing of the index.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from docker_variant.errors import InvalidInputError
from docker_variant.numtext import natural_key
from docker_variant.planner.placement import (
    DeviceClass,
    Judge,
    NodeAllocation,
    Plan,
    Refusal,
    candidate_key,
)
from docker_variant.planner.pool import Device, Node, Pool, ProfileKey
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.platform import Platform
from docker_variant.variant.selection import Candidate, select
from docker_variant.variant.virtual import virtual_host
from docker_variant.vendors import CPU_NAMESPACES

_SHOWN_AGENTS = 3
_SHOWN_GROUPS = 5


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


def _device_order(device: Device) -> tuple[tuple[int, int, str], ...]:
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


def reference_plan(
    index: VariantIndex,
    pool: Pool,
    nodes: int,
    devices_per_node: int,
    *,
    device_name: str | None = None,
) -> Plan | Refusal:
    """The placement the rule in ``placement``'s docstring picks, scanning every node."""
    judge = Judge(index, pool.profiles)
    units = _units(pool, judge, devices_per_node, device_name)
    reference = select(index, virtual_host(index)).ranked
    search = _Search(units, judge.classes, reference, nodes, devices_per_node)
    found = search.homogeneous() or search.mixed()
    if found is None:
        return Refusal(search.reasons(index, pool, device_name))
    if devices_per_node and device_name is None:
        variant = found.candidate.variant
        if variant is None or set(variant.namespaces) <= CPU_NAMESPACES:
            raise InvalidInputError(f"device_name: {found.candidate.label} takes no devices")
        names = {a.device_name for a in found.allocations}
        if len(names) > 1:  # of one device name: the best plan of each name alone
            order = {candidate_key(c): i for i, c in enumerate(reference)}
            options = []
            every = sorted({name for node in pool.nodes for name in node.devices})
            outcomes = {
                n: reference_plan(index, pool, nodes, devices_per_node, device_name=n)
                for n in every
            }
            for name, one in outcomes.items():
                if isinstance(one, Plan):
                    options.append((one.standing, order[candidate_key(one.candidate)], name, one))
            if not options:
                return Refusal(_merged(outcomes, sorted(str(n) for n in names)))
            return min(options, key=lambda option: option[:3])[3]
    return _on_platform(found, index)


def _merged(outcomes: Mapping[str, Plan | Refusal], names: Sequence[str]) -> dict[str, str]:
    parts: dict[str, list[str]] = {}
    for name, one in sorted(outcomes.items()):
        assert isinstance(one, Refusal)
        for key, why in one.reasons.items():
            parts.setdefault(key, []).append(f"device_name {name!r}: {why}")
    kinds = ", ".join(names)
    head = f"the gang would take devices of several kinds ({kinds}); of one kind: "
    return {
        key: head
        + " | ".join(texts[:5])
        + (f" | {len(texts) - 5} more device_names" if len(texts) > 5 else "")
        for key, texts in parts.items()
    }


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

    def _plan(
        self, key: str, picks: Sequence[_Pick], homogeneous: bool, standing: tuple[int, int]
    ) -> Plan:
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
        return Plan(self.candidates[key], allocations, homogeneous, standing=standing)

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
        return self._plan(self.classes[class_key].first_choice, picks, True, (0, 1))

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
        worst, key, picks = best
        if self.per_node == 0:
            used = {p.unit.host_class for p in picks}
        else:
            used = {p.unit.class_of[d.profile] for p in picks for d in p.devices}
        return self._plan(key, picks, len(used) <= 1, (1, worst))

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
