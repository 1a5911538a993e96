"""The scheduler's tables (SQLAlchemy Core; the same schema on SQLite and PostgreSQL).

- ``profiles``: supported-lists documents, named by their content hash, so that thousands of
  identical GPUs store (and parse) their lists once.
- ``agents`` and ``devices``: the last report of each agent; a report replaces its devices.
- ``pool_version``: one row, one counter, bumped by every report that changes an agent's
  resource group, lists or devices (not by plain heartbeats), and by deleting an agent.
- ``allocation_version``: the same for allocations, bumped by every placement and every
  release. While both are unchanged, a scheduler process plans on the pool it keeps in
  memory without reading it; it applies its own changes to that pool as it commits them, and
  re-reads only what another process (a replica on the same database) changed.
- ``placements`` and ``allocations``: one row per allocated device, whose primary key
  ``(agent_id, device_name, device_id)`` is what makes a second allocation of a device
  impossible, whatever the concurrency. Allocations do not reference ``devices``: a device
  that vanishes from a report while allocated keeps its allocation until the placement is
  deleted.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

__all__ = [
    "agents",
    "allocation_version",
    "allocations",
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
    Column("last_seen", Float, nullable=False),
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
        nullable=False,
    ),
    Index("ix_allocations_placement_id", "placement_id"),
)
