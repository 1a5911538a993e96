"""The scheduler's rows: every SQL statement, and the only module that touches the database.

Transactions: ``Rows.read`` (PostgreSQL: one REPEATABLE READ snapshot for every statement)
and ``Rows.write`` (SQLite: ``BEGIN IMMEDIATE``, so writers queue instead of failing when
they upgrade). The functions below run inside one of them, on its connection.

A device is never allocated twice, under any concurrency: ``take`` inserts one
``allocations`` row per device and one ``device_usage`` row per device in use, whose primary
key and ``used <= capacity`` check the database enforces (see ``models``). A commit that
loses such a race raises, and ``lost_race`` says so; the caller plans again on fresh state.

Two version rows (``pool_version``, ``allocation_version``) count the changes to agents and
devices, and to allocations: ``bump`` takes the row's lock until the transaction ends, so
versions commit in order, and ``new - 1`` is the version just before the change.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Dialect,
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
from docker_variant.jsondoc import load_json
from docker_variant.planner.placement import Plan
from docker_variant.planner.pool import WHOLE, DeviceKey, ProfileKey, profile_key
from docker_variant.scheduler.database import (
    RETRYABLE_SQLSTATES,
    WRITE,
    driver_execute,
    open_engine,
    safe_url,
    sqlstate,
    unavailable,
)
from docker_variant.scheduler.documents import SHARE, AgentReport
from docker_variant.scheduler.models import (
    agents,
    allocation_version,
    allocations,
    cordons,
    device_usage,
    devices,
    metadata,
    placements,
    pool_version,
    profiles,
)
from docker_variant.variant.model import SupportedLists

__all__ = [
    "HOST_ROW",
    "STATES",
    "Change",
    "DeviceState",
    "Prepared",
    "Rows",
    "Stale",
    "Usage",
    "degraded_by",
    "iso",
    "lost_race",
    "retryable",
]

STATES = ("active", "degraded")  # a placement's
#: The device name (and id) of a node's row in a placement that takes no device
#: (devices_per_node 0), so that the agents of every placement are in ``allocations``.
HOST_ROW = ""
_IN_BATCH = 500
#: SQLite: the free pages deletes may leave before they are given back (4 KiB each).
_RECLAIM_PAGES = 256
#: PostgreSQL: the first key of the advisory locks that count a client's placements.
_QUOTA_LOCK = 817_825

_log = logging.getLogger("docker_variant.scheduler")

Usage = dict[tuple[str, str], int]  # (device name, device id) -> in use (millionths, or WHOLE)
Change = tuple[DeviceKey, int | None]  # a device freed or taken: whole (None) or shares


class Stale(Exception):
    """The plan's view of the pool changed before it could commit."""


def retryable(error: Exception) -> bool:
    """PostgreSQL ended the transaction as a deadlock or a serialization failure."""
    return isinstance(error, sa_exc.OperationalError) and sqlstate(error) in RETRYABLE_SQLSTATES


def lost_race(error: Exception) -> bool:
    """A commit that lost to a concurrent one: the rows it planned on changed (``Stale``),
    the database refused a device taken twice or past its capacity, or PostgreSQL ended it."""
    return isinstance(error, Stale | sa_exc.IntegrityError) or retryable(error)


