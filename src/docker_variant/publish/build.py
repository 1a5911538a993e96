"""``docker variant build --matrix``: every matrix entry built from one Dockerfile through the
Engine API, with the variant labels set by the tool and tagged ``VERSION-<label>``; then, if
asked, each image checked and pushed, and the variant image index written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docker_variant.docker.context import context_archive
from docker_variant.docker.engine import Engine, ProgressEvent
from docker_variant.errors import InvalidInputError
from docker_variant.oci.reference import Reference
from docker_variant.publish.matrix import Matrix, MatrixEntry
from docker_variant.variant.labels import LABEL_PREFIX
from docker_variant.variant.platform import Platform

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from rich.console import Console

    from docker_variant.publish.publisher import Published

__all__ = ["BuildReport", "BuiltImage", "build_matrix", "build_release", "matrix_targets"]

#: What takes a push's engine events: ``(action, image, *, shown)`` -> a context manager of
#: a callable (``cli.output.layer_progress``: bars on a terminal, else lines naming the image).
LayerWatcher = Callable[..., "AbstractContextManager[Callable[[ProgressEvent], None]]"]


@dataclass(frozen=True)
class BuiltImage:
    entry: MatrixEntry
    reference: Reference
    image_id: str


@dataclass(frozen=True)
class BuildReport:
    """What ``build_release`` did: the images in matrix order, which were pushed, and the
    index written (``None`` without ``publish``)."""

    images: list[BuiltImage]
    pushed: set[str] = field(default_factory=set)  # references, as strings
    published: Published | None = None

    def rows(self) -> list[dict[str, Any]]:
        """One JSON object per image."""
        return [
            {
                "entry": image.entry.name,
                "label": image.entry.label,
                "platform": str(image.entry.platform) if image.entry.platform else None,
                "reference": str(image.reference),
                "image_id": image.image_id,
                "pushed": str(image.reference) in self.pushed,
            }
            for image in self.images
        ]


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
    archive: bytes | None = None,
) -> list[BuiltImage]:
    """Build every entry, in matrix order; the context is archived once (or given)."""
    targets = matrix_targets(matrix, reference)
    if archive is None:
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
        _check_built(engine, entry, target, image_id)
        built.append(BuiltImage(entry, target, image_id))
    return built


def _check_built(engine: Engine, entry: MatrixEntry, target: Reference, image_id: str) -> None:
    """The built image is for its entry's platform, where the entry names one, and carries
    exactly its entry's variant labels. Labels are inherited from the base image (``FROM``
    another variant) and may be set in the Dockerfile, and a build can add labels but never
    take one away: such an image would promise what its entry does not give (or a bare
    entry would be a variant), so it is refused before anything is pushed."""
    found = engine.inspect_image(image_id) or {}
    if entry.platform is not None:
        os_name, arch = found.get("Os"), found.get("Architecture")
        if isinstance(os_name, str) and isinstance(arch, str):
            made = Platform.of(os_name, arch, found.get("Variant") or "")
            if not made.matches(entry.platform):
                raise InvalidInputError(
                    f"{entry.name}: asked for {entry.platform}, the engine built {target} for "
                    f"{made} (the classic builder cannot build for another platform FROM "
                    "scratch or without emulation): it would be published as what it is not"
                )
    config = found.get("Config") or {}
    labels = config.get("Labels") or {} if isinstance(config, dict) else {}
    stray = sorted(
        (str(k), str(v))
        for k, v in (labels.items() if isinstance(labels, dict) else ())
        if str(k).startswith(LABEL_PREFIX) and entry.labels.get(str(k)) != v
    )
    if stray:
        shown = ", ".join(f"{key}={value!r}" for key, value in stray[:4])
        more = f" and {len(stray) - 4} more" if len(stray) > 4 else ""
        raise InvalidInputError(
            f"{entry.name}: the image built for {target} carries {shown}{more} from its base "
            "image or its Dockerfile, which the entry does not set; a variant image carries "
            f"exactly its entry's labels (build FROM an image without {LABEL_PREFIX}* labels, "
            "and set none in the Dockerfile)"
        )


def build_release(
    matrix: Matrix,
    reference: Reference,
    context: Path,
    *,
    push: bool,
    publish: bool,
    verify: bool,
    console: Console,
    show_progress: bool,
    warn: Callable[[str], None],
    layer_progress: LayerWatcher,
) -> BuildReport:
    """Build the matrix; with ``push`` (or ``publish``) check every image (unless not
    ``verify``) before the first push, then push them all; with ``publish`` write the
    version's variant image index. Everything that can be refused (the reference, the
    context and its Dockerfile) is checked before the first build starts. Progress bars
    go to ``console`` when ``show_progress`` (bars on a terminal, else plain lines, each
    naming its image), a push's through ``layer_progress``; warnings to ``warn``."""
    from docker_variant.docker.events import BuildLines
    from docker_variant.docker.ops import push_image
    from docker_variant.docker.progress import BuildProgress
    from docker_variant.publish.publisher import publish as publish_index
    from docker_variant.publish.verify import verify_local

    targets = matrix_targets(matrix, reference)
    archive = context_archive(context, matrix.dockerfile)
    pushed: set[str] = set()
    with Engine() as engine:
        engine.ping()
        names = [str(t.tag) for _, t in targets]
        progress: BuildProgress | BuildLines = (
            BuildProgress(names, console=console, enabled=show_progress)
            if console.is_terminal or not show_progress
            else BuildLines(console.file)
        )
        with progress:
            built = build_matrix(
                engine,
                matrix,
                reference,
                context,
                lambda entry, event: progress.event(entry.tag(reference.tag or ""), event),
                archive,
            )
            for image in built:
                progress.done(str(image.reference.tag), "built")
        if push or publish:
            for image in built:  # every image is checked before the first push
                verify_local(
                    engine,
                    image.reference,
                    verify=verify,
                    console=console,
                    show_progress=show_progress,
                    warn=warn,
                )
            for image in built:
                pushing = layer_progress("push", str(image.reference), shown=show_progress)
                with pushing as layers:
                    push_image(engine, str(image.reference), layers)
                pushed.add(str(image.reference))
    published = None
    if publish:
        published = publish_index(
            reference, verify=verify, verified_tags={t.tag for _, t in targets if t.tag}
        )
        for warning in published.warnings:
            warn(warning)
    return BuildReport(built, pushed, published)
