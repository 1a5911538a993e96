"""``GET /ui``: the fleet view, one server-rendered HTML page (no JavaScript, no CDN).

It shows the fleet by device class, the placements and their state and, for an image
reference or an index document typed in, which variant each device class would run and why
the others do not fit. The matrix is ``placement.Judge``'s: the same device classes and the
same ``select`` as a placement, so the page cannot disagree with ``POST /v1/placements``.
What a device class is (its product and driver) comes from its vendor's ``describe`` hook
(``fleet.describe``; a descriptor's namespace shows its own values).

Authentication is the API's: the same token table and roles (``client`` or ``admin``; a
client sees its own placements). Browsers cannot be told to send a bearer token, so the
page also takes the token as the password of HTTP Basic authentication (any user name) and
asks for it with a Basic challenge; without ``--tokens`` (loopback only) it is open, as the
API is. The page itself is read-only; its one action, an admin's cordon or uncordon of a host
(``POST /ui/cordon``), is a form that must carry ``form_key``: an HMAC keyed by the caller's
own token (without ``--tokens``, by a secret of this process), which a page of another site
cannot know, since a browser sends a Basic password with a forged cross-site form too. A form
whose ``Origin`` or ``Sec-Fetch-Site`` says it comes from another site is refused as well.

The page is a Jinja2 template (``templates/fleet.html``) rendered with autoescaping: every
value from agents, clients or registries is text, whatever it holds (markup, a 5,000-digit
number). It is served with a Content-Security-Policy that allows no script at all.
"""

from __future__ import annotations

import hmac
import json
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from docker_variant.api.names import check_agent_id
from docker_variant.errors import InvalidInputError, one_line
from docker_variant.jsondoc import load_json
from docker_variant.numtext import natural_key
from docker_variant.oci.errors import RegistryError
from docker_variant.planner.placement import Judge, candidate_key
from docker_variant.planner.pool import Pool
from docker_variant.scheduler.fleet import best_values, describe, fleet_classes
from docker_variant.scheduler.store import Store
from docker_variant.scheduler.tokens import Principal
from docker_variant.server.bodies import read_body
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists
from docker_variant.variant.selection import select
from docker_variant.variant.virtual import virtual_host

__all__ = [
    "SECURITY_HEADERS",
    "ForgedFormError",
    "cordon_form",
    "fleet_page",
    "form_key",
    "page_context",
]

#: No script may run, nothing is loaded from elsewhere, forms post back here only.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_MAX_FORM = 4 * 1024 * 1024  # an index document typed or pasted in
#: The key of ``form_key`` without ``--tokens``: one process, on loopback.
_FORM_SECRET = secrets.token_bytes(32)


class ForgedFormError(Exception):
    """A form that changes something came without its key, or from another site (403)."""


def form_key(credential: str | None) -> str:
    """The hidden field of a form that changes something: keyed by the caller's token."""
    key = credential.encode("utf-8", "surrogateescape") if credential else _FORM_SECRET
    return hmac.new(key, b"variant-scheduler /ui form", "sha256").hexdigest()


def _check_form(request: Request, fields: Mapping[str, str], credential: str | None) -> None:
    origin = request.headers.get("origin")
    if origin is not None and urllib.parse.urlsplit(origin).netloc != request.headers.get("host"):
        raise ForgedFormError(f"a form posted from {origin!r}, another site, is refused")
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise ForgedFormError("a form posted from another site is refused")
    if not hmac.compare_digest(fields.get("form_key", ""), form_key(credential)):
        raise ForgedFormError("the form's key is missing or wrong: reload the page and try again")


async def cordon_form(request: Request, credential: str | None) -> tuple[str, bool]:
    """The posted cordon form, checked: (agent id, cordon it or not)."""
    fields = await _form_fields(request)
    _check_form(request, fields, credential)
    action = fields.get("action")
    if action not in ("cordon", "uncordon"):
        raise InvalidInputError(f"action {action!r} is not one of cordon, uncordon")
    return check_agent_id(fields.get("agent_id")), action == "cordon"


@dataclass(frozen=True)
class MatrixRow:
    title: str  # device name and what the lists say
    platform: str | None
    relevant: SupportedLists  # the lists of the namespaces the index uses
    devices: int
    free: int
    ranks: Mapping[str, int]
    reasons: Mapping[str, str]


@dataclass(frozen=True)
class Matrix:
    columns: list[tuple[str, list[str]]]  # (candidate key, its properties as text)
    rows: list[MatrixRow]
    invalid: list[tuple[str, str]]  # (tag, why)


