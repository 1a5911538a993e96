"""``ls``, ``resolve`` and ``pull``: which index, and which of its variants fits this host."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from docker_variant.cli.complete import complete_reference
from docker_variant.cli.options import GpusOpt, IndexOpt, Options, PlatformOpt, options_of
from docker_variant.cli.output import (
    emit_json,
    error,
    layer_progress,
    stderr_console,
    stdout_console,
)
from docker_variant.errors import InvalidInputError
from docker_variant.oci.reference import Reference
from docker_variant.render import candidate_json, selection_json, selection_table
from docker_variant.safetext import safe_text
from docker_variant.variant import Candidate, Selection, VariantIndex, select

if TYPE_CHECKING:
    from docker_variant.variant.model import SupportedLists
    from docker_variant.variant.platform import Platform

__all__ = [
    "HostChoice",
    "Target",
    "host_choice",
    "load_index",
    "ls_",
    "pull",
    "report_no_match",
    "resolve",
    "target_of",
]


def load_index(source: str) -> VariantIndex:
    """A variant index document from a file or an http(s) URL."""
    if source.startswith(("http://", "https://")):
        from docker_variant.oci.source import download_index

        return download_index(source)
    from docker_variant.jsondoc import read_json_file

    return VariantIndex.from_json(
        read_json_file(source, f"index file {source!r}"), f"index {source}"
    )


@dataclass(frozen=True)
class Target:
    """What ls/resolve/pull work on: an index, and the reference it came from if any."""

    index: VariantIndex
    reference: Reference | None = None  # None for --index

    def describe(self) -> str:
        return str(self.reference) if self.reference is not None else "the index"

    @property
    def given(self) -> str | None:
        """REF as given; ``None`` for ``--index``."""
        return None if self.reference is None else str(self.reference)

    def chosen_ref(self, tag: str) -> str:
        return tag if self.reference is None else str(self.reference.with_tag(tag))


def target_of(ref: str | Reference | None, index: str | None) -> Target:
    """The index of REF (from its registry) or of ``--index``: exactly one of them. A
    command that parsed REF already passes its ``Reference``: it is not parsed again."""
    if (ref is None) == (index is None):
        raise InvalidInputError(
            "give exactly one of REF (registry/name:version) or --index FILE|URL"
        )
    if index is not None:
        return Target(load_index(index))
    from docker_variant.oci.source import fetch_index

    assert ref is not None
    reference, variant_index = fetch_index(ref)
    return Target(variant_index, reference)


@dataclass(frozen=True)
class HostChoice:
    """What a selection is made for, read from the local inputs alone (``--platform``,
    ``--gpus``, the providers or a providers file): bad input there is exit 2 before any
    registry or engine is asked anything."""

    platform: Platform
    lists: SupportedLists  # what the selection ranks by
    devices: dict[str, SupportedLists]  # each device's lists, named as --gpus numbers them
    titles: tuple[str, ...] = ()  # "0 (sm 9.0: H100, H200, GH200)" of each chosen device
    narrowed: bool = False  # --gpus chose some of the devices
    mixed: bool = False  # the chosen devices' lists differ

    def select(self, index: VariantIndex) -> Selection:
        return select(index, self.lists, self.platform, self.devices)

    @property
    def for_gpus(self) -> str:
        """`` for GPUs 0 (...), 1 (...)``: whom the choice is for; empty without devices.
        Alike devices are said once: eight MI300X are ``GPUs 0-7 (gfx942: ...)``."""
        if not self.titles:
            return ""
        alike: dict[str, list[str]] = {}  # description -> device numbers, in order
        for title in self.titles:
            number, _, description = title.partition(" ")
            alike.setdefault(description, []).append(number)
        said = ", ".join(f"{_numbers(n)} {d}".rstrip() for d, n in alike.items())
        return f" for GPU{'s' if len(self.titles) > 1 else ''} {said}"


def _numbers(numbers: list[str]) -> str:
    """``0-7`` for a consecutive run of device numbers, else ``0, 2, 5``."""
    if len(numbers) > 2 and all(n.isdigit() for n in numbers):
        values = [int(n) for n in numbers]
        if values == list(range(values[0], values[0] + len(values))):
            return f"{values[0]}-{values[-1]}"
    return ", ".join(numbers)


def host_choice(opts: Options, platform: str | None, gpus: str | None = None) -> HostChoice:
    """The host a selection is for: the devices a container gets (``--gpus``, default all,
    as ``docker run --gpus all``), a variant fitting only if every one of them runs it."""
    from docker_variant.providers.gpus import choose_devices, parse_gpus
    from docker_variant.variant.platform import Platform, host_platform

    # As docker pull: the engine's machine unless --platform says otherwise, also when a
    # providers file describes the host's devices.
    chosen = Platform.parse(platform, "--platform") if platform else host_platform()
    request = parse_gpus(gpus) if gpus is not None else None  # bad syntax before detection
    devices = choose_devices(opts.host(), request, gpus or "all")
    return HostChoice(
        chosen,
        devices.host,
        devices.devices,
        devices.titles,
        narrowed=request is not None,
        mixed=devices.mixed,
    )


def report_no_match(selection: Selection, target: Target, choice: HostChoice | None = None) -> None:
    whom = choice.for_gpus if choice is not None else ""
    error(f"no variant of {target.describe()} fits this host{whom}:")
    for c in selection.rejected:
        sys.stderr.write(safe_text(f"  {c.label or c.tag}: {c.reason}", markup=False) + "\n")
    if not selection.rejected:
        sys.stderr.write("  (the version has no images)\n")


#: REF of ``ls`` and ``resolve`` (``--index`` instead is allowed).
OptionalRefArg = Annotated[
    str | None, typer.Argument(help="registry/name:version", autocompletion=complete_reference)
]


def _selection(
    ctx: typer.Context, ref: str | None, index: str | None, platform: str | None, gpus: str | None
) -> tuple[Options, Target, HostChoice, Selection]:
    """What ``ls`` and ``resolve`` show: the options, the index, whom and its selection."""
    opts = options_of(ctx)
    choice = host_choice(opts, platform, gpus)  # local input first, as pull reads it
    target = target_of(ref, index)
    return opts, target, choice, choice.select(target.index)


QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Print only references: ls, of the compatible variants, best first."
    ),
]


def ls_(
    ctx: typer.Context,
    ref: OptionalRefArg = None,
    index: IndexOpt = None,
    platform: PlatformOpt = None,
    gpus: GpusOpt = None,
    quiet: QuietOpt = False,
    format_: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="table (default), json or '{{json .}}' (one variant a line) or a template of "
            "{{.Rank}} {{.Label}} {{.Tag}} {{.Reference}} {{.Digest}} {{.Kind}} "
            "{{.Compatible}} {{.Platform}} {{.Reason}}, e.g. '{{.Tag}}\\t{{.Compatible}}'.",
        ),
    ] = None,
) -> None:
    """List every variant: compatible or not (with the reason), rank and tag; exit 1 when
    none fits."""
    from docker_variant.render import check_format, format_candidate

    opts = options_of(ctx)
    if format_ is None and opts.json_lines:  # docker-variant --format '{{json .}}' ls
        format_, opts.json = "json", False
    layout = check_format(format_) if format_ is not None else "table"
    if (quiet and format_ is not None) or (opts.json and (quiet or format_ is not None)):
        raise InvalidInputError("give one of --json, --quiet and --format")
    opts, target, choice, selection = _selection(ctx, ref, index, platform, gpus)
    if quiet:
        for c in selection.candidates:
            if c.compatible:
                sys.stdout.write(target.chosen_ref(c.tag) + "\n")
    elif opts.json:
        data = selection_json(selection, target.given, target.chosen_ref)
        emit_json(data | {"gpus": list(choice.titles)})
    elif layout == "json":
        for c in selection.candidates:
            line = candidate_json(c) | {"reference": target.chosen_ref(c.tag)}
            sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    elif layout != "table":
        for c in selection.candidates:
            sys.stdout.write(format_candidate(layout, c, target.chosen_ref(c.tag)) + "\n")
    else:
        title = f"Variants of {target.describe()}{choice.for_gpus}"
        stdout_console().print(selection_table(selection, title))
    if selection.best is None:  # as resolve and pull: exit 1, the reasons are listed above
        error(f"no variant of {target.describe()} fits this host{choice.for_gpus}")
        raise typer.Exit(1)


def resolve(
    ctx: typer.Context,
    ref: OptionalRefArg = None,
    index: IndexOpt = None,
    platform: PlatformOpt = None,
    gpus: GpusOpt = None,
) -> None:
    """Print the reference of the best variant for this host's GPUs (--gpus, default all)."""
    opts, target, choice, selection = _selection(ctx, ref, index, platform, gpus)
    best = selection.best
    if best is None:
        if opts.json:
            data = selection_json(selection, target.given, target.chosen_ref)
            emit_json(data | {"gpus": list(choice.titles)})
        report_no_match(selection, target, choice)
        raise typer.Exit(1)
    chosen = target.chosen_ref(best.tag)
    if opts.json:
        emit_json(
            {
                "reference": chosen,
                "label": best.label,
                "tag": best.tag,
                "digest": best.digest,
                "kind": best.kind,
                "gpus": list(choice.titles),
            }
        )
    else:
        if choice.mixed or choice.narrowed:  # stdout stays the reference alone, for $(...)
            note = f"docker-variant: chose {best.label or 'the bare image'}{choice.for_gpus}"
            sys.stderr.write(safe_text(note, markup=False) + "\n")
        sys.stdout.write(chosen + "\n")


