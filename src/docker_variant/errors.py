"""One exception tree for the whole package.

Every error a user can cause or meet carries the CLI exit code of SPEC section 7, so
the command line maps exceptions to exit codes in exactly one place.
"""

from __future__ import annotations


class DockerVariantError(Exception):
    """Base of every error docker-variant raises on purpose."""

    exit_code = 4  # an internal error; 1 (no compatible variant) is decided by the CLI


class InvalidInputError(DockerVariantError):
    """Bad input: an invalid label, property, reference, providers file or index document."""

    exit_code = 2


class UnreachableError(DockerVariantError):
    """A registry, proxy or Docker engine could not be reached or answered garbage."""

    exit_code = 3
