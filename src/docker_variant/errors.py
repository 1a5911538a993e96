"""One exception tree for the whole package.

Every error a user can cause or meet carries the CLI exit code of docs/reference/cli.md, so
the command line maps exceptions to exit codes in exactly one place.
"""

from __future__ import annotations

import re

# scheme://host[:port] of any URL
_URL_ORIGIN = re.compile(r"\bhttps?://[^\s/]+")


def without_origins(text: str, instead: str = "") -> str:
    """``text`` with the origin (``scheme://host[:port]``) of every URL in it replaced by
    ``instead``: the paths stay, which name what was asked for; a registry's address may be
    the operator's business."""
    return _URL_ORIGIN.sub(instead, text)


def one_line(text: str, limit: int = 300) -> str:
    """Collapse whitespace (upstream messages may span lines) and cap the length: every
    message this package prints or serves is one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


#: The exit status when the reader of stdout went away (``| head``): 128 + SIGPIPE, what a
#: shell reports for ``ls`` or ``docker`` killed by it, and never 1, "no compatible variant".
EXIT_BROKEN_PIPE = 141


class DockerVariantError(Exception):
    """Base of every error docker-variant raises on purpose. ``hint``, when set, is what
    the user may do about it (the CLI prints it on a ``hint:`` line after the error)."""

    exit_code = 4  # an internal error; 1 (no compatible variant) is decided by the CLI
    hint: str | None = None


class InvalidInputError(DockerVariantError):
    """Bad input: an invalid label, property, reference, providers file or index document
    (a malformed document is bad input whoever serves it: a file, a URL or a registry)."""

    exit_code = 2


class UnreachableError(DockerVariantError):
    """A registry, proxy or Docker engine could not be reached or answered garbage."""

    exit_code = 3


class MissingError(UnreachableError):
    """What was asked for does not exist: an unknown repository or tag in a registry, a
    missing local image (exit 3, as docs/reference/cli.md says; the message says "not
    found", so that it is told apart from a registry that cannot be reached)."""


class UnauthorizedError(UnreachableError):
    """A registry refused the credentials, or their absence (exit 3; the message says
    "unauthorized", the hint names ``docker login``)."""


def login_hint(registry: str) -> str:
    """The hint of an ``UnauthorizedError`` from ``registry`` (``host[:port]``)."""
    return f"run `docker login {registry}` (credentials come from Docker's config.json)"
