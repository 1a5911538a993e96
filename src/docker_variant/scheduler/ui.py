"""``GET /ui``: the fleet view, one server-rendered HTML page (no JavaScript, no CDN).

It shows the fleet by device class, the placements and their state and, for an image
reference or an index document typed in, which variant each device class would run and why
the others do not fit. The matrix is ``placement.Judge``'s: the same device classes and the
same ``select`` as a placement, so the page cannot disagree with ``POST /v1/placements``.

Authentication is the API's: the same token table and roles (``client`` or ``admin``; a
client sees its own placements). Browsers cannot be told to send a bearer token, so the
page also takes the token as the password of HTTP Basic authentication (any user name) and
asks for it with a Basic challenge; without ``--tokens`` (loopback only) it is open, as the
API is. The page is read-only, so a forged request can change nothing.

Everything that comes from agents, clients or registries is HTML-escaped, and the page is
served with a Content-Security-Policy that allows no script at all.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.jsondoc import load_json
from docker_variant.oci.errors import RegistryError
from docker_variant.scheduler.documents import SHARE, check_agent_id
from docker_variant.scheduler.placement import Judge, candidate_key
from docker_variant.scheduler.pool import Pool, natural_key
from docker_variant.scheduler.store import Store
from docker_variant.scheduler.tokens import Principal
from docker_variant.server.bodies import read_body
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists
from docker_variant.variant.selection import select
from docker_variant.variant.virtual import virtual_host

__all__ = ["SECURITY_HEADERS", "basic_token", "fleet_page", "render_page"]

#: No script may run, nothing is loaded from elsewhere, forms post back here only.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_MAX_FORM = 4 * 1024 * 1024  # an index document typed or pasted in

# REFERENCE.md: compute capability -> products; a driver branch's highest CUDA version.
_PRODUCTS = {
    (7, 0): "V100",
    (7, 5): "T4",
    (8, 0): "A100",
    (8, 6): "A10, A40, RTX 30",
    (8, 9): "L4, L40S, RTX 40",
    (9, 0): "H100, H200, GH200",
    (10, 0): "B200, GB200",
    (10, 3): "B300, GB300",
    (12, 0): "RTX 50, RTX PRO 6000",
}
_BRANCHES = {
    "12.2": "R535",
    "12.4": "R550",
    "12.6": "R560",
    "12.8": "R570",
    "12.9": "R575",
    "13.0": "R580",
}


def basic_token(request: Request) -> str | None:
    """The password of ``Authorization: Basic ...``: how a browser sends the token."""
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon and password else None


# --------------------------------------------------------------------------- what is shown


def product_of(lists: SupportedLists) -> str:
    """What the lists say of the GPU: its compute capability and the products that have it
    (the heartbeat carries lists, not product names)."""
    sm = lists.get("nvidia", {}).get("sm_arch", [])
    real = [v for v in sm if v.endswith("_real")]
    if not real:
        return "-"
    digits = real[0].removesuffix("_real")
    if not digits.isdigit() or len(digits) < 2:
        return real[0]
    cc = (int(digits[:-1]), int(digits[-1]))
    known = _PRODUCTS.get(cc)
    return f"sm {cc[0]}.{cc[1]}" + (f" ({known})" if known else "")


def driver_of(lists: SupportedLists) -> str:
    lower = lists.get("nvidia", {}).get("cuda_version_lower_bound", [])
    if not lower:
        return "-"
    branch = _BRANCHES.get(lower[0])
    return f"CUDA {lower[0]}" + (f" ({branch})" if branch else "")


@dataclass
class FleetClass:
    """Devices of one name with identical lists on one platform."""

    device_name: str
    lists: SupportedLists
    platform: str | None
    agents: set[str] = field(default_factory=set)
    devices: int = 0
    free: int = 0  # healthy and unused: a whole-device request can take it
    used: int = 0  # healthy, some or all of its shares allocated
    unhealthy: int = 0
    capacity: int = 0  # shares of the healthy devices, in millionths
    room: int = 0  # shares left on them


def fleet_classes(pool: Pool) -> list[FleetClass]:
    """The live devices grouped by name, lists and platform (every device visited once)."""
    judge = Judge(VariantIndex([], {}), pool.profiles)  # for the platform rule only
    classes: dict[tuple[str, str, str | None], FleetClass] = {}
    for node in pool.nodes:
        platform = judge.platform(node)
        for name, members in node.devices.items():
            for device in members:
                key = (name, device.profile, platform)
                row = classes.get(key)
                if row is None:
                    row = classes[key] = FleetClass(name, pool.profiles[device.profile], platform)
                row.agents.add(node.agent_id)
                row.devices += 1
                if not device.healthy:
                    row.unhealthy += 1
                    continue
                row.capacity += device.capacity
                row.room += device.room
                if device.free:
                    row.free += 1
                else:
                    row.used += 1
    return sorted(
        classes.values(),
        key=lambda c: (c.device_name, product_of(c.lists), driver_of(c.lists), c.platform or ""),
    )


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
            lists = judge.lists(node.host, profile)
            said = [t for t in (product_of(lists), driver_of(lists)) if t != "-"]
            title = f"{name}: {', '.join(said)}" if said else name
            counts = grouped.setdefault((cls.key, title), [0, 0])
            counts[0] += 1
            counts[1] += free
            extra[cls.key] = (platform, json.loads(cls.key)[1])
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


# --------------------------------------------------------------------------- HTML


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _lists_html(lists: SupportedLists) -> str:
    """Each feature's best value, and the whole lists on demand."""
    if not lists:
        return "<span class=muted>none</span>"
    short = []
    for namespace, features in lists.items():
        for feature, values in features.items():
            more = f" <span class=muted>+{len(values) - 1}</span>" if len(values) > 1 else ""
            short.append(f"<code>{_e(namespace)} :: {_e(feature)} :: {_e(values[0])}</code>{more}")
    full = _e(json.dumps(lists, indent=1))
    return f"{'<br>'.join(short)}<details><summary>lists</summary><pre>{full}</pre></details>"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#1d1d1f;background:#fff}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.15em;margin:1.6em 0 .4em}