def iso(timestamp: float) -> str:
    return (
        datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _insert(conn: Connection, table: Any) -> Any:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def _same_device(one: Any, other: Any) -> Any:
    return and_(
        one.c.agent_id == other.c.agent_id,
        one.c.device_name == other.c.device_name,
        one.c.device_id == other.c.device_id,
    )


class Prepared:
    """A statement compiled once per dialect and run on the DBAPI cursor of the transaction
    (``database.driver_execute``), for the statements of every placement: no cache key,
    parameter processing, result object or events per execution. Parameters by name (an
    INSERT's: its ``columns``) over the statement's literal values; plain values only (str,
    int, float, bool, None), which the drivers bind as they are."""

    def __init__(self, statement: Any, *columns: str) -> None:
        self.statement = statement
        self.columns = list(columns) or None
        self._forms: dict[tuple[str, str], tuple[str, list[str] | None, dict[str, Any]]] = {}

    def _form(self, dialect: Dialect) -> tuple[str, list[str] | None, dict[str, Any]]:
        """(SQL text, bind names in order for a positional paramstyle, literal values)."""
        key = (dialect.name, dialect.paramstyle)
        form = self._forms.get(key)
        if form is None:
            compiled: Any = self.statement.compile(dialect=dialect, column_keys=self.columns)
            if any(bind.expanding for bind in compiled.binds.values()):
                raise TypeError("an expanding parameter needs SQLAlchemy's execution")
            fixed = {
                name: value
                for name, value in compiled.params.items()
                if not compiled.binds[name].required
            }
            form = self._forms[key] = (compiled.string, compiled.positiontup, fixed)
        return form

    @staticmethod
    def _bound(form: tuple[str, list[str] | None, dict[str, Any]], row: Mapping[str, Any]) -> Any:
        _, order, fixed = form
        values = fixed | dict(row) if fixed else row
        return values if order is None else tuple(values[name] for name in order)

    def rows(self, conn: Connection, row: Mapping[str, Any] | None = None) -> list[Any]:
        """Run it once with ``row``; the rows it returns (a SELECT's, or RETURNING)."""
        form = self._form(conn.dialect)
        cursor = driver_execute(conn, form[0], self._bound(form, row or {}))
        try:
            return list(cursor.fetchall()) if cursor.description is not None else []
        finally:
            cursor.close()

    def many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run it once per row (an INSERT of many rows)."""
        form = self._form(conn.dialect)
        driver_execute(conn, form[0], [self._bound(form, r) for r in rows], many=True).close()


class Rows:
    """One database: transactions, and the engine's life."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.url = safe_url(engine.url)
        # the same pool, each with its transactions' options set once, not per connection
        self._writer = engine.execution_options(**{WRITE: True})
        self._reader = engine
        if engine.dialect.name == "postgresql":  # one snapshot for every statement
            self._reader = engine.execution_options(isolation_level="REPEATABLE READ")

    @classmethod
    def open(cls, url: str) -> Rows:
        """Connect and create the tables that are missing."""
        rows = cls(open_engine(url))
        with unavailable("creating the tables", rows.url):
            metadata.create_all(rows.engine)
            # create_all adds missing tables, not columns: a database from before shares
            columns = inspect(rows.engine).get_columns("allocations")
            if "shares" not in {c["name"] for c in columns}:
                rows.engine.dispose()
                raise InvalidInputError(
                    f"database {rows.url} was made by an older variant-scheduler (no device "
                    "shares, health or placement states); start on a new database"
                )
            with rows.write("creating the tables") as conn:
                for table in (pool_version, allocation_version):
                    seed = _insert(conn, table).values(id=1, version=0)
                    conn.execute(seed.on_conflict_do_nothing())
                _add_owners(conn)
        if rows.single_writer:
            rows._vacuum_once()
        return rows

    def _vacuum_once(self) -> None:
        """SQLite: a file made before incremental auto-vacuum (``database``) takes it at one
        VACUUM, which rewrites the file without its free pages. Best effort: a file some
        other process keeps busy stays as it is, and is served all the same."""
        raw = self.engine.raw_connection()
        try:
            driver: Any = raw.driver_connection
            if driver.execute("PRAGMA auto_vacuum").fetchone()[0] != 0:
                return
            _log.info("database %s: one VACUUM, to give deleted rows' space back", self.url)
            driver.execute("VACUUM")
        except self.engine.dialect.loaded_dbapi.Error as error:
            _log.warning("database %s: VACUUM failed, space stays in use: %s", self.url, error)
        finally:
            raw.close()

    def reclaim(self) -> None:
        """SQLite: once deletes have left ``_RECLAIM_PAGES`` pages or more free, give them
        back to the file system (the file shrinks at the next WAL checkpoint); fewer are
        kept for the next inserts. PostgreSQL: nothing (its autovacuum reuses the space).
        Best effort, after the delete committed: a failure is logged, and the next one
        tries again."""
        if not self.single_writer:
            return
        try:
            raw = self.engine.raw_connection()
        except sa_exc.DBAPIError as error:
            _log.warning("database %s: free pages not given back: %s", self.url, error)
            return
        try:
            driver: Any = raw.driver_connection
            if driver.execute("PRAGMA freelist_count").fetchone()[0] >= _RECLAIM_PAGES:
                # executescript steps the pragma to its end; one execute frees a single page
                driver.executescript("PRAGMA incremental_vacuum;")
        except self.engine.dialect.loaded_dbapi.Error as error:
            _log.warning("database %s: free pages not given back: %s", self.url, error)
        finally:
            raw.close()

    def close(self) -> None:
        self.engine.dispose()

    @property
    def single_writer(self) -> bool:
        """Whether a write transaction excludes every other writer from its start (SQLite's
        ``BEGIN IMMEDIATE``; PostgreSQL's writers run side by side)."""
        return self.engine.dialect.name == "sqlite"

    @contextlib.contextmanager
    def read(self, what: str) -> Iterator[Connection]:
        with unavailable(what, self.url), self._reader.connect() as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def write(self, what: str) -> Iterator[Connection]:
        with unavailable(what, self.url), self._writer.connect() as conn, conn.begin():
            yield conn

    def ping(self) -> None:
        with self.read("health check") as conn:
            conn.exec_driver_sql("SELECT 1")


# --------------------------------------------------------------------------- versions

_VERSIONS = Prepared(
    select(
        select(pool_version.c.version).where(pool_version.c.id == 1).scalar_subquery(),
        select(allocation_version.c.version).where(allocation_version.c.id == 1).scalar_subquery(),
    )
)


def versions(conn: Connection) -> tuple[int, int]:
    """(pool version, allocation version) as of this transaction."""
    [(pool_v, allocation_v)] = _VERSIONS.rows(conn)
    return int(pool_v), int(allocation_v)


_BUMP_POOL = Prepared(
    pool_version.update()
    .where(pool_version.c.id == 1)
    .values(version=pool_version.c.version + 1)
    .returning(pool_version.c.version)
)
_BUMP_ALLOCATIONS = Prepared(
    allocation_version.update()
    .where(allocation_version.c.id == 1)
    .values(version=allocation_version.c.version + 1)
    .returning(allocation_version.c.version)
)


def bump_pool(conn: Connection) -> int:
    """The pool's agents or devices changed: other processes re-read them on their next plan."""
    [(version,)] = _BUMP_POOL.rows(conn)
    return int(version)


def bump_allocations(conn: Connection) -> int:
    """Devices were taken or freed: other processes re-read the allocations."""
    [(version,)] = _BUMP_ALLOCATIONS.rows(conn)
    return int(version)


# --------------------------------------------------------------------------- agents


def profile_documents(conn: Connection, keys: Iterable[ProfileKey]) -> dict[str, SupportedLists]:
    """The supported-lists documents named ``keys``."""
    wanted = sorted(keys)
    found: dict[str, SupportedLists] = {}
    for start in range(0, len(wanted), _IN_BATCH):
        batch = wanted[start : start + _IN_BATCH]
        for key, text in conn.execute(
            select(profiles.c.id, profiles.c.lists).where(profiles.c.id.in_(batch))
        ):
            found[key] = load_json(text, f"stored lists {key}")
    return found


def report_documents(report: AgentReport) -> dict[ProfileKey, SupportedLists]:
    """The lists a report names, by profile key."""
    documents = {profile_key(report.host): report.host}
    for members in report.devices.values():
        for lists in members.values():
            documents[profile_key(lists)] = lists
    return documents


class DeviceState(NamedTuple):
    """One device of an agent, as reported and as stored in ``devices``."""

    profile: ProfileKey
    capacity: int  # shares, in millionths
    healthy: bool


DeviceStates = dict[tuple[str, str], DeviceState]  # (device name, device id) -> state


def record_report(
    conn: Connection,
    report: AgentReport,
    now: float,
    known_profiles: Mapping[ProfileKey, object],
) -> tuple[int, Usage]:
    """Write a heartbeat; when it changed the agent (group, lists, platform, devices), also
    its devices, the placements it degrades (a device it held now unhealthy or missing), and
    the new pool version with what the agent's allocated devices have in use; else (0, {})."""
    reported = reported_states(report)
    host = profile_key(report.host)
    known = _stored_states(conn, report.agent_id)
    changed = known != reported or _agent_changed(conn, report, host)
    if changed:
        _insert_profiles(conn, report, known_profiles)
    _upsert_agent(conn, report, host, now)  # its last_seen, changed or not
    if not changed:
        return 0, {}
    _replace_devices(conn, report.agent_id, reported)
    _resize_usage(conn, report.agent_id, known, reported)
    held_rows = conn.execute(
        select(
            allocations.c.device_name,
            allocations.c.device_id,
            allocations.c.placement_id,
            allocations.c.shares,
        ).where(allocations.c.agent_id == report.agent_id)
    ).all()
    held = [(name, device_id, placement) for name, device_id, placement, _ in held_rows]
    reasons = degraded_by(report.agent_id, held, reported)
    degrade(conn, {placement: (reason, now) for placement, reason in reasons.items()})
    in_use = {
        (name, device_id): used
        for (_, name, device_id), used in usage_of(
            (report.agent_id, n, d, shares) for n, d, _, shares in held_rows
        ).items()
    }
    return bump_pool(conn), in_use


def reported_states(report: AgentReport) -> DeviceStates:
    """Each device of ``report``: its lists' profile, its shares and whether it is healthy."""
    return {
        (name, device_id): DeviceState(
            profile_key(lists),
            report.capacity.get((name, device_id), SHARE),
            (name, device_id) not in report.unhealthy,
        )
        for name, members in report.devices.items()
        for device_id, lists in members.items()
    }


def degraded_by(
    agent_id: str,
    held: Iterable[tuple[str, str, str]],
    reported: Mapping[tuple[str, str], DeviceState],
) -> dict[str, str]:
    """Placement id -> why, for each placement that holds (``held``: device name, device
    id, placement id, the agent's allocations) a device ``reported`` now unhealthy or no
    longer has; the first such device of a placement names the reason. Pure."""
    reasons: dict[str, str] = {}
    for name, device_id, placement_id in held:
        if name == HOST_ROW or placement_id in reasons:
            continue
        state = reported.get((name, device_id))
        trouble = "no longer reported" if state is None else None if state.healthy else "unhealthy"
        if trouble is not None:
            reasons[placement_id] = f"agent {agent_id}: device {name}/{device_id} is {trouble}"
    return reasons


def _stored_states(conn: Connection, agent_id: str) -> DeviceStates:
    return {
        (name, device_id): DeviceState(profile, capacity, bool(healthy))
        for _, name, device_id, profile, capacity, healthy in conn.execute(
            select(devices).where(devices.c.agent_id == agent_id)
        )
    }


def _agent_changed(conn: Connection, report: AgentReport, host: ProfileKey) -> bool:
    """Whether the agent is new, or its group, host lists or platform changed."""
    before = conn.execute(
        select(agents.c.resource_group, agents.c.host_profile, agents.c.platform).where(
            agents.c.agent_id == report.agent_id
        )
    ).first()
    return before is None or tuple(before) != (report.resource_group, host, report.platform)


def _insert_profiles(
    conn: Connection, report: AgentReport, known_profiles: Mapping[ProfileKey, object]
) -> None:
    """The supported-lists documents of ``report`` that are not stored yet."""
    documents = report_documents(report)
    missing = [key for key in documents if key not in known_profiles]
    if missing:
        rows = [{"id": key, "lists": json.dumps(documents[key])} for key in missing]
        conn.execute(_insert(conn, profiles).on_conflict_do_nothing(), rows)


def _upsert_agent(conn: Connection, report: AgentReport, host: ProfileKey, now: float) -> None:
    upsert = _insert(conn, agents).values(
        agent_id=report.agent_id,
        resource_group=report.resource_group,
        host_profile=host,
        first_seen=now,
        last_seen=now,
        platform=report.platform,
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


def _replace_devices(conn: Connection, agent_id: str, reported: DeviceStates) -> None:
    conn.execute(delete(devices).where(devices.c.agent_id == agent_id))
    if reported:
        conn.execute(
            insert(devices),
            [
                {
                    "agent_id": agent_id,
                    "device_name": name,
                    "device_id": device_id,
                    "profile": state.profile,
                    "capacity": state.capacity,
                    "healthy": state.healthy,
                }
                for (name, device_id), state in reported.items()
            ],
        )


def _resize_usage(
    conn: Connection, agent_id: str, known: DeviceStates, reported: DeviceStates
) -> None:
    """A device reported with other shares than stored: a device partly used keeps at
    least what it has in use."""
    resized = [
        {"a": agent_id, "n": name, "d": device_id, "c": state.capacity}
        for (name, device_id), state in reported.items()
        if (name, device_id) not in known or known[(name, device_id)].capacity != state.capacity
    ]
    if resized:
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


def usage_of(rows: Iterable[Any]) -> dict[DeviceKey, int]:
    """What each device has in use, from (agent, name, device, shares) allocation rows."""
    used: dict[DeviceKey, int] = {}
    for agent, name, device_id, shares in rows:
        if name == HOST_ROW:
            continue
        key = (agent, name, device_id)
        used[key] = WHOLE if shares is None else min(WHOLE, used.get(key, 0) + shares)
    return used


def agent_rows(
    conn: Connection,
    resource_group: str | None,
    agent_id: str | None = None,
) -> tuple[list[Any], list[Any], list[Any]]:
    """(agents, their devices, their allocations) rows, of one agent or of a resource group
    (None: every agent); columns in table order (unpacked as tuples: named access costs ~5x)."""
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
        list(conn.execute(allocation_query)),
    )


def agents_seen(conn: Connection) -> list[tuple[str, float]]:
    """(resource group, last heartbeat) of every agent: all the metrics need of them."""
    query = select(agents.c.resource_group, agents.c.last_seen)
    return [(group, seen) for group, seen in conn.execute(query)]


def resource_groups(conn: Connection) -> list[str]:
    """The resource groups that hold an agent, sorted."""
    query = select(agents.c.resource_group).distinct().order_by(agents.c.resource_group)
    return [group for (group,) in conn.execute(query)]


def _allocation_query(resource_group: str | None) -> Any:
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


def usage(conn: Connection, resource_group: str | None) -> dict[DeviceKey, int]:
    """What the devices of ``resource_group`` (None: all) have in use."""
    return usage_of(conn.execute(_allocation_query(resource_group)))


def held_by(conn: Connection, placement_id: str) -> list[Change]:
    """The placement's allocation rows (hosts included), in key order."""
    query = _allocation_query(None).where(allocations.c.placement_id == placement_id)
    return sorted(((a, n, d), s) for a, n, d, s in conn.execute(query))


def last_seen(conn: Connection, ids: Sequence[str]) -> dict[str, float]:
    """The agents' last heartbeats."""
    query = select(agents.c.agent_id, agents.c.last_seen)
    found: dict[str, float] = {}
    for start in range(0, len(ids), _IN_BATCH):
        batch = ids[start : start + _IN_BATCH]
        found.update({a: at for a, at in conn.execute(query.where(agents.c.agent_id.in_(batch)))})
    return found


def delete_agent(conn: Connection, agent_id: str) -> tuple[list[str], list[Change]] | None:
    """Delete every placement holding one of the agent's devices, then the agent and its
    devices: (the placements deleted, the devices freed); None when there is no such agent."""
    exists = conn.execute(select(agents.c.agent_id).where(agents.c.agent_id == agent_id)).first()
    if exists is None:
        return None
    held = sorted(
        set(
            conn.execute(
                select(allocations.c.placement_id).where(allocations.c.agent_id == agent_id)
            ).scalars()
        )
    )
    freed: list[Change] = []
    if held:
        freed = free(conn, allocations.c.placement_id.in_(held))
        conn.execute(delete(placements).where(placements.c.id.in_(held)))
    conn.execute(delete(devices).where(devices.c.agent_id == agent_id))
    conn.execute(delete(agents).where(agents.c.agent_id == agent_id))
    return held, freed


def cordoned(conn: Connection) -> dict[str, float]:
    """Every cordoned agent id (reporting or drained) and since when (a short table)."""
    return {agent: since for agent, since in conn.execute(select(cordons))}


def agent_known(conn: Connection, agent_id: str) -> bool:
    query = select(agents.c.agent_id).where(agents.c.agent_id == agent_id)
    return conn.execute(query).first() is not None


def cordon(conn: Connection, agent_id: str, at: float) -> bool:
    """Cordon the agent (kept when it already is); True when that is a change."""
    query = _insert(conn, cordons).values(agent_id=agent_id, since=at).on_conflict_do_nothing()
    return bool(conn.execute(query).rowcount)


def uncordon(conn: Connection, agent_id: str) -> bool:
    """True when the agent was cordoned."""
    return bool(conn.execute(delete(cordons).where(cordons.c.agent_id == agent_id)).rowcount)


# --------------------------------------------------------------------------- allocations


_LOCK_AGENTS = (
    select(agents.c.agent_id, agents.c.host_profile)
    .where(agents.c.agent_id.in_(bindparam("ids", expanding=True)))
    .order_by(agents.c.agent_id)
    .with_for_update(read=True)
)
_AGENTS_DEVICES = select(devices).where(devices.c.agent_id.in_(bindparam("ids", expanding=True)))


def check_plan(conn: Connection, chosen: Plan) -> None:
    """The planned agents still have the host lists, and the devices the lists, capacity and
    health, planned (else ``Stale``). On PostgreSQL the agents' rows are share-locked, so no
    report can change them before this transaction ends (SQLite: BEGIN IMMEDIATE already
    excludes every writer)."""
    agent_ids = sorted({a.agent_id for a in chosen.allocations})
    hosts = dict(conn.execute(_LOCK_AGENTS, {"ids": agent_ids}).all())
    if hosts != {a.agent_id: a.host for a in chosen.allocations}:
        raise Stale()
    planned = {
        (a.agent_id, a.device_name or "", d.device_id): (d.profile, d.capacity, True)
        for a in chosen.allocations
        for d in a.devices
    }
    if planned:
        present = {
            (agent, name, device_id): (profile, capacity, bool(healthy))
            for agent, name, device_id, profile, capacity, healthy in conn.execute(
                _AGENTS_DEVICES, {"ids": agent_ids}
            )
        }
        if any(present.get(key) != state for key, state in planned.items()):
            raise Stale()


# Whole devices' usage in one statement from the allocation rows just written (a gang may
# take thousands of devices): those of the placement whose device has no usage yet (a
# replacement's kept nodes have theirs). A device in use since the plan has its row: it is
# left out and ``take`` sees the count short; a concurrent insert of the same device is
# refused by the primary key. RETURNING: psycopg reports no row count for INSERT ... SELECT.
_TAKE_WHOLE = Prepared(
    insert(device_usage)
    .from_select(
        ["agent_id", "device_name", "device_id", "used", "capacity", "whole"],
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
            allocations.c.placement_id == bindparam("p"),
            ~select(device_usage.c.used).where(_same_device(device_usage, allocations)).exists(),
        )
        .order_by(allocations.c.agent_id, allocations.c.device_name, allocations.c.device_id),
    )
    .returning(device_usage.c.device_id)
)


