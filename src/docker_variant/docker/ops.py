"""``docker variant pull`` and ``push``: selection and label checks around engine calls."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from docker_variant.docker.engine import Engine, EngineError, EngineNotFoundError, ProgressEvent
from docker_variant.errors import InvalidInputError
from docker_variant.oci.reference import Reference, parse_reference
from docker_variant.variant import Candidate, Variant, read_labels

__all__ = ["PullResult", "check_push_labels", "pull_candidate", "push_image"]


@dataclass(frozen=True)
class PullResult:
    image_id: str
    tags: tuple[str, str]  # REF and the variant's own reference
    downloaded: bool  # the engine fetched something: not "Image is up to date"

    @property
    def status(self) -> str:
        """``docker pull``'s last line but one, for the variant's reference."""
        what = "Downloaded newer image" if self.downloaded else "Image is up to date"
        return f"Status: {what} for {self.tags[1]}"


#: The engine's last status of a pull that fetched nothing (``docker pull`` prints it).
_UP_TO_DATE = "Status: Image is up to date"


def pull_candidate(
    engine: Engine,
    reference: Reference,
    chosen: Candidate,
    on_event: Callable[[ProgressEvent], None],
) -> PullResult:
    """Pull the chosen image (by digest when known) and tag it as REF and as its variant ref.

    Tags are made only after the pull completed, and a tag made here is removed again if the
    second one fails, so an interrupted pull never leaves half-made tags behind.
    """
    name = reference.name
    source = f"{name}@{chosen.digest}" if chosen.digest else f"{name}:{chosen.tag}"
    statuses: list[str] = []

    def watch(event: ProgressEvent) -> None:
        statuses.append(str(event.get("status", "")))
        on_event(event)

    engine.pull(name, chosen.digest or chosen.tag, reference.registry, watch, chosen.platform)
    inspected = engine.inspect_image(source)
    if inspected is None:
        raise EngineError(f"pull {source}: the engine reports no such image after pulling it")
    version_tag = reference.tag or chosen.tag
    wanted = [chosen.tag, version_tag] if chosen.tag != version_tag else [chosen.tag]
    # The engine lists the image's tags as Docker prints them (``familiar``): one already
    # there needs no request, and is not undone if the other tag fails.
    in_place = set(inspected.get("RepoTags") or ())
    made: list[str] = []
    try:
        for tag in wanted:
            if reference.with_tag(tag).familiar() in in_place:
                continue
            engine.tag(source, name, tag)
            made.append(f"{name}:{tag}")
    except EngineError:
        for ref in made:
            engine.untag(ref)
        raise
    up_to_date = any(status.startswith(_UP_TO_DATE) for status in statuses)
    return PullResult(
        str(inspected["Id"]),
        (f"{name}:{version_tag}", f"{name}:{chosen.tag}"),
        downloaded=not up_to_date,
    )


def check_push_labels(reference: Reference, labels: Mapping[str, str] | None) -> Variant | None:
    """The local image's labels must agree with the tag it is pushed under (docs: reference/labels)."""
    tag = reference.tag
    if tag is None:
        raise InvalidInputError(f"{reference}: push needs a tag, e.g. {reference.name}:1.0.0-cu128")
    parsed = read_labels(labels)  # raises InvalidInputError naming the bad label
    variant = parsed.variant
    if variant is None:
        return None
    suffix = f"-{variant.label}"
    if not tag.endswith(suffix) or tag == suffix:
        raise InvalidInputError(
            f"{reference}: the image's variant label is {variant.label!r}, so its tag must be "
            f"<version>{suffix} (e.g. 1.0.0{suffix}), not {tag!r}"
        )
    return variant


def local_image(engine: Engine, reference: Reference) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's inspection of the local image to be pushed as ``reference``, and its
    labels."""
    inspected = engine.inspect_image(str(reference))
    if inspected is None:
        raise EngineNotFoundError(f"{reference}: no such local image (build or tag it first)")
    return inspected, (inspected.get("Config") or {}).get("Labels") or {}


def push_image(
    engine: Engine, ref_text: str, on_event: Callable[[ProgressEvent], None]
) -> tuple[Reference, Variant | None]:
    reference = parse_reference(ref_text)
    _, labels = local_image(engine, reference)
    variant = check_push_labels(reference, labels)
    assert reference.tag is not None
    engine.push(reference.name, reference.tag, reference.registry, on_event)
    return reference, variant
