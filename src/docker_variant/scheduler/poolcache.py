"""The pools in memory: one ``Pool`` per resource group asked for, kept current with the rows.

Two version rows say whether a pool is current: ``pool_version`` (agents and devices) and
``allocation_version`` (placements and releases). This process applies the changes it
commits to the pools while holding ``lock`` across the commit (``committing``), so the
versions read next still match: a placement reads two numbers and plans, at a cost that
does not grow with the fleet. A change committed by another process (a replica on the same
database) shows as a version this process did not make: a new allocation version re-reads
the allocations, a new pool version the whole pool.

Cordoned agents (``rows.cordoned``) are parked too, for as long as they are cordoned: their
heartbeats are recorded, but no plan sees them. A cordon or uncordon bumps the pool version,
so every process reads the pool again.

With an agent TTL, agents whose last heartbeat is older are left out of the pool (parked,
with the reason) until they are heard from again; only the heartbeats of agents that seem
due by what this process knows are read (the ones it recorded itself, kept on a heap).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection

from docker_variant.planner.pool import (
    Device,
    DeviceKey,
    Node,
    Pool,
    ProfileKey,
    device_in_use,
    profile_key,
)
from docker_variant.scheduler import rows
from docker_variant.scheduler.documents import SHARE, AgentReport, PlacementRequest
from docker_variant.scheduler.rows import Change, Usage
from docker_variant.variant.model import SupportedLists

__all__ = ["Commit", "PoolCache"]

_CACHED_POOLS = 64  # resource groups whose devices are kept in memory
_HEARD = 1 << 16  # heartbeats kept for a pool between two plans (more are read when due)

_CORDONED = "cordoned by an admin (uncordon it to place on it again)"

_Member = tuple[str, ProfileKey, int, bool]  # device id, profile, capacity, healthy


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
    cordoned: frozenset[str] = frozenset()  # parked whatever their heartbeats say
    deadlines: list[tuple[float, str]] = field(default_factory=list)
    heard: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=_HEARD))


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


def _grouped(
    changes: Sequence[Change], allocate: bool
) -> list[tuple[list[DeviceKey], int | None, bool]]:
    by_shares: dict[int | None, list[DeviceKey]] = {}
    for key, shares in changes:
        by_shares.setdefault(shares, []).append(key)
    return [(keys, shares, allocate) for shares, keys in by_shares.items()]


def apply_changes(pool: Pool, freed: Sequence[Change] = (), taken: Sequence[Change] = ()) -> None:
    """Devices freed and taken (whole: None, or the shares), into ``pool``."""
    for keys, shares, allocate in (*_grouped(freed, False), *_grouped(taken, True)):
        if allocate:
            pool.allocate(keys, shares)
        else:
            pool.release(keys, shares)


class Commit:
    """A write transaction whose changes reach the pools in memory in commit order."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.applied: list[Callable[[], None]] = []

    def then(self, apply: Callable[[], None]) -> None:
        """Run ``apply`` once committed, with the pools' lock still held."""
        self.applied.append(apply)


