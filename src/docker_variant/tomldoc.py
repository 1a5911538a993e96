"""TOML documents from outside (the build matrix, the scheduler's token file, device
descriptors), read safely: the one TOML reader, as ``jsondoc`` is the one JSON reader.

A file over ``max_bytes`` (``MAX_BYTES`` unless a caller says less) is refused after reading
at most one byte more (``/dev/zero`` or a fifo is not read on), the bytes are decoded as
strict UTF-8, arrays and inline tables nested deeper than ``MAX_DEPTH`` are refused before
parsing (tomllib recurses once per level), and every failure, a number too long for
Python's int included, is one ``InvalidInputError`` line naming the file and the rule.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.textdoc import (
    NotRegularFileError,
    decode_utf8,
    nested_deeper,
    read_regular_file,
)

__all__ = ["MAX_BYTES", "MAX_DEPTH", "load_toml", "read_toml_file"]

#: The largest TOML file any reader here takes unless its caller gives a smaller bound.
MAX_BYTES = 1 << 20
MAX_DEPTH = 32

# A string or comment (skipped whole, so brackets inside do not count), or a bracket. Table
# headers ([t], [[t]]) open and close on their line, so they count one or two levels.
_TOKENS = re.compile(
    r'"""(?:[^"\\]++|\\.|"(?!""))*+"""'
    r"|'''(?:[^']++|'(?!''))*+'''"
    r'|"(?:[^"\\\n]++|\\.)*+"'
    r"|'[^'\n]*+'"
    r"|#[^\n]*+"
    r"|[\[\]{}]"
)


def load_toml(
    data: bytes, what: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> dict[str, Any]:
    """Parse ``data`` of at most ``max_bytes``; ``what`` names it in errors."""
    if len(data) > max_bytes:
        raise InvalidInputError(f"{what}: larger than the {max_bytes} bytes allowed")
    text = decode_utf8(data, what, "TOML files")
    if nested_deeper(text, _TOKENS, max_depth):
        raise InvalidInputError(
            f"{what}: arrays or tables nested more than {max_depth} levels deep; "
            "files here need at most a few"
        )
    try:
        return tomllib.loads(text)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise InvalidInputError(f"{what}: TOML nested too deeply") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInputError(f"{what}: not valid TOML ({one_line(str(exc))})") from None
    except ValueError:  # int()'s digit limit
        raise InvalidInputError(
            f"{what}: a number of more than {sys.get_int_max_str_digits()} digits"
        ) from None


def read_toml_file(path: str | Path, what: str, *, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """A TOML file, read up to ``max_bytes`` (and one byte more, to tell it is over). Only a
    regular file is read: a FIFO, a device (``/dev/zero``) or a socket is refused without
    waiting on it, and a symlink loop is a failure to open."""
    try:
        data = read_regular_file(path, max_bytes + 1)
    except NotRegularFileError:
        raise InvalidInputError(f"{what}: not a regular file") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InvalidInputError(f"{what}: cannot read it ({reason})") from None
    return load_toml(data, what, max_bytes=max_bytes)
