"""Where a placement goes: pure logic over a snapshot of the pool, on top of ``select``.

Every device is judged on its node's CPU lists (``x86_64``, ``aarch64``) with the device's own
lists: an accelerator namespace (``nvidia``, ``amd``, a descriptor's such as ``furiosa``)
counts only from the device, so the accelerator namespace a variant names decides which
devices it takes, and ``devices_per_node`` counts those. Each device is judged exactly as
``docker variant pull`` would judge a host with those lists: ``select`` ranks the index's variants for it (1 = the variant that device
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

Devices may be shared (Backend.AI's ``cuda.shares``): each has a capacity in shares (one by
default) and a placement may ask ``shares`` of each device instead of whole devices. A share
fits a healthy device with that much room left; whole devices are only those nothing uses.
Shares go best-fit: among the devices of the class chosen, first those already partly used,
the one with the least room that fits first, then untouched ones; nodes are taken in the
order (whole devices it would break, the room on the partly used devices it would fill,
free devices), so that whole devices and whole nodes stay free for whole-device requests.
Unhealthy devices (as their agent reports them) are never taken, whole or in part.

A gang takes devices of one device name. Devices follow the accelerator namespace of the
chosen variant; when it names none (a CPU build, ``null``, the bare image) and devices are
asked, the request must name ``device_name`` (``InvalidInputError``, a 400): the scheduler
never guesses a device kind. When the best plan over every name mixes names, each name is
planned alone and ``best_plan`` picks among them; ``plan_in_groups`` does the same over
resource groups, so a gang never mixes groups unless its request spreads.

Nothing is placed unless all ``nodes`` nodes are found. A refusal says, per variant, how many
nodes could take it and why the others cannot.
"""

from __future__ import annotations

import functools
import heapq
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, islice, repeat
from typing import Any, Protocol

from docker_variant.errors import InvalidInputError
from docker_variant.numtext import NaturalKey, natural_key
from docker_variant.planner.kept import Kept
from docker_variant.planner.pool import (
    SHARE,
    Device,
    Node,
    Pool,
    ProfileKey,
    Rooms,
    Signature,
)
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists
from docker_variant.variant.platform import Platform, platform_of_lists
from docker_variant.variant.selection import Candidate, select
from docker_variant.variant.virtual import virtual_host
from docker_variant.vendors import CPU_NAMESPACES

__all__ = [
    "BARE",
    "DeviceClass",
    "GangRequest",
    "Judge",
    "JudgeCache",
    "NodeAllocation",
    "Plan",
    "Refusal",
    "best_plan",
    "candidate_key",
    "merged_reasons",
    "plan",
    "plan_in_groups",
    "plan_request",
    "plural",
]

BARE = "(bare)"

_SHOWN_AGENTS = 3
_SHOWN_GROUPS = 5


class GangRequest(Protocol):
    """What ``plan_request`` plans: the scheduler's ``PlacementRequest``, a ``k8s gang``."""

    @property
    def nodes(self) -> int: ...
    @property
    def devices_per_node(self) -> int: ...
    @property
    def device_name(self) -> str | None: ...
    @property
    def shares(self) -> int | None: ...


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
    shares: int | None = None  # taken of each device (millionths); None: whole devices
    # how the search ranks it: (0, 1) homogeneous; (1, worst rank over its devices) mixed
    standing: tuple[int, int] = (0, 1)


