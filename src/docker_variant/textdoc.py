"""What the bounded document readers (``jsondoc``, ``tomldoc``) share: strict UTF-8 decoding
and a nesting check made before a recursive parser sees the text."""

from __future__ import annotations

import re

from docker_variant.errors import InvalidInputError

__all__ = ["decode_utf8", "nested_deeper"]


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
