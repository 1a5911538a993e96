"""The wire shapes that the node agent and the scheduler both speak: the rules for the
names a heartbeat carries. Both sides import them from here, so that a node agent never
loads the scheduler's server to check an id."""

from docker_variant.api.names import (
    DEFAULT_RESOURCE_GROUP,
    DEVICE_NAME,
    ID,
    SHORT_NAME,
    NameRule,
    check_agent_id,
)

__all__ = [
    "DEFAULT_RESOURCE_GROUP",
    "DEVICE_NAME",
    "ID",
    "SHORT_NAME",
    "NameRule",
    "check_agent_id",
]