@dataclass(frozen=True)
class Refusal:
    reasons: dict[str, str]  # candidate (label, or BARE) -> why it cannot be placed


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
        # what ``_kinds`` and ``_on_platform`` work out, the same for every plan of the index:
        # a signature's judged offers (its agents aside), a candidate's image on a platform
        self.kinds: Kept[_KindKey, _KindParts] = Kept(_KEPT_KINDS)
        self._on: dict[tuple[str, str], Candidate] = {}

    @functools.cached_property
    def reference(self) -> list[Candidate]:
        """The candidates ranked on the virtual host (the tie rule of the module docstring)."""
        return select(self.index, virtual_host(self.index)).ranked

    @functools.cached_property
    def reference_order(self) -> tuple[dict[str, int], dict[str, Candidate]]:
        """(candidate key -> its place in ``reference``, candidate key -> candidate)."""
        return _reference_maps(self.reference)

    def on_platform(self, candidate: Candidate, platform: str) -> Candidate:
        """``candidate`` with the digest and platform of its image's manifest for
        ``platform``; itself when the image lists no platforms or none matches."""
        key = (candidate_key(candidate), platform)
        found = self._on.get(key)
        if found is None:
            found = self._on[key] = _image_on(candidate, self.index, platform)
        return found

    def lists(self, host: ProfileKey, device: ProfileKey | None) -> SupportedLists:
        """The lists a device is judged on: the host's CPU namespaces and the device's own
        lists. An accelerator namespace (any other: ``nvidia``, ``amd``, a descriptor's)
        counts only from the device, so a variant naming it takes only devices that report
        it, whatever else the host has. Without a device: the host's lists."""
        host_lists = self.profiles[host]
        if device is None:
            return dict(host_lists)
        merged = {ns: lists for ns, lists in host_lists.items() if ns in CPU_NAMESPACES}
        merged.update(self.profiles[device])
        return merged

    def platform(self, node: Node) -> str | None:
        """The node's platform: as reported, else what its host lists' CPU namespace says
        (worked out once per host profile: a pool has few)."""
        return self.platform_of(node.host, node.platform)

    def platform_of(self, host: ProfileKey, reported: str | None) -> str | None:
        if reported is not None:
            return reported
        if host not in self._implied:
            implied = platform_of_lists(self.profiles[host])
            self._implied[host] = str(implied) if implied is not None else None
        return self._implied[host]

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


class JudgeCache:
    """Judges kept for the indexes planned most recently, so that repeated placements of
    one index (``documents`` hands out one ``VariantIndex`` per distinct document) compile
    each device class once, not once per request. Classes are keyed by content and profiles
    are content-addressed, so a kept judge never goes stale; the cache only bounds memory."""

    def __init__(self, size: int = 32) -> None:
        self._judges: Kept[tuple[int, int], Judge] = Kept(size)

    def judge(self, index: VariantIndex, profiles: Mapping[ProfileKey, SupportedLists]) -> Judge:
        key = (id(index), id(profiles))  # the judge holds both: the ids stay theirs
        found = self._judges.get(key)
        if found is not None and found.index is index and found.profiles is profiles:
            return found
        return self._judges.put(key, Judge(index, profiles))


def _reference_maps(
    reference: Sequence[Candidate],
) -> tuple[dict[str, int], dict[str, Candidate]]:
    order = {candidate_key(c): i for i, c in enumerate(reference)}
    return order, {candidate_key(c): c for c in reference}


def _image_on(candidate: Candidate, index: VariantIndex, platform: str) -> Candidate:
    image = index.bare if candidate.label is None else index.images.get(candidate.label)
    picked = None if image is None else image.on(Platform.parse(platform))
    if picked is None:
        return candidate
    return replace(candidate, digest=picked[0], platform=picked[1])


# --------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class _Offer:
    """What each node of one signature offers under one device name, by device class."""

    device_name: str
    free: Mapping[str, int]  # class key -> usable devices (classes with one at least)
    total: Mapping[str, int]  # class key -> devices, free or not


Spare = tuple[int, ...]  # the best-fit measure of a node: lowest first


@dataclass(frozen=True)
class _Kind:
    """The nodes of one signature as one index sees them: alike but for their agent ids."""

    agents: Sequence[str]  # sorted
    spare: Spare  # (free devices on each node under every name,); for shares, see _spare
    host_class: str  # the class of the host lists alone
    offers: tuple[_Offer, ...]  # by device name (``device_name`` alone when given); none
    # when no device is taken