_INSERT_ALLOCATIONS = Prepared(
    insert(allocations), "agent_id", "device_name", "device_id", "placement_id", "shares"
)


def take(conn: Connection, placement_id: str, plan_: Plan) -> list[Change]:
    """Insert the allocation rows of ``plan_`` and the devices' usage; the database refuses
    (IntegrityError) a device taken whole twice, or shares past a device's capacity."""
    hosts = [a.agent_id for a in plan_.allocations if not a.devices]
    if hosts:  # no usage: a host is not taken
        rows = [
            {"agent_id": agent, "device_name": HOST_ROW, "device_id": HOST_ROW, "shares": 0}
            for agent in sorted(hosts)
        ]
        _INSERT_ALLOCATIONS.many(conn, [row | {"placement_id": placement_id} for row in rows])
    keyed = sorted(
        ((a.agent_id, a.device_name or "", d.device_id), d.capacity)
        for a in plan_.allocations
        for d in a.devices
    )
    if not keyed:  # in key order, so that racing writers cannot deadlock
        return []
    shares = plan_.shares
    _INSERT_ALLOCATIONS.many(
        conn,
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
        inserted = _TAKE_WHOLE.rows(conn, {"p": placement_id})
        if len(inserted) != len(keyed):  # a planned device is gone, or in use meanwhile
            raise Stale()
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
        upsert = _insert(conn, device_usage)
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


def free(conn: Connection, which: Any) -> list[Change]:
    """Delete the allocation rows ``which`` selects and give their devices' usage back."""
    query = select(
        allocations.c.agent_id,
        allocations.c.device_name,
        allocations.c.device_id,
        allocations.c.shares,
    ).where(which)
    freed = [((a, n, d), s) for a, n, d, s in conn.execute(query) if n != HOST_ROW]
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


def free_nodes(conn: Connection, placement_id: str, agent_ids: Sequence[str]) -> list[Change]:
    """Free what the placement holds on ``agent_ids``."""
    mine = allocations.c.placement_id == placement_id
    return free(conn, and_(mine, allocations.c.agent_id.in_(sorted(agent_ids))))


# --------------------------------------------------------------------------- placements

_PLACEMENT = select(
    placements.c.document,
    placements.c.state,
    placements.c.degraded_reason,
    placements.c.degraded_since,
)

_DEGRADE = (
    placements.update()
    .where(placements.c.id == bindparam("p"), placements.c.state == "active")
    .values(state="degraded", degraded_reason=bindparam("r"), degraded_since=bindparam("t"))
)


def _shown(text: str, state: str, reason: str | None, since: float | None) -> dict[str, Any]:
    """A placement as GET shows it: its document, with its state (and why it is degraded)."""
    document = dict(load_json(text, "a stored placement"))
    document["state"] = state
    document.pop("degraded", None)
    if state == "degraded":
        document["degraded"] = {
            "reason": reason,
            "since": None if since is None else iso(since),
        }
    return document


def _owner_in(text: str, placement_id: str) -> str | None:
    owner = load_json(text, f"stored placement {placement_id}").get("owner")
    return owner if isinstance(owner, str) else None


def placement_owners(conn: Connection, ids: Sequence[str]) -> dict[str, str | None]:
    """Who made each of the placements ``ids`` (the client named in its document)."""
    owners: dict[str, str | None] = {}
    query = select(placements.c.id, placements.c.document)
    wanted = sorted(ids)
    for start in range(0, len(wanted), _IN_BATCH):
        batch = wanted[start : start + _IN_BATCH]
        for placement_id, text in conn.execute(query.where(placements.c.id.in_(batch))):
            owners[placement_id] = _owner_in(text, placement_id)
    return owners


def _add_owners(conn: Connection) -> None:
    """A database made before the quota: its placements gain the ``owner`` column, filled
    from their documents, and its index (IF NOT EXISTS: replicas may start together)."""
    if "owner" in {c["name"] for c in inspect(conn).get_columns("placements")}:
        return
    exists = " IF NOT EXISTS" if conn.dialect.name == "postgresql" else ""
    conn.exec_driver_sql(f"ALTER TABLE placements ADD COLUMN{exists} owner VARCHAR(255)")
    found = conn.execute(select(placements.c.id, placements.c.document)).all()
    if found:
        conn.execute(
            placements.update()
            .where(placements.c.id == bindparam("p"))
            .values(owner=bindparam("o")),
            [{"p": p, "o": _owner_in(text, p)} for p, text in found],
        )
    conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_placements_owner ON placements (owner)")


_OWNED = Prepared(
    select(func.count()).select_from(placements).where(placements.c.owner == bindparam("o"))
)


def owned(conn: Connection, owner: str) -> int:
    """How many placements ``owner`` keeps (active or degraded), one index range. On
    PostgreSQL an advisory lock on the owner is taken first, until the transaction ends, so
    that servers sharing the database count one client's placements one after the other
    (SQLite: ``BEGIN IMMEDIATE`` already excludes every other writer)."""
    if conn.dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(owner.encode()).digest()[:4], "big", signed=True)
        driver_execute(conn, "SELECT pg_advisory_xact_lock(%s, %s)", (_QUOTA_LOCK, key)).close()
    [(count,)] = _OWNED.rows(conn, {"o": owner})
    return int(count)


