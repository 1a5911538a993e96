"""Persistence: agent reports, snapshots of the pool, and atomic all-or-nothing placements.

A placement is planned on a snapshot read without locks, then committed in one transaction
that re-checks the planned agents and devices and inserts the placement with one
``allocations`` row per device. The table's primary key refuses a device allocated twice, so
two placements racing for a device cannot both commit: the loser's transaction rolls back
as a whole and it plans again on fresh state, up to ``attempts`` times.

The pool lives in memory, indexed for planning (``placement.Pool``), one per resource group
asked for. Two version rows say whether it is current: ``pool_version`` (agents and devices;
bumped by a report that changes an agent, not by a plain heartbeat, and by deleting one) and
``allocation_version`` (bumped by every placement and every release). This process applies
the changes it commits to the pools in memory while holding ``_memory`` across the commit, so
the versions read next still match: a placement reads two numbers, plans on the index and
commits, at a cost that does not grow with the fleet. A change committed by another process
(a replica on the same database) shows as a version this process did not make: a new
allocation version re-reads the allocations, a new pool version the whole pool. With an
agent TTL, a placement also reads every agent's last heartbeat, as before.

Shares: a device in use has a ``device_usage`` row whose check (``used <= capacity``) and
primary key the database enforces (see ``models``), so concurrent placements, replicas
included, can never over-commit a device; the loser replans as above.

Failures: a report that marks an allocated device unhealthy or leaves it out, and an agent
whose heartbeat lapses past the TTL (noticed when placements are read), make the placements
holding them ``degraded``, with the reason and the time; they stay so until ``replace``
moves them onto healthy devices (in one transaction: the old devices are freed as the new
ones are taken) or they are deleted.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    inspect,
    select,
    true,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from docker_variant.errors import InvalidInputError
from docker_variant.scheduler.database import (
    RETRYABLE_SQLSTATES,
    WRITE,
    open_engine,
    safe_url,
    sqlstate,
    unavailable,
)
from docker_variant.scheduler.documents import (
    SHARE,
    AgentReport,
    PlacementRequest,
    parse_placement_request,
)
from docker_variant.scheduler.models import (
    agents,
    allocation_version,
    allocations,
    device_usage,
    devices,
    metadata,
    placements,
    pool_version,
    profiles,
)
from docker_variant.scheduler.placement import (
    BARE,
    WHOLE,
    Device,
    DeviceKey,
    Node,
    NodeAllocation,
    Plan,
    Pool,
    ProfileKey,
    Refusal,
    device_in_use,
    natural_key,
    plan,
    pool_shares,
    profile_key,
    room_left,
)
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists
from docker_variant.variant.selection import Candidate

__all__ = ["DEFAULT_ATTEMPTS", "STATES", "Store"]

DEFAULT_ATTEMPTS = 5
STATES = ("active", "degraded")  # a placement's
_IN_BATCH = 500

_T = TypeVar("_T")
_CACHED_POOLS = 64  # resource groups whose devices are kept in memory
_HEARD = 1 << 16  # heartbeats kept for a pool between two plans (more are read when due)


@dataclass
class _Memory:
    """One resource group's pool in memory, as of two versions of the database."""

    pool: Pool
    pool_version: int  # its agents and devices
    allocation_version: int  # its devices' ``free``
    # For the agent TTL: each agent's last heartbeat as far as this process knows (never
    # later than the database's), the same as a heap, soonest first (entries that no longer
    # match ``last_seen`` are stale), and heartbeats this process recorded since the last
    # plan (appended without a lock; a hint: one lost or dropped is read again when due).
    last_seen: dict[str, float]
    deadlines: list[tuple[float, str]] = field(default_factory=list)
    heard: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=_HEARD))


_VERSIONS = select(
    select(pool_version.c.version).where(pool_version.c.id == 1).scalar_subquery(),
    select(allocation_version.c.version).where(allocation_version.c.id == 1).scalar_subquery(),
)


def _bump(conn: Connection, table: Any) -> int:
    """Count a change in ``pool_version`` or ``allocation_version``; the new version. The row
    stays locked (SQLite: the database) until the transaction ends, so versions commit in
    order, and ``new - 1`` is the version just before this change."""
    conn.execute(table.update().where(table.c.id == 1).values(version=table.c.version + 1))
    return int(conn.execute(select(table.c.version).where(table.c.id == 1)).scalar_one())


def _bump_pool_version(conn: Connection) -> int:
    """The pool's agents or devices changed: other processes re-read them on their next plan."""
    return _bump(conn, pool_version)


_Member = tuple[str, ProfileKey, int, bool]  # device id, profile, capacity, healthy
Usage = dict[tuple[str, str], int]  # (device name, device id) -> in use (millionths, or WHOLE)


def _node(
    agent_id: str,
    host: ProfileKey,
    members: Mapping[str, Sequence[_Member]],
    platform: str | None,
    held: Mapping[tuple[str, str], int],
) -> Node:
    """A node from its rows; ``held``: what its allocated devices have in use."""
    devices: dict[str, list[Device]] = {}
    for name, ids in members.items():
        devices[name] = [
            device_in_use(device_id, profile, capacity, healthy, held.get((name, device_id), 0))
            for device_id, profile, capacity, healthy in sorted(ids)
        ]
    return Node(agent_id, host, devices, platform)


def _usage(rows: Any) -> dict[DeviceKey, int]:
    """What each device has in use, from (agent, name, device, shares) allocation rows."""
    used: dict[DeviceKey, int] = {}
    for agent, name, device_id, shares in rows:
        if name == _HOST:
            continue
        key = (agent, name, device_id)
        used[key] = WHOLE if shares is None else min(WHOLE, used.get(key, 0) + shares)
    return used


def _shares_out(units: int) -> float:
    return round(units / SHARE, 6)