_KindKey = tuple[Signature, int, str | None, int | None]  # (signature, per node, name, shares)
_KindParts = tuple[Spare, str, tuple[_Offer, ...]]  # a _Kind but its agents
_KEPT_KINDS = 4096  # signatures' offers per judge, the least recently used dropped past it


def _usable(n_free: int, rooms: Rooms, shares: int | None) -> int:
    """Devices that can take a request: free ones, or with ``shares`` of room."""
    if shares is None:
        return n_free
    return sum(count for (room, _), count in rooms if room >= shares)


def _spare(
    rooms: Iterable[tuple[int, bool]], free: int, per_node: int, shares: int | None
) -> Spare:
    """Whole requests: the free devices. Shares: (the free devices a request must break,
    the room on the devices it takes, the free devices), the devices being the partly used
    ones with the least room that fits, then the free ones with the least: nodes that can
    pack the request on devices already partly used go first, the tightest first."""
    if shares is None:
        return (free,)
    fitting = sorted((is_free, room) for room, is_free in rooms if room >= shares)[:per_node]
    return (sum(is_free for is_free, _ in fitting), sum(room for _, room in fitting), free)


def _kinds(
    pool: Pool, judge: Judge, per_node: int, device_name: str | None, shares: int | None
) -> list[_Kind]:
    """Each signature of the pool judged once, so that the work grows with the signatures,
    not with the nodes; what a signature offers is kept by the judge (``Judge.kinds``), as
    it depends on nothing else: a plan after a placement judges only the signatures that
    the placement made."""
    kept = judge.kinds
    kinds = []
    for signature, agents in pool.buckets():
        key = (signature, per_node, device_name, shares)
        parts = kept.get(key)
        if parts is None:
            parts = kept.put(key, _kind_parts(signature, judge, per_node, device_name, shares))
        kinds.append(_Kind(agents, *parts))
    return kinds


def _kind_parts(
    signature: Signature,
    judge: Judge,
    per_node: int,
    device_name: str | None,
    shares: int | None,
) -> _KindParts:
    """What the nodes of ``signature`` offer: a class looked up once per profile."""
    host, reported, names = signature
    classify = judge.classify
    platform = judge.platform_of(host, reported)
    host_class = classify(host, None, platform).key
    free_devices = sum(n_free for _, counts in names for _, _, n_free, _ in counts)
    rooms = [
        room
        for name, counts in names
        if shares is not None and (device_name is None or name == device_name)
        for *_, each in counts
        for room, count in each
        for _ in range(count)
    ]
    spare = _spare(rooms, free_devices, per_node, shares)
    offers = []
    if per_node > 0:
        for name, counts in names:
            if device_name is not None and name != device_name:
                continue
            free: dict[str, int] = {}
            total: dict[str, int] = {}
            for profile, n, n_free, each in counts:
                class_key = classify(host, profile, platform).key
                total[class_key] = total.get(class_key, 0) + n
                if usable := _usable(n_free, each, shares):
                    free[class_key] = free.get(class_key, 0) + usable
            offers.append(_Offer(name, free, total))
    return spare, host_class, tuple(offers)


# --------------------------------------------------------------------------- units


