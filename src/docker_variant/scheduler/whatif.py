"""What-if for autoscalers (docs/reference/scheduler-api.md ``POST /v1/what-if``): would new nodes of a template make
a placement request place, how many, and with which variant? Pure, and it allocates nothing.

It plans with ``placement.plan`` itself, on a copy of the pool snapshot plus *virtual nodes*
built from a template exactly as ``build_pool`` builds a node from an agent's heartbeat. So
the variant it predicts is the one a real placement would pick on that pool, by the same
rule, and a prediction can be checked by sending those heartbeats and placing for real.

**Fewest nodes.** ``plan`` places a gang exactly when some candidate (variant, ``null`` or
bare) has at least ``nodes`` nodes able to take it: the homogeneous rule picks among such
candidates, the mixed rule takes any of them. Adding a node only adds an able node to the
candidates it fits and removes none, so "places with N new nodes" is monotone in N. And N
beyond the gang's ``nodes`` changes nothing: ``nodes`` new nodes already hold a whole gang of
any candidate the template fits. So a search over ``1..nodes`` (doubling, then halving),
with ``plan`` as the oracle, finds the fewest in about 2 log2(N) plans; a randomized test
checks it against trying every N.

**Bounded work.** Each plan of the search visits the virtual nodes it picks device by device,
so the work grows with the gang's nodes times a template's devices: a question is refused
(400, naming the limit) when that product exceeds ``MAX_VIRTUAL_DEVICES`` for any template,
and the search stops at a deadline (``DEADLINE_S`` by default; checked before every plan) with
a refusal that names it, so that no question holds a worker, or a server that was told to
stop, for longer.

A template that does not help is explained: no variant fits one of its nodes (its platform
has no image, its devices fit no variant, it has too few devices), or it would take more
than its ``max_nodes``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from docker_variant.api.names import SHORT_NAME
from docker_variant.errors import InvalidInputError
from docker_variant.planner.placement import (
    BARE,
    Judge,
    Plan,
    Refusal,
    plan_in_groups,
    plan_request,
    plural,
)
from docker_variant.planner.pool import Node, Pool, build_pool
from docker_variant.scheduler.documents import (
    MAX_NODES,
    AgentReport,
    PlacementRequest,
    parse_agent_report,
    parse_placement_request,
)
from docker_variant.variant.index import VariantIndex

__all__ = [
    "DEADLINE_S",
    "MAX_TEMPLATES",
    "MAX_VIRTUAL_DEVICES",
    "NodeTemplate",
    "Option",
    "WhatIf",
    "WhatIfQuestion",
    "WhatIfTooCostlyError",
    "parse_what_if",
    "what_if",
    "what_if_in_groups",
]

MAX_TEMPLATES = 64  # each costs a few plans: bounded, as every input of the scheduler is
#: The most virtual devices (the request's nodes times a template's devices) one template
#: may add: a gang of 1,000 nodes with 256 devices each, or 10,000 with 26.
MAX_VIRTUAL_DEVICES = 262_144
DEADLINE_S = 10.0  # of planning per question
_TEMPLATE_KEYS = {"name", "host", "devices", "platform", "max_nodes", "cost"}
_VIRTUAL = "#"  # in virtual agent ids: a character no real agent id may hold


class WhatIfTooCostlyError(InvalidInputError):
    """The question would take more planning than the limits allow (400)."""


@dataclass(frozen=True)
class NodeTemplate:
    """A kind of node an autoscaler could add: what one such node would report."""

    name: str
    report: AgentReport  # its heartbeat (agent id: the template's name)
    max_nodes: int | None = None  # None: as many as the gang has nodes
    cost: float | None = None  # of one node, in whatever unit the caller prices in


@dataclass(frozen=True)
class WhatIfQuestion:
    request: PlacementRequest
    templates: tuple[NodeTemplate, ...]


@dataclass(frozen=True)
class Option:
    template: str
    nodes: int  # the fewest new nodes of it that make the request place
    variant: str | None  # the gang's variant then (None: the bare image)
    cost: float | None  # nodes * the template's cost, when it gives one


@dataclass(frozen=True)
class WhatIf:
    fits_now: bool
    variant: str | None  # the variant a placement would run now (None: does not fit, or bare)
    options: tuple[Option, ...]
    reasons: Mapping[str, str]  # template name -> why it cannot help

    @property
    def cheapest(self) -> str | None:
        """The option of the lowest total cost (ties by name); None when none gives a cost."""
        priced = [(o.cost, o.template) for o in self.options if o.cost is not None]
        return min(priced)[1] if priced else None

    def to_json(self) -> dict[str, Any]:
        return {
            "fits_now": self.fits_now,
            "variant": self.variant,
            "options": [
                {"template": o.template, "nodes": o.nodes, "variant": o.variant}
                for o in self.options
            ],
            "cheapest": self.cheapest,
            "reasons": dict(self.reasons),
        }


# --------------------------------------------------------------------------- input


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def parse_what_if(data: object) -> WhatIfQuestion:
    """``{"request": <placement request>, "templates": [...]}``, validated like placement
    requests and heartbeats: each failure one line naming the value."""
    body = _object(data, "a what-if request")
    if unknown := sorted(set(body) - {"request", "templates"}):
        raise InvalidInputError(
            f"what-if request: unknown key {unknown[0]!r} (expected request, templates)"
        )
    if "request" not in body:
        raise InvalidInputError('what-if request: "request" (a placement request) is required')
    try:
        request = parse_placement_request(body["request"])
    except InvalidInputError as exc:
        raise InvalidInputError(f"request: {exc}") from exc
    raw = body.get("templates")
    if not isinstance(raw, list):
        got = "nothing" if raw is None else type(raw).__name__
        raise InvalidInputError(f"templates must be a JSON list of node templates, got {got}")
    if len(raw) > MAX_TEMPLATES:
        raise InvalidInputError(f"templates: {len(raw)} given, at most {MAX_TEMPLATES}")
    templates = [parse_template(item, f"templates[{i}]") for i, item in enumerate(raw)]
    seen: set[str] = set()
    for template in templates:
        if template.name in seen:
            raise InvalidInputError(f"templates: name {template.name!r} appears twice")
        seen.add(template.name)
        devices = sum(len(ids) for ids in template.report.devices.values())
        if request.nodes * devices > MAX_VIRTUAL_DEVICES:
            raise WhatIfTooCostlyError(
                f"template {template.name!r}: {request.nodes} nodes x {devices} devices is "
                f"{request.nodes * devices:,} virtual devices, more than the limit "
                f"{MAX_VIRTUAL_DEVICES:,} (ask for fewer nodes, or a template with fewer devices)"
            )
    return WhatIfQuestion(request, tuple(templates))


def parse_template(data: object, where: str) -> NodeTemplate:
    """``{"name", "host", "devices", "platform"?, "max_nodes"?, "cost"?}``; ``host``,
    ``devices`` and ``platform`` are checked as a heartbeat's are."""
    item = _object(data, where)
    if unknown := sorted(set(item) - _TEMPLATE_KEYS):
        raise InvalidInputError(
            f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(_TEMPLATE_KEYS))})"
        )
    name = SHORT_NAME.check(item.get("name"), f"{where}: name")
    where = f"template {name!r}"
    heartbeat = {key: item[key] for key in ("host", "devices", "platform") if key in item}
    try:
        report = parse_agent_report(heartbeat, name)
    except InvalidInputError as exc:
        # the heartbeat's messages name an agent; here the value is the template's
        message = str(exc).removeprefix(f"agent {name}: ")
        raise InvalidInputError(f"{where}: {message}") from exc
    max_nodes = item.get("max_nodes")
    if max_nodes is not None and (
        isinstance(max_nodes, bool)
        or not isinstance(max_nodes, int)
        or not 1 <= max_nodes <= MAX_NODES
    ):
        raise InvalidInputError(
            f"{where}: max_nodes must be an integer 1..{MAX_NODES}, got {max_nodes!r}"
        )
    cost = item.get("cost")
    if cost is not None and (
        isinstance(cost, bool)
        or not isinstance(cost, int | float)
        or not math.isfinite(cost)
        or cost < 0
    ):
        raise InvalidInputError(f"{where}: cost must be a number >= 0, got {cost!r}")
    return NodeTemplate(name, report, max_nodes, None if cost is None else float(cost))