_INSERT_PLACEMENT = Prepared(
    insert(placements), "id", "created_at", "document", "state", "request", "owner"
)


def insert_placement(
    conn: Connection, document: Mapping[str, Any], request: str | None, now: float
) -> None:
    row = {
        "id": document["id"],
        "created_at": now,
        "document": json.dumps(document),
        "state": "active",
        "request": request,
        "owner": document.get("owner"),
    }
    _INSERT_PLACEMENT.rows(conn, row)


def placement(conn: Connection, placement_id: str) -> dict[str, Any] | None:
    """The placement as GET shows it; None when there is none."""
    row = conn.execute(_PLACEMENT.where(placements.c.id == placement_id)).first()
    return None if row is None else _shown(*row)


def placement_list(conn: Connection, state: str | None) -> list[dict[str, Any]]:
    """Every placement (in ``state``), oldest first."""
    query = _PLACEMENT.order_by(placements.c.created_at, placements.c.id)
    if state is not None:
        query = query.where(placements.c.state == state)
    return [_shown(*row) for row in conn.execute(query)]


def placement_states(conn: Connection) -> dict[str, int]:
    query = select(placements.c.state, func.count()).group_by(placements.c.state)
    return dict.fromkeys(STATES, 0) | {state: n for state, n in conn.execute(query)}