class PoolCache:
    """The pools in memory by resource group (None: every agent)."""

    def __init__(self, *, agent_ttl: float = 0, clock: Callable[[], float]) -> None:
        self.agent_ttl = agent_ttl  # 0: agents never expire
        self.clock = clock
        self.profiles: dict[ProfileKey, SupportedLists] = {}  # content-addressed: never stale
        # Held while the pools are read or changed, and across the commit of each change this
        # process makes, so that changes reach memory in the order they commit. Taken after
        # a connection, never before one; held, it waits on no database lock.
        self.lock = threading.Lock()
        self._pools: dict[str | None, _Memory] = {}
        self._groups: tuple[int, list[str]] | None = None  # (pool version, resource groups)

    def alive(self, last_seen: float, now: float) -> bool:
        return self.agent_ttl <= 0 or now - last_seen <= self.agent_ttl

    @contextlib.contextmanager
    def committing(self, write: contextlib.AbstractContextManager[Connection]) -> Iterator[Commit]:
        """Run the block in ``write`` (a ``Rows.write``); the lock is taken after its last
        statement and held across the commit until every ``Commit.then`` has run."""
        with contextlib.ExitStack() as held:
            with write as conn:
                commit = Commit(conn)
                yield commit
                if commit.applied:
                    held.enter_context(self.lock)
            for apply in commit.applied:
                apply()

    # ----------------------------------------------------------------------- reading

    def synced(
        self,
        conn: Connection,
        resource_group: str | None,
        versions: tuple[int, int] | None = None,
    ) -> Pool:
        """The pool of ``resource_group``, brought up to date (call with ``lock`` held):
        nothing read but two versions while no other process changed anything (none when
        the caller read them already, ``rows.versions``)."""
        pool_v, allocation_v = rows.versions(conn) if versions is None else versions
        memory = self._pools.get(resource_group)
        if memory is None or memory.pool_version != pool_v:
            memory = self._load(conn, resource_group, pool_v, allocation_v)
        elif memory.allocation_version != allocation_v:
            self._reload_allocations(conn, resource_group, memory, allocation_v)
        if self.agent_ttl > 0:
            self._check_heartbeats(conn, memory)
        return memory.pool

    def _groups_at(self, conn: Connection, pool_v: int) -> list[str]:
        """The resource groups that hold an agent, read again only when the pool's version
        moved."""
        if self._groups is None or self._groups[0] != pool_v:
            self._groups = (pool_v, rows.resource_groups(conn))
        return self._groups[1]

    def pools_for(self, conn: Connection, request: PlacementRequest) -> dict[str | None, Pool]:
        """The pools a request may take a gang from, each whole (call with ``lock`` held):
        its resource group's; every agent's when it spreads; else each group's, for a gang
        never mixes resource groups unless asked to."""
        if request.resource_group is not None or request.spread:
            return {request.resource_group: self.synced(conn, request.resource_group)}
        versions = rows.versions(conn)  # once for every group's pool
        groups = self._groups_at(conn, versions[0])
        if not groups:
            return {None: self.synced(conn, None, versions)}  # no agents: the refusal says so
        return {group: self.synced(conn, group, versions) for group in groups}

    def learn_profiles(self, conn: Connection, keys: set[ProfileKey]) -> None:
        """Read the lists documents of ``keys`` not known yet."""
        missing = keys - self.profiles.keys()
        if missing:
            self.profiles.update(rows.profile_documents(conn, missing))

    def _load(
        self, conn: Connection, resource_group: str | None, pool_v: int, allocation_v: int
    ) -> _Memory:
        """The whole pool of ``resource_group``, read afresh."""
        agent_rows, device_rows, allocation_rows = rows.agent_rows(conn, resource_group)
        used = {host for _, _, host, _, _, _ in agent_rows}
        used |= {profile for _, _, _, profile, _, _ in device_rows}
        self.learn_profiles(conn, used)
        by_agent: dict[str, dict[str, list[_Member]]] = {}
        for agent, name, device, profile, capacity, healthy in device_rows:
            member = (device, profile, capacity, bool(healthy))
            by_agent.setdefault(agent, {}).setdefault(name, []).append(member)
        usage = rows.usage_of((a, n, d, shares) for a, n, d, _, shares in allocation_rows)
        held: dict[str, Usage] = {}
        for (agent, name, device), in_use in usage.items():
            held.setdefault(agent, {})[(name, device)] = in_use
        nodes = [
            _node(agent, host, by_agent.get(agent, {}), platform, held.get(agent, {}))
            for agent, _, host, _, _, platform in agent_rows
        ]
        scope = f" in resource group {resource_group!r}" if resource_group is not None else ""
        pool = Pool(nodes, self.profiles, {}, scope)
        pool.set_usage(usage)
        last_seen = {agent: seen for agent, _, _, _, seen, _ in agent_rows}
        cordoned = frozenset(rows.cordoned(conn))
        for agent in cordoned:
            pool.park(agent, _CORDONED)
        memory = _Memory(pool, pool_v, allocation_v, last_seen, cordoned)
        if self.agent_ttl > 0:
            memory.deadlines = [(seen, agent) for agent, seen in last_seen.items()]
            heapq.heapify(memory.deadlines)
        if len(self._pools) >= _CACHED_POOLS:
            self._pools.clear()
        self._pools[resource_group] = memory
        return memory

    def _reload_allocations(
        self, conn: Connection, resource_group: str | None, memory: _Memory, allocation_v: int
    ) -> None:
        """Another process placed or freed devices: read the allocations, apply the change."""
        now = rows.usage(conn, resource_group)
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
        cordoned = memory.cordoned
        left_out = [a for a in pool.unavailable if a in pool and a not in cordoned]
        seen.update(rows.last_seen(conn, [*due, *left_out]))
        for agent in due:
            if self.alive(seen[agent], now):
                heapq.heappush(deadlines, (seen[agent], agent))
        for agent in {*due, *left_out, *changed} - cordoned:
            last_seen = seen[agent]
            if self.alive(last_seen, now):
                if agent in pool.unavailable:
                    pool.unpark(agent)
                    heapq.heappush(deadlines, (last_seen, agent))
            else:
                pool.park(agent, f"no heartbeat for {int(now - last_seen)} s (agent TTL {ttl:g} s)")

    # ----------------------------------------------------------------------- changing

    def heard(self, agent_id: str, at: float) -> None:
        """A heartbeat this process recorded (a hint for the TTL; no lock needed)."""
        if self.agent_ttl > 0:
            for memory in list(self._pools.values()):
                memory.heard.append((agent_id, at))

    def apply_report(self, version: int, report: AgentReport, held: Usage, now: float) -> None:
        """A report this process committed as pool ``version``, into the pools that were
        current just before it (the others are re-read on their next plan)."""
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
                if agent in memory.cordoned:
                    memory.pool.park(agent, _CORDONED)
                memory.last_seen[agent] = now
                heapq.heappush(memory.deadlines, (now, agent))
            else:  # moved to another group, or never in this one
                memory.pool.remove(agent)
                memory.last_seen.pop(agent, None)
            memory.pool_version = version

    def apply_allocations(
        self, version: int, freed: Sequence[Change] = (), taken: Sequence[Change] = ()
    ) -> None:
        """Devices this process freed and allocated as allocation ``version``, into the
        pools that were current just before it."""
        for memory in self._pools.values():
            if memory.allocation_version == version - 1:
                apply_changes(memory.pool, freed, taken)
                memory.allocation_version = version

    def apply_agent_deleted(self, pool_version: int, agent_id: str) -> None:
        """An agent this process deleted, and so cordoned, as pool ``pool_version``."""
        for memory in self._pools.values():
            if memory.pool_version == pool_version - 1:
                memory.pool.remove(agent_id)
                memory.last_seen.pop(agent_id, None)
                memory.cordoned |= {agent_id}
                memory.pool_version = pool_version