# --------------------------------------------------------------------------- answer


class _Budget:
    """Plans run against a deadline, checked before each one."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.seconds = seconds
        self.clock = clock
        self.until = clock() + seconds
        self.plans = 0

    def plan(self, index: VariantIndex, pool: Pool, request: PlacementRequest) -> Plan | Refusal:
        if self.clock() >= self.until:
            raise WhatIfTooCostlyError(
                f"what-if: stopped at its deadline of {self.seconds:g} s of planning, after "
                f"{self.plans} plans (ask for fewer nodes or fewer templates)"
            )
        self.plans += 1
        return plan_request(index, pool, request)


def _label(found: Plan) -> str | None:
    return found.candidate.label


def what_if(
    index: VariantIndex,
    request: PlacementRequest,
    pool: Pool,
    templates: Sequence[NodeTemplate],
    *,
    deadline_s: float = DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
) -> WhatIf:
    """Whether ``request`` places on ``pool`` now and, if not, how many nodes of each
    template would make it place; ``pool`` is left as it was (plans run on a copy).
    ``WhatIfTooCostlyError`` once ``deadline_s`` of ``clock`` have passed."""
    budget = _Budget(deadline_s, clock)
    now = budget.plan(index, pool, request)
    if isinstance(now, Plan):
        why = "not needed: the request fits today's pool"
        return WhatIf(True, _label(now), (), {t.name: why for t in templates})
    bases = {t.name: _base_node(t) for t in templates}
    work = pool.copy()
    profiles = dict(pool.profiles)  # a new mapping: the snapshot's (the store's) stays as it is
    for _, alone in bases.values():
        profiles.update(alone.profiles)
    work.profiles = profiles
    options: list[Option] = []
    reasons: dict[str, str] = {}
    for template in templates:
        node, alone = bases[template.name]
        with _Virtual(work, node) as virtual:
            found = _fewest(budget, index, request, virtual, alone)
            if found is None:
                reasons[template.name] = _useless(index, request, work, node)
                continue
            count, placed = found
        if template.max_nodes is not None and count > template.max_nodes:
            reasons[template.name] = (
                f"needs {count} new nodes, more than its max_nodes {template.max_nodes}"
            )
            continue
        cost = None if template.cost is None else count * template.cost
        options.append(Option(template.name, count, _label(placed), cost))
    return WhatIf(False, None, tuple(options), reasons)


def what_if_in_groups(
    index: VariantIndex,
    request: PlacementRequest,
    pools: Mapping[str | None, Pool],
    templates: Sequence[NodeTemplate],
    *,
    deadline_s: float = DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
) -> WhatIf:
    """``what_if`` over the pools a request may take its gang from (``PoolCache.pools_for``):
    a gang stays in one resource group, so new nodes of a template would join one group; its
    option is the group that needs the fewest (then the first by name). One deadline for all."""
    if len(pools) == 1:
        (pool,) = pools.values()
        return what_if(index, request, pool, templates, deadline_s=deadline_s, clock=clock)
    until = clock() + deadline_s
    now = plan_in_groups(index, pools, request)
    if not isinstance(now, Refusal):
        why = "not needed: the request fits today's pool"
        return WhatIf(True, _label(now[1]), (), {t.name: why for t in templates})
    answers = [
        what_if(index, request, pool, templates, deadline_s=until - clock(), clock=clock)
        for _, pool in sorted(pools.items(), key=lambda item: str(item[0]))
    ]
    options: list[Option] = []
    reasons: dict[str, str] = {}
    for template in templates:
        offered = [o for answer in answers for o in answer.options if o.template == template.name]
        if offered:
            options.append(min(offered, key=lambda o: o.nodes))  # the first group on a tie
        else:
            reasons[template.name] = answers[0].reasons[template.name]
    return WhatIf(False, None, tuple(options), reasons)


def _base_node(template: NodeTemplate) -> tuple[Node, Pool]:
    """One node of the template, as ``build_pool`` makes it from a heartbeat, and the pool
    holding it (for its profiles)."""
    alone = build_pool([template.report])
    return alone.node(template.report.agent_id), alone


class _Virtual:
    """Virtual nodes of one template in ``pool``, added and removed as the search asks;
    all removed on exit."""

    def __init__(self, pool: Pool, node: Node) -> None:
        self.pool = pool
        self.node = node
        self.count = 0

    def __enter__(self) -> _Virtual:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.resize(0)

    def _id(self, i: int) -> str:
        return f"{self.node.agent_id}{_VIRTUAL}{i:05d}"

    def resize(self, count: int) -> Pool:
        while self.count < count:
            self.pool.put(replace(self.node, agent_id=self._id(self.count)))
            self.count += 1
        while self.count > count:
            self.count -= 1
            self.pool.remove(self._id(self.count))
        return self.pool


def _fewest(
    budget: _Budget,
    index: VariantIndex,
    request: PlacementRequest,
    virtual: _Virtual,
    alone: Pool,
) -> tuple[int, Plan] | None:
    """The fewest virtual nodes (1..``request.nodes``) that make the request place, and
    the plan then; None when even ``request.nodes`` would not (see the module docstring).

    ``request.nodes`` new nodes place it exactly when one of them alone takes a one-node
    gang (``alone``: a pool of that node), so that is asked first, at no cost of the pool's
    size. Then 1, 2, 4 ... new nodes until it places, and a binary search below: the nodes
    added and the plans made grow with the answer, not with the gang."""
    if not isinstance(budget.plan(index, alone, replace(request, nodes=1)), Plan):
        return None
    low, high = 1, 1  # it does not place with low - 1 new nodes (0: the caller planned it)
    while not isinstance(found := budget.plan(index, virtual.resize(high), request), Plan):
        if high >= request.nodes:
            return None  # not so by the rule above; should plan change, say it cannot help
        low, high = high + 1, min(2 * high, request.nodes)
    while low < high:
        middle = (low + high) // 2
        attempt = budget.plan(index, virtual.resize(middle), request)
        if isinstance(attempt, Plan):
            high, found = middle, attempt
        else:
            low = middle + 1
    return high, found


def _useless(index: VariantIndex, request: PlacementRequest, pool: Pool, node: Node) -> str:
    """Why nodes of the template cannot make the request place: what one of them lacks."""
    judge = Judge(index, pool.profiles)
    platform = judge.platform(node)
    per_node = request.devices_per_node
    if per_node == 0:
        host = judge.classify(node.host, None, platform)
        unfit = {
            k: host.reasons.get(k, "does not fit") for k in _keys(index) if k not in host.ranks
        }
        return _no_variant(unfit) if unfit else _still_not(request)
    names = [request.device_name] if request.device_name else sorted(node.devices)
    counts = {name: len(node.devices.get(name, ())) for name in names}
    usable = [name for name in names if counts[name] >= per_node]
    if not usable:
        what = f"{request.device_name} device" if request.device_name else "device"
        most = max(counts.values(), default=0)
        return f"its nodes have {plural(most, what)}; the request needs {per_node} on each node"
    name = usable[0]
    classes: dict[str, int] = {}
    for device in node.devices[name]:
        key = judge.classify(node.host, device.profile, platform).key
        classes[key] = classes.get(key, 0) + 1
    common = judge.classes[max(classes, key=lambda k: (classes[k], k))]
    why: dict[str, str] = {}
    for key in _keys(index):
        fitting = sum(n for c, n in classes.items() if key in judge.classes[c].ranks)
        if fitting >= per_node:
            continue  # fits a node alone: the pool's other nodes are not what it lacks
        if fitting:
            why[key] = f"only {fitting} of its {plural(counts[name], name + ' device')} fit it"
        else:
            why[key] = common.reasons.get(key, "does not fit").replace("this host", "this device")
    return _no_variant(why) if why else _still_not(request)


def _still_not(request: PlacementRequest) -> str:
    return f"even {request.nodes} new nodes of it do not make the request place"


def _keys(index: VariantIndex) -> Iterator[str]:
    """Every candidate's key, as refusals name them: variant labels, then the bare image."""
    yield from sorted(index.variants)
    if index.bare is not None:
        yield BARE


def _no_variant(why: Mapping[str, str]) -> str:
    """``no variant fits a node of it (cu128, cu126: no linux/arm64 image; ...)``, the
    candidates grouped by reason."""
    grouped: dict[str, list[str]] = {}
    for key, reason in why.items():
        grouped.setdefault(reason, []).append(key)
    parts = [f"{', '.join(keys)}: {reason}" for reason, keys in grouped.items()]
    return f"no variant fits a node of it ({'; '.join(parts)})"
