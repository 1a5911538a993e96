"""Persistence: agent reports, snapshots of the pool, and atomic all-or-nothing placements.

A placement is planned on a snapshot read without locks, then committed in one transaction
that re-checks the planned agents and devices and inserts the placement with one
``allocations`` row per device. The table's primary key refuses a device allocated twice, so
two placements racing for a device cannot both commit: the loser's transaction rolls back
as a whole and it plans again on fresh state, up to ``attempts`` times.

A report that changes an agent (not a plain heartbeat) bumps ``pool_version``; while it is
unchanged a snapshot takes agents and devices from memory and reads only the allocations.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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


@dataclass
class _PoolRows:
    """The agents and devices of a pool at one ``pool_version``."""

    version: int
    agents: list[tuple[str, ProfileKey, str | None]]  # (agent_id, host profile, platform)
    last_seen: dict[str, float]
    devices: dict[str, dict[str, list[tuple[str, ProfileKey]]]]  # agent -> name -> (id, profile)


def _bump_pool_version(conn: Connection) -> None:
    """The pool's agents or devices changed: every process re-reads them on its next plan."""
    conn.execute(
        pool_version.update()
        .where(pool_version.c.id == 1)
        .values(version=pool_version.c.version + 1)
    )


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
        self._pools: dict[str | None, _PoolRows] = {}  # by resource group (None: all)

    @classmethod
    def open(cls, url: str, **kwargs: Any) -> Store:
        """Connect and create the tables that are missing."""
        engine = open_engine(url)
        store = cls(engine, **kwargs)
        with unavailable("creating the tables", store.url):
            metadata.create_all(engine)
            with store._write("creating the tables") as conn:
                seed = store._insert(conn, pool_version).values(id=1, version=0)
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
        group, host, platform = report.resource_group, profile_key(report.host), report.platform
        reported = {(r["device_name"], r["device_id"]): r["profile"] for r in rows}
        with self._write(f"recording agent {report.agent_id}") as conn:
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
            if changed:
                conn.execute(delete(devices).where(devices.c.agent_id == report.agent_id))
                if rows:
                    conn.execute(insert(devices), rows)
                _bump_pool_version(conn)
        self._profiles.update(documents)
        views = self._views(None, report.agent_id, detail=False)  # the lists were just sent
        return views[0]

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

    def _pool_rows(self, conn: Connection, resource_group: str | None) -> _PoolRows:
        """The pool's agents and devices: from memory while ``pool_version`` is unchanged."""
        version = conn.execute(select(pool_version.c.version)).scalar_one()
        cached = self._pools.get(resource_group)
        if cached is not None and cached.version == version:
            if self.agent_ttl > 0:  # heartbeats move last_seen without a new version
                query = select(agents.c.agent_id, agents.c.last_seen)
                if resource_group is not None:
                    query = query.where(agents.c.resource_group == resource_group)
                cached.last_seen.update({agent: seen for agent, seen in conn.execute(query)})
            return cached
        agent_rows, device_rows, _ = self._agent_rows(conn, resource_group, with_allocations=False)
        # rows unpacked as tuples (columns in table order): named access costs ~5x more
        used = {host for _, _, host, _, _, _ in agent_rows}
        used |= {profile for _, _, _, profile in device_rows}
        self._profile_documents(conn, used)
        by_agent: dict[str, dict[str, list[tuple[str, ProfileKey]]]] = {}
        for agent, name, device, profile in device_rows:
            by_agent.setdefault(agent, {}).setdefault(name, []).append((device, profile))
        fresh = _PoolRows(
            version,
            [(agent, host, platform) for agent, _, host, _, _, platform in agent_rows],
            {agent: seen for agent, _, _, _, seen, _ in agent_rows},
            by_agent,
        )
        if len(self._pools) >= _CACHED_POOLS:
            self._pools.clear()
        self._pools[resource_group] = fresh
        return fresh

    def snapshot(self, resource_group: str | None = None) -> Pool:
        """Live agents (of ``resource_group``), their devices, which are free, their lists."""
        with self._read("reading the pool") as conn:
            rows = self._pool_rows(conn, resource_group)
            query = select(
                allocations.c.agent_id, allocations.c.device_name, allocations.c.device_id
            )
            if resource_group is not None:
                group = select(agents.c.agent_id).where(agents.c.resource_group == resource_group)
                query = query.where(allocations.c.agent_id.in_(group))
            taken = {tuple(row) for row in conn.execute(query)}
        now = self.clock()
        nodes, left_out = [], {}
        for agent, host, platform in rows.agents:
            last_seen = rows.last_seen.get(agent, 0.0)
            if not self._alive(last_seen, now):
                age, ttl = int(now - last_seen), self.agent_ttl
                left_out[agent] = f"no heartbeat for {age} s (agent TTL {ttl:g} s)"
                continue
            devices_of = {
                name: [Device(d, p, (agent, name, d) not in taken) for d, p in members]
                for name, members in rows.devices.get(agent, {}).items()
            }
            nodes.append(Node(agent, host, devices_of, platform))
        scope = f" in resource group {resource_group!r}" if resource_group is not None else ""
        return Pool(nodes, self._profiles, left_out, scope)

    def place(
        self,
        index: VariantIndex,
        request: PlacementRequest,
        image_of: Callable[[Candidate], str],
        owner: str = "anonymous",
    ) -> dict[str, Any] | Refusal:
        """Plan on a fresh snapshot and commit; on a conflict, plan again (all or nothing)."""
        label = "?"
        for attempt in range(self.attempts):
            with self._placing:
                pool = self.snapshot(request.resource_group)
                outcome = plan(
                    index,
                    pool,
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
        with self._write(f"deleting agent {agent_id}") as conn:
            exists = conn.execute(
                select(agents.c.agent_id).where(agents.c.agent_id == agent_id)
            ).first()
            if exists is None:
                return None
            held = sorted(
                set(
                    conn.execute(
                        select(allocations.c.placement_id).where(allocations.c.agent_id == agent_id)
                    ).scalars()
                )
            )
            if held:
                conn.execute(delete(allocations).where(allocations.c.placement_id.in_(held)))
                conn.execute(delete(placements).where(placements.c.id.in_(held)))
            conn.execute(delete(devices).where(devices.c.agent_id == agent_id))
            conn.execute(delete(agents).where(agents.c.agent_id == agent_id))
            _bump_pool_version(conn)
        return held

    def delete_placement(self, placement_id: str) -> bool:
        """Free the placement's devices; False when there is no such placement."""
        with self._write(f"deleting placement {placement_id}") as conn:
            conn.execute(delete(allocations).where(allocations.c.placement_id == placement_id))
            result = conn.execute(delete(placements).where(placements.c.id == placement_id))
            return bool(result.rowcount)