@dataclass(frozen=True)
class _Unit:
    """What one chosen node offers under one device name (or, taking no device, its host)."""

    node: Node
    device_name: str | None  # None when no device is taken
    devices: Sequence[Device]  # every device of that name, free or not
    class_of: Mapping[ProfileKey, str]  # device profile -> class key, on this node's host
    free: Mapping[str, int]  # class key -> usable devices of that class
    host_class: str  # the class of the host lists alone
    spare: Spare  # the best-fit measure (_Kind.spare)
    platform: str | None  # reported, or implied by the host lists (Judge.platform)
    shares: int | None = None  # asked of each device; None: whole devices

    def usable(self, device: Device) -> bool:
        return device.free if self.shares is None else device.room >= self.shares

    def order(self, device: Device) -> tuple[Any, ...]:
        """Whole devices by id; shares best-fit: partly used ones first, least room first."""
        if self.shares is None:
            return _device_order(device)
        return (device.free, device.room, _device_order(device))

    def free_of(self, class_key: str) -> list[Device]:
        return [d for d in self.devices if self.usable(d) and self.class_of[d.profile] == class_key]

    def pick(self, devices: Sequence[Device], count: int) -> tuple[Device, ...]:
        return tuple(sorted(devices, key=self.order)[:count])


def _unit(
    node: Node, judge: Judge, device_name: str | None, spare: Spare, shares: int | None = None
) -> _Unit:
    """The node's offer under ``device_name`` (None: no device is taken), device by device:
    made only for the nodes a plan picks."""
    platform = judge.platform(node)
    host_class = judge.classify(node.host, None, platform).key
    devices = () if device_name is None else node.devices.get(device_name, ())
    class_of: dict[ProfileKey, str] = {}
    free: dict[str, int] = {}
    for device in devices:
        class_key = class_of.get(device.profile)
        if class_key is None:
            class_key = judge.classify(node.host, device.profile, platform).key
            class_of[device.profile] = class_key
        if device.free if shares is None else device.room >= shares:
            free[class_key] = free.get(class_key, 0) + 1
    return _Unit(node, device_name, devices, class_of, free, host_class, spare, platform, shares)


def _device_order(device: Device) -> NaturalKey:
    return _id_order(device.device_id)


@functools.lru_cache(maxsize=1 << 16)  # a fleet's device ids, ordered on every plan
def _id_order(device_id: str) -> NaturalKey:
    return natural_key(device_id)


# --------------------------------------------------------------------------- plan


def plan(
    index: VariantIndex,
    pool: Pool,
    nodes: int,
    devices_per_node: int,
    *,
    device_name: str | None = None,
    shares: int | None = None,
    only: str | None = None,
    judge: Judge | None = None,
) -> Plan | Refusal:
    """The placement the rule in this module's docstring picks, or why there is none.

    ``shares``: of each device, in millionths (``documents.SHARE``); None: whole devices.
    ``only``: the one candidate (label, or ``BARE``) that may be chosen (a replacement
    keeping its gang's variant). ``judge``: one kept from earlier plans of the same index
    on the same profiles (``JudgeCache``), whose compiled classes are reused."""
    if judge is None or judge.index is not index or judge.profiles is not pool.profiles:
        judge = Judge(index, pool.profiles)
    kinds = _kinds(pool, judge, devices_per_node, device_name, shares)
    reference = judge.reference
    maps = judge.reference_order
    if only is not None:
        reference = [c for c in reference if candidate_key(c) == only]
        maps = _reference_maps(reference)
    search = _Search(
        pool, judge, kinds, reference, maps, nodes, devices_per_node, device_name, shares
    )
    found = search.homogeneous() or search.mixed()
    if found is None:
        return Refusal(search.reasons(index))
    if devices_per_node > 0 and device_name is None:
        names = sorted({str(a.device_name) for a in found.allocations})
        _check_device_kind(found.candidate, devices_per_node, names)
        if len(names) > 1:  # one device kind a gang: the best plan of one name alone
            return _one_device_name(
                names, index, pool, nodes, devices_per_node, shares, only, judge
            )  # fmt: skip
    return _on_platform(found, judge)


