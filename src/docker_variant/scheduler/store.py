"""The scheduler's operations: heartbeats, placements, replace, deletes, the agent TTL.

Each operation walks down once: the pool in memory (``poolcache``, brought up to date from
two version numbers), the plan on it (``placement.plan``, pure), then one transaction
(``rows``, the only module that touches the database).

On PostgreSQL a placement is planned without locks, then committed in one transaction that
re-checks the planned agents and devices and inserts the placement with one ``allocations``
row per device. The database refuses a device allocated twice (or shares past its capacity),
so two placements racing for a device cannot both commit: the loser's transaction rolls back
as a whole and it plans again on fresh state, up to ``attempts`` times, after a jittered
pause. On SQLite, whose write transaction excludes every other writer from its start, the
plan is made inside that transaction, so there is nothing to re-check (the same keys and
checks still refuse what they refuse).

Bounds on what one client stores: at most ``max_placements`` placements (active or degraded;
a host-only one, ``devices_per_node: 0``, takes no device but is kept all the same), counted
in the transaction that would add one; and the request kept with each for ``replace`` at
most ``max_request`` bytes. Deleting gives the space back (``Rows.reclaim``).

Failures: a report that marks an allocated device unhealthy or leaves it out, and an agent
whose heartbeat lapses past the TTL (noticed when placements are read), make the placements
holding them ``degraded``, with the reason and the time; they stay so until ``replace``
moves them onto healthy devices (in one transaction: the old devices are freed as the new
ones are taken) or they are deleted.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from docker_variant.errors import InvalidInputError
from docker_variant.planner.placement import (
    BARE,
    JudgeCache,
    NodeAllocation,
    Plan,
    Refusal,
    plan,
    plan_in_groups,
)
from docker_variant.planner.pool import Pool, pool_shares
from docker_variant.retry import Backoff, retry
from docker_variant.scheduler import rows
from docker_variant.scheduler.documents import (
    AgentReport,
    PlacementRequest,
    parse_placement_request,
)
from docker_variant.scheduler.poolcache import PoolCache, apply_changes
from docker_variant.scheduler.rows import STATES, Change, Rows, Stale, iso, lost_race
from docker_variant.scheduler.views import agent_views, shares_out
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.selection import Candidate

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_MAX_PLACEMENTS",
    "DEFAULT_MAX_REQUEST",
    "STATES",
    "QuotaExceededError",
    "RequestTooLargeError",
    "Store",
]

DEFAULT_ATTEMPTS = 5
#: Placements one client may keep (``--max-placements``; 0: no limit).
DEFAULT_MAX_PLACEMENTS = 1_000
#: Bytes of the request kept with a placement, as stored (``--max-placement-request``; 0: no
#: limit): an index of some 400 variants. With the quota, 64 MiB a client at most.
DEFAULT_MAX_REQUEST = 64 << 10
#: Between two tries of a transaction that lost a race: let the winner finish.
_RACE = Backoff(first=0.005)

_T = TypeVar("_T")


def _ignore_stage(_stage: str, _seconds: float) -> None:
    pass


class QuotaExceededError(Exception):
    """The client keeps ``limit`` placements already (HTTP 429)."""

    def __init__(self, owner: str, count: int, limit: int) -> None:
        super().__init__(
            f"client {owner!r} keeps {count} placements, the most one client may keep "
            f"(--max-placements {limit}); delete one first"
        )
        self.owner, self.count, self.limit = owner, count, limit


class RequestTooLargeError(InvalidInputError):
    """The request to keep with a placement is over ``max_request`` bytes (HTTP 413)."""


class _Lost(Exception):
    """A plan's commit lost to a concurrent one (``label``: the candidate it chose)."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.label = label


