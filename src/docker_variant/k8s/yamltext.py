"""Block-style YAML for the manifests this package writes, without a YAML library.

Only what a manifest holds: mappings, lists, strings, integers, booleans and null. A string
is written plain only when it is an identifier-like word YAML cannot read as anything else
(``gpu``, ``resource.k8s.io/v1``; not ``null``, ``on`` or ``12.8``); otherwise single-quoted
when it is printable ASCII (CEL expressions read as written: only ``'`` is doubled), else
double-quoted with JSON's escapes (YAML's double-quoted style is a superset of JSON strings).
No value can turn into another type or break the layout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

__all__ = ["dump_yaml"]

_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*")
_RESERVED = frozenset(
    {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}
)  # YAML 1.1 booleans and null, in any case


def _string(text: str) -> str:
    if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    if all(" " <= c <= "~" for c in text):
        return "'" + text.replace("'", "''") + "'"
    return json.dumps(text)


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"mapping keys must be strings, got {key!r}")
    return _string(key)


def _scalar(value: object) -> str | None:
    """The inline form of ``value``, or ``None`` if it needs a block of its own."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping) and not value:
        return "{}"
    if isinstance(value, Sequence) and not value:
        return "[]"
    if isinstance(value, Mapping | Sequence):
        return None
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _lines(value: object, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, Mapping):
        out: list[str] = []
        for key, item in value.items():
            inline = _scalar(item)
            if inline is not None:
                out.append(f"{pad}{_key(key)}: {inline}")
            else:
                out.append(f"{pad}{_key(key)}:")
                out.extend(_lines(item, indent + 2))
        return out
    if isinstance(value, Sequence) and not isinstance(value, str):
        out = []
        for item in value:
            inline = _scalar(item)
            if inline is not None:
                out.append(f"{pad}- {inline}")
                continue
            block = _lines(item, indent + 2)
            out.append(f"{pad}- {block[0].lstrip()}")
            out.extend(block[1:])
        return out
    return [f"{pad}{_scalar(value)}"]


def dump_yaml(document: Mapping[str, object]) -> str:
    """One YAML document, ending in a newline."""
    return "\n".join(_lines(document, 0)) + "\n"