def _one_device_name(
    mixed: Sequence[str],
    index: VariantIndex,
    pool: Pool,
    nodes: int,
    devices_per_node: int,
    shares: int | None,
    only: str | None,
    judge: Judge,
) -> Plan | Refusal:
    """The best plan over every device name alone (``best_plan``), for a gang whose best plan
    over all names took devices of several (``mixed``): never an NVIDIA GPU on one node
    and an NPU on another."""
    outcomes = {
        name: plan(
            index,
            pool,
            nodes,
            devices_per_node,
            device_name=name,
            shares=shares,
            only=only,
            judge=judge,
        )
        for name in pool.device_names()
    }
    best = best_plan(outcomes, judge)
    if best is not None:
        return best[1]
    kinds = ", ".join(mixed)
    return Refusal(
        {
            key: f"the gang would take devices of several kinds ({kinds}); of one kind: {why}"
            for key, why in merged_reasons(outcomes, "device_name").items()
        }
    )


def best_plan(outcomes: Mapping[str, Plan | Refusal], judge: Judge) -> tuple[str, Plan] | None:
    """The best of plans made on parts of a pool (device names, resource groups), by the
    order one plan's search follows: homogeneous before mixed, the lowest worst rank, the
    variant first on the virtual host; then the part's name. None: no part places it."""
    order = judge.reference_order[0]
    options = [
        (found.standing, order.get(candidate_key(found.candidate), len(order)), part, found)
        for part, found in outcomes.items()
        if isinstance(found, Plan)
    ]
    if not options:
        return None
    *_, part, found = min(options, key=lambda option: option[:3])
    return part, found


def merged_reasons(outcomes: Mapping[str, Plan | Refusal], what: str) -> dict[str, str]:
    """Per candidate, why each part (device name, resource group) refused it, in one line."""
    by_key: dict[str, list[str]] = {}
    for part, found in sorted(outcomes.items()):
        if isinstance(found, Refusal):
            for key, why in found.reasons.items():
                by_key.setdefault(key, []).append(f"{what} {part!r}: {why}")
    shown = _SHOWN_GROUPS
    return {
        key: " | ".join(parts[:shown])
        + (f" | {plural(len(parts) - shown, 'more ' + what)}" if len(parts) > shown else "")
        for key, parts in by_key.items()
    }


def _check_device_kind(candidate: Candidate, devices_per_node: int, names: Sequence[str]) -> None:
    """Devices are taken by the accelerator namespace the chosen variant names; one that
    names none (a CPU variant, ``null``, the bare image) says no device kind, and the
    scheduler does not guess one. ``names``: the device names (as the agents report them,
    ``nvidia``, ``amd``) the plan took, which the hint offers."""
    variant = candidate.variant
    if variant is not None and any(ns not in CPU_NAMESPACES for ns in variant.namespaces):
        return
    chosen = f"variant {candidate.label!r}" if candidate.label is not None else "bare image"
    reported = ", ".join(f'"{name}"' for name in names)
    raise InvalidInputError(
        f"device_name: the {chosen} names no accelerator namespace, so devices_per_node "
        f"{devices_per_node} does not say which devices to take; name them with device_name "
        f"(a device name the agents report: {reported}) or ask devices_per_node 0"
    )


def plan_request(
    index: VariantIndex, pool: Pool, request: GangRequest, judge: Judge | None = None
) -> Plan | Refusal:
    """``plan`` for a placement request: what ``Store.place`` and what-if both plan."""
    return plan(
        index,
        pool,
        request.nodes,
        request.devices_per_node,
        device_name=request.device_name,
        shares=request.shares,
        judge=judge,
    )


def plan_in_groups(
    index: VariantIndex,
    pools: Mapping[str | None, Pool],
    request: GangRequest,
    judge: Judge | None = None,
) -> tuple[str | None, Plan] | Refusal:
    """``plan_request`` on each pool a request may take its gang from (one per resource
    group, ``PoolCache.pools_for``): the best plan of one group (``best_plan``) and that
    group, or why no group can take it. A gang never mixes resource groups."""
    outcomes = {group: plan_request(index, pool, request, judge) for group, pool in pools.items()}
    if len(outcomes) == 1:
        ((group, found),) = outcomes.items()
        return found if isinstance(found, Refusal) else (group, found)
    named = {str(group): found for group, found in outcomes.items()}
    best = best_plan(named, judge or Judge(index, next(iter(pools.values())).profiles))
    if best is not None:
        return best
    return Refusal(merged_reasons(named, "resource group"))