class Store:
    """The scheduler's state in one database; every method is one or two transactions."""

    def __init__(
        self,
        engine: Engine,
        *,
        agent_ttl: float = 0,
        attempts: int = DEFAULT_ATTEMPTS,
        clock: Callable[[], float] = time.time,
        max_placements: int = DEFAULT_MAX_PLACEMENTS,
        max_request: int = DEFAULT_MAX_REQUEST,
    ) -> None:
        self.rows = Rows(engine)
        self.engine = engine
        self.url = self.rows.url
        self.agent_ttl = agent_ttl  # 0: agents never expire
        self.attempts = attempts
        self.clock = clock
        self.max_placements = max_placements  # per client; 0: no limit
        self.max_request = max_request  # bytes; 0: no limit
        self.cache = PoolCache(agent_ttl=agent_ttl, clock=clock)
        # Placements of one process plan one at a time: they would all pick the same best
        # devices and then lose the race to each other. Other processes (replicas sharing
        # the database) still race; the database settles it and the loser plans again.
        self._placing = threading.Lock()
        self._judges = JudgeCache()
        # How long each stage of a placement took ("plan", "commit"), for the metrics;
        # the app's metrics set it (``metrics.SchedulerMetrics.watch``).
        self.observe_stage: Callable[[str, float], None] = _ignore_stage

    @classmethod
    def open(cls, url: str, **kwargs: Any) -> Store:
        """Connect and create the tables that are missing."""
        return cls(Rows.open(url).engine, **kwargs)

    def close(self) -> None:
        self.rows.close()

    def ping(self) -> None:
        self.rows.ping()

    def _committed(self, change: Callable[[], None]) -> bool:
        """True when ``change`` committed; False when it lost a race (``rows.lost_race``)."""
        try:
            change()
        except Exception as error:
            if lost_race(error):
                return False
            raise
        return True

    def _retried(self, change: Callable[[], _T]) -> _T:
        """``change`` again when PostgreSQL ends it as a deadlock or serialization failure
        (shares: rows several placements use, which a replace changes in two passes)."""
        return retry(change, attempts=self.attempts, backoff=_RACE, retryable=rows.retryable)

    def _replanned(self, attempt: Callable[[], _T]) -> _T | Refusal:
        """``attempt`` (plan and commit) again while its commit loses a race."""
        try:
            return retry(
                attempt,
                attempts=self.attempts,
                backoff=_RACE,
                retryable=lambda e: isinstance(e, _Lost),
            )
        except _Lost as lost:
            return Refusal(
                {
                    lost.label: f"the devices it was given were taken by concurrent "
                    f"placements {self.attempts} times in a row; try again"
                }
            )

    # ------------------------------------------------------------------ agents

    def report_agent(self, report: AgentReport) -> dict[str, Any]:
        """Record a heartbeat: the agent's lists and devices replace the previous report;
        allocations are untouched (a vanished allocated device is reported as missing), but
        the placements holding a device now unhealthy or missing become degraded."""
        now = self.clock()
        cache = self.cache
        with cache.committing(self.rows.write(f"recording agent {report.agent_id}")) as commit:
            version, held = rows.record_report(commit.conn, report, now, cache.profiles)
            documents = rows.report_documents(report)
            if version:  # the lists first: a plan may read the node as soon as it is in
                commit.then(lambda: cache.profiles.update(documents))
                commit.then(lambda: cache.apply_report(version, report, held, now))
        if not version:
            cache.profiles.update(documents)
        cache.heard(report.agent_id, now)
        return self._views(None, report.agent_id, detail=False)[0]  # its lists were just sent

    def _views(
        self, resource_group: str | None, agent_id: str | None, detail: bool
    ) -> list[dict[str, Any]]:
        with self.rows.read("listing agents") as conn:
            agent_rows, device_rows, allocation_rows = rows.agent_rows(
                conn, resource_group, agent_id
            )
            cordoned = rows.cordoned(conn)
            if detail:
                used = {r.host_profile for r in agent_rows} | {r.profile for r in device_rows}
                self.cache.learn_profiles(conn, used)
        now = self.clock()
        profiles = self.cache.profiles if detail else None
        return agent_views(
            agent_rows,
            device_rows,
            allocation_rows,
            lambda last_seen: self.cache.alive(last_seen, now),
            cordoned,
            profiles,
        )

    def list_agents(self, resource_group: str | None = None) -> list[dict[str, Any]]:
        return self._views(resource_group, None, detail=False)

    def get_agent(
        self, agent_id: str, may_see: Callable[[str | None], bool] | None = None
    ) -> dict[str, Any] | None:
        """The agent with its lists and the placements holding its devices: every one, or
        only those whose owner ``may_see`` accepts."""
        views = self._views(None, agent_id, detail=True)
        if not views:
            return None
        view = views[0]
        if may_see is not None and view["placements"]:
            with self.rows.read("reading placements") as conn:
                owners = rows.placement_owners(conn, view["placements"])
            view["placements"] = [p for p in view["placements"] if may_see(owners.get(p))]
        return view

    def pool_summary(self, resource_group: str | None = None) -> dict[str, Any]:
        """The free shares of the live pool (of ``resource_group``), and its fragmentation:
        the share of the free capacity that no whole-device request can use."""
        figures = self.read_pool(pool_shares, resource_group)
        return {
            "capacity_shares": shares_out(figures.capacity),
            "free_shares": shares_out(figures.free),
            "stranded_shares": shares_out(figures.stranded),
            "fragmentation": round(figures.fragmentation, 4),
        }

    def read_pool(self, reader: Callable[[Pool], _T], resource_group: str | None = None) -> _T:
        """``reader`` applied to the live pool (of ``resource_group``) under the cache's lock,
        nothing copied: for counts and summaries, which must neither keep the pool nor pay
        for a copy of it. ``reader`` must not keep references into the pool either."""
        with self.rows.read("reading the pool") as conn, self.cache.lock:
            return reader(self.cache.synced(conn, resource_group))

    def snapshot(self, resource_group: str | None = None) -> Pool:
        """Live agents (of ``resource_group``), their devices, which are free, their lists:
        a copy of the pool in memory, that later changes leave alone."""
        with self.rows.read("reading the pool") as conn, self.cache.lock:
            return self.cache.synced(conn, resource_group).copy()

    def snapshots(self, request: PlacementRequest) -> dict[str | None, Pool]:
        """``snapshot`` of each pool ``request`` may take its gang from (one per resource
        group, unless it names one or spreads: ``PoolCache.pools_for``)."""
        with self.rows.read("reading the pool") as conn, self.cache.lock:
            return {g: p.copy() for g, p in self.cache.pools_for(conn, request).items()}

    # ------------------------------------------------------------------ placements

    def place(
        self,
        index: VariantIndex,
        request: PlacementRequest,
        image_of: Callable[[Candidate], str],
        owner: str = "anonymous",
    ) -> dict[str, Any] | Refusal:
        """Plan on the pool in memory and commit; on a conflict, plan again (all or nothing).
        ``RequestTooLargeError`` when the request to keep is over ``max_request`` bytes,
        ``QuotaExceededError`` when ``owner`` keeps ``max_placements`` already."""
        size = len(request.stored_text)  # ASCII: json.dumps escapes the rest
        if self.max_request and size > self.max_request:
            raise RequestTooLargeError(
                f"the placement request is {size} bytes as stored, over {self.max_request} "
                "bytes, the most kept with a placement (--max-placement-request); send an "
                'index of fewer variants, or {"image": REF}'
            )

        def planned(conn: Connection) -> tuple[str | None, Plan] | Refusal:
            """The plan and its resource group (call with the pools' lock held)."""
            started = time.perf_counter()
            judge = self._judges.judge(index, self.cache.profiles)
            outcome = plan_in_groups(index, self.cache.pools_for(conn, request), request, judge)
            self.observe_stage("plan", time.perf_counter() - started)
            return outcome

        def attempt() -> dict[str, Any] | Refusal:
            with self._placing:
                if self.rows.single_writer:
                    return self._place_at_once(planned, request, image_of, owner)
                with self.rows.read("reading the pool") as conn, self.cache.lock:
                    outcome = planned(conn)
                if isinstance(outcome, Refusal):
                    return outcome
                group, chosen = outcome
                document = self._document(chosen, group, request, image_of, owner)
                started = time.perf_counter()
                committed = self._commit(chosen, document, request)
                self.observe_stage("commit", time.perf_counter() - started)
                if committed:
                    return document
            raise _Lost(chosen.candidate.label or BARE)

        return self._replanned(attempt)

    def _place_at_once(
        self,
        planned: Callable[[Connection], tuple[str | None, Plan] | Refusal],
        request: PlacementRequest,
        image_of: Callable[[Candidate], str],
        owner: str,
    ) -> dict[str, Any] | Refusal:
        """SQLite: plan and commit in one write transaction. It holds the database's only
        write lock from its start (``BEGIN IMMEDIATE``), so the pool brought up to date at
        its start stays current until it commits: nothing to check again, no race to lose.
        The pools' lock is taken after the connection, as everywhere, and held across the
        commit until memory has the change."""
        asked = request.stored_text
        label = "?"
        try:
            with contextlib.ExitStack() as held:
                with self.rows.write("recording a placement") as conn:
                    self._check_quota(conn, owner)  # before planning: nothing to undo
                    held.enter_context(self.cache.lock)
                    outcome = planned(conn)
                    if isinstance(outcome, Refusal):
                        return outcome  # nothing written
                    group, chosen = outcome
                    label = chosen.candidate.label or BARE
                    document = self._document(chosen, group, request, image_of, owner)
                    started = time.perf_counter()
                    rows.insert_placement(conn, document, asked, self.clock())
                    taken = rows.take(conn, document["id"], chosen)
                    version = rows.bump_allocations(conn)
                self.cache.apply_allocations(version, taken=taken)
                self.observe_stage("commit", time.perf_counter() - started)
        except Exception as error:
            if lost_race(error):  # not expected here; if ever, plan again as elsewhere
                raise _Lost(label) from error
            raise
        return document

    def _document(
        self,
        chosen: Plan,
        group: str | None,
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
            "resource_group": group,  # the gang's (None: it may spread over several)
            "nodes": request.nodes,
            "devices_per_node": request.devices_per_node,
            "created_at": iso(self.clock()),
            "state": "active",
            "allocations": _allocations(chosen.allocations),
        }
        if request.shares is not None:
            document["shares_per_device"] = shares_out(request.shares)
        if request.spread:
            document["spread"] = True
        return document

    def _commit(
        self,
        chosen: Plan,
        document: Mapping[str, Any],
        request: PlacementRequest | None = None,
    ) -> bool:
        """True when committed; False when the pool changed or a device was taken meanwhile."""
        asked = None if request is None else request.stored_text

        def change() -> None:
            with self.cache.committing(self.rows.write("recording a placement")) as commit:
                conn = commit.conn
                self._check_quota(conn, document["owner"])
                rows.check_plan(conn, chosen)
                rows.insert_placement(conn, document, asked, self.clock())
                taken = rows.take(conn, document["id"], chosen)
                version = rows.bump_allocations(conn)  # last: the row stays locked
                commit.then(lambda: self.cache.apply_allocations(version, taken=taken))

        return self._committed(change)

    def _check_quota(self, conn: Connection, owner: str) -> None:
        """``QuotaExceededError`` when ``owner`` keeps ``max_placements`` already; in the
        transaction that would add one, so that concurrent placements cannot pass it."""
        if self.max_placements:
            count = rows.owned(conn, owner)
            if count >= self.max_placements:
                raise QuotaExceededError(owner, count, self.max_placements)

    # ------------------------------------------------------------------ reading placements

    def get_placement(self, placement_id: str) -> dict[str, Any] | None:
        self._degrade_lapsed()
        with self.rows.read("reading a placement") as conn:
            return rows.placement(conn, placement_id)

    def list_placements(self, state: str | None = None) -> list[dict[str, Any]]:
        """Every placement, oldest first; ``state``: only those in it (``STATES``)."""
        self._degrade_lapsed()
        with self.rows.read("listing placements") as conn:
            return rows.placement_list(conn, state)

    def agents_seen(self) -> list[tuple[str, bool]]:
        """(resource group, alive) of every agent, alive by ``agent_ttl`` now."""
        with self.rows.read("counting agents") as conn:
            seen = rows.agents_seen(conn)
        now = self.clock()
        return [(group, self.cache.alive(last, now)) for group, last in seen]

    def placement_states(self) -> dict[str, int]:
        """How many placements are in each state (for /metrics)."""
        self._degrade_lapsed()
        with self.rows.read("counting placements") as conn:
            return rows.placement_states(conn)

    def placement_request(self, placement_id: str) -> PlacementRequest | None:
        """What the client asked for the placement (for ``replace``)."""
        with self.rows.read("reading a placement") as conn:
            sent = rows.placement_request(conn, placement_id)
        return None if sent is None else parse_placement_request(sent)

    def _degrade_lapsed(self) -> None:
        """Degrade the active placements holding devices of agents past the TTL, as of when
        it lapsed (one indexed query; a write only when there is something to degrade)."""
        if self.agent_ttl <= 0:
            return
        now = self.clock()
        with self.rows.read("reading heartbeats") as conn:
            lapsed = rows.lapsed(conn, now - self.agent_ttl)
        if not lapsed:
            return
        reasons: dict[str, tuple[str, float]] = {}
        for placement_id, agent_id, last_seen in lapsed:
            silent = f"no heartbeat for {int(now - last_seen)} s"
            reason = f"agent {agent_id}: {silent} (agent TTL {self.agent_ttl:g} s)"
            reasons.setdefault(placement_id, (reason, last_seen + self.agent_ttl))
        with self.rows.write("degrading placements") as conn:
            rows.degrade(conn, reasons)

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

        def attempt() -> dict[str, Any] | Refusal | None:
            with self._placing:
                with self.rows.read("reading the pool") as conn:
                    document = rows.placement(conn, placement_id)
                    if document is None:
                        return None
                    own = rows.held_by(conn, placement_id)
                    with self.cache.lock:
                        group = None if request.spread else document["resource_group"]
                        pool = self.cache.synced(conn, group).copy()  # the gang's group
                outcome, kept = _replan(pool, document, own, index, request)
                if isinstance(outcome, Refusal):
                    return outcome
                if outcome is None and document["state"] == "active":
                    why = f"placement {placement_id} is active: nothing to replace"
                    return Refusal({document["variant"] or BARE: why})
                moved = [a for a in document["allocations"] if a not in kept]
                new = self._replaced(document, outcome, kept, moved, image_of)
                if self._commit_replace(placement_id, own, moved, outcome, new):
                    return new
            raise _Lost(document["variant"] or BARE)

        return self._replanned(attempt)

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
            "at": iso(self.clock()),
            "agents": sorted({a["agent_id"] for a in moved}),
            "reason": document.get("degraded", {}).get("reason"),
        }
        return new

    def _commit_replace(
        self,
        placement_id: str,
        own: Sequence[Change],
        moved: Sequence[Mapping[str, Any]],
        outcome: Plan | None,
        document: Mapping[str, Any],
    ) -> bool:
        """True when committed; False when the placement, the pool or a device changed."""

        def change() -> None:
            what = f"replacing placement {placement_id}"
            with self.cache.committing(self.rows.write(what)) as commit:
                conn = commit.conn
                if rows.held_by(conn, placement_id) != list(own):
                    raise Stale()
                freed: list[Change] = []
                taken: list[Change] = []
                if outcome is not None:
                    rows.check_plan(conn, outcome)
                    gone = sorted({a["agent_id"] for a in moved})
                    freed = rows.free_nodes(conn, placement_id, gone)
                    taken = rows.take(conn, placement_id, outcome)
                rows.reactivate(conn, placement_id, document)
                version = rows.bump_allocations(conn)
                commit.then(lambda: self.cache.apply_allocations(version, freed, taken))

        return self._committed(change)

    def set_cordon(self, agent_id: str, cordoned: bool) -> bool | None:
        """Cordon (no new placements; heartbeats still recorded) or uncordon the agent.
        True when that changed something, False when it already was so; None when there is
        no such agent (an agent drained by ``delete_agent`` may still be uncordoned)."""
        with self.rows.write(f"cordoning agent {agent_id}") as conn:
            if cordoned:
                if not rows.agent_known(conn, agent_id):
                    return None
                changed = rows.cordon(conn, agent_id, self.clock())
            else:
                changed = rows.uncordon(conn, agent_id)
                if not changed and not rows.agent_known(conn, agent_id):
                    return None
            if changed:  # every process (this one too) reads the pool again on its next plan
                rows.bump_pool(conn)
        return changed

    # ------------------------------------------------------------------ deleting

    def delete_agent(self, agent_id: str) -> list[str] | None:
        """Drain and deregister: delete every placement holding one of the agent's devices
        (freeing all their devices), then the agent and its devices, and cordon it, so that
        when it reports again it takes no placement until uncordoned. Returns the deleted
        placements' ids; ``None`` when there is no such agent."""
        held = self._retried(lambda: self._delete_agent(agent_id))
        if held:
            self.rows.reclaim()
        return held

    def _delete_agent(self, agent_id: str) -> list[str] | None:
        cache = self.cache
        with cache.committing(self.rows.write(f"deleting agent {agent_id}")) as commit:
            deleted = rows.delete_agent(commit.conn, agent_id)
            if deleted is None:
                return None
            held, freed = deleted
            rows.cordon(commit.conn, agent_id, self.clock())
            pool_v = rows.bump_pool(commit.conn)
            allocation_v = rows.bump_allocations(commit.conn)
            commit.then(lambda: cache.apply_allocations(allocation_v, freed))
            commit.then(lambda: cache.apply_agent_deleted(pool_v, agent_id))
        return held

    def delete_placement(self, placement_id: str) -> bool:
        """Free the placement's devices; False when there is no such placement."""
        deleted = self._retried(lambda: self._delete_placement(placement_id))
        if deleted:
            self.rows.reclaim()
        return deleted

    def _delete_placement(self, placement_id: str) -> bool:
        with self.cache.committing(self.rows.write(f"deleting placement {placement_id}")) as c:
            freed = rows.delete_placement(c.conn, placement_id)
            if freed is None:
                return False
            version = rows.bump_allocations(c.conn)
            c.then(lambda: self.cache.apply_allocations(version, freed))
        return True


def _replan(
    pool: Pool,
    document: Mapping[str, Any],
    own: Sequence[Change],
    index: VariantIndex,
    request: PlacementRequest,
) -> tuple[Plan | Refusal | None, list[dict[str, Any]]]:
    """(the plan for the nodes to move, or None when none need to; the allocations kept)
    on ``pool``, a copy this changes."""
    apply_changes(pool, freed=own)
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


def _allocations(chosen: Sequence[NodeAllocation]) -> list[dict[str, Any]]:
    return [
        {
            "agent_id": a.agent_id,
            "device_name": a.device_name,
            "devices": [d.device_id for d in a.devices],
        }
        for a in chosen
    ]
