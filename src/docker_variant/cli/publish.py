"""The publisher's commands: ``labels``, ``inspect``, ``push``, ``publish`` and ``build``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from docker_variant.cli.options import NoVerifyOpt, PlatformOpt, options_of
from docker_variant.cli.output import (
    emit_json,
    layer_progress,
    stderr_console,
    stdout_console,
    warn,
)
from docker_variant.errors import InvalidInputError
from docker_variant.render import built_table, published_table
from docker_variant.variant import labels_for, parse_property

__all__ = ["build", "inspect_", "labels", "publish", "push"]


def labels(
    ctx: typer.Context,
    label: Annotated[
        str | None, typer.Option("--label", help="The variant label, e.g. cu128 (or null).")
    ] = None,
    prop: Annotated[
        list[str] | None,
        typer.Option("--property", help='A property "namespace :: feature :: value"; repeat.'),
    ] = None,
    namespace_order: Annotated[
        str | None,
        typer.Option(
            "--namespace-order", help="Comma-separated namespace priority, e.g. nvidia,x86_64."
        ),
    ] = None,
    from_image: Annotated[
        str | None,
        typer.Option("--from-image", help="Propose them from a registry image's binaries."),
    ] = None,
    local: Annotated[
        str | None,
        typer.Option("--local", help="Propose them from a local image's binaries."),
    ] = None,
) -> None:
    """Validate a variant and print its image labels as `--label k=v` build arguments."""
    opts = options_of(ctx)
    order = [ns for ns in (namespace_order or "").split(",") if ns]
    if from_image is not None or local is not None:
        from docker_variant.contents.report import inspect_image, labels_from_image

        if prop:
            raise InvalidInputError("--property and --from-image/--local exclude each other")
        image = inspect_image(from_image, local, None, stderr_console(), not opts.json)
        result = labels_from_image(image, label, order)
    elif label is None:
        raise InvalidInputError("give --label (with --property ...) or --from-image/--local")
    else:
        result = labels_for(label, [parse_property(p) for p in prop or []], order)
    if opts.json:
        emit_json(result)
    else:
        sys.stdout.write(" ".join(f"--label {k}={v}" for k, v in result.items()) + "\n")


def inspect_(
    ctx: typer.Context,
    ref: Annotated[
        str | None, typer.Argument(help="registry/name:tag (read in the registry)")
    ] = None,
    local: Annotated[
        str | None, typer.Option("--local", help="A local image (read through the engine).")
    ] = None,
    platform: PlatformOpt = None,
) -> None:
    """Read an image's binaries without running it: what they need (with the evidence) and
    the variant properties to label it with."""
    from docker_variant.contents.report import inspect_image, inspect_json, inspect_renderable

    opts = options_of(ctx)
    image = inspect_image(ref, local, platform, stderr_console(), not opts.json)
    if opts.json:
        emit_json(inspect_json(image))
    else:
        stdout_console().print(inspect_renderable(image))


def push(
    ctx: typer.Context,
    ref: Annotated[
        str, typer.Argument(help="registry/name:version-label (or :version for a bare image)")
    ],
    no_verify: NoVerifyOpt = False,
) -> None:
    """Check the local image's variant labels against its tag and its binaries, then push it."""
    from docker_variant.docker.engine import Engine
    from docker_variant.docker.ops import push_image
    from docker_variant.oci.reference import parse_reference
    from docker_variant.oci.source import published_without, refresh_proxy_index
    from docker_variant.publish.verify import verify_local

    opts = options_of(ctx)
    with Engine() as engine:
        verify_local(
            engine,
            parse_reference(ref),
            verify=not no_verify,
            console=stderr_console(),
            show_progress=not opts.json,
            warn=warn,
        )
        with layer_progress("push", ref, shown=not opts.json) as progress:
            reference, variant = push_image(engine, ref, progress)
    label = variant.label if variant else None
    version = reference.tag[: -len(label) - 1] if label and reference.tag else reference.tag
    refreshed = refresh_proxy_index(reference, version or "")
    if label and published_without(reference, version or ""):
        warn(
            f"{reference.name}:{version} is a published variant image index without "
            f"{reference.tag}; ls, resolve and pull read that index: run `docker variant "
            f"publish {reference.name}:{version}` to add it"
        )
    if opts.json:
        emit_json(
            {
                "reference": str(reference),
                "label": label,
                "version": version,
                "proxy_index_refreshed": refreshed,
            }
        )
    else:
        what = f'variant "{label}"' if label else "bare image"
        sys.stdout.write(f"Pushed {what} of {reference.name} version {version}\n")


def publish(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="registry/name:version")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the index; push nothing.")
    ] = False,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Write the version's variant image index at tag VERSION (docs: reference/image-index),
    so that any registry serves the whole set in one request."""
    from docker_variant.jsondoc import load_json
    from docker_variant.oci.reference import parse_reference
    from docker_variant.publish.publisher import publish as publish_index

    opts = options_of(ctx)
    if no_verify:
        warn(f"{ref}: --no-verify: labels are not checked against the images' binaries")
    published = publish_index(parse_reference(ref), dry_run=dry_run, verify=not no_verify)
    document = load_json(published.body, "the variant image index")
    for warning in published.warnings:
        warn(warning)
    if dry_run and not opts.json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    if opts.json:
        emit_json(
            {
                "reference": str(published.reference),
                "digest": published.digest,
                "changed": published.changed,
                "dry_run": dry_run,
                "index": document,
            }
        )
        return
    stdout_console().print(published_table(published.entries, f"Variant image index of {ref}"))
    state = "published" if published.changed else "already published (unchanged)"
    sys.stdout.write(
        f"{published.reference}: variant image index {state}, {published.digest}, "
        f"{len(published.entries)} entries\n"
    )


def build(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="registry/name:version")],
    context: Annotated[Path, typer.Argument(help="Build context (default: .).")] = Path("."),
    matrix_file: Annotated[
        Path, typer.Option("--matrix", help="TOML matrix: one image per [[variant]] entry.")
    ] = Path("variants.toml"),
    push_: Annotated[bool, typer.Option("--push", help="Push every image built.")] = False,
    publish_: Annotated[
        bool, typer.Option("--publish", help="Push, then write the variant image index.")
    ] = False,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Build one image per matrix entry from one Dockerfile, labelled and tagged
    VERSION-<label>; with --push push them, with --publish also write the index."""
    from docker_variant.oci.reference import parse_reference
    from docker_variant.publish.build import build_release
    from docker_variant.publish.matrix import load_matrix

    opts = options_of(ctx)
    matrix = load_matrix(matrix_file)
    reference = parse_reference(ref)
    report = build_release(
        matrix,
        reference,
        context,
        push=push_,
        publish=publish_,
        verify=not no_verify,
        console=stderr_console(),
        show_progress=not opts.json,
        warn=warn,
        layer_progress=layer_progress,
    )
    published = report.published
    if opts.json:
        emit_json(
            {
                "images": report.rows(),
                "index_digest": published.digest if published else None,
            }
        )
        return
    stdout_console().print(built_table(report, f"Built {len(report.images)} images of {ref}"))
    if published is not None:
        sys.stdout.write(
            f"{published.reference}: variant image index published, {published.digest}, "
            f"{len(published.entries)} entries\n"
        )
