"""The rule for every name a heartbeat or a request carries (agent and device ids, device
names, resource groups, token owners, what-if templates)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from docker_variant.errors import InvalidInputError

__all__ = [
    "DEFAULT_RESOURCE_GROUP",
    "DEVICE_NAME",
    "ID",
    "SHORT_NAME",
    "NameRule",
    "check_agent_id",
]

DEFAULT_RESOURCE_GROUP = "default"


@dataclass(frozen=True)
class NameRule:
    """The one rule for every name the scheduler is sent (agent and device ids, device
    names, resource groups, token owners, what-if templates): letters, digits and
    ``. _ : @ + -``, starting with a letter or digit, at most ``length`` characters; device
    names may also hold ``/`` (``nvidia.com/gpu``). Agent ids travel in URL paths: no ``/``.
    """

    length: int
    slash: bool = False

    @property
    def pattern(self) -> re.Pattern[str]:
        return _name_pattern(self.length, self.slash)

    @property
    def text(self) -> str:
        rule = "letters, digits and . _ : @ + -, starting with a letter or digit"
        return f"{rule}, at most {self.length}{' (and /)' if self.slash else ''}"

    def matches(self, value: object) -> bool:
        return isinstance(value, str) and self.pattern.fullmatch(value) is not None

    def check(self, value: object, what: str) -> str:
        """``value`` when it follows the rule, else one line naming it (``what``)."""
        if not self.matches(value):
            raise InvalidInputError(f"{what} {value!r} is not valid: {self.text}")
        assert isinstance(value, str)
        return value


@functools.cache
def _name_pattern(length: int, slash: bool) -> re.Pattern[str]:
    chars = "A-Za-z0-9._:@+" + ("/" if slash else "") + "-"
    return re.compile(f"[A-Za-z0-9][{chars}]{{0,{length - 1}}}")


ID = NameRule(255)  # agent ids, device ids, resource groups
DEVICE_NAME = NameRule(255, slash=True)
SHORT_NAME = NameRule(64)  # token owners, what-if templates


def check_agent_id(value: object) -> str:
    return ID.check(value, "agent_id")
