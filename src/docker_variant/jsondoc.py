"""JSON documents from outside (files, request bodies, headers, downloads), read safely.

One reader for every untrusted JSON input (registry manifests and token answers, the engine's
event stream, image tars, request bodies, the scheduler's answers): a document over
``max_bytes`` (``MAX_BYTES`` unless a caller says less) is refused before it is parsed, bytes
are decoded as strict UTF-8, the text is refused when nested deeper than ``MAX_DEPTH`` (the
documents here are at most a few levels deep; a 100,000-deep array would otherwise exhaust
the parser's recursion), ``NaN`` and ``Infinity`` are refused as JSON refuses them, and every
failure is one ``InvalidInputError`` line naming the document and the rule.
``read_json_stream`` reads a file-like object with the same bound, so nothing past it is
ever held.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import IO, Any

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.textdoc import decode_utf8, nested_deeper

__all__ = ["MAX_BYTES", "MAX_DEPTH", "load_json", "read_json_file", "read_json_stream"]

MAX_DEPTH = 32
#: The largest document any reader here takes unless its caller gives a smaller bound.
MAX_BYTES = 64 << 20

# A JSON string (skipped whole, so brackets inside it do not count) or a bracket.
_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')


def load_json(
    data: bytes | str, what: str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES
) -> Any:
    """Parse ``data`` (UTF-8 bytes or text) of at most ``max_bytes``; ``what`` names it in
    errors."""
    if len(data) > max_bytes:  # text: characters, each at least one byte
        raise InvalidInputError(f"{what}: larger than the {max_bytes} bytes allowed")
    text = decode_utf8(data, what, "JSON documents") if isinstance(data, bytes) else data
    text = text.removeprefix("\ufeff")  # a byte-order mark is harmless; say nothing
    if nested_deeper(text, _TOKENS, max_depth):
        raise InvalidInputError(
            f"{what}: JSON nested more than {max_depth} levels deep; documents here "
            "need at most a few"
        )
    try:
        return json.loads(text, parse_constant=_not_json)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise InvalidInputError(f"{what}: JSON nested too deeply") from None
    except ValueError as exc:
        raise InvalidInputError(f"{what}: not valid JSON ({one_line(str(exc))})") from None


def _not_json(name: str) -> Any:
    """``NaN``, ``Infinity``, ``-Infinity``: Python's ``json`` takes them, JSON (and Go's
    decoder, which registries and Docker use) does not."""
    raise ValueError(f"{name} is not a JSON value")


def read_json_file(path: str | Path, what: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """A JSON file, read whole up to ``max_bytes``; ``what`` names it in errors."""
    try:
        with Path(path).open("rb") as handle:
            return read_json_stream(handle, what, max_bytes=max_bytes)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InvalidInputError(f"{what}: cannot read it ({reason})") from exc


def read_json_stream(stream: IO[bytes], what: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """A JSON document read from ``stream`` (a file, a tar member) up to ``max_bytes``: one
    byte more is read to tell a document at the bound from one past it, never more."""
    data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InvalidInputError(f"{what}: larger than {max_bytes} bytes")
    return load_json(data, what, max_bytes=max_bytes)
