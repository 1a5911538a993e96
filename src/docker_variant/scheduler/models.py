"""The scheduler's tables (SQLAlchemy Core; the same schema on SQLite and PostgreSQL).

- ``profiles``: supported-lists documents, named by their content hash, so that thousands of
  identical GPUs store (and parse) their lists once.
- ``agents`` and ``devices``: the last report of each agent; a report replaces its devices.
- ``cordons``: the agents an admin cordoned (or drained): no new placement goes to them. Not a
  column of ``agents`` and not tied to it, so that a drained agent that reports again is still
  cordoned; created by ``create_all`` in an older database (a new table, nothing to migrate).
- ``pool_version``: one row, one counter, bumped by every report that changes an agent's
  resource group, lists or devices (not by plain heartbeats), by deleting an agent, and by a
  cordon or uncordon.
- ``allocation_version``: the same for allocations, bumped by every placement and every
  release. While both are unchanged, a scheduler process plans on the pool it keeps in
  memory without reading it; it applies its own changes to that pool as it commits them, and
  re-reads only what another process (a replica on the same database) changed.
- ``placements`` and ``allocations``: one allocation row per device and placement, with the
  shares it takes (NULL: the whole device). Allocations do not reference ``devices``: a device
  that vanishes from a report while allocated keeps its allocation until the placement is
  deleted (or replaced). A placement's ``state`` is ``active`` or ``degraded`` (with the
  reason and the time); ``request`` keeps what the client asked, for ``replace``; ``owner``
  the client that made it (as its document says), indexed for the per-client quota.
- ``device_usage``: one row per device in use, with the shares used and the device's capacity
  (both in millionths). This is what makes over-commitment impossible, whatever the
  concurrency: a whole device is taken by inserting its row (the primary key refuses a second
  row), a share by an upsert adding to ``used``, which the ``used <= capacity`` check refuses
  past the capacity; either way the losing transaction rolls back as a whole. Rows are
  deleted when nothing uses the device any more.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    true,
)

__all__ = [
    "agents",
    "allocation_version",
    "allocations",
    "cordons",
    "device_usage",
    "devices",
    "metadata",
    "placements",
    "pool_version",
    "profiles",
]

metadata = MetaData()

_ID = 255
_HASH = 64

profiles = Table(
    "profiles",
    metadata,
    Column("id", String(_HASH), primary_key=True),
    Column("lists", Text, nullable=False),  # JSON, key order kept (it is preference order)
)

agents = Table(
    "agents",
    metadata,
    Column("agent_id", String(_ID), primary_key=True),
    Column("resource_group", String(_ID), nullable=False, index=True),
    Column("host_profile", String(_HASH), ForeignKey("profiles.id"), nullable=False),
    Column("first_seen", Float, nullable=False),  # epoch seconds
    Column("last_seen", Float, nullable=False, index=True),  # agents past the TTL: a range
    Column("platform", String(64), nullable=True),  # as reported; NULL: from the CPU lists
)

devices = Table(
    "devices",
    metadata,
    Column(
        "agent_id",
        String(_ID),
        ForeignKey("agents.agent_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("device_name", String(_ID), primary_key=True),
    Column("device_id", String(_ID), primary_key=True),
    Column("profile", String(_HASH), ForeignKey("profiles.id"), nullable=False),
    # in millionths of a share (documents.SHARE): one share unless the agent says otherwise
    Column("capacity", BigInteger, nullable=False, default=1_000_000, server_default="1000000"),
    Column("healthy", Boolean, nullable=False, default=True, server_default=true()),
)

cordons = Table(
    "cordons",
    metadata,
    Column("agent_id", String(_ID), primary_key=True),
    Column("since", Float, nullable=False),  # epoch seconds
)

pool_version = Table(
    "pool_version",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1
    Column("version", BigInteger, nullable=False),
)

allocation_version = Table(
    "allocation_version",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1
    Column("version", BigInteger, nullable=False),
)

placements = Table(
    "placements",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("created_at", Float, nullable=False, index=True),
    Column("document", Text, nullable=False),  # the JSON answer to POST, served by GET
    Column("state", String(16), nullable=False, default="active", server_default="active"),
    Column("degraded_reason", Text, nullable=True),
    Column("degraded_since", Float, nullable=True),  # epoch seconds
    Column("request", Text, nullable=True),  # the placement request, JSON
    Column("owner", String(_ID), nullable=True),  # NULL only until an older database is opened
    Index("ix_placements_state", "state"),
    Index("ix_placements_owner", "owner"),
)

allocations = Table(
    "allocations",
    metadata,
    Column("agent_id", String(_ID), primary_key=True),
    Column("device_name", String(_ID), primary_key=True),
    Column("device_id", String(_ID), primary_key=True),
    Column(
        "placement_id",
        String(32),
        ForeignKey("placements.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("shares", BigInteger, nullable=True),  # millionths; NULL: the whole device
    Index("ix_allocations_placement_id", "placement_id"),
)

device_usage = Table(
    "device_usage",
    metadata,
    Column("agent_id", String(_ID), primary_key=True),
    Column("device_name", String(_ID), primary_key=True),
    Column("device_id", String(_ID), primary_key=True),
    Column("used", BigInteger, nullable=False),  # millionths of a share
    Column("capacity", BigInteger, nullable=False),
    Column("whole", Boolean, nullable=False),  # taken whole: no share may join
    CheckConstraint("used <= capacity", name="ck_device_usage_within_capacity"),
)