def variant_matrix(index: VariantIndex, pool: Pool) -> Matrix:
    """Each device class of the pool (and each host without devices), judged as a
    placement judges it: ``Judge.classify``, i.e. ``select`` on its merged lists."""
    judge = Judge(index, pool.profiles)
    grouped: dict[tuple[str, str], list[int]] = {}  # (class key, title) -> [devices, free]
    extra: dict[str, tuple[str | None, SupportedLists]] = {}
    for node in pool.nodes:
        platform = judge.platform(node)
        pairs: list[tuple[str, str | None, bool]] = [
            (name, device.profile, device.free)
            for name, members in node.devices.items()
            for device in members
        ]
        if not pairs:
            pairs = [("(host only)", None, True)]
        for name, profile, free in pairs:
            cls = judge.classify(node.host, profile, platform)
            # a device is named by its own lists: on a host with GPUs of two vendors, the
            # host's lists (merged into what is judged) name both
            own = pool.profiles[profile] if profile is not None else judge.lists(node.host, None)
            said = describe(own).said()
            title = f"{name}: {', '.join(said)}" if said else name
            counts = grouped.setdefault((cls.key, title), [0, 0])
            counts[0] += 1
            counts[1] += free
            # the class key is the judge's own compact JSON of [platform, relevant lists]
            extra[cls.key] = (platform, load_json(cls.key, "a device class key")[1])
    rows = []
    for (key, title), (count, free_count) in grouped.items():
        cls = judge.classes[key]
        platform, relevant = extra[key]
        rows.append(MatrixRow(title, platform, relevant, count, free_count, cls.ranks, cls.reasons))
    rows.sort(key=lambda r: (natural_key(r.title), r.platform or ""))
    reference = select(index, virtual_host(index)).ranked
    columns = []
    for candidate in reference:
        if candidate.variant is not None:
            props = [str(p) for p in candidate.variant.iter_properties()]
            columns.append((candidate_key(candidate), props or ["no properties"]))
        else:
            columns.append((candidate_key(candidate), ["the image without variant labels"]))
    invalid = [(image.tag, image.error) for image in index.invalid]
    return Matrix(columns, rows, invalid)


#: Hosts listed on the page: the rest are counted (``GET /v1/agents`` lists every one).
MAX_HOSTS = 1000
#: Seconds between reloads of a plain GET of the page (a posted index is not reloaded).
REFRESH = 30


@dataclass(frozen=True)
class HostRow:
    """One agent: its heartbeat's age and state, and its devices by name."""

    agent_id: str
    resource_group: str
    alive: bool
    last_seen: str
    devices: list[tuple[str, int, int]]  # (device name, free, allocated)
    unhealthy: int
    problem: str | None  # why it is shown first: stale, no devices, unhealthy devices
    cordoned: bool


def host_rows(views: Sequence[Mapping[str, Any]]) -> tuple[list[HostRow], int]:
    """Every agent, those with a problem first (stale, no devices, unhealthy devices),
    then by id; at most ``MAX_HOSTS``, and how many were left out."""
    rows = []
    for view in views:
        devices = [
            (name, len(ids.get("free", [])), len(ids.get("allocated", [])))
            for name, ids in view.get("devices", {}).items()
        ]
        unhealthy = sum(len(ids) for ids in view.get("unhealthy", {}).values())
        problem = None
        cordoned = bool(view.get("cordoned"))
        if cordoned:
            problem = "cordoned: no new placements"
        elif not view.get("alive", True):
            problem = "stale: no heartbeat within the agent TTL"
        elif not devices:
            problem = "no devices reported"
        elif unhealthy:
            problem = f"{unhealthy} unhealthy"
        rows.append(
            HostRow(
                view["agent_id"],
                view.get("resource_group", "-"),
                view.get("alive", True),
                view.get("last_seen", "-"),
                devices,
                unhealthy,
                problem,
                cordoned,
            )
        )
    rows.sort(key=lambda r: (r.problem is None, natural_key(r.agent_id)))
    return rows[:MAX_HOSTS], max(0, len(rows) - MAX_HOSTS)


@dataclass(frozen=True)
class PlacementRow:
    id: str
    state: str
    why: str | None  # a degraded placement's reason
    since: str
    variant: str
    image: str
    nodes: list[dict[str, str]]  # the first few allocations: agent id, devices
    more_nodes: int
    owner: str
    created_at: str


def placement_rows(placements: Sequence[Mapping[str, Any]]) -> list[PlacementRow]:
    rows = []
    for p in placements:
        state = str(p.get("state", "active"))
        degraded = p.get("degraded") or {}
        degraded = degraded if isinstance(degraded, dict) else {}
        allocations = list(p.get("allocations", []))
        rows.append(
            PlacementRow(
                id=str(p.get("id")),
                state=state,
                why=str(degraded.get("reason", "")) if state != "active" and degraded else None,
                since=str(degraded.get("since", "?")),
                variant=str(p.get("variant")),
                image=str(p.get("image")),
                nodes=[
                    {
                        "agent_id": str(a.get("agent_id")),
                        "devices": " ".join(map(str, a.get("devices", []))),
                    }
                    for a in allocations[:4]
                ],
                more_nodes=len(allocations) - 4,
                owner=str(p.get("owner", "") or ""),
                created_at=str(p.get("created_at", "")),
            )
        )
    return rows