def placement_request(conn: Connection, placement_id: str) -> Any:
    """What the client asked for the placement, as it sent it (JSON); None when not kept."""
    text = conn.execute(
        select(placements.c.request).where(placements.c.id == placement_id)
    ).scalar_one_or_none()
    return None if text is None else load_json(text, f"placement {placement_id}'s request")


def reactivate(conn: Connection, placement_id: str, document: Mapping[str, Any]) -> None:
    """The placement replaced: its new document, active again (else ``Stale``: it is gone)."""
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
        raise Stale()


def delete_placement(conn: Connection, placement_id: str) -> list[Change] | None:
    """Free the placement's devices and delete it: what was freed; None when there is none."""
    freed = free(conn, allocations.c.placement_id == placement_id)
    result = conn.execute(delete(placements).where(placements.c.id == placement_id))
    return freed if result.rowcount else None


def degrade(conn: Connection, reasons: Mapping[str, tuple[str, float]]) -> None:
    """Mark active placements degraded: placement id -> (reason, since)."""
    if reasons:
        rows = [{"p": p, "r": reason, "t": since} for p, (reason, since) in sorted(reasons.items())]
        conn.execute(_DEGRADE, rows)


def lapsed(conn: Connection, before: float) -> list[tuple[str, str, float]]:
    """(placement, agent, its last heartbeat) for every active placement holding an agent
    last heard from before ``before``, in that order (one indexed query)."""
    query = (
        select(allocations.c.placement_id, agents.c.agent_id, agents.c.last_seen)
        .select_from(
            allocations.join(agents, allocations.c.agent_id == agents.c.agent_id).join(
                placements, allocations.c.placement_id == placements.c.id
            )
        )
        .where(agents.c.last_seen < before, placements.c.state == "active")
        .distinct()
    )
    return sorted(((p, a, seen) for p, a, seen in conn.execute(query)), key=lambda r: r[:2])
