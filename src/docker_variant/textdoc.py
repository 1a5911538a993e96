"""What the bounded readers of outside files (``jsondoc``, ``tomldoc``, the host root's
sysfs files) share: reading a regular file only, bounded; strict UTF-8 decoding; and a nesting
check made before a recursive parser sees the text."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from docker_variant.errors import InvalidInputError

__all__ = ["NotRegularFileError", "decode_utf8", "nested_deeper", "read_regular_file"]


class NotRegularFileError(OSError):
    """A FIFO, a device (``/dev/zero``), a socket or a directory where a file should be."""


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``. Opened without blocking, so a
    FIFO with no writer is refused at once instead of waited on; anything but a regular file
    is ``NotRegularFileError``; a symlink loop or a missing file is the ``OSError`` of open."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
        return handle.read(limit)


def decode_utf8(data: bytes, what: str, kind: str) -> str:
    """``data`` as strict UTF-8; ``what`` names the document and ``kind`` its format in the
    one-line error."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"{what}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); "
            f"{kind} must be UTF-8"
        ) from None


def nested_deeper(text: str, tokens: re.Pattern[str], limit: int) -> bool:
    """Whether the brackets ``tokens`` finds in ``text`` nest deeper than ``limit``.
    ``tokens`` matches whole strings and comments too (so brackets in them do not count)
    and each bracket alone; one linear pass, no recursion."""
    depth = 0
    for match in tokens.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False
