"""The OCI grammar of tags and digests, pure, for every layer that checks them (references,
index documents). Each check returns what is wrong, or ``None``."""

from __future__ import annotations

import re

__all__ = ["TAG_RULE", "digest_problem", "tag_problem"]

TAG_RULE = r"[\w][\w.-]{0,127}"
_TAG_RE = re.compile(TAG_RULE, re.ASCII)
_DIGEST_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_DIGEST_LENGTHS = {"sha256": 64, "sha512": 128}
_HEX_RE = re.compile(r"[a-f0-9]+")
# The image spec's general form, for documents that only carry digests along.
_ANY_DIGEST_RE = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+")


def tag_problem(tag: str) -> str | None:
    if not isinstance(tag, str) or not _TAG_RE.fullmatch(tag):
        return f"tag {tag!r} does not match {TAG_RULE}"
    return None


def digest_problem(digest: str, *, strict: bool = True) -> str | None:
    """``strict``: as Docker parses a reference (known algorithms at their length); else the
    image spec's grammar ``algorithm:encoded`` only."""
    if not strict:
        if isinstance(digest, str) and _ANY_DIGEST_RE.fullmatch(digest):
            return None
        return f"digest {digest!r} is not algorithm:encoded (e.g. sha256:<64 hex digits>)"
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        return f"digest {digest!r} is not algorithm:hex (at least 32 hex digits)"
    algorithm, _, encoded = digest.partition(":")
    length = _DIGEST_LENGTHS.get(algorithm)
    if length is not None and (len(encoded) != length or not _HEX_RE.fullmatch(encoded)):
        return f"digest {digest!r}: {algorithm} needs {length} lowercase hex digits"
    return None
