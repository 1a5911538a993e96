"""Human and JSON renderings of selections and host lists, shared by CLI commands.

rich is imported by the table functions only: ``--json`` output and plain ``resolve`` never
need it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from docker_variant.errors import InvalidInputError
from docker_variant.oci.imageindex import IndexEntry
from docker_variant.safetext import safe_text
from docker_variant.variant import Candidate, Selection, SupportedLists, Variant

if TYPE_CHECKING:
    from rich.table import Table

    from docker_variant.publish.build import BuildReport

__all__ = [
    "built_table",
    "candidate_json",
    "host_table",
    "properties_text",
    "published_table",
    "selection_json",
    "selection_table",
]


def _shown(text: object) -> str:
    """A table cell from text that came from outside (an index, a registry, a provider)."""
    return safe_text(text, markup=True)


def properties_text(variant: Variant | None) -> str:
    if variant is None:
        return ""
    return "\n".join(
        f"{ns} :: {feature} :: {','.join(values)}"
        for ns, features in variant.properties.items()
        for feature, values in features.items()
    )


def candidate_json(candidate: Candidate) -> dict[str, Any]:
    return {
        "label": candidate.label,
        "tag": candidate.tag,
        "digest": candidate.digest,
        "kind": candidate.kind,
        "compatible": candidate.compatible,
        "rank": candidate.rank,
        "reason": candidate.reason,
        "platform": candidate.platform,
        "properties": candidate.variant.to_json() if candidate.variant else {},
    }


#: ``ls --format`` placeholders, Docker's ``{{.Field}}`` spelling, and what each shows.
FORMAT_FIELDS = ("Rank", "Label", "Tag", "Reference", "Digest", "Kind", "Compatible",
                 "Platform", "Reason")  # fmt: skip
# one quantifier only: linear on hostile text; the field's spaces are stripped in Python
_PLACEHOLDER = re.compile(r"\{\{([^{}]*)\}\}")
#: ``{{json .}}``, as ``docker image ls --format`` takes it (spaces inside the braces free)
_JSON_TEMPLATE = re.compile(r"\{\{ *json +\. *\}\}")


def check_format(template: str) -> str:
    """An ``ls --format`` template: ``table`` (the default), ``json`` or ``{{json .}}`` (one
    object a line) or
    text with ``{{.Field}}`` placeholders and ``\\t``/``\\n``; anything else in ``{{ }}``
    (Go template logic) is refused, naming it."""
    if template in ("table", "json"):
        return template
    if _JSON_TEMPLATE.fullmatch(template):  # docker's spelling of json: one object a line
        return "json"
    for found in _PLACEHOLDER.finditer(template):
        field = found.group(1).strip()
        if not field.startswith(".") or field[1:] not in FORMAT_FIELDS:
            raise InvalidInputError(
                f"--format: {found.group(0)!r} is not a placeholder; use table, json, or "
                f"text with {', '.join('{{.' + f + '}}' for f in FORMAT_FIELDS)}"
            )
    if "{{" not in template:
        raise InvalidInputError(
            f"--format {template!r}: no {{{{.Field}}}} placeholder (table, json, or e.g. "
            "'{{.Tag}}\\t{{.Compatible}}')"
        )
    return template


def format_candidate(template: str, candidate: Candidate, reference: str | None) -> str:
    """One line of ``ls --format TEMPLATE`` (checked by ``check_format``); every value as
    text with control characters escaped."""
    values = {
        "Rank": candidate.rank or "",
        "Label": candidate.label or f"({candidate.kind})",
        "Tag": candidate.tag,
        "Reference": reference or candidate.tag,
        "Digest": candidate.digest or "",
        "Kind": candidate.kind,
        "Compatible": "true" if candidate.compatible else "false",
        "Platform": candidate.platform or "",
        "Reason": candidate.reason or "",
    }
    text = template.replace("\\t", "\t").replace("\\n", "\n")
    return _PLACEHOLDER.sub(
        lambda m: safe_text(str(values[m.group(1).strip()[1:]]), markup=False), text
    )


def selection_json(
    selection: Selection, reference: str | None, reference_of: Callable[[str], str]
) -> dict[str, Any]:
    """REF, the ``chosen`` variant (``None`` when none fits) and every variant, each with
    its ``reference`` (``reference_of`` its tag): ``chosen`` as in ``pull --json``."""

    def entry(candidate: Candidate) -> dict[str, Any]:
        return candidate_json(candidate) | {"reference": reference_of(candidate.tag)}

    best = selection.best
    return {
        "reference": reference,
        "chosen": entry(best) if best else None,
        "variants": [entry(c) for c in selection.candidates],
    }


def selection_table(selection: Selection, title: str) -> Table:
    from rich.table import Table

    table = Table(title=_shown(title), title_justify="left")
    for column in ("rank", "label", "tag", "fits", "properties / reason"):
        table.add_column(column, overflow="fold")
    for c in selection.candidates:
        if c.compatible:
            # one property a line: each line is escaped, the line breaks are the table's own
            lines = properties_text(c.variant).splitlines() or [f"({c.kind})"]
            fits, detail = "[green]yes[/]", "\n".join(_shown(line) for line in lines)
        else:
            fits = "[red]no[/]" if c.kind != "invalid" else "[red]invalid[/]"
            detail = _shown(c.reason or "")
        table.add_row(
            str(c.rank or "-"),
            _shown(c.label or f"({c.kind})"),
            _shown(c.tag),
            fits,
            detail,
        )
    return table


def published_table(entries: Sequence[IndexEntry], title: str) -> Table:
    """A variant image index's entries in index order; each platform's first entry is what
    variant-unaware clients get."""
    from rich.table import Table

    table = Table(title=_shown(title), title_justify="left")
    for column in ("platform", "label", "tag", "digest", "variant-unaware clients"):
        table.add_column(column, overflow="fold")
    seen: set[str] = set()
    for entry in entries:
        platform = str(entry.platform)
        first = platform not in seen
        seen.add(platform)
        table.add_row(
            _shown(platform),
            _shown(entry.label or "(bare)"),
            _shown(entry.tag),
            _shown(entry.digest),
            "[green]this one[/]" if first else "",
        )
    return table


def built_table(report: BuildReport, title: str) -> Table:
    """The images a matrix build made, in matrix order."""
    from rich.table import Table

    table = Table(title=_shown(title), title_justify="left")
    for column in ("entry", "platform", "reference", "image", "pushed"):
        table.add_column(column, overflow="fold")
    for row in report.rows():
        table.add_row(
            _shown(row["entry"]),
            _shown(row["platform"] or "(engine's)"),
            _shown(row["reference"]),
            _shown(str(row["image_id"])[7:19]),
            "yes" if row["pushed"] else "no",
        )
    return table


def host_table(host: SupportedLists, limit: int = 8) -> Table:
    from rich.table import Table

    table = Table(title="Supported properties (most preferred first)", title_justify="left")
    for column in ("namespace", "feature", "values"):
        table.add_column(column, overflow="fold")
    for namespace, features in host.items():
        if not features:
            table.add_row(_shown(namespace), "[dim](nothing on this host)[/]", "")
        # on/off CPU flags are many: one row for all of them keeps the table readable
        flags = [f for f, values in features.items() if values == ["on"]]
        for feature, values in features.items():
            if feature in flags:
                continue
            shown = ", ".join(values[:limit])
            if len(values) > limit:
                shown += f", ... ({len(values)} values)"
            table.add_row(_shown(namespace), _shown(feature), _shown(shown))
        if flags:
            table.add_row(
                _shown(namespace), f"{len(flags)} flags, each 'on'", _shown(", ".join(flags))
            )
    return table
