"""``docker variant inspect`` and ``labels --from-image``: what an image's binaries need, as
a rich table or JSON, and the build arguments for the properties they support."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table

from docker_variant.contents.evidence import ELF, X86_ISA
from docker_variant.contents.properties import Proposal, Verdict, propose, verify
from docker_variant.contents.sources import InspectedImage
from docker_variant.docker.progress import RichMeter
from docker_variant.errors import InvalidInputError
from docker_variant.safetext import safe_text
from docker_variant.variant.labels import labels_for, read_labels

__all__ = [
    "inspect_image",
    "inspect_json",
    "inspect_renderable",
    "labels_from_image",
]


def inspect_image(
    ref: str | None,
    local: str | None,
    platform: str | None,
    console: Console,
    progress: bool,
) -> InspectedImage:
    """Read the image named by exactly one of ``ref`` (registry) and ``local`` (engine)."""
    if (ref is None) == (local is None):
        raise InvalidInputError("give exactly one of REF (registry/name:tag) or --local IMAGE")
    with RichMeter(f"inspect {ref or local}", console, progress) as meter:
        if local is not None:
            from docker_variant.docker.engine import Engine

            with Engine() as engine:
                engine.ping()
                from docker_variant.contents.sources import inspect_local

                return inspect_local(local, engine, meter)
        from docker_variant.contents.sources import inspect_registry
        from docker_variant.variant.platform import Platform

        assert ref is not None
        chosen = Platform.parse(platform, "--platform") if platform else None
        return inspect_registry(ref, platform=chosen, meter=meter)


def _verdict(image: InspectedImage) -> Verdict:
    try:
        variant = read_labels(image.labels).variant
    except InvalidInputError as exc:
        return Verdict(errors=[str(exc)])
    return verify(image.contents, variant)


def inspect_json(image: InspectedImage) -> dict[str, Any]:
    proposal = propose(image.contents, image.labels)
    verdict = _verdict(image)
    machines = Counter(f.value for f in image.contents.of_kind(ELF))
    noted = {f.path for f in image.contents.of_kind(X86_ISA)}
    x86 = [f for f in image.contents.of_kind(ELF) if f.value == "x86-64"]
    return {
        "reference": image.reference,
        "source": image.source,
        "platform": image.platform,
        "layers": image.contents.layers,
        "bytes_read": image.contents.bytes_read,
        "elf_files": dict(sorted(machines.items())),
        "x86_64_level_unknown": sum(1 for f in x86 if f.path not in noted),
        "findings": [f.to_json() for f in image.contents.findings if f.kind != ELF],
        "warnings": list(image.contents.warnings),
        "proposed": {
            "label": proposal.label,
            "properties": [str(p) for p in proposal.properties],
            "notes": list(proposal.notes),
        },
        "labels": {
            "current": dict(sorted(image.labels.items())),
            "checked": verdict.checked,
            "errors": verdict.errors,
            "warnings": verdict.warnings,
        },
    }


def _shown(text: object) -> str:
    return safe_text(text, markup=True)  # paths, annotations and messages come from the image


def inspect_renderable(image: InspectedImage) -> Group:
    data = inspect_json(image)
    where = f"{image.reference} ({image.source}, {image.platform or '?'})"
    table = Table(
        title=f"Binaries of {_shown(where)}",
        title_justify="left",
    )
    longest = max((len(f["path"]) for f in data["findings"]), default=4)
    table.add_column("kind", overflow="fold")
    table.add_column("path", overflow="fold", min_width=min(longest, 90))  # paths kept whole
    table.add_column("section", overflow="fold")
    table.add_column("value", overflow="fold")
    for finding in data["findings"]:
        table.add_row(*(_shown(finding[key]) for key in ("kind", "path", "section", "value")))
    elf = ", ".join(f"{n} {machine}" for machine, n in data["elf_files"].items()) or "none"
    summary = Table.grid(padding=(0, 2))
    summary.add_row("ELF files", _shown(elf))
    summary.add_row(
        "x86-64 level unknown", f"{data['x86_64_level_unknown']} ELF(s) without an ISA note"
    )
    summary.add_row("layers", f"{data['layers']} ({data['bytes_read']} bytes read)")
    proposed = data["proposed"]
    props = "\n".join(proposed["properties"]) or "(none: no accelerator or ISA evidence)"
    summary.add_row("proposed label", _shown(proposed["label"]))
    summary.add_row("proposed properties", _shown(props))
    for note in proposed["notes"]:
        summary.add_row("note", _shown(note))
    parts: list[Any] = [table, summary]
    checks = Table.grid(padding=(0, 2))
    labels = data["labels"]
    for error in labels["errors"]:
        checks.add_row("[red]label refused[/]", _shown(error))
    for warning in labels["warnings"]:
        checks.add_row("[yellow]label warning[/]", _shown(warning))
    if labels["checked"] and not labels["errors"]:
        checks.add_row("[green]labels agree[/]", _shown(", ".join(labels["checked"])))
    for warning in data["warnings"]:
        checks.add_row("[yellow]skipped[/]", _shown(warning))
    parts.append(checks)
    return Group(*parts)


def labels_from_image(
    image: InspectedImage, label: str | None, namespace_order: Sequence[str] = ()
) -> dict[str, str]:
    """The labels for the properties the binaries support (the image's own namespace order
    unless one is given), validated exactly as ``labels --label ... --property ...``."""
    proposal: Proposal = propose(image.contents, image.labels)
    order: Sequence[str] = namespace_order
    if not order:
        try:
            order = read_labels(image.labels).namespace_order if image.labels else ()
        except InvalidInputError:
            order = ()
    return labels_for(label or proposal.label, proposal.properties, order)