# --------------------------------------------------------------------------- the template


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("docker_variant.scheduler", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a name the template gets wrong fails its tests
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["best_values"] = best_values
    env.filters["tojson_indented"] = lambda value: json.dumps(value, indent=1)
    env.filters["tojson_compact"] = json.dumps
    return env


TEMPLATES = Jinja2Templates(env=_environment())


def page_context(
    *,
    pool: Pool,
    views: Sequence[Mapping[str, Any]],
    placements: Sequence[Mapping[str, Any]],
    image: str = "",
    index_text: str = "",
    matrix: Matrix | None = None,
    error: str | None = None,
    resource_group: str | None = None,
    shares: Mapping[str, Any] | None = None,
    now: datetime | None = None,
    refresh: int | None = None,
    admin_form_key: str | None = None,
) -> dict[str, Any]:
    """Everything ``fleet.html`` shows, computed here (the template only lays it out)."""
    classes = fleet_classes(pool)
    hosts, hosts_left_out = host_rows(views)
    return {
        "refresh": refresh,
        "admin_form_key": admin_form_key,  # an admin's page: cordon buttons with this key
        "hosts": hosts,
        "hosts_left_out": hosts_left_out,
        "resource_group": resource_group,
        "summary": {
            "agents": len(views),
            "alive": sum(1 for v in views if v.get("alive", True)),
            "devices": sum(c.devices for c in classes),
            "free": sum(c.free for c in classes),
            "unhealthy": sum(c.unhealthy for c in classes),
            "degraded": sum(1 for p in placements if p.get("state") == "degraded"),
        },
        "shares": shares,
        "now": (now or datetime.now(UTC)).isoformat(timespec="seconds"),
        "unavailable": sorted(pool.unavailable.items())[:20],
        "classes": classes,
        "placements": placements,
        "placement_rows": placement_rows(placements),
        "image": image,
        "index_text": index_text,
        "error": error,
        "matrix": matrix,
    }


# --------------------------------------------------------------------------- the route


async def _form_fields(request: Request) -> dict[str, str]:
    """The query's fields, or a posted form's (``application/x-www-form-urlencoded``)."""
    fields = dict(request.query_params)
    if request.method == "POST":
        body = await read_body(request, _MAX_FORM)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError("the form is not UTF-8 text") from None
        for key, values in urllib.parse.parse_qs(text, keep_blank_values=True).items():
            fields[key] = values[-1]
    return fields


async def fleet_page(
    request: Request,
    store: Store,
    who: Principal,
    resolve: Callable[[str], Awaitable[VariantIndex]],
    credential: str | None = None,
) -> Response:
    """The page for ``who`` (whose token is ``credential``); ``resolve`` fetches an image's
    index under the API's rules (the registry allow-list)."""
    fields = await _form_fields(request)
    image = fields.get("image", "").strip()
    index_text = fields.get("index", "").strip()
    group = fields.get("resource_group", "").strip() or None
    if group is not None:
        check_agent_id(group)  # the rule of resource groups (400 otherwise)
    pool = await run_in_threadpool(store.snapshot, group)
    views = await run_in_threadpool(store.list_agents, group)
    shares = await run_in_threadpool(store.pool_summary, group)
    placements = [
        p
        for p in await run_in_threadpool(store.list_placements)
        if who.may_own(p.get("owner")) and (group is None or p.get("resource_group") == group)
    ]
    matrix: Matrix | None = None
    error: str | None = None
    if image or index_text:
        try:
            if index_text:
                index = VariantIndex.from_json(load_json(index_text, "the index"), "the index")
            else:
                index = await resolve(image)
            matrix = await run_in_threadpool(variant_matrix, index, pool)
        except (InvalidInputError, RegistryError) as exc:
            error = one_line(str(exc))
    context = page_context(
        pool=pool,
        views=views,
        placements=placements,
        image=image,
        index_text=index_text,
        matrix=matrix,
        error=error,
        resource_group=group,
        shares=shares,
        refresh=REFRESH if request.method == "GET" else None,  # a posted form is kept
        admin_form_key=form_key(credential) if who.role == "admin" else None,
    )
    # rendered off the event loop: a fleet of thousands of agents is a long page
    return await run_in_threadpool(
        TEMPLATES.TemplateResponse, request, "fleet.html", context, headers=SECURITY_HEADERS
    )
