"""Who may call the scheduler: bearer tokens with a role, from a TOML file (``--tokens``).

```toml
[[token]]
role = "agent"          # may only PUT the heartbeat of its own agent_id
agent_id = "h200-a"
sha256 = "9f86d0..."    # hex SHA-256 of the token (or token = "...", the token itself)

[[token]]
role = "client"         # may create placements, and list, read and delete its own
name = "ci"
token = "..."

[[token]]
role = "admin"          # anything, including DELETE /v1/agents/{id}
name = "ops"
sha256 = "..."
```

Tokens are kept as SHA-256 digests and compared in constant time (``hmac.compare_digest``
against every entry), and never logged. A literal token shorter than 16 characters is taken,
with a warning at start-up: how strong a token must be is the operator's call, and the same
token given by its ``sha256`` could not be measured at all.

The file is read again when it changes (``TokenFile``: one ``stat`` per lookup sees a new
inode, size or modification time, as when a Kubernetes Secret volume swaps its files) and on
SIGHUP (at the next lookup), without a restart. A new file that does not load is logged and
ignored: the tokens read last stay in force.

A name is one role's: an ``agent_id`` that is also a client's or an admin's name (or a client
named as an admin) is refused when the file loads, since placements record their owner by
name. Several tokens of one name and role (a rotation) are one owner.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from docker_variant.api.names import SHORT_NAME, check_agent_id
from docker_variant.errors import InvalidInputError
from docker_variant.tomldoc import read_toml_file

__all__ = ["ANONYMOUS", "Principal", "TokenFile", "TokenTable", "load_tokens"]

Role = Literal["agent", "client", "admin"]
_ROLES: tuple[Role, ...] = ("agent", "client", "admin")
_HEX = re.compile(r"[0-9a-f]{64}")
_MIN_TOKEN = 16

_log = logging.getLogger("docker_variant.scheduler")


@dataclass(frozen=True)
class Principal:
    role: Role
    name: str  # the owner named on placements; an agent's is its agent id
    agent_id: str | None = None

    def may_report(self, agent_id: str) -> bool:
        return self.role == "admin" or (self.role == "agent" and self.agent_id == agent_id)

    def may_own(self, owner: str | None) -> bool:
        """Whether the placement of ``owner`` is this caller's to see and delete: an agent
        makes none, so it owns none, even of a client that shares its name."""
        return self.role == "admin" or (self.role != "agent" and owner == self.name)


#: The caller when no ``--tokens`` are configured (loopback only): may do anything.
ANONYMOUS = Principal("admin", "anonymous")


class TokenTable:
    def __init__(
        self, entries: Iterable[tuple[bytes, Principal]], warnings: Iterable[str] = ()
    ) -> None:
        self._entries = list(entries)
        self.warnings = list(warnings)  # said once at start-up (short literal tokens)

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, token: str) -> Principal | None:
        """The principal of ``token``; every entry is compared, in constant time."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for known, principal in self._entries:
            if hmac.compare_digest(known, digest):
                found = principal
        return found


class TokenFile:
    """The tokens of ``path``, read again when the file changes or on ``reload`` (SIGHUP)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._asked = False  # by ``ask_reload``: read again at the next lookup
        self._stamp = self._stamp_now()
        self._table = load_tokens(path)  # InvalidInputError at start: the server does not run

    @property
    def warnings(self) -> list[str]:
        return self._table.warnings

    def __len__(self) -> int:
        return len(self._table)

    def _stamp_now(self) -> tuple[int, int, int] | None:
        try:
            found = os.stat(self.path)
        except OSError:
            return None  # a Secret's files being swapped: the next lookup sees the new one
        return found.st_ino, found.st_size, found.st_mtime_ns

    def find(self, token: str) -> Principal | None:
        if self._asked or self._stamp_now() != self._stamp:
            self._asked = False
            self.reload()
        return self._table.find(token)

    def ask_reload(self) -> None:
        """Read the file again at the next lookup: safe in a signal handler (SIGHUP), which
        may run in the middle of a reload or of a log line, where reading and logging are not."""
        self._asked = True

    def reload(self) -> bool:
        """Read the file again; False (logged) when it does not load: the old tokens stay."""
        with self._lock:
            self._stamp = self._stamp_now()
            try:
                table = load_tokens(self.path)
            except InvalidInputError as exc:
                _log.error("tokens not reloaded, the previous ones stay in force: %s", exc)
                return False
            for warning in table.warnings:
                _log.warning("%s", warning)
            self._table = table
        _log.info("tokens reloaded from %s: %d tokens", self.path, len(table))
        return True


def load_tokens(path: Path) -> TokenTable:
    where = f"tokens file {str(path)!r}"
    data = read_toml_file(path, where)
    raw = data.get("token")
    if not isinstance(raw, list) or not raw:
        raise InvalidInputError(f"{where}: no [[token]] entries")
    entries = [_entry(item, f"{where}: token[{i}]") for i, item in enumerate(raw, start=1)]
    digests = [d for d, _ in entries]
    if len(set(digests)) != len(digests):
        raise InvalidInputError(f"{where}: the same token appears twice")
    first: dict[str, tuple[int, Role]] = {}  # name -> (its first entry, role)
    for i, (_, principal) in enumerate(entries, start=1):
        seen, role = first.setdefault(principal.name, (i, principal.role))
        if role != principal.role:
            raise InvalidInputError(
                f"{where}: name {principal.name!r} is both {_whose(role)} (token[{seen}]) and "
                f"{_whose(principal.role)} (token[{i}]); give each role its own names"
            )
    short = [
        f"{where}: token[{i}] has fewer than {_MIN_TOKEN} characters, easy to guess"
        for i, item in enumerate(raw, start=1)
        if isinstance(item.get("token"), str) and len(item["token"]) < _MIN_TOKEN
    ]
    return TokenTable(entries, short)


def _whose(role: Role) -> str:
    return f"{'an' if role[0] in 'aeiou' else 'a'} {role}'s"


def _entry(item: object, where: str) -> tuple[bytes, Principal]:
    if not isinstance(item, Mapping):
        raise InvalidInputError(f"{where}: must be a table")
    unknown = sorted(set(item) - {"role", "name", "agent_id", "token", "sha256"})
    if unknown:
        raise InvalidInputError(f"{where}: unknown key {unknown[0]!r}")
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidInputError(f"{where}: role {role!r} is not one of agent, client, admin")
    if ("token" in item) == ("sha256" in item):
        raise InvalidInputError(f"{where}: give exactly one of token or sha256")
    if "token" in item:
        token = item["token"]
        if not isinstance(token, str) or not token:
            raise InvalidInputError(f"{where}: token must be a non-empty string")
        digest = hashlib.sha256(token.encode()).digest()
    else:
        hexed = item["sha256"]
        if not isinstance(hexed, str) or not _HEX.fullmatch(hexed):
            raise InvalidInputError(f"{where}: sha256 must be 64 lowercase hex digits")
        digest = bytes.fromhex(hexed)
    if role == "agent":
        agent_id = check_agent_id(item.get("agent_id"))
        return digest, Principal("agent", agent_id, agent_id)
    if "agent_id" in item:
        raise InvalidInputError(f"{where}: only an agent token names an agent_id")
    name = item.get("name")
    if not SHORT_NAME.matches(name):
        article = "an" if role[0] in "aeiou" else "a"
        raise InvalidInputError(f"{where}: {article} {role} token needs a name ({SHORT_NAME.text})")
    assert isinstance(name, str)
    return digest, Principal(role, name)
