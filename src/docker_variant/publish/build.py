"""``docker variant build --matrix``: every matrix entry built from one Dockerfile through the
Engine API, with the SPEC 3 labels set by the tool and tagged ``VERSION-<label>``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from docker_variant.docker.context import context_archive
from docker_variant.docker.engine import Engine, ProgressEvent
from docker_variant.errors import InvalidInputError
from docker_variant.oci.reference import Reference
from docker_variant.publish.matrix import Matrix, MatrixEntry

__all__ = ["BuiltImage", "build_matrix", "matrix_targets"]


@dataclass(frozen=True)
class BuiltImage:
    entry: MatrixEntry
    reference: Reference
    image_id: str


def matrix_targets(matrix: Matrix, reference: Reference) -> list[tuple[MatrixEntry, Reference]]:
    """Each entry with the reference it is tagged as; checks ``reference`` is name:version."""
    version = reference.tag
    if version is None or reference.digest is not None:
        raise InvalidInputError(f"{reference}: build needs registry/name:version (a tag)")
    return [(entry, reference.with_tag(entry.tag(version))) for entry in matrix.entries]


def build_matrix(
    engine: Engine,
    matrix: Matrix,
    reference: Reference,
    context: Path,
    on_event: Callable[[MatrixEntry, ProgressEvent], None],
) -> list[BuiltImage]:
    """Build every entry, in matrix order; the context is archived once."""
    targets = matrix_targets(matrix, reference)
    archive = context_archive(context, matrix.dockerfile)
    built: list[BuiltImage] = []
    for entry, target in targets:
        image_id = engine.build(
            archive,
            str(target),
            lambda event, entry=entry: on_event(entry, event),  # type: ignore[misc]
            dockerfile=matrix.dockerfile,
            build_args=entry.build_args,
            labels=entry.labels,
            platform=str(entry.platform) if entry.platform is not None else None,
        )
        built.append(BuiltImage(entry, target, image_id))
    return built
