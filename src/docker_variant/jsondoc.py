"""JSON documents from outside (files, request bodies, headers, downloads), read safely.

One reader for every untrusted JSON input: bytes are decoded as strict UTF-8, the text is
refused when nested deeper than ``MAX_DEPTH`` (the documents of SPEC sections 4, 5 and 8 are
at most five deep; a 100,000-deep array would otherwise exhaust the parser's recursion), and
every failure is one ``InvalidInputError`` line naming the document and the rule.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from docker_variant.errors import InvalidInputError, one_line

__all__ = ["MAX_DEPTH", "load_json", "read_json_file"]

MAX_DEPTH = 32

# A JSON string (skipped whole, so brackets inside it do not count) or a bracket.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_depth(text: str, what: str, limit: int) -> None:
    depth = 0
    for match in _TOKENS.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                raise InvalidInputError(
                    f"{what}: JSON nested more than {limit} levels deep; documents here "
                    "need at most a few"
                )
        elif char in "]}":
            depth -= 1


def load_json(data: bytes | str, what: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``data`` (UTF-8 bytes or text); ``what`` names it in errors."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"{what}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); "
                "JSON documents must be UTF-8"
            ) from None
    else:
        text = data
    text = text.removeprefix("\ufeff")  # a byte-order mark is harmless; say nothing
    _check_depth(text, what, max_depth)
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise InvalidInputError(f"{what}: JSON nested too deeply") from None
    except ValueError as exc:
        raise InvalidInputError(f"{what}: not valid JSON ({one_line(str(exc))})") from None


def read_json_file(path: str | Path, what: str, *, max_bytes: int = 64 << 20) -> Any:
    """A JSON file, read whole up to ``max_bytes``; ``what`` names it in errors."""
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InvalidInputError(f"{what}: cannot read it ({reason})") from exc
    if len(data) > max_bytes:
        raise InvalidInputError(f"{what}: larger than {max_bytes} bytes")
    return load_json(data, what)
