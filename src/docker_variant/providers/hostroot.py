"""The host root: where file-based detection reads the host's files (``sys/``, ``opt/rocm``).

Default ``/``; an agent in a container with the host's ``/sys`` mounted at ``/host/sys``
passes ``/host`` (Node Feature Discovery's convention). Reads are bounded (sysfs attributes
are a page at most), take regular files only (a FIFO or a device there is never waited on or
read on) and never follow a path out of the root through ``..``; a file that cannot be read
counts as absent, since sysfs attributes vanish with their devices.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from docker_variant.errors import InvalidInputError
from docker_variant.textdoc import read_regular_file

__all__ = ["HOST_ROOT_ENV", "MAX_FILE_BYTES", "HostRoot"]

HOST_ROOT_ENV = "DOCKER_VARIANT_HOST_ROOT"
MAX_FILE_BYTES = 64 * 1024  # a sysfs attribute is at most a page; a version file a line


@dataclass(frozen=True)
class HostRoot:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))  # a str works too

    @classmethod
    def resolve(cls, value: str | Path | None, env: Mapping[str, str] | None = None) -> HostRoot:
        """``value``, else ``$DOCKER_VARIANT_HOST_ROOT``, else ``/``; it must be a directory."""
        env = os.environ if env is None else env
        chosen = str(value) if value else env.get(HOST_ROOT_ENV) or "/"
        path = Path(chosen)
        if not path.is_dir():
            where = "--host-root" if value else HOST_ROOT_ENV
            raise InvalidInputError(f"{where} {chosen!r}: not a directory")
        return cls(path)

    def path(self, relative: str) -> Path:
        parts = Path(relative.lstrip("/")).parts
        if ".." in parts:
            raise InvalidInputError(f"{relative!r}: a path under the host root may not use '..'")
        return self.root.joinpath(*parts)

    def read_text(self, relative: str | Path) -> str | None:
        """The file's text (at most ``MAX_FILE_BYTES``), or ``None`` when it cannot be read."""
        path = relative if isinstance(relative, Path) else self.path(relative)
        try:  # a FIFO, /dev/zero or a loop where a sysfs file should be: absent, at once
            data = read_regular_file(path, MAX_FILE_BYTES)
        except OSError:
            return None
        return data.decode("utf-8", errors="replace")

    def first_line(self, relative: str | Path) -> str | None:
        text = self.read_text(relative)
        if text is None:
            return None
        line = text.splitlines()[0].strip() if text.strip() else ""
        return line or None

    def entries(self, relative: str) -> Iterator[Path]:
        """The entries of a directory, sorted by name; none when it is absent."""
        try:
            names = sorted(os.listdir(self.path(relative)))
        except OSError:
            return
        for name in names:
            yield self.path(relative) / name

    def __str__(self) -> str:
        return str(self.root)
