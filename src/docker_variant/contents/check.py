"""``push``, ``publish`` and ``build --push/--publish`` check labels against the binaries.

A label that promises what the binaries do not deliver is refused (``LabelsUnsupportedError``,
exit 2) with the evidence; what only deserves a warning is returned. Images whose labels
promise nothing checkable (bare, ``null``, other namespaces) are not read at all, and
images with no accelerator binaries pass, as before.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from docker_variant import vendors
from docker_variant.contents.properties import Verdict, verify
from docker_variant.contents.walker import ImageContents, LayerScan
from docker_variant.errors import InvalidInputError
from docker_variant.variant.labels import read_labels

if TYPE_CHECKING:
    from docker_variant.contents.sources import Meter
    from docker_variant.docker.engine import Engine
    from docker_variant.oci.client import RegistryClient
    from docker_variant.oci.imageindex import IndexEntry
    from docker_variant.oci.reference import Reference

__all__ = [
    "LabelsUnsupportedError",
    "check_contents",
    "check_local_image",
    "check_registry_entries",
    "checked_features",
    "needs_check",
]

NO_VERIFY_HINT = "--no-verify skips this check"


class LabelsUnsupportedError(InvalidInputError):
    """Labels that promise what the image's binaries do not deliver (exit code 2)."""


def checked_features() -> frozenset[tuple[str, str]]:
    """The properties whose promises the binaries can confirm or refute: every vendor's."""
    return frozenset(
        (vendor.namespace, feature)
        for vendor in vendors.registered()
        if vendor.contents is not None
        for feature in vendor.contents.checked
    )


def needs_check(labels: Mapping[str, str] | None) -> bool:
    """Whether the labels promise anything the binaries could refute."""
    variant = read_labels(labels).variant
    if variant is None:
        return False
    checked = checked_features()
    return any(
        (namespace, feature) in checked
        for namespace, features in variant.properties.items()
        for feature in features
    )


def check_contents(what: str, labels: Mapping[str, str], contents: ImageContents) -> Verdict:
    """The verdict on ``labels``; raises ``LabelsUnsupportedError`` naming the evidence."""
    verdict = verify(contents, read_labels(labels).variant)
    if verdict.errors:
        more = f" (and {len(verdict.errors) - 1} more)" if len(verdict.errors) > 1 else ""
        raise LabelsUnsupportedError(
            f"{what}: the labels promise what the binaries do not deliver: "
            f"{verdict.errors[0]}{more}; fix the labels (docker variant labels --from-image) "
            f"or the build; {NO_VERIFY_HINT}"
        )
    return verdict


def check_local_image(engine: Engine, reference: Reference, meter: Meter | None = None) -> Verdict:
    """Check a local image before it is pushed as ``reference``: its labels against its tag
    first (cheap), then against its binaries."""
    from docker_variant.contents.sources import inspect_local
    from docker_variant.docker.ops import check_push_labels, local_image

    inspected, labels = local_image(engine, reference)
    check_push_labels(reference, labels)
    if not needs_check(labels):
        return Verdict()
    image = inspect_local(str(reference), engine, meter, inspected=inspected)
    return check_contents(str(reference), image.labels, image.contents)


async def check_registry_entries(
    client: RegistryClient,
    repository: str,
    name: str,
    entries: Collection[IndexEntry],
    *,
    skip_tags: Collection[str] = (),
) -> list[str]:
    """Check every entry of a version about to be published; returns the warnings."""
    from docker_variant.contents.sources import inspect_manifest, spool_dir

    warnings: list[str] = []
    scanned: dict[str, LayerScan] = {}  # base layers shared by the variants are read once
    for entry in entries:
        if entry.tag in skip_tags or not needs_check(entry.labels):
            continue
        manifest = await client.fetch_manifest(repository, entry.digest)
        config = await client.get_config(repository, manifest)
        with spool_dir() as spool:
            contents = await inspect_manifest(
                client, repository, manifest.data, config, spool, scanned=scanned
            )
        where = f"{name}:{entry.tag}" + (f" ({entry.platform})" if entry.platform else "")
        verdict = check_contents(where, entry.labels, contents)
        warnings.extend(f"{where}: {w}" for w in verdict.warnings)
    return warnings