def _on_platform(found: Plan, judge: Judge) -> Plan:
    """The chosen image's manifest for the gang's platform, when all its nodes share one."""
    platforms = {a.platform for a in found.allocations}
    if len(platforms) != 1 or None in platforms:
        return found
    chosen = judge.on_platform(found.candidate, str(platforms.pop()))
    return found if chosen is found.candidate else replace(found, candidate=chosen)


@dataclass(frozen=True, order=True)
class _Pick:
    """One node's best offer for a candidate; sorts best first."""

    cost: int  # the worst rank of the candidate over the chosen devices
    classes: int  # distinct device classes among them
    spare: Spare
    agent_id: str
    unit: _Unit = field(compare=False)
    devices: tuple[Device, ...] = field(compare=False)


_Run = tuple[tuple[int, ...], _Kind, str | None]  # (order of its nodes, kind, device name)
_Taken = tuple[tuple[int, ...], str, _Kind, str | None]  # (order, agent id, kind, device name)


class _Agents:
    """Agent ids as sorted runs (one per kind), merged only as far as a message shows
    them, then ``after`` (agents left out) in their order."""

    def __init__(self, runs: Sequence[Sequence[str]], after: Sequence[str] = ()) -> None:
        self.runs = runs
        self.after = after
        self.count = sum(len(run) for run in runs) + len(after)

    def __len__(self) -> int:
        return self.count

    def first(self, count: int) -> list[str]:
        return list(islice(chain(heapq.merge(*self.runs), self.after), count))


