"""Image references, parsed the way Docker parses them (``distribution/reference``).

``app:1.0`` is ``docker.io/library/app:1.0``; the first component is a registry only when
it looks like a host (a ``.``, a ``:`` port, ``localhost``, or upper case), so
``myorg/app`` stays on Docker Hub and ``127.0.0.1:5000/app`` does not.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace

from docker_variant.errors import InvalidInputError
from docker_variant.oci.grammar import (
    DIGEST_MAX,
    NAME_MAX,
    NAME_RULE,
    TAG_MAX,
    digest_problem,
    domain_problem,
    name_problem,
    registry_problem,
    tag_problem,
)

__all__ = [
    "DOCKER_HUB",
    "Reference",
    "check_manifest_reference",
    "check_registry",
    "check_repository",
    "is_loopback",
    "parse_reference",
    "registry_base_url",
    "versioned_reference",
]

DOCKER_HUB = "docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
_HUB_API = "https://registry-1.docker.io"
# No valid reference is longer: a name of NAME_MAX (given through a longer Hub alias), a tag
# and a digest. Refused before anything else looks at the text.
REFERENCE_MAX = 2 * NAME_MAX + TAG_MAX + DIGEST_MAX
_IMAGE_ID_RE = re.compile(r"[a-f0-9]{64}")


def _bad(text: str, why: str) -> InvalidInputError:
    return InvalidInputError(f"invalid image reference {text!r}: {why}")


@dataclass(frozen=True)
class Reference:
    """``registry/repository[:tag][@digest]`` with Docker Hub names made explicit."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text

    def familiar(self) -> str:
        """The short form Docker prints: ``ubuntu:24.04`` rather than ``docker.io/library/...``."""
        text = str(self)
        if self.registry == DOCKER_HUB:
            text = text.removeprefix(f"{DOCKER_HUB}/").removeprefix("library/")
        return text

    def with_tag(self, tag: str) -> Reference:
        """The same repository at another tag (the digest of the old tag no longer applies)."""
        _check_tag(tag, f"{self.name}:{tag}")
        return replace(self, tag=tag, digest=None)

    def with_digest(self, digest: str) -> Reference:
        _check_digest(digest, f"{self.name}@{digest}")
        return replace(self, digest=digest)


def parse_reference(text: str) -> Reference:
    """Parse ``[registry/]repository[:tag][@digest]``; raises ``InvalidInputError``."""
    if not text:
        raise _bad(text, "empty reference")
    if len(text) > REFERENCE_MAX:
        raise InvalidInputError(
            f"invalid image reference {text[:80]!r}...: {len(text)} characters, longer than "
            f"any reference ({REFERENCE_MAX})"
        )
    if text != text.strip() or any(c.isspace() for c in text):
        raise _bad(text, "whitespace is not allowed")
    if _IMAGE_ID_RE.fullmatch(text):
        raise _bad(text, "a 64-character hex string is an image ID, not a repository name")

    rest, at, digest = text.partition("@")
    if at:
        _check_digest(digest, text)
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    tag: str | None = None
    if colon > slash:  # a ':' after the last '/' starts the tag, not a port
        rest, tag = rest[:colon], rest[colon + 1 :]
        _check_tag(tag, text)

    registry, path = _split_registry(rest, text)
    if not path:
        raise _bad(text, "missing repository name")
    if len(f"{registry}/{path}") > NAME_MAX:
        raise _bad(text, f"name is longer than {NAME_MAX} characters")
    if problem := name_problem(path):
        raise _bad(text, problem)
    return Reference(registry, path, tag, digest if at else None)


def versioned_reference(ref: str | Reference) -> Reference:
    """``registry/name:version``: ``ref`` parsed (unless it is already) and holding a tag,
    the version a variant index is read for."""
    reference = parse_reference(ref) if isinstance(ref, str) else ref
    if reference.tag is None:
        raise InvalidInputError(
            f"{reference}: a version tag is needed, e.g. {reference.name}:1.0.0"
        )
    return reference


def _split_registry(name: str, text: str) -> tuple[str, str]:
    first, slash, remainder = name.partition("/")
    # Docker's splitDockerDomain: only a host-looking first component names a registry.
    if not slash or (
        not any(c in first for c in ".:") and first != "localhost" and first == first.lower()
    ):
        registry, path = DOCKER_HUB, name
    else:
        if problem := domain_problem(first):
            raise _bad(text, problem)
        registry, path = first, remainder
    if registry in _HUB_ALIASES:
        registry = DOCKER_HUB
        if "/" not in path:
            path = f"library/{path}"
    return registry, path


def check_repository(repository: str) -> None:
    """Reject a repository path that is not Docker's grammar before it goes into a URL."""
    if name_problem(repository):
        shown = repository if len(repository) <= NAME_MAX else repository[:NAME_MAX] + "..."
        raise InvalidInputError(
            f"invalid repository name {shown!r}: must be {NAME_RULE}, at most {NAME_MAX} characters"
        )


def check_manifest_reference(reference: str) -> None:
    """A tag or a digest, as a ``/manifests/<reference>`` URL takes."""
    if ":" in reference:
        _check_digest(reference, reference)
    else:
        _check_tag(reference, reference)


def _check_tag(tag: str, text: str) -> None:
    if problem := tag_problem(tag):
        raise _bad(text, problem)


def _check_digest(digest: str, text: str) -> None:
    if problem := digest_problem(digest):
        raise _bad(text, problem)


def check_registry(registry: str) -> str:
    """``host[:port]`` as image references name a registry; the hosts directory's name."""
    if problem := registry_problem(registry):
        raise InvalidInputError(problem)
    return registry


def _host(registry: str) -> str:
    if registry.startswith("["):
        return registry[1 : registry.find("]")]
    return registry.partition(":")[0]


def is_loopback(registry: str) -> bool:
    host = _host(registry)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def registry_base_url(registry: str, *, tls: bool = False) -> str:
    """Where the distribution API of ``registry`` lives: plain HTTP on loopback only, unless
    ``tls`` (a CA is configured for it)."""
    if registry in _HUB_ALIASES:
        return _HUB_API
    scheme = "http" if is_loopback(registry) and not tls else "https"
    return f"{scheme}://{registry}"
