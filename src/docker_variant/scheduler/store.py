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
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from docker_variant.scheduler.database import (
    RETRYABLE_SQLSTATES,
    WRITE,
    open_engine,
    safe_url,
    sqlstate,
    unavailable,
)
from docker_variant.scheduler.documents import AgentReport, PlacementRequest
from docker_variant.scheduler.models import (
    agents,
    allocation_version,
    allocations,
    devices,
    metadata,
    placements,
    pool_version,
    profiles,
)
from docker_variant.scheduler.placement import (
    BARE,
    Device,
    DeviceKey,
    Node,
    Plan,
    Pool,
    ProfileKey,
    Refusal,
    natural_key,
    plan,
    profile_key,
)
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists
from docker_variant.variant.selection import Candidate

__all__ = ["DEFAULT_ATTEMPTS", "Store"]

DEFAULT_ATTEMPTS = 5
_IN_BATCH = 500

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


def _node(
    agent_id: str,
    host: ProfileKey,
    members: Mapping[str, Sequence[tuple[str, ProfileKey]]],
    platform: str | None,
    held: set[tuple[str, str]],
) -> Node:
    """A node from its rows; ``held``: its allocated (device name, device id)."""
    devices = {
        name: [Device(d, p, (name, d) not in held) for d, p in sorted(ids)]
        for name, ids in members.items()
    }
    return Node(agent_id, host, devices, platform)