class _Search:
    def __init__(
        self,
        pool: Pool,
        judge: Judge,
        kinds: Sequence[_Kind],
        reference: Sequence[Candidate],
        maps: tuple[Mapping[str, int], Mapping[str, Candidate]],
        nodes: int,
        per_node: int,
        device_name: str | None,
        shares: int | None = None,
    ) -> None:
        self.pool = pool
        self.shares = shares
        self.judge = judge
        self.kinds = kinds
        self.classes = judge.classes
        self.reference = reference
        self.order, self.candidates = maps  # by candidate key: place in reference, candidate
        self.nodes = nodes
        self.per_node = per_node
        self.device_name = device_name

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
        return Plan(self.candidates[key], allocations, homogeneous, self.shares, standing)

    def _take(self, runs: Sequence[_Run]) -> list[_Taken]:
        """The first ``nodes`` agents of ``runs`` by (their run's order, agent id)."""
        merged = heapq.merge(
            *(zip(repeat(order), kind.agents, repeat(i)) for i, (order, kind, _) in enumerate(runs))
        )
        return [
            (order, agent, runs[i][1], runs[i][2]) for order, agent, i in islice(merged, self.nodes)
        ]

    def homogeneous(self) -> Plan | None:
        """Nodes whose chosen devices are all of one class, with that class's first choice."""
        groups: dict[tuple[str, str], list[_Kind]] = {}
        for kind in self.kinds:
            if self.per_node == 0:
                groups.setdefault(("", kind.host_class), []).append(kind)
                continue
            for offer in kind.offers:
                for class_key, free in offer.free.items():
                    if free >= self.per_node:
                        groups.setdefault((offer.device_name, class_key), []).append(kind)
        options = []
        for (name, class_key), members in groups.items():
            cls = self.classes[class_key]
            enough = sum(len(kind.agents) for kind in members) >= self.nodes
            if enough and cls.ranks and cls.first_choice in self.order:  # (``only``)
                options.append((self.order[cls.first_choice], name, class_key))
        if not options:
            return None
        _, name, class_key = min(options)
        device_name = name if self.per_node > 0 else None
        runs = [(kind.spare, kind, device_name) for kind in groups[(name, class_key)]]
        picks = []
        for _, agent, kind, _ in self._take(runs):
            unit = _unit(self.pool.node(agent), self.judge, device_name, kind.spare, self.shares)
            devices = unit.pick(unit.free_of(class_key), self.per_node)
            picks.append(_Pick(1, 1, kind.spare, agent, unit, devices))
        return self._plan(self.classes[class_key].first_choice, picks, True, (0, 1))

    def _kind_offer(self, key: str, kind: _Kind) -> tuple[int, int, str | None] | None:
        """(worst rank, classes, device name) of the best devices a node of ``kind`` has for
        candidate ``key``: lowest ranks, fewest classes, the first device name on a tie."""
        if self.per_node == 0:
            rank = self.classes[kind.host_class].ranks.get(key)
            return None if rank is None else (rank, 1, None)
        best: tuple[int, int, str | None] | None = None
        for offer in kind.offers:
            fitting = sorted(
                (rank, -free, class_key)
                for class_key, free in offer.free.items()
                if (rank := self.classes[class_key].ranks.get(key)) is not None
            )
            if sum(-negative for _, negative, _ in fitting) < self.per_node:
                continue
            need, classes, cost = self.per_node, 0, 0
            for rank, negative, _ in fitting:  # devices taken class by class in this order
                need, classes, cost = need + negative, classes + 1, rank
                if need <= 0:
                    break
            if best is None or (cost, classes) < best[:2]:
                best = (cost, classes, offer.device_name)
        return best

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
            (rank, -unit.free[class_key], class_key, unit.order(d), d)
            for d in unit.devices
            if unit.usable(d) and (rank := ranks[class_key := unit.class_of[d.profile]]) is not None
        )
        chosen = fitting[: self.per_node]
        classes = len({class_key for _, _, class_key, _, _ in chosen})
        devices = tuple(d for *_, d in chosen)
        return _Pick(chosen[-1][0], classes, unit.spare, unit.node.agent_id, unit, devices)

    def mixed(self) -> Plan | None:
        """The candidate whose worst rank over the chosen devices is lowest."""
        best: tuple[int, str, list[_Taken]] | None = None
        for candidate in self.reference:  # on an equal worst rank, the first one wins
            key = candidate_key(candidate)
            runs: list[_Run] = []
            able = 0
            for kind in self.kinds:
                offer = self._kind_offer(key, kind)
                if offer is not None:
                    cost, classes, name = offer
                    runs.append(((cost, classes, *kind.spare), kind, name))
                    able += len(kind.agents)
            if able < self.nodes:
                continue
            taken = self._take(runs)
            worst = taken[-1][0][0]
            if best is None or worst < best[0]:
                best = (worst, key, taken)
                if worst == 1:
                    break
        if best is None:
            return None
        worst, key, taken = best
        picks = []
        for order, agent, kind, name in taken:
            unit = _unit(self.pool.node(agent), self.judge, name, kind.spare, self.shares)
            pick = self._offer(key, unit)
            assert pick is not None and (pick.cost, pick.classes) == order[:2], (agent, key)
            picks.append(pick)
        if self.per_node == 0:
            used = {p.unit.host_class for p in picks}
        else:
            used = {p.unit.class_of[d.profile] for p in picks for d in p.devices}
        return self._plan(key, picks, len(used) <= 1, (1, worst))

    # ----------------------------------------------------------------------- refusals

    def _why_not(self, key: str, kind: _Kind) -> str | None:
        """None when a node of ``kind`` can take the candidate, else why it cannot."""
        if self.per_node == 0:
            cls = self.classes[kind.host_class]
            return None if key in cls.ranks else cls.reasons.get(key, "does not fit")
        best: tuple[int, int, Mapping[str, int]] | None = None
        for offer in kind.offers:
            if not offer.total:
                continue
            fits = [c for c in offer.total if key in self.classes[c].ranks]
            free = sum(offer.free.get(c, 0) for c in fits)
            if free >= self.per_node:
                return None
            fitting = sum(offer.total[c] for c in fits)
            if best is None or (free, fitting) > best[:2]:
                best = (free, fitting, offer.total)
        if best is None:
            return f"no {self.device_name} devices" if self.device_name else "no devices"
        free, fitting, counts = best
        if fitting == 0:
            common = max(counts, key=lambda k: (counts[k], k))
            reason = self.classes[common].reasons.get(key, "does not fit")
            return reason.replace("this host", "this device")
        if fitting < self.per_node:
            return f"only {plural(fitting, 'device')} fit{'s' if fitting == 1 else ''} it"
        if self.shares is not None:
            return (
                f"only {free} of its {fitting} fitting devices have "
                f"{_share_text(self.shares)} shares free"
            )
        return f"only {free} of its {fitting} fitting devices are free"

    def reasons(self, index: VariantIndex) -> dict[str, str]:
        """Per candidate: how many nodes could take it and, grouped, why the others cannot
        (judged once per kind; the agents named are merged from the kinds' sorted runs)."""
        left_out: dict[str, list[str]] = {}
        for agent, why_out in sorted(self.pool.unavailable.items()):
            left_out.setdefault(why_out, []).append(agent)
        reasons: dict[str, str] = {}
        for candidate in sorted(self.reference, key=candidate_key):
            key = candidate_key(candidate)
            able: list[Sequence[str]] = []
            why: dict[str, list[Sequence[str]]] = {}
            for kind in self.kinds:
                because = self._why_not(key, kind)
                if because is None:
                    able.append(kind.agents)
                else:
                    why.setdefault(because, []).append(kind.agents)
            groups = {
                text: _Agents(why.get(text, []), left_out.get(text, []))
                for text in why.keys() | left_out.keys()
            }
            reasons[key] = self._sentence(_Agents(able), groups, self.pool.scope)
        for image in index.invalid:
            reasons[image.tag] = f"invalid image: {image.error}"
        return reasons

    def _sentence(self, able: _Agents, why: Mapping[str, _Agents], scope: str) -> str:
        if self.per_node == 0:
            need = f"needs {plural(self.nodes, 'node')} whose host fits it"
        elif self.shares is not None:
            devices = plural(self.per_node, "device")
            shares = _share_text(self.shares)
            need = f"needs {plural(self.nodes, 'node')} with {devices} fitting it, "
            need += f"{shares} shares free on each"
        else:
            devices = plural(self.per_node, "free device")
            need = f"needs {plural(self.nodes, 'node')} with {devices} fitting it"
        if not len(able) and not why:
            return f"{need}; there are no agents{scope}"
        if len(able):
            verb = "has" if len(able) == 1 else "have"
            have = f"{plural(len(able), 'node')} {verb} them ({_agents(able)})"
        else:
            have = "no node has them"
        groups = sorted(why.items(), key=lambda item: (-len(item[1]), item[0]))
        parts = [f"{_agents(agents)}: {text}" for text, agents in groups[:_SHOWN_GROUPS]]
        if rest := sum(len(agents) for _, agents in groups[_SHOWN_GROUPS:]):
            parts.append(f"{plural(rest, 'more agent')} for other reasons")
        return "; ".join([need, have, *parts])


def _share_text(units: int) -> str:
    return f"{units / SHARE:g}"


def plural(count: int, word: str) -> str:
    """``1 node``, ``2 nodes``: the count and the word, in the plural unless one."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _agents(ids: _Agents) -> str:
    shown = ", ".join(ids.first(_SHOWN_AGENTS))
    extra = len(ids) - _SHOWN_AGENTS
    return f"{shown} and {extra} more" if extra > 0 else shown