def _iso(timestamp: float) -> str:
    return (
        datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _sorted(ids: Sequence[str]) -> list[str]:
    return sorted(ids, key=natural_key)


class _Stale(Exception):
    """The plan's view of the pool changed before it could commit."""


def _grouped(
    changes: Sequence[tuple[DeviceKey, int | None]], allocate: bool
) -> list[tuple[list[DeviceKey], int | None, bool]]:
    by_shares: dict[int | None, list[DeviceKey]] = {}
    for key, shares in changes:
        by_shares.setdefault(shares, []).append(key)
    return [(keys, shares, allocate) for shares, keys in by_shares.items()]


_DEGRADE = (
    placements.update()
    .where(placements.c.id == bindparam("p"), placements.c.state == "active")
    .values(state="degraded", degraded_reason=bindparam("r"), degraded_since=bindparam("t"))
)


def _degrade(conn: Connection, reasons: Mapping[str, tuple[str, float]]) -> None:
    """Mark active placements degraded: placement id -> (reason, since)."""
    if reasons:
        rows = [{"p": p, "r": reason, "t": since} for p, (reason, since) in sorted(reasons.items())]
        conn.execute(_DEGRADE, rows)


#: The device name of a node's row in a placement that takes no device (devices_per_node 0),
#: so that the agents of every placement are in ``allocations`` (for the TTL, and draining).
_HOST = ""


def _take(conn: Connection, placement_id: str, plan_: Plan) -> list[tuple[DeviceKey, int | None]]:
    """Insert the allocation rows of ``plan_`` and the devices' usage; the database refuses
    (IntegrityError) a device taken whole twice, or shares past a device's capacity."""
    hosts = [a.agent_id for a in plan_.allocations if not a.devices]
    if hosts:  # no usage: a host is not taken
        rows = [
            {"agent_id": agent, "device_name": _HOST, "device_id": _HOST, "shares": 0}
            for agent in sorted(hosts)
        ]
        conn.execute(insert(allocations), [row | {"placement_id": placement_id} for row in rows])
    keyed = sorted(
        ((a.agent_id, a.device_name or "", d.device_id), d.capacity)
        for a in plan_.allocations
        for d in a.devices
    )
    if not keyed:  # in key order, so that racing writers cannot deadlock
        return []
    shares = plan_.shares
    conn.execute(
        insert(allocations),
        [
            {
                "agent_id": agent_id,
                "device_name": name,
                "device_id": device_id,
                "placement_id": placement_id,
                "shares": shares,
            }
            for (agent_id, name, device_id), _ in keyed
        ],
    )
    if shares is None:  # the primary key refuses a device anything else uses
        # one statement from the rows just written (a gang may take thousands of devices)
        taken = (
            select(
                allocations.c.agent_id,
                allocations.c.device_name,
                allocations.c.device_id,
                devices.c.capacity.label("used"),
                devices.c.capacity,
                true().label("whole"),
            )
            .join_from(allocations, devices, _same_device(allocations, devices))
            .where(
                allocations.c.placement_id == placement_id,
                allocations.c.agent_id.in_(sorted({a.agent_id for a in plan_.allocations})),
            )
            .order_by(allocations.c.agent_id, allocations.c.device_name, allocations.c.device_id)
        )
        columns = ["agent_id", "device_name", "device_id", "used", "capacity", "whole"]
        # (RETURNING: psycopg reports no row count for INSERT ... SELECT)
        filled = insert(device_usage).from_select(columns, taken)
        inserted = conn.execute(filled.returning(device_usage.c.device_id)).all()
        if len(inserted) != len(keyed):  # a planned device is gone (``_check`` saw it not)
            raise _Stale()
    else:  # the check refuses the sum past the capacity, and any share of a whole device
        rows = [
            {
                "agent_id": agent_id,
                "device_name": name,
                "device_id": device_id,
                "used": shares,
                "capacity": capacity,
                "whole": False,
            }
            for (agent_id, name, device_id), capacity in keyed
        ]
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        upsert = dialect.insert(device_usage)
        conn.execute(
            upsert.on_conflict_do_update(
                index_elements=[
                    device_usage.c.agent_id,
                    device_usage.c.device_name,
                    device_usage.c.device_id,
                ],
                set_={"used": device_usage.c.used + upsert.excluded.used},
            ),
            rows,
        )
    return [(key, shares) for key, _ in keyed]


def _free(conn: Connection, which: Any) -> list[tuple[DeviceKey, int | None]]:
    """Delete the allocation rows ``which`` selects and give their devices' usage back."""
    query = select(
        allocations.c.agent_id,
        allocations.c.device_name,
        allocations.c.device_id,
        allocations.c.shares,
    ).where(which)
    freed = [((a, n, d), s) for a, n, d, s in conn.execute(query) if n != _HOST]
    if not freed:
        conn.execute(delete(allocations).where(which))
        return []
    if any(s is None for _, s in freed):  # whole devices: their rows are theirs alone
        whole = select(
            allocations.c.agent_id, allocations.c.device_name, allocations.c.device_id
        ).where(which, allocations.c.shares.is_(None))
        key = tuple_(device_usage.c.agent_id, device_usage.c.device_name, device_usage.c.device_id)
        conn.execute(device_usage.delete().where(device_usage.c.whole, key.in_(whole)))
    # shares: rows other placements share, changed one by one in key order (no deadlock)
    partly = [
        {"a": a, "n": n, "d": d, "s": s} for (a, n, d), s in sorted(freed, key=lambda f: f[0]) if s
    ]
    if partly:
        one = and_(
            device_usage.c.agent_id == bindparam("a"),
            device_usage.c.device_name == bindparam("n"),
            device_usage.c.device_id == bindparam("d"),
        )
        give_back = (
            device_usage.update().where(one).values(used=device_usage.c.used - bindparam("s"))
        )
        conn.execute(give_back, partly)
        # a device whose last share went is unused
        conn.execute(device_usage.delete().where(one, device_usage.c.used <= 0), partly)
    conn.execute(delete(allocations).where(which))
    return freed


def _same_device(one: Any, other: Any) -> Any:
    return and_(
        one.c.agent_id == other.c.agent_id,
        one.c.device_name == other.c.device_name,
        one.c.device_id == other.c.device_id,
    )


class Store:
    """The scheduler's state in one database; every method is one or two transactions."""

    def __init__(
        self,
        engine: Engine,
        *,
        agent_ttl: float = 0,
        attempts: int = DEFAULT_ATTEMPTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.url = safe_url(engine.url)
        self.agent_ttl = agent_ttl  # 0: agents never expire
        self.attempts = attempts
        self.clock = clock
        self._profiles: dict[ProfileKey, SupportedLists] = {}  # content-addressed: never stale
        # Placements of one process plan one at a time: they would all pick the same best
        # devices and then lose the race to each other. Other processes (replicas sharing
        # the database) still race; the primary key settles it and the loser plans again.
        self._placing = threading.Lock()
        # Held while the pools in memory are read or changed, and across the commit of each
        # change this process makes, so that changes reach memory in the order they commit.
        # Taken after a connection, never before one; held, it waits on no database lock.
        self._memory = threading.Lock()
        self._pools: dict[str | None, _Memory] = {}  # by resource group (None: all)

    @classmethod
    def open(cls, url: str, **kwargs: Any) -> Store:
        """Connect and create the tables that are missing."""
        engine = open_engine(url)
        store = cls(engine, **kwargs)
        with unavailable("creating the tables", store.url):
            metadata.create_all(engine)
            # create_all adds missing tables, not columns: a database from before shares
            if "shares" not in {c["name"] for c in inspect(engine).get_columns("allocations")}:
                engine.dispose()
                raise InvalidInputError(
                    f"database {store.url} was made by an older variant-scheduler (no device "
                    "shares, health or placement states); start on a new database"
                )
            with store._write("creating the tables") as conn:
                for table in (pool_version, allocation_version):
                    seed = store._insert(conn, table).values(id=1, version=0)
                    conn.execute(seed.on_conflict_do_nothing())
        return store

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ transactions

    @contextlib.contextmanager
    def _read(self, what: str) -> Iterator[Connection]:
        with unavailable(what, self.url), self.engine.connect() as conn:
            if conn.dialect.name == "postgresql":  # one snapshot for every statement
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        with unavailable(what, self.url), self.engine.connect() as conn:
            conn = conn.execution_options(**{WRITE: True})
            with conn.begin():
                yield conn

    def ping(self) -> None:
        with self._read("health check") as conn:
            conn.exec_driver_sql("SELECT 1")

    def _insert(self, conn: Connection, table: Any) -> Any:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        return dialect.insert(table)

    # ------------------------------------------------------------------ agents

    def _ensure_profiles(
        self, conn: Connection, documents: Mapping[ProfileKey, SupportedLists]
    ) -> None:
        missing = [key for key in documents if key not in self._profiles]
        if missing:
            rows = [{"id": key, "lists": json.dumps(documents[key])} for key in missing]
            conn.execute(self._insert(conn, profiles).on_conflict_do_nothing(), rows)

    def report_agent(self, report: AgentReport) -> dict[str, Any]:
        """Record a heartbeat: the agent's lists and devices replace the previous report;
        allocations are untouched (a vanished allocated device is reported as missing), but
        the placements holding a device now unhealthy or missing become degraded."""
        documents = {profile_key(report.host): report.host}
        rows: list[dict[str, Any]] = []
        for name, members in report.devices.items():
            for device_id, lists in members.items():
                key = profile_key(lists)
                documents[key] = lists
                rows.append(
                    {
                        "agent_id": report.agent_id,
                        "device_name": name,
                        "device_id": device_id,
                        "profile": key,
                        "capacity": report.capacity.get((name, device_id), SHARE),
                        "healthy": (name, device_id) not in report.unhealthy,
                    }
                )
        now = self.clock()
        with contextlib.ExitStack() as applying:
            with self._write(f"recording agent {report.agent_id}") as conn:
                version, held = self._record(conn, report, rows, documents, now)
                if version:
                    applying.enter_context(self._memory)  # released once memory has it
            self._profiles.update(documents)
            if version:
                self._apply_report(version, report, held, now)
        if self.agent_ttl > 0:
            for memory in list(self._pools.values()):
                memory.heard.append((report.agent_id, now))
        views = self._views(None, report.agent_id, detail=False)  # the lists were just sent
        return views[0]

    def _record(
        self,
        conn: Connection,
        report: AgentReport,
        rows: list[dict[str, Any]],
        documents: Mapping[ProfileKey, SupportedLists],
        now: float,
    ) -> tuple[int, Usage]:
        """Write the report: the new pool version and what the agent's allocated devices
        have in use when it changed the agent, else (0, empty)."""
        group, host, platform = report.resource_group, profile_key(report.host), report.platform
        reported = {
            (r["device_name"], r["device_id"]): (r["profile"], r["capacity"], r["healthy"])
            for r in rows
        }
        before = conn.execute(
            select(agents.c.resource_group, agents.c.host_profile, agents.c.platform).where(
                agents.c.agent_id == report.agent_id
            )
        ).first()
        known = {
            (name, device_id): (profile, capacity, bool(healthy))
            for _, name, device_id, profile, capacity, healthy in conn.execute(
                select(devices).where(devices.c.agent_id == report.agent_id)
            )
        }
        changed = before is None or tuple(before) != (group, host, platform)
        changed = changed or known != reported
        if changed:
            self._ensure_profiles(conn, documents)
        upsert = self._insert(conn, agents).values(
            agent_id=report.agent_id,
            resource_group=group,
            host_profile=host,
            first_seen=now,
            last_seen=now,
            platform=platform,
        )
        conn.execute(
            upsert.on_conflict_do_update(
                index_elements=[agents.c.agent_id],
                set_={
                    "resource_group": upsert.excluded.resource_group,
                    "host_profile": upsert.excluded.host_profile,
                    "last_seen": upsert.excluded.last_seen,
                    "platform": upsert.excluded.platform,
                },
            )
        )
        if not changed:
            return 0, {}
        conn.execute(delete(devices).where(devices.c.agent_id == report.agent_id))
        if rows:
            conn.execute(insert(devices), rows)
        resized = [
            {"a": report.agent_id, "n": name, "d": device_id, "c": capacity}
            for (name, device_id), (_, capacity, _) in reported.items()
            if (name, device_id) not in known or known[(name, device_id)][1] != capacity
        ]
        if resized:  # a device partly used keeps at least what it has in use
            conn.execute(
                device_usage.update()
                .where(
                    device_usage.c.agent_id == bindparam("a"),
                    device_usage.c.device_name == bindparam("n"),
                    device_usage.c.device_id == bindparam("d"),
                    device_usage.c.whole.is_(False),
                )
                .values(
                    capacity=case(
                        (device_usage.c.used <= bindparam("c"), bindparam("c")),
                        else_=device_usage.c.used,
                    )
                ),
                resized,
            )
        held_rows = conn.execute(
            select(
                allocations.c.device_name,
                allocations.c.device_id,
                allocations.c.placement_id,
                allocations.c.shares,
            ).where(allocations.c.agent_id == report.agent_id)
        ).all()
        degraded: dict[str, tuple[str, float]] = {}
        for name, device_id, placement_id, _ in held_rows:
            if name == _HOST:
                continue
            state = reported.get((name, device_id))
            trouble = "no longer reported" if state is None else None if state[2] else "unhealthy"
            if trouble is not None and placement_id not in degraded:
                reason = f"agent {report.agent_id}: device {name}/{device_id} is {trouble}"
                degraded[placement_id] = (reason, now)
        _degrade(conn, degraded)
        held = {
            (name, device_id): used
            for (_, name, device_id), used in _usage(
                (report.agent_id, n, d, shares) for n, d, _, shares in held_rows
            ).items()
        }
        return _bump_pool_version(conn), held

    def _apply_report(self, version: int, report: AgentReport, held: Usage, now: float) -> None:
        """A report this process committed as pool ``version``, into the pools in memory
        that were current just before it (the others are re-read on their next plan)."""
        members = {
            name: [
                (
                    device_id,
                    profile_key(lists),
                    report.capacity.get((name, device_id), SHARE),
                    (name, device_id) not in report.unhealthy,
                )
                for device_id, lists in ids.items()
            ]
            for name, ids in report.devices.items()
        }
        agent = report.agent_id
        node = _node(agent, profile_key(report.host), members, report.platform, held)
        for group, memory in self._pools.items():
            if memory.pool_version != version - 1:
                continue
            if group is None or group == report.resource_group:
                memory.pool.put(node, held)
                memory.last_seen[agent] = now
                heapq.heappush(memory.deadlines, (now, agent))
            else:  # moved to another group, or never in this one
                memory.pool.remove(agent)
                memory.last_seen.pop(agent, None)
            memory.pool_version = version

    def _apply_allocations(
        self,
        version: int,
        freed: Sequence[tuple[DeviceKey, int | None]] = (),
        taken: Sequence[tuple[DeviceKey, int | None]] = (),
    ) -> None:
        """Devices this process freed and allocated (whole: None, or the shares) as
        allocation ``version``, into the pools in memory that were current just before it."""
        for memory in self._pools.values():
            if memory.allocation_version != version - 1:
                continue
            for keys, shares, allocate in (*_grouped(freed, False), *_grouped(taken, True)):
                if allocate:
                    memory.pool.allocate(keys, shares)
                else:
                    memory.pool.release(keys, shares)
            memory.allocation_version = version

    def _profile_documents(self, conn: Connection, keys: set[ProfileKey]) -> None:
        missing = sorted(keys - self._profiles.keys())
        for start in range(0, len(missing), _IN_BATCH):
            batch = missing[start : start + _IN_BATCH]
            for key, text in conn.execute(
                select(profiles.c.id, profiles.c.lists).where(profiles.c.id.in_(batch))
            ):
                self._profiles[key] = json.loads(text)

    def _agent_rows(
        self,
        conn: Connection,
        resource_group: str | None,
        agent_id: str | None = None,
        *,
        with_allocations: bool = True,
    ) -> tuple[list[Any], list[Any], list[Any]]:
        agent_query = select(agents)
        device_query = select(devices)
        allocation_query = select(allocations)
        if agent_id is not None:
            agent_query = agent_query.where(agents.c.agent_id == agent_id)
            device_query = device_query.where(devices.c.agent_id == agent_id)
            allocation_query = allocation_query.where(allocations.c.agent_id == agent_id)
        elif resource_group is not None:
            group = select(agents.c.agent_id).where(agents.c.resource_group == resource_group)
            agent_query = agent_query.where(agents.c.resource_group == resource_group)
            device_query = device_query.where(devices.c.agent_id.in_(group))
            allocation_query = allocation_query.where(allocations.c.agent_id.in_(group))
        return (
            list(conn.execute(agent_query.order_by(agents.c.agent_id))),
            list(conn.execute(device_query)),
            list(conn.execute(allocation_query)) if with_allocations else [],
        )

    def _views(
        self, resource_group: str | None, agent_id: str | None, detail: bool
    ) -> list[dict[str, Any]]:
        with self._read("listing agents") as conn:
            agent_rows, device_rows, allocation_rows = self._agent_rows(
                conn, resource_group, agent_id
            )
            if detail:
                self._profile_documents(
                    conn,
                    {r.host_profile for r in agent_rows} | {r.profile for r in device_rows},
                )
        now = self.clock()
        reported: dict[str, dict[str, dict[str, Any]]] = {}
        for row in device_rows:
            reported.setdefault(row.agent_id, {}).setdefault(row.device_name, {})[row.device_id] = (
                row
            )
        taken: dict[str, dict[str, dict[str, list[str]]]] = {}
        usage = _usage((r.agent_id, r.device_name, r.device_id, r.shares) for r in allocation_rows)
        for row in allocation_rows:
            if row.device_name == _HOST:  # its host only: in "placements", not "devices"
                taken.setdefault(row.agent_id, {})
                held_by = taken[row.agent_id].setdefault(_HOST, {})
                held_by.setdefault(_HOST, []).append(row.placement_id)
                continue
            held_by = taken.setdefault(row.agent_id, {}).setdefault(row.device_name, {})
            held_by.setdefault(row.device_id, []).append(row.placement_id)
        views = []
        for row in agent_rows:
            mine, busy = reported.get(row.agent_id, {}), taken.get(row.agent_id, {})
            summary = {}
            unhealthy: dict[str, list[str]] = {}
            shares: dict[str, dict[str, Any]] = {}
            for name in sorted((set(mine) | set(busy)) - {_HOST}, key=natural_key):
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
                        partly[device_id] = _shares_out(room)
                shares[name] = {
                    "capacity": _shares_out(capacity),
                    "free": _shares_out(free),
                    "partly_used": {i: partly[i] for i in _sorted(list(partly))},
                }
            view: dict[str, Any] = {
                "agent_id": row.agent_id,
                "resource_group": row.resource_group,
                "first_seen": _iso(row.first_seen),
                "last_seen": _iso(row.last_seen),
                "alive": self._alive(row.last_seen, now),
                "platform": row.platform,
                "devices": summary,
                "unhealthy": unhealthy,
                "shares": shares,
            }
            if detail:
                view["host"] = self._profiles[row.host_profile]
                view["device_lists"] = {
                    name: {i: self._profiles[d.profile] for i, d in sorted(ids.items())}
                    for name, ids in sorted(mine.items())
                }
                view["placements"] = sorted(
                    {p for held in busy.values() for ps in held.values() for p in ps}
                )
            views.append(view)
        return views

    def list_agents(self, resource_group: str | None = None) -> list[dict[str, Any]]:
        return self._views(resource_group, None, detail=False)

    def pool_summary(self, resource_group: str | None = None) -> dict[str, Any]:
        """The free shares of the live pool (of ``resource_group``), and its fragmentation:
        the share of the free capacity that no whole-device request can use."""
        with self._read("reading the pool") as conn, self._memory:
            figures = pool_shares(self._synced(conn, resource_group))
        return {
            "capacity_shares": _shares_out(figures.capacity),
            "free_shares": _shares_out(figures.free),
            "stranded_shares": _shares_out(figures.stranded),
            "fragmentation": round(figures.fragmentation, 4),
        }

    def get_agent(self, agent_id: str) -> dict[str, Any] | None:
        views = self._views(None, agent_id, detail=True)
        return views[0] if views else None

    def _alive(self, last_seen: float, now: float) -> bool:
        return self.agent_ttl <= 0 or now - last_seen <= self.agent_ttl

    # ------------------------------------------------------------------ placements

    def _synced(self, conn: Connection, resource_group: str | None) -> Pool:
        """The pool of ``resource_group`` in memory, brought up to date (with ``_memory``
        held): nothing read but two versions while no other process changed anything."""
        pool_v, allocation_v = conn.execute(_VERSIONS).one()
        memory = self._pools.get(resource_group)
        if memory is None or memory.pool_version != pool_v:
            memory = self._load(conn, resource_group, pool_v, allocation_v)
        elif memory.allocation_version != allocation_v:
            self._reload_allocations(conn, resource_group, memory, allocation_v)
        if self.agent_ttl > 0:
            self._check_heartbeats(conn, memory)
        return memory.pool

    def _load(
        self, conn: Connection, resource_group: str | None, pool_v: int, allocation_v: int
    ) -> _Memory:
        """The whole pool of ``resource_group``, read afresh."""
        agent_rows, device_rows, allocation_rows = self._agent_rows(conn, resource_group)
        # rows unpacked as tuples (columns in table order): named access costs ~5x more
        used = {host for _, _, host, _, _, _ in agent_rows}
        used |= {profile for _, _, _, profile, _, _ in device_rows}
        self._profile_documents(conn, used)
        by_agent: dict[str, dict[str, list[_Member]]] = {}
        for agent, name, device, profile, capacity, healthy in device_rows:
            member = (device, profile, capacity, bool(healthy))
            by_agent.setdefault(agent, {}).setdefault(name, []).append(member)
        usage = _usage((a, n, d, shares) for a, n, d, _, shares in allocation_rows)
        held: dict[str, Usage] = {}
        for (agent, name, device), in_use in usage.items():
            held.setdefault(agent, {})[(name, device)] = in_use
        nodes = [
            _node(agent, host, by_agent.get(agent, {}), platform, held.get(agent, {}))
            for agent, _, host, _, _, platform in agent_rows
        ]
        scope = f" in resource group {resource_group!r}" if resource_group is not None else ""
        pool = Pool(nodes, self._profiles, {}, scope)
        pool.set_usage(usage)
        last_seen = {agent: seen for agent, _, _, _, seen, _ in agent_rows}
        memory = _Memory(pool, pool_v, allocation_v, last_seen)
        if self.agent_ttl > 0:
            memory.deadlines = [(seen, agent) for agent, seen in last_seen.items()]
            heapq.heapify(memory.deadlines)
        if len(self._pools) >= _CACHED_POOLS:
            self._pools.clear()
        self._pools[resource_group] = memory
        return memory

    def _allocation_query(self, resource_group: str | None) -> Any:
        query = select(
            allocations.c.agent_id,
            allocations.c.device_name,
            allocations.c.device_id,
            allocations.c.shares,
        )
        if resource_group is not None:
            group = select(agents.c.agent_id).where(agents.c.resource_group == resource_group)
            query = query.where(allocations.c.agent_id.in_(group))
        return query

    def _reload_allocations(
        self, conn: Connection, resource_group: str | None, memory: _Memory, allocation_v: int
    ) -> None:
        """Another process placed or freed devices: read the allocations, apply the change."""
        now = _usage(conn.execute(self._allocation_query(resource_group)))
        before = memory.pool.usage()
        changed = {key: used for key, used in now.items() if before.get(key) != used}
        changed |= {key: 0 for key in before.keys() - now.keys()}
        memory.pool.set_usage(changed)
        memory.allocation_version = allocation_v

    def _check_heartbeats(self, conn: Connection, memory: _Memory) -> None:
        """Leave out the agents past the TTL and bring back those heard from again, reading
        only the heartbeats of agents that seem past it by what this process knows (the
        heartbeats it recorded itself, and what it read before) and of those left out."""
        now, pool, ttl = self.clock(), memory.pool, self.agent_ttl
        seen, deadlines, heard = memory.last_seen, memory.deadlines, memory.heard
        changed: set[str] = set()
        while heard:
            agent, at = heard.popleft()
            if agent in pool and at > seen.get(agent, 0.0):
                seen[agent] = at
                heapq.heappush(deadlines, (at, agent))
                changed.add(agent)
        due: list[str] = []
        while deadlines and now - deadlines[0][0] > ttl:
            at, agent = heapq.heappop(deadlines)
            if seen.get(agent) == at and agent in pool:
                due.append(agent)
        left_out = [agent for agent in pool.unavailable if agent in pool]
        seen.update(self._last_seen(conn, [*due, *left_out]))
        for agent in due:
            if self._alive(seen[agent], now):
                heapq.heappush(deadlines, (seen[agent], agent))
        for agent in {*due, *left_out, *changed}:
            last_seen = seen[agent]
            if self._alive(last_seen, now):
                if agent in pool.unavailable:
                    pool.unpark(agent)
                    heapq.heappush(deadlines, (last_seen, agent))
            else:
                pool.park(agent, f"no heartbeat for {int(now - last_seen)} s (agent TTL {ttl:g} s)")

    def _last_seen(self, conn: Connection, ids: Sequence[str]) -> dict[str, float]:
        query = select(agents.c.agent_id, agents.c.last_seen)
        found: dict[str, float] = {}
        for start in range(0, len(ids), _IN_BATCH):
            batch = ids[start : start + _IN_BATCH]
            found.update(
                {a: at for a, at in conn.execute(query.where(agents.c.agent_id.in_(batch)))}
            )
        return found

    def snapshot(self, resource_group: str | None = None) -> Pool:
        """Live agents (of ``resource_group``), their devices, which are free, their lists:
        a copy of the pool in memory, that later changes leave alone."""
        with self._read("reading the pool") as conn, self._memory:
            return self._synced(conn, resource_group).copy()

    def place(
        self,
        index: VariantIndex,
        request: PlacementRequest,
        image_of: Callable[[Candidate], str],
        owner: str = "anonymous",
    ) -> dict[str, Any] | Refusal:
        """Plan on the pool in memory and commit; on a conflict, plan again (all or nothing)."""
        label = "?"
        for attempt in range(self.attempts):
            with self._placing:
                with self._read("reading the pool") as conn, self._memory:
                    outcome = plan(
                        index,
                        self._synced(conn, request.resource_group),
                        request.nodes,
                        request.devices_per_node,
                        device_name=request.device_name,
                        shares=request.shares,
                    )
                if isinstance(outcome, Refusal):
                    return outcome
                document = self._document(outcome, request, image_of, owner)
                if self._commit(outcome, document, request):
                    return document
            label = outcome.candidate.label or BARE
            time.sleep(random.uniform(0, 0.005 * 2**attempt))  # let the winner finish
        return self._lost(label)

    def _lost(self, label: str) -> Refusal:
        return Refusal(
            {
                label: f"the devices it was given were taken by concurrent placements "
                f"{self.attempts} times in a row; try again"
            }
        )

    def _document(
        self,
        chosen: Plan,
        request: PlacementRequest,
        image_of: Callable[[Candidate], str],
        owner: str,
    ) -> dict[str, Any]:
        candidate = chosen.candidate
        document: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "owner": owner,  # the client (token name) that made it
            "variant": candidate.label,  # None for the bare image
            "image": image_of(candidate),
            "digest": candidate.digest or None,
            "platform": candidate.platform,  # whose manifest "digest" is, when listed
            "homogeneous": chosen.homogeneous,
            "resource_group": request.resource_group,
            "nodes": request.nodes,
            "devices_per_node": request.devices_per_node,
            "created_at": _iso(self.clock()),
            "state": "active",
            "allocations": _allocations(chosen.allocations),
        }
        if request.shares is not None:
            document["shares_per_device"] = _shares_out(request.shares)
        return document

    def _check(self, conn: Connection, chosen: Plan) -> None:
        """The planned agents still have the host lists, and the devices the lists, capacity
        and health, planned. On PostgreSQL the agents' rows are share-locked, so no report
        can change them before this transaction ends (SQLite: BEGIN IMMEDIATE already
        excludes every writer)."""
        agent_ids = sorted({a.agent_id for a in chosen.allocations})
        locked = (
            select(agents.c.agent_id, agents.c.host_profile)
            .where(agents.c.agent_id.in_(agent_ids))
            .order_by(agents.c.agent_id)
            .with_for_update(read=True)
        )
        hosts = {row.agent_id: row.host_profile for row in conn.execute(locked)}
        if hosts != {a.agent_id: a.host for a in chosen.allocations}:
            raise _Stale()
        planned = {
            (a.agent_id, a.device_name or "", d.device_id): (d.profile, d.capacity, True)
            for a in chosen.allocations
            for d in a.devices
        }
        if planned:
            rows = conn.execute(select(devices).where(devices.c.agent_id.in_(agent_ids))).all()
            present = {
                (r.agent_id, r.device_name, r.device_id): (r.profile, r.capacity, bool(r.healthy))
                for r in rows
            }
            if any(present.get(key) != state for key, state in planned.items()):
                raise _Stale()

    def _commit(
        self,
        chosen: Plan,
        document: Mapping[str, Any],
        request: PlacementRequest | None = None,
    ) -> bool:
        """True when committed; False when the pool changed or a device was taken meanwhile."""
        asked = None if request is None else json.dumps(request.to_json())
        try:
            with contextlib.ExitStack() as applying:
                with self._write("recording a placement") as conn:
                    self._check(conn, chosen)
                    conn.execute(
                        insert(placements).values(
                            id=document["id"],
                            created_at=self.clock(),
                            document=json.dumps(document),
                            state="active",
                            request=asked,
                        )
                    )
                    taken = _take(conn, document["id"], chosen)
                    version = _bump(conn, allocation_version)  # last: the row stays locked
                    applying.enter_context(self._memory)
                self._apply_allocations(version, taken=taken)
        except (_Stale, sa_exc.IntegrityError):
            return False
        except sa_exc.OperationalError as error:
            if sqlstate(error) in RETRYABLE_SQLSTATES:
                return False
            raise
        return True

    # ------------------------------------------------------------------ reading placements

    def get_placement(self, placement_id: str) -> dict[str, Any] | None:
        self._degrade_lapsed()
        with self._read("reading a placement") as conn:
            row = conn.execute(_PLACEMENT.where(placements.c.id == placement_id)).first()
        return None if row is None else _shown(*row)

    def list_placements(self, state: str | None = None) -> list[dict[str, Any]]:
        """Every placement, oldest first; ``state``: only those in it (``STATES``)."""
        self._degrade_lapsed()
        query = _PLACEMENT.order_by(placements.c.created_at, placements.c.id)
        if state is not None:
            query = query.where(placements.c.state == state)
        with self._read("listing placements") as conn:
            return [_shown(*row) for row in conn.execute(query)]

    def placement_states(self) -> dict[str, int]:
        """How many placements are in each state (for /healthz)."""
        self._degrade_lapsed()
        query = select(placements.c.state, func.count()).group_by(placements.c.state)
        with self._read("counting placements") as conn:
            counts = dict.fromkeys(STATES, 0) | {state: n for state, n in conn.execute(query)}
        return counts

    def placement_request(self, placement_id: str) -> PlacementRequest | None:
        """What the client asked for the placement (for ``replace``)."""
        with self._read("reading a placement") as conn:
            text = conn.execute(
                select(placements.c.request).where(placements.c.id == placement_id)
            ).scalar_one_or_none()
        if text is None:
            return None
        return parse_placement_request(json.loads(text))

    def _degrade_lapsed(self) -> None:
        """Degrade the active placements holding devices of agents past the TTL, as of when
        it lapsed (one indexed query; a write only when there is something to degrade)."""
        if self.agent_ttl <= 0:
            return
        now = self.clock()
        query = (
            select(allocations.c.placement_id, agents.c.agent_id, agents.c.last_seen)
            .select_from(
                allocations.join(agents, allocations.c.agent_id == agents.c.agent_id).join(
                    placements, allocations.c.placement_id == placements.c.id
                )
            )
            .where(agents.c.last_seen < now - self.agent_ttl, placements.c.state == "active")
            .distinct()
        )
        with self._read("reading heartbeats") as conn:
            lapsed = sorted(conn.execute(query).all(), key=lambda row: (row[0], row[1]))
        if not lapsed:
            return
        reasons: dict[str, tuple[str, float]] = {}
        for placement_id, agent_id, last_seen in lapsed:
            silent = f"no heartbeat for {int(now - last_seen)} s"
            reason = f"agent {agent_id}: {silent} (agent TTL {self.agent_ttl:g} s)"
            reasons.setdefault(placement_id, (reason, last_seen + self.agent_ttl))
        with self._write("degrading placements") as conn:
            _degrade(conn, reasons)

    # ------------------------------------------------------------------ replacing

    def replace(
        self,
        placement_id: str,
        index: VariantIndex,
        request: PlacementRequest,
        image_of: Callable[[Candidate], str],
    ) -> dict[str, Any] | Refusal | None:
        """Move a degraded placement's troubled nodes onto healthy devices, all or nothing:
        the same variant on the nodes still healthy where it can, else the whole gang placed
        again by the usual rule (on the pool with its own devices counted free). The old
        devices are freed in the transaction that takes the new ones. None: no placement."""
        self._degrade_lapsed()
        label = "?"
        for attempt in range(self.attempts):
            with self._placing:
                with self._read("reading the pool") as conn:
                    row = conn.execute(_PLACEMENT.where(placements.c.id == placement_id)).first()
                    if row is None:
                        return None
                    own = sorted(
                        ((a, n, d), s)
                        for a, n, d, s in conn.execute(
                            self._allocation_query(None).where(
                                allocations.c.placement_id == placement_id
                            )
                        )
                    )
                    with self._memory:
                        pool = self._synced(conn, request.resource_group).copy()
                document = _shown(*row)
                outcome, kept = self._replan(pool, document, own, index, request)
                if isinstance(outcome, Refusal):
                    return outcome
                if outcome is None and document["state"] == "active":
                    why = f"placement {placement_id} is active: nothing to replace"
                    return Refusal({document["variant"] or BARE: why})
                moved = [a for a in document["allocations"] if a not in kept]
                new = self._replaced(document, outcome, kept, moved, image_of)
                if self._commit_replace(placement_id, own, moved, outcome, new):
                    return new
            label = document["variant"] or BARE
            time.sleep(random.uniform(0, 0.005 * 2**attempt))
        return self._lost(label)

    def _replan(
        self,
        pool: Pool,
        document: Mapping[str, Any],
        own: Sequence[tuple[DeviceKey, int | None]],
        index: VariantIndex,
        request: PlacementRequest,
    ) -> tuple[Plan | Refusal | None, list[dict[str, Any]]]:
        """(the plan for the nodes to move, or None when none need to; the allocations kept)
        on ``pool``, a copy this changes."""
        for keys, shares, _ in _grouped(own, False):
            pool.release(keys, shares)
        gang: list[dict[str, Any]] = document["allocations"]
        troubled = [a for a in gang if pool.trouble(a["agent_id"], a["device_name"], a["devices"])]
        if not troubled:
            return None, gang
        kept = [a for a in gang if a not in troubled]
        for a in kept:  # a gang takes each node once
            pool.park(a["agent_id"], "already in this placement")
        per_node = request.devices_per_node
        same = plan(
            index,
            pool,
            len(troubled),
            per_node,
            device_name=gang[0]["device_name"] if per_node else None,
            shares=request.shares,
            only=document["variant"] or BARE,
        )
        if isinstance(same, Plan):
            return same, kept
        for a in kept:
            pool.unpark(a["agent_id"])
        again = plan(
            index,
            pool,
            request.nodes,
            per_node,
            device_name=request.device_name,
            shares=request.shares,
        )
        return again, []

    def _replaced(
        self,
        document: Mapping[str, Any],
        outcome: Plan | None,
        kept: list[dict[str, Any]],
        moved: list[dict[str, Any]],
        image_of: Callable[[Candidate], str],
    ) -> dict[str, Any]:
        new = {key: value for key, value in document.items() if key != "degraded"}
        new["state"] = "active"
        if outcome is None:
            return new
        new["allocations"] = kept + _allocations(outcome.allocations)
        if not kept:  # chosen again: the variant may differ
            candidate = outcome.candidate
            new["variant"] = candidate.label
            new["image"] = image_of(candidate)
            new["digest"] = candidate.digest or None
            new["platform"] = candidate.platform
            new["homogeneous"] = outcome.homogeneous
        else:  # the kept nodes' classes are not judged again: homogeneous only if both were
            new["homogeneous"] = bool(document.get("homogeneous")) and outcome.homogeneous
        new["replaced"] = {
            "at": _iso(self.clock()),
            "agents": sorted({a["agent_id"] for a in moved}),
            "reason": document.get("degraded", {}).get("reason"),
        }
        return new

    def _commit_replace(
        self,
        placement_id: str,
        own: Sequence[tuple[DeviceKey, int | None]],
        moved: Sequence[Mapping[str, Any]],
        outcome: Plan | None,
        document: Mapping[str, Any],
    ) -> bool:
        """True when committed; False when the placement, the pool or a device changed."""
        mine = allocations.c.placement_id == placement_id
        try:
            with contextlib.ExitStack() as applying:
                with self._write(f"replacing placement {placement_id}") as conn:
                    now = sorted(
                        ((a, n, d), s)
                        for a, n, d, s in conn.execute(self._allocation_query(None).where(mine))
                    )
                    if now != list(own):
                        raise _Stale()
                    freed: list[tuple[DeviceKey, int | None]] = []
                    taken: list[tuple[DeviceKey, int | None]] = []
                    if outcome is not None:
                        self._check(conn, outcome)
                        gone = sorted({a["agent_id"] for a in moved})
                        freed = _free(conn, and_(mine, allocations.c.agent_id.in_(gone)))
                        taken = _take(conn, placement_id, outcome)
                    result = conn.execute(
                        placements.update()
                        .where(placements.c.id == placement_id)
                        .values(
                            document=json.dumps(document),
                            state="active",
                            degraded_reason=None,
                            degraded_since=None,
                        )
                    )
                    if not result.rowcount:
                        raise _Stale()
                    version = _bump(conn, allocation_version)
                    applying.enter_context(self._memory)
                self._apply_allocations(version, freed, taken)
        except (_Stale, sa_exc.IntegrityError):
            return False
        except sa_exc.OperationalError as error:
            if sqlstate(error) in RETRYABLE_SQLSTATES:
                return False
            raise
        return True

    # ------------------------------------------------------------------ deleting

    def delete_agent(self, agent_id: str) -> list[str] | None:
        """Drain and deregister: delete every placement holding one of the agent's devices
        (freeing all their devices), then the agent and its devices. Returns the deleted
        placements' ids; ``None`` when there is no such agent."""
        return self._retried(lambda: self._delete_agent(agent_id))

    def _delete_agent(self, agent_id: str) -> list[str] | None:
        with contextlib.ExitStack() as applying:
            with self._write(f"deleting agent {agent_id}") as conn:
                exists = conn.execute(
                    select(agents.c.agent_id).where(agents.c.agent_id == agent_id)
                ).first()
                if exists is None:
                    return None
                held = sorted(
                    set(
                        conn.execute(
                            select(allocations.c.placement_id).where(
                                allocations.c.agent_id == agent_id
                            )
                        ).scalars()
                    )
                )
                freed: list[tuple[DeviceKey, int | None]] = []
                if held:
                    freed = _free(conn, allocations.c.placement_id.in_(held))
                    conn.execute(delete(placements).where(placements.c.id.in_(held)))
                conn.execute(delete(devices).where(devices.c.agent_id == agent_id))
                conn.execute(delete(agents).where(agents.c.agent_id == agent_id))
                pool_v = _bump_pool_version(conn)
                allocation_v = _bump(conn, allocation_version)
                applying.enter_context(self._memory)
            self._apply_allocations(allocation_v, freed)
            for memory in self._pools.values():
                if memory.pool_version == pool_v - 1:
                    memory.pool.remove(agent_id)
                    memory.last_seen.pop(agent_id, None)
                    memory.pool_version = pool_v
        return held

    def delete_placement(self, placement_id: str) -> bool:
        """Free the placement's devices; False when there is no such placement."""
        return self._retried(lambda: self._delete_placement(placement_id))

    def _retried(self, change: Callable[[], _T]) -> _T:
        """``change`` again when PostgreSQL ends it as a deadlock or serialization failure
        (shares: rows several placements use, which a replace changes in two passes)."""
        for attempt in range(self.attempts):
            try:
                return change()
            except sa_exc.OperationalError as error:
                if sqlstate(error) not in RETRYABLE_SQLSTATES or attempt + 1 == self.attempts:
                    raise
            time.sleep(random.uniform(0, 0.005 * 2**attempt))
        raise AssertionError("unreachable")

    def _delete_placement(self, placement_id: str) -> bool:
        with contextlib.ExitStack() as applying:
            with self._write(f"deleting placement {placement_id}") as conn:
                freed = _free(conn, allocations.c.placement_id == placement_id)
                result = conn.execute(delete(placements).where(placements.c.id == placement_id))
                if not result.rowcount:
                    return False
                version = _bump(conn, allocation_version)
                applying.enter_context(self._memory)
            self._apply_allocations(version, freed)
        return True


_PLACEMENT = select(
    placements.c.document,
    placements.c.state,
    placements.c.degraded_reason,
    placements.c.degraded_since,
)


def _shown(text: str, state: str, reason: str | None, since: float | None) -> dict[str, Any]:
    """A placement as GET shows it: its document, with its state (and why it is degraded)."""
    document = dict(json.loads(text))
    document["state"] = state
    document.pop("degraded", None)
    if state == "degraded":
        document["degraded"] = {
            "reason": reason,
            "since": None if since is None else _iso(since),
        }
    return document


def _allocations(chosen: Sequence[NodeAllocation]) -> list[dict[str, Any]]:
    return [
        {
            "agent_id": a.agent_id,
            "device_name": a.device_name,
            "devices": [d.device_id for d in a.devices],
        }
        for a in chosen
    ]