table{border-collapse:collapse;margin:.3em 0} th,td{border:1px solid #ccd;padding:.3em .55em;
vertical-align:top;text-align:left} th{background:#eef1f6} td.n{text-align:right}
.muted{color:#778} code{font-size:12px} pre{font-size:11px;margin:.2em 0}
.bad{background:#fde2e1} .warn{background:#fff3cd} .ok{background:#e3f5e1}
td.first{background:#b9e6b3;font-weight:600} td.fits{background:#e3f5e1}
td.no{background:#f6f6f8;color:#555;font-size:12px;max-width:16em}
form{margin:.6em 0 1em;padding:.6em;background:#f5f7fa;border:1px solid #dde}
input[type=text]{width:32em} textarea{width:48em;height:5em;font:12px monospace}
.error{color:#a40000;font-weight:600} .summary span{margin-right:1.4em}
.small{font-size:11px;font-weight:400}
"""


def render_page(
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
) -> str:
    now = now or datetime.now(UTC)
    classes = fleet_classes(pool)
    alive = sum(1 for v in views if v.get("alive", True))
    devices = sum(c.devices for c in classes)
    unhealthy = sum(c.unhealthy for c in classes)
    degraded = sum(1 for p in placements if p.get("state") == "degraded")
    scope = f" in resource group {_e(resource_group)}" if resource_group else ""
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width,initial-scale=1'>",
        f"<title>variant-scheduler fleet</title><style>{_CSS}</style></head><body>",
        f"<h1>variant-scheduler fleet{scope}</h1>",
        "<p class=summary>"
        f"<span id=agents>{len(views)} agents ({alive} alive)</span>"
        f"<span id=devices>{devices} devices</span>"
        f"<span id=free>{sum(c.free for c in classes)} free</span>"
        f"<span id=unhealthy class='{'bad' if unhealthy else ''}'>{unhealthy} unhealthy</span>"
        f"<span id=placements>{len(placements)} placements ({degraded} degraded)</span>"
        + (
            f"<span id=shares>{_e(shares.get('free_shares'))} of "
            f"{_e(shares.get('capacity_shares'))} shares free, fragmentation "
            f"{_e(shares.get('fragmentation'))}</span>"
            if shares
            else ""
        )
        + f"<span class=muted>{_e(now.isoformat(timespec='seconds'))}</span></p>",
    ]
    if pool.unavailable:
        left = ", ".join(f"{_e(a)} ({_e(w)})" for a, w in sorted(pool.unavailable.items())[:20])
        parts.append(f"<p class=warn>Left out of placements: {left}</p>")
    parts.append(_fleet_table(classes))
    parts.append(_placements_table(placements))
    parts.append(_form(image, index_text, resource_group))
    if error is not None:
        parts.append(f"<p class=error id=lookup-error>{_e(error)}</p>")
    if matrix is not None:
        what = image or "the index typed in"
        parts.append(_matrix_table(matrix, what))
    parts.append("</body></html>")
    return "\n".join(parts)


def _fleet_table(classes: Sequence[FleetClass]) -> str:
    rows = [
        "<h2>Fleet by device class</h2><table id=fleet><tr><th>device name</th><th>product</th>"
        "<th>driver</th><th>properties</th><th>platform</th><th>agents</th><th>devices</th>"
        "<th>free</th><th>used</th><th>free shares</th><th>unhealthy</th></tr>"
    ]
    for c in classes:
        agents = sorted(c.agents, key=natural_key)
        shown = ", ".join(_e(a) for a in agents[:3]) + (
            f" +{len(agents) - 3}" if len(agents) > 3 else ""
        )
        shares = f"{c.room / SHARE:g} of {c.capacity / SHARE:g}"
        rows.append(
            f"<tr class='{'bad' if c.unhealthy else ''}'><td>{_e(c.device_name)}</td>"
            f"<td>{_e(product_of(c.lists))}</td><td>{_e(driver_of(c.lists))}</td>"
            f"<td>{_lists_html(c.lists)}</td><td>{_e(c.platform or '-')}</td>"
            f"<td>{len(agents)}<br><span class=muted>{shown}</span></td>"
            f"<td class=n>{c.devices}</td><td class=n>{c.free}</td><td class=n>{c.used}</td>"
            f"<td class=n>{shares}</td><td class='n unhealthy'>{c.unhealthy}</td></tr>"
        )
    if not classes:
        rows.append("<tr><td colspan=11 class=muted>no devices reported</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _placements_table(placements: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        "<h2>Placements</h2><table id=placement-list><tr><th>id</th><th>state</th>"
        "<th>variant</th><th>image</th><th>nodes</th><th>owner</th><th>created</th></tr>"
    ]
    for p in placements:
        state = str(p.get("state", "active"))
        degraded = p.get("degraded") or {}
        why = ""
        if state != "active" and isinstance(degraded, dict):
            why = (
                f"<br><span class=muted>{_e(degraded.get('reason', ''))}"
                f" (since {_e(degraded.get('since', '?'))})</span>"
            )
        nodes = ", ".join(
            f"{_e(a.get('agent_id'))}: {_e(' '.join(map(str, a.get('devices', []))))}"
            for a in p.get("allocations", [])[:4]
        )
        more = len(p.get("allocations", [])) - 4
        nodes += f" +{more} nodes" if more > 0 else ""
        rows.append(
            f"<tr class='{'bad' if state == 'degraded' else ''}' data-id='{_e(p.get('id'))}'>"
            f"<td><code>{_e(str(p.get('id'))[:12])}</code></td>"
            f"<td class=state>{_e(state)}{why}</td><td>{_e(p.get('variant'))}</td>"
            f"<td><code>{_e(p.get('image'))}</code></td><td>{nodes}</td>"
            f"<td>{_e(p.get('owner', ''))}</td><td>{_e(p.get('created_at', ''))}</td></tr>"
        )
    if not placements:
        rows.append("<tr><td colspan=7 class=muted>no placements</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _form(image: str, index_text: str, resource_group: str | None) -> str:
    group = (
        f"<input type=hidden name=resource_group value='{_e(resource_group)}'>"
        if resource_group
        else ""
    )
    return (
        "<h2>Which variant would each device class run?</h2>"
        "<form method=post action=''>"
        f"<label>Image <input type=text name=image placeholder='registry/name:version' "
        f"value='{_e(image)}'></label><br><label>or an index document (JSON)<br>"
        f"<textarea name=index>{_e(index_text)}</textarea></label>{group}<br>"
        "<button type=submit>Show the matrix</button></form>"
    )


def _matrix_table(matrix: Matrix, what: str) -> str:
    head = "".join(
        f"<th data-variant='{_e(key)}'>{_e(key)}<br><span class='muted small'>"
        f"{'<br>'.join(_e(p) for p in props)}</span></th>"
        for key, props in matrix.columns
    )
    rows = [
        f"<p>Each row is a device class of the fleet as a placement of <code>{_e(what)}</code> "
        "judges it (its host lists merged with the device's, on its platform); the cell says the "
        "rank of each image for it, 1 being what that device would pull itself.</p>"
        f"<table id=matrix><tr><th>device class</th><th>devices (free)</th>{head}</tr>"
    ]
    for row in matrix.rows:
        cells = []
        for key, _ in matrix.columns:
            rank = row.ranks.get(key)
            if rank == 1:
                cells.append(f"<td class=first data-variant='{_e(key)}' data-rank=1>runs this</td>")
            elif rank is not None:
                cells.append(
                    f"<td class=fits data-variant='{_e(key)}' data-rank={rank}>fits (rank {rank})"
                    "</td>"
                )
            else:
                why = row.reasons.get(key, "does not fit")
                cells.append(f"<td class=no data-variant='{_e(key)}'>{_e(why)}</td>")
        rows.append(
            f"<tr><th>{_e(row.title)}<br><span class=muted>{_e(row.platform or '-')}</span>"
            f"<details><summary>lists judged</summary><pre>{_e(json.dumps(row.relevant))}</pre>"
            f"</details></th><td class=n>{row.devices} ({row.free})</td>{''.join(cells)}</tr>"
        )
    if not matrix.rows:
        rows.append(f"<tr><td colspan={len(matrix.columns) + 2} class=muted>no agents</td></tr>")
    rows.append("</table>")
    for tag, why in matrix.invalid:
        rows.append(f"<p class=warn>invalid image <code>{_e(tag)}</code>: {_e(why)}</p>")
    return "".join(rows)


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
) -> HTMLResponse:
    """The page for ``who``; ``resolve`` fetches an image's index under the API's rules
    (the registry allow-list)."""
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
    page = render_page(
        pool=pool,
        views=views,
        placements=placements,
        image=image,
        index_text=index_text,
        matrix=matrix,
        error=error,
        resource_group=group,
        shares=shares,
    )
    return HTMLResponse(page, headers=SECURITY_HEADERS)
