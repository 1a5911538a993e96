"""Parse and validate ``/v2/...`` request paths before anything goes upstream.

Routes are matched on the *raw* (still percent-encoded) path, from the right, because a
repository name may itself contain ``/`` and even words like ``manifests``. Every part
that ends up in an upstream URL (name, reference, digest, upload id) is checked against
the distribution grammar (``oci.grammar``, the one home of its rules), so an upstream URL is
only ever built from validated parts and can never leave the upstream's ``/v2/`` API (no
``..``, no encoded ``.`` or ``/``). A path longer than any route is refused on its length
before any pattern looks at it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property, lru_cache
from urllib.parse import unquote

from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.grammar import (
    DIGEST_MAX,
    NAME_MAX,
    NAME_RULE,
    TAG_RULE,
    digest_problem,
    is_digest,
    name_problem,
    tag_problem,
)

__all__ = ["PathError", "Route", "RouteKind", "check_name", "parse_v2_path"]

# Upload session ids are opaque: distribution uses UUIDs, others base64url; no '%' or '/'.
_UPLOAD_ID_RE = re.compile(r"[A-Za-z0-9_=-][A-Za-z0-9._=~-]{0,511}+")
# No valid route is longer (a name, a route word and a digest or an upload id): a longer
# path is refused on its length before any pattern looks at it.
_PATH_MAX = len("/v2/") + NAME_MAX + len("/blobs/uploads/") + DIGEST_MAX


class RouteKind(StrEnum):
    """Route classes, also the ``route`` label of metrics and logs."""

    BASE = "base"  # /v2/
    CATALOG = "catalog"  # /v2/_catalog
    DISCOVER = "discover"  # /v2/_oci/ext/discover and /v2/<name>/_oci/ext/discover
    VARIANTS = "variants"  # /v2/<name>/_variants/<version>
    MANIFEST = "manifest"  # /v2/<name>/manifests/<reference>
    BLOB = "blob"  # /v2/<name>/blobs/<digest>
    UPLOAD = "upload"  # /v2/<name>/blobs/uploads/[<id>]
    TAGS = "tags"  # /v2/<name>/tags/list
    REFERRERS = "referrers"  # /v2/<name>/referrers/<digest>
    UNKNOWN = "unknown"  # under /v2/ but no distribution route
    INVALID = "invalid"  # a route whose parts fail validation
    HEALTH = "healthz"
    METRICS = "metrics"
    OTHER = "other"  # outside /v2/


@dataclass(frozen=True)
class Route:
    kind: RouteKind
    name: str | None = None
    reference: str | None = None  # tag/digest, blob digest, upload id or variants version

    def upstream_path(self) -> str:
        """The upstream path, rebuilt from the validated parts only."""
        path = self._upstream
        if path is None:
            raise ValueError(f"route {self.kind} is not forwarded upstream")
        return path

    # parse_v2_path keeps its routes, and a pull asks for each many times: built once
    @cached_property
    def _upstream(self) -> str | None:
        name, ref = self.name, self.reference or ""
        match self.kind:
            case RouteKind.BASE:
                return "/v2/"
            case RouteKind.CATALOG:
                return "/v2/_catalog"
            case RouteKind.MANIFEST:
                return f"/v2/{name}/manifests/{ref}"
            case RouteKind.BLOB:
                return f"/v2/{name}/blobs/{ref}"
            case RouteKind.UPLOAD:
                return f"/v2/{name}/blobs/uploads/{ref}"
            case RouteKind.TAGS:
                return f"/v2/{name}/tags/list"
            case RouteKind.REFERRERS:
                return f"/v2/{name}/referrers/{ref}"
        return None


class PathError(Exception):
    """A ``/v2/`` path that fails validation: answered with this OCI error (its status the
    code's)."""

    def __init__(self, code: ErrorCode, message: str, detail: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


# Matched on the part after "/v2/", from the right (greedy name, fixed suffix).
_ROUTES: list[tuple[re.Pattern[str], RouteKind]] = [
    (re.compile(r"(?P<name>.+)/_variants/(?P<ref>[^/]*)"), RouteKind.VARIANTS),
    (re.compile(r"(?P<name>.+)/manifests/(?P<ref>[^/]*)"), RouteKind.MANIFEST),
    (re.compile(r"(?P<name>.+)/blobs/uploads/(?P<ref>[^/]*)"), RouteKind.UPLOAD),
    (re.compile(r"(?P<name>.+)/blobs/(?P<ref>[^/]*)"), RouteKind.BLOB),
    (re.compile(r"(?P<name>.+)/tags/list"), RouteKind.TAGS),
    (re.compile(r"(?P<name>.+)/referrers/(?P<ref>[^/]*)"), RouteKind.REFERRERS),
    (re.compile(r"(?P<name>.+)/_oci/ext/discover"), RouteKind.DISCOVER),
]


def check_name(name: str) -> None:
    if name_problem(name):
        shown = name if len(name) <= NAME_MAX else name[:NAME_MAX] + "..."
        raise PathError(
            ErrorCode.NAME_INVALID,
            f"invalid repository name {shown!r}: must be {NAME_RULE}, at most {NAME_MAX} "
            "characters",
            shown,
        )


def _check_reference(kind: RouteKind, ref: str) -> None:
    if kind is RouteKind.UPLOAD:
        if ref and not (_UPLOAD_ID_RE.fullmatch(ref) and ".." not in ref):
            raise PathError(ErrorCode.BLOB_UPLOAD_INVALID, f"invalid upload id {ref!r}", ref)
        return
    if kind in (RouteKind.BLOB, RouteKind.REFERRERS) or (
        kind is RouteKind.MANIFEST and is_digest(ref)
    ):
        if problem := digest_problem(ref, strict=False):
            raise PathError(ErrorCode.DIGEST_INVALID, f"invalid digest: {problem}", ref)
        return
    if kind is RouteKind.MANIFEST and tag_problem(ref):
        # As the registry answers: no manifest has that name (the conformance suite asks
        # for ".INVALID_MANIFEST_NAME"). Traversal never reaches here (refused above).
        raise PathError(
            ErrorCode.MANIFEST_UNKNOWN,
            f"manifest unknown: {ref!r} is not a tag ({TAG_RULE})",
            ref,
        )
    if kind is RouteKind.VARIANTS and tag_problem(ref):
        raise PathError(
            ErrorCode.TAG_INVALID, f"invalid version {ref!r}: must match {TAG_RULE}", ref
        )


# Pulls ask for the same manifests and blobs over and over: parses are kept (refusals, which
# raise, are not).
@lru_cache(maxsize=4096)
def parse_v2_path(raw_path: str) -> Route:
    """Classify a raw request path; raises ``PathError`` for an invalid ``/v2/`` route.

    ``raw_path`` is the path exactly as sent (percent-encoded, no query string).
    """
    if raw_path in ("/v2", "/v2/"):
        return Route(RouteKind.BASE)
    if not raw_path.startswith("/v2/"):
        return Route(RouteKind.OTHER)
    if len(raw_path) > _PATH_MAX:
        raise PathError(
            ErrorCode.NAME_INVALID,
            f"request path of {len(raw_path)} characters is longer than any distribution "
            f"route ({_PATH_MAX}); a repository name is at most {NAME_MAX}",
            raw_path[:NAME_MAX] + "...",
        )
    decoded = unquote(raw_path)
    # Path traversal, raw or encoded: refused before any routing, whatever the route.
    for text in (raw_path, decoded):
        if ".." in text or "%2e" in text.lower() or "//" in text:
            raise PathError(
                ErrorCode.NAME_INVALID,
                "path traversal or empty path segment in the request path",
                raw_path,
            )
    rest = raw_path[len("/v2/") :]
    if rest == "_catalog":
        return Route(RouteKind.CATALOG)
    if rest == "_oci/ext/discover":
        return Route(RouteKind.DISCOVER)
    for pattern, kind in _ROUTES:
        match = pattern.fullmatch(rest)
        if match is None:
            continue
        name = match["name"]
        # The grammar has no '%', so any encoded character in a name is refused here.
        check_name(name)
        ref = match.groupdict().get("ref")
        if ref is not None:
            _check_reference(kind, ref)
        return Route(kind, name, ref)
    return Route(RouteKind.UNKNOWN)
