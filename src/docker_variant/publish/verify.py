"""The check before a local image is pushed: its labels against its binaries."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from docker_variant.docker.engine import Engine
from docker_variant.oci.reference import Reference

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["verify_local"]


def verify_local(
    engine: Engine,
    reference: Reference,
    *,
    verify: bool,
    console: Console,
    show_progress: bool,
    warn: Callable[[str], None],
) -> None:
    """Refuse (``InvalidInputError``, exit 2) a local image whose labels promise what its
    binaries do not deliver; ``warn`` is told what it could not decide, or that
    ``verify`` is off."""
    if not verify:
        warn(f"{reference}: --no-verify: its labels are not checked against its binaries")
        return
    from docker_variant.contents.check import check_local_image
    from docker_variant.docker.progress import RichMeter

    with RichMeter(f"verify {reference}", console, show_progress) as meter:
        verdict = check_local_image(engine, reference, meter)
    for warning in verdict.warnings:
        warn(f"{reference}: {warning}")