def _iso(timestamp: float) -> str:
    return (
        datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _sorted(ids: Sequence[str]) -> list[str]:
    return sorted(ids, key=natural_key)


class _Stale(Exception):
    """The plan's view of the pool changed before it could commit."""


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
        allocations are untouched (a vanished allocated device is reported as missing)."""
        documents = {profile_key(report.host): report.host}
        rows = []
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
        rows: list[dict[str, str]],
        documents: Mapping[ProfileKey, SupportedLists],
        now: float,
    ) -> tuple[int, set[tuple[str, str]]]:
        """Write the report: the new pool version and the agent's allocated devices when
        it changed the agent, else (0, empty)."""
        group, host, platform = report.resource_group, profile_key(report.host), report.platform
        reported = {(r["device_name"], r["device_id"]): r["profile"] for r in rows}
        before = conn.execute(
            select(agents.c.resource_group, agents.c.host_profile, agents.c.platform).where(
                agents.c.agent_id == report.agent_id
            )
        ).first()
        known = {
            (name, device_id): profile
            for _, name, device_id, profile in conn.execute(
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
            return 0, set()
        conn.execute(delete(devices).where(devices.c.agent_id == report.agent_id))
        if rows:
            conn.execute(insert(devices), rows)
        held = conn.execute(
            select(allocations.c.device_name, allocations.c.device_id).where(
                allocations.c.agent_id == report.agent_id
            )
        )
        return _bump_pool_version(conn), {(name, device_id) for name, device_id in held}

    def _apply_report(
        self, version: int, report: AgentReport, held: set[tuple[str, str]], now: float
    ) -> None:
        """A report this process committed as pool ``version``, into the pools in memory
        that were current just before it (the others are re-read on their next plan)."""
        members = {
            name: [(device_id, profile_key(lists)) for device_id, lists in ids.items()]
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

    def _apply_allocations(self, version: int, keys: Sequence[DeviceKey], taken: bool) -> None:
        """Devices this process allocated (or freed) as allocation ``version``, into the
        pools in memory that were current just before it."""
        for memory in self._pools.values():
            if memory.allocation_version != version - 1:
                continue
            if taken:
                memory.pool.allocate(keys)
            else:
                memory.pool.release(keys)
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
        reported: dict[str, dict[str, dict[str, ProfileKey]]] = {}
        for row in device_rows:
            reported.setdefault(row.agent_id, {}).setdefault(row.device_name, {})[row.device_id] = (
                row.profile
            )
        taken: dict[str, dict[str, dict[str, str]]] = {}
        for row in allocation_rows:
            taken.setdefault(row.agent_id, {}).setdefault(row.device_name, {})[row.device_id] = (
                row.placement_id
            )
        views = []
        for row in agent_rows:
            mine, busy = reported.get(row.agent_id, {}), taken.get(row.agent_id, {})
            summary = {}
            for name in sorted(set(mine) | set(busy), key=natural_key):
                ids, held = mine.get(name, {}), busy.get(name, {})
                summary[name] = {
                    "free": _sorted([i for i in ids if i not in held]),
                    "allocated": _sorted([i for i in ids if i in held]),
                    "missing": _sorted([i for i in held if i not in ids]),
                }
            view: dict[str, Any] = {
                "agent_id": row.agent_id,
                "resource_group": row.resource_group,
                "first_seen": _iso(row.first_seen),
                "last_seen": _iso(row.last_seen),
                "alive": self._alive(row.last_seen, now),
                "platform": row.platform,
                "devices": summary,
            }
            if detail:
                view["host"] = self._profiles[row.host_profile]
                view["device_lists"] = {
                    name: {i: self._profiles[p] for i, p in sorted(ids.items())}
                    for name, ids in sorted(mine.items())
                }
                view["placements"] = sorted({p for held in busy.values() for p in held.values()})
            views.append(view)
        return views

    def list_agents(self, resource_group: str | None = None) -> list[dict[str, Any]]:
        return self._views(resource_group, None, detail=False)

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
        used |= {profile for _, _, _, profile in device_rows}
        self._profile_documents(conn, used)
        by_agent: dict[str, dict[str, list[tuple[str, ProfileKey]]]] = {}
        for agent, name, device, profile in device_rows:
            by_agent.setdefault(agent, {}).setdefault(name, []).append((device, profile))
        held: dict[str, set[tuple[str, str]]] = {}
        for agent, name, device, _ in allocation_rows:
            held.setdefault(agent, set()).add((name, device))
        nodes = [
            _node(agent, host, by_agent.get(agent, {}), platform, held.get(agent, set()))
            for agent, _, host, _, _, platform in agent_rows
        ]
        scope = f" in resource group {resource_group!r}" if resource_group is not None else ""
        pool = Pool(nodes, self._profiles, {}, scope)
        pool.allocate((agent, name, device) for agent, name, device, _ in allocation_rows)
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
        query = select(allocations.c.agent_id, allocations.c.device_name, allocations.c.device_id)
        if resource_group is not None:
            group = select(agents.c.agent_id).where(agents.c.resource_group == resource_group)
            query = query.where(allocations.c.agent_id.in_(group))
        return query

    def _reload_allocations(
        self, conn: Connection, resource_group: str | None, memory: _Memory, allocation_v: int
    ) -> None:
        """Another process placed or freed devices: read the allocations, apply the change."""
        now = {(a, n, d) for a, n, d in conn.execute(self._allocation_query(resource_group))}
        before = set(memory.pool.allocations())
        memory.pool.release(before - now)
        memory.pool.allocate(now - before)
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
                    )
                if isinstance(outcome, Refusal):
                    return outcome
                document = self._document(outcome, request, image_of, owner)
                if self._commit(outcome, document):
                    return document
            label = outcome.candidate.label or BARE
            time.sleep(random.uniform(0, 0.005 * 2**attempt))  # let the winner finish
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
        return {
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
            "allocations": [
                {
                    "agent_id": a.agent_id,
                    "device_name": a.device_name,
                    "devices": [d.device_id for d in a.devices],
                }
                for a in chosen.allocations
            ],
        }

    def _check(self, conn: Connection, chosen: Plan) -> None:
        """The planned agents still have the host lists, and the devices the lists, planned.
        On PostgreSQL the agents' rows are share-locked, so no report can change them before
        this transaction ends (SQLite: BEGIN IMMEDIATE already excludes every writer)."""
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
            (a.agent_id, a.device_name or "", d.device_id): d.profile
            for a in chosen.allocations
            for d in a.devices
        }
        if planned:
            rows = conn.execute(select(devices).where(devices.c.agent_id.in_(agent_ids))).all()
            present = {(r.agent_id, r.device_name, r.device_id): r.profile for r in rows}
            if any(present.get(key) != profile for key, profile in planned.items()):
                raise _Stale()

    def _commit(self, chosen: Plan, document: Mapping[str, Any]) -> bool:
        """True when committed; False when the pool changed or a device was taken meanwhile."""
        keys = sorted(
            (a.agent_id, a.device_name or "", d.device_id)
            for a in chosen.allocations
            for d in a.devices
        )
        try:
            with contextlib.ExitStack() as applying:
                with self._write("recording a placement") as conn:
                    self._check(conn, chosen)
                    conn.execute(
                        insert(placements).values(
                            id=document["id"],
                            created_at=self.clock(),
                            document=json.dumps(document),
                        )
                    )
                    if keys:  # in key order, so that racing inserts cannot deadlock
                        conn.execute(
                            insert(allocations),
                            [
                                {
                                    "agent_id": agent_id,
                                    "device_name": name,
                                    "device_id": device_id,
                                    "placement_id": document["id"],
                                }
                                for agent_id, name, device_id in keys
                            ],
                        )
                    version = _bump(conn, allocation_version)  # last: the row stays locked
                    applying.enter_context(self._memory)
                self._apply_allocations(version, keys, taken=True)
        except (_Stale, sa_exc.IntegrityError):
            return False
        except sa_exc.OperationalError as error:
            if sqlstate(error) in RETRYABLE_SQLSTATES:
                return False
            raise
        return True

    def get_placement(self, placement_id: str) -> dict[str, Any] | None:
        with self._read("reading a placement") as conn:
            text = conn.execute(
                select(placements.c.document).where(placements.c.id == placement_id)
            ).scalar_one_or_none()
        return None if text is None else dict(json.loads(text))

    def list_placements(self) -> list[dict[str, Any]]:
        with self._read("listing placements") as conn:
            texts = conn.execute(
                select(placements.c.document).order_by(placements.c.created_at, placements.c.id)
            ).scalars()
            return [dict(json.loads(text)) for text in texts]

    def delete_agent(self, agent_id: str) -> list[str] | None:
        """Drain and deregister: delete every placement holding one of the agent's devices
        (freeing all their devices), then the agent and its devices. Returns the deleted
        placements' ids; ``None`` when there is no such agent."""
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
                freed: list[DeviceKey] = []
                if held:
                    freed = self._freed(conn, allocations.c.placement_id.in_(held))
                    conn.execute(delete(allocations).where(allocations.c.placement_id.in_(held)))
                    conn.execute(delete(placements).where(placements.c.id.in_(held)))
                conn.execute(delete(devices).where(devices.c.agent_id == agent_id))
                conn.execute(delete(agents).where(agents.c.agent_id == agent_id))
                pool_v = _bump_pool_version(conn)
                allocation_v = _bump(conn, allocation_version)
                applying.enter_context(self._memory)
            self._apply_allocations(allocation_v, freed, taken=False)
            for memory in self._pools.values():
                if memory.pool_version == pool_v - 1:
                    memory.pool.remove(agent_id)
                    memory.last_seen.pop(agent_id, None)
                    memory.pool_version = pool_v
        return held

    def _freed(self, conn: Connection, which: Any) -> list[DeviceKey]:
        query = select(allocations.c.agent_id, allocations.c.device_name, allocations.c.device_id)
        return [(a, n, d) for a, n, d in conn.execute(query.where(which))]

    def delete_placement(self, placement_id: str) -> bool:
        """Free the placement's devices; False when there is no such placement."""
        with contextlib.ExitStack() as applying:
            with self._write(f"deleting placement {placement_id}") as conn:
                freed = self._freed(conn, allocations.c.placement_id == placement_id)
                conn.execute(delete(allocations).where(allocations.c.placement_id == placement_id))
                result = conn.execute(delete(placements).where(placements.c.id == placement_id))
                if not result.rowcount:
                    return False
                version = _bump(conn, allocation_version)
                applying.enter_context(self._memory)
            self._apply_allocations(version, freed, taken=False)
        return True
