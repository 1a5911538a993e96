"""What one caller, one upload or one tenant's image may cost the proxy (docs/security.md).

Each bound has a default here and is set with ``variant-proxy --limit NAME=VALUE``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from docker_variant.errors import InvalidInputError

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True
if TYPE_CHECKING:
    from docker_variant.oci.client import ReadLimits

__all__ = ["DEFAULT_CACHE_TTL", "DEFAULT_UPSTREAM_TIMEOUT", "ProxyLimits", "parse_limit"]

#: how long an index may be served from the cache, and the deadline of a scan and of an
#: upstream's response headers (--cache-ttl, --upstream-timeout), in seconds
DEFAULT_CACHE_TTL = 30.0
DEFAULT_UPSTREAM_TIMEOUT = 30.0


@dataclass(frozen=True)
class ProxyLimits:
    #: blob uploads streamed upstream at once, in their own pool: reads keep theirs
    upload_connections: int = 64
    #: a manifest PUT is read whole, up to this, before it goes upstream
    manifest_bytes: int = 4 << 20
    #: an image config larger than this is listed invalid, never read
    config_bytes: int = 1 << 20
    #: labels in one image config
    labels: int = 1024
    #: the values of one image's ``dev.pep817.*`` labels, together
    variant_label_chars: int = 64 << 10
    #: one version's variant index document
    index_bytes: int = 8 << 20
    #: all the indexes this process caches (their documents' bytes)
    cache_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(
                    f"limit {_flag(field.name)} must be a whole number >= 1, got {value!r}"
                )

    def reads(self) -> ReadLimits:
        """What an index scan reads of each image."""
        from docker_variant.oci.client import ReadLimits  # httpx: not for --help

        return ReadLimits(
            config_bytes=self.config_bytes,
            labels=self.labels,
            variant_label_chars=self.variant_label_chars,
        )


def _flag(name: str) -> str:
    return name.replace("_", "-")


def names() -> list[str]:
    return [_flag(f.name) for f in dataclasses.fields(ProxyLimits)]


def parse_limit(limits: ProxyLimits, text: str) -> ProxyLimits:
    """``limits`` with one ``NAME=VALUE`` (``config-bytes=2097152``) applied."""
    name, sep, value = text.partition("=")
    field = name.strip().replace("-", "_")
    if not sep or field not in {f.name for f in dataclasses.fields(ProxyLimits)}:
        raise InvalidInputError(
            f"--limit {text!r}: expected NAME=VALUE with NAME one of {', '.join(names())}"
        )
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 15:
        raise InvalidInputError(f"--limit {text!r}: {value!r} is not a whole number")
    return dataclasses.replace(limits, **{field: int(value)})