def _chosen_message(best: Candidate, reference: Reference, choice: HostChoice) -> str:
    """``Selected variant "cu126" of reg/app version 1.0.0`` (the part scripts read), then
    whom it was chosen for on a host with devices: `` for GPUs 0 (...), 1 (...)``."""
    what = f'variant "{best.label}"' if best.label else "the bare image"
    return f"Selected {what} of {reference.name} version {reference.tag}{choice.for_gpus}"


def pull(
    ctx: typer.Context,
    ref: Annotated[
        str, typer.Argument(help="registry/name:version", autocompletion=complete_reference)
    ],
    index: IndexOpt = None,
    platform: PlatformOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the choice only.")] = False,
    gpus: GpusOpt = None,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="No progress; print only the chosen reference."),
    ] = False,
) -> None:
    """Pull the best variant of REF for this host and tag it as REF and as its own tag."""
    from docker_variant.oci.reference import parse_reference

    opts = options_of(ctx)
    reference = parse_reference(ref)
    if reference.tag is None or reference.digest is not None:
        raise InvalidInputError(f"{ref}: pull needs registry/name:version (a tag, no digest)")
    # every local input first: bad input is exit 2 whether or not an engine is there
    choice = host_choice(opts, platform, gpus)
    local = Target(load_index(index), reference) if index else None
    engine = None
    if not dry_run:  # the engine client only when there is something to pull
        from docker_variant.docker.engine import Engine

        engine = Engine()
    try:
        if engine is not None:
            engine.ping()  # fail fast, before any registry traffic
        target = local or target_of(reference, None)
        selection = choice.select(target.index)
        best = selection.best
        if best is None:
            if opts.json:  # as resolve --json: every variant, and why none fits
                emit_json(selection_json(selection, str(reference), target.chosen_ref))
            else:
                title = f"Variants of {reference}{choice.for_gpus}"
                stderr_console().print(selection_table(selection, title))
            report_no_match(selection, target, choice)
            raise typer.Exit(1)
        message = _chosen_message(best, reference, choice)
        result = None
        if engine is not None:
            from docker_variant.docker.ops import pull_candidate

            image = target.chosen_ref(best.tag)
            with layer_progress("pull", image, shown=not (opts.json or quiet)) as progress:
                result = pull_candidate(engine, reference, best, progress)
    finally:
        if engine is not None:
            engine.close()
    if opts.json:
        emit_json(
            {
                "reference": str(reference),
                "chosen": candidate_json(best) | {"reference": target.chosen_ref(best.tag)},
                "label": best.label,
                "kind": best.kind,
                "digest": best.digest,
                "image_id": result.image_id if result else None,
                "tags": list(result.tags) if result else [],
                "downloaded": result.downloaded if result else None,
                "gpus": list(choice.titles),
            }
        )
    elif quiet:  # as docker pull -q: the reference alone
        sys.stdout.write(target.chosen_ref(best.tag) + "\n")
    else:
        sys.stdout.write(safe_text(message, markup=False) + "\n")
        if result is not None:  # as docker pull ends (not for --dry-run); on stderr, with
            # the progress, so that stdout is the one line scripts read
            sys.stderr.write(safe_text(result.status, markup=False) + "\n")
