"""The ``docker-variant`` command line, also run by Docker as ``docker variant`` (SPEC section 7).

Exit codes: 0 done; 1 no compatible variant; 2 bad input; 3 registry or engine unreachable;
4 internal error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer

from docker_variant.errors import DockerVariantError, InvalidInputError
from docker_variant.render import host_table, published_table, selection_json, selection_table
from docker_variant.variant import (
    Candidate,
    Selection,
    VariantIndex,
    labels_for,
    parse_property,
    select,
)

# Each command imports what only it uses, in its body: a `docker variant` call starts this
# process twice, and `resolve --index` should cost little more than variantlib's own import.
# tests/test_cli_cost.py checks which modules a command loads.
if TYPE_CHECKING:
    from rich.console import Console

    from docker_variant.oci.reference import Reference  # the oci package pulls in httpx
    from docker_variant.providers import HostReport

app = typer.Typer(
    name="docker-variant",
    help="PEP 817/825 variants for container images.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@functools.cache
def stdout_console() -> Console:
    """rich's console for tables, made on first use (rich.console costs ~15 ms to import).
    Without emoji codes: none is meant, and their table costs 5 to 12 ms more to load."""
    from rich.console import Console

    return Console(soft_wrap=True, emoji=False)


@functools.cache
def stderr_console() -> Console:
    """rich's console for progress bars and the tables that go with errors."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, emoji=False)


@dataclass
class Options:
    """The global options (SPEC section 7), given before or after the command."""

    json: bool = False
    providers_file: Path | None = None
    enable_provider: list[str] = field(default_factory=list)

    def host(self, refresh: bool = False) -> HostReport:
        from docker_variant.providers import detect_host

        return detect_host(self.providers_file, self.enable_provider, use_cache=not refresh)


JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ProvidersFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--providers-file",
        envvar="DOCKER_VARIANT_PROVIDERS_FILE",
        help="Supported lists to use instead of detection.",
    ),
]
EnableOpt = Annotated[
    list[str] | None,
    typer.Option("--enable-provider", help="Run the third-party provider plugin for namespace NS."),
]
PlatformOpt = Annotated[
    str | None,
    typer.Option(
        "--platform",
        envvar="DOCKER_DEFAULT_PLATFORM",
        help="os/arch[/variant] to choose for, as docker pull (default: this machine's).",
    ),
]
IndexOpt = Annotated[
    str | None,
    typer.Option("--index", help="A variant index document (file or URL) instead of REF."),
]


def _options(
    ctx: typer.Context,
    json_: bool = False,
    providers_file: Path | None = None,
    enable: list[str] | None = None,
) -> Options:
    base: Options = ctx.obj if isinstance(ctx.obj, Options) else Options()
    return Options(
        json=json_ or base.json,
        providers_file=providers_file or base.providers_file,
        enable_provider=[*base.enable_provider, *(enable or [])],
    )


@app.callback()
def _global(
    ctx: typer.Context,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
) -> None:
    ctx.obj = Options(json_, providers_file, list(enable or []))


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@app.command()
def providers(
    ctx: typer.Context,
    devices: Annotated[
        bool, typer.Option("--devices", help="Also each device's own lists.")
    ] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore the detection cache.")] = False,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
) -> None:
    """Print what this host supports (SPEC section 4)."""
    opts = _options(ctx, json_, providers_file, enable)
    report = opts.host(refresh)
    if opts.json:
        _emit_json(report.to_json() if devices else report.host)
        return
    stdout_console().print(host_table(report.host))
    if devices:
        for kind, by_id in report.devices.items():
            for device_id, lists in by_id.items():
                stdout_console().print(f"\n[bold]{kind} device {device_id}[/]")
                stdout_console().print(host_table(lists))


@app.command()
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
    json_: JsonOpt = False,
) -> None:
    """Validate a variant and print its image labels as `--label k=v` build arguments."""
    opts = _options(ctx, json_)
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
        _emit_json(result)
    else:
        sys.stdout.write(" ".join(f"--label {k}={v}" for k, v in result.items()) + "\n")


@app.command("inspect")
def inspect_(
    ctx: typer.Context,
    ref: Annotated[
        str | None, typer.Argument(help="registry/name:tag (read in the registry)")
    ] = None,
    local: Annotated[
        str | None, typer.Option("--local", help="A local image (read through the engine).")
    ] = None,
    platform: PlatformOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Read an image's binaries without running it: what they need (with the evidence) and
    the variant properties to label it with."""
    from docker_variant.contents.report import inspect_image, inspect_json, inspect_renderable

    opts = _options(ctx, json_)
    image = inspect_image(ref, local, platform, stderr_console(), not opts.json)
    if opts.json:
        _emit_json(inspect_json(image))
    else:
        stdout_console().print(inspect_renderable(image))


NoVerifyOpt = Annotated[
    bool,
    typer.Option("--no-verify", help="Do not check the labels against the image's binaries."),
]


def _verify_local(engine: Any, reference: Reference, no_verify: bool, quiet: bool) -> None:
    """Refuse (exit 2) a local image whose labels promise what its binaries do not deliver."""
    if no_verify:
        _warn(f"{reference}: --no-verify: its labels are not checked against its binaries")
        return
    from docker_variant.contents.check import check_local_image
    from docker_variant.docker.progress import RichMeter

    with RichMeter(f"verify {reference}", stderr_console(), not quiet) as meter:
        verdict = check_local_image(engine, reference, meter)
    for warning in verdict.warnings:
        _warn(f"{reference}: {warning}")


def _load_index(source: str) -> VariantIndex:
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

    def chosen_ref(self, tag: str) -> str:
        return tag if self.reference is None else str(self.reference.with_tag(tag))


def _target(ref: str | None, index: str | None) -> Target:
    if (ref is None) == (index is None):
        raise InvalidInputError(
            "give exactly one of REF (registry/name:version) or --index FILE|URL"
        )
    if index is not None:
        return Target(_load_index(index))
    from docker_variant.oci.source import fetch_index

    assert ref is not None
    reference, variant_index = fetch_index(ref)
    return Target(variant_index, reference)


def _select(opts: Options, target: Target, platform: str | None) -> Selection:
    from docker_variant.variant.platform import Platform, host_platform

    # As docker pull: the engine's machine unless --platform says otherwise, also when a
    # providers file describes the host's devices.
    chosen = Platform.parse(platform, "--platform") if platform else host_platform()
    return select(target.index, opts.host().host, chosen)


def _report_no_match(selection: Selection, target: Target) -> None:
    sys.stderr.write(f"docker-variant: no variant of {target.describe()} fits this host:\n")
    for c in selection.rejected:
        sys.stderr.write(f"  {c.label or c.tag}: {c.reason}\n")
    if not selection.rejected:
        sys.stderr.write("  (the version has no images)\n")


@app.command("ls")
def ls_(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Argument(help="registry/name:version")] = None,
    index: IndexOpt = None,
    platform: PlatformOpt = None,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
) -> None:
    """List every variant: compatible or not (with the reason), rank and tag."""
    opts = _options(ctx, json_, providers_file, enable)
    target = _target(ref, index)
    selection = _select(opts, target, platform)
    if opts.json:
        _emit_json(selection_json(selection, str(target.reference) if target.reference else None))
    else:
        stdout_console().print(selection_table(selection, f"Variants of {target.describe()}"))


@app.command()
def resolve(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Argument(help="registry/name:version")] = None,
    index: IndexOpt = None,
    platform: PlatformOpt = None,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
) -> None:
    """Print the reference of the best variant for this host."""
    opts = _options(ctx, json_, providers_file, enable)
    target = _target(ref, index)
    selection = _select(opts, target, platform)
    best = selection.best
    if best is None:
        if opts.json:
            _emit_json(selection_json(selection, None))
        _report_no_match(selection, target)
        raise typer.Exit(1)
    chosen = target.chosen_ref(best.tag)
    if opts.json:
        _emit_json(
            {
                "reference": chosen,
                "label": best.label,
                "tag": best.tag,
                "digest": best.digest,
                "kind": best.kind,
            }
        )
    else:
        sys.stdout.write(chosen + "\n")


def _chosen_message(best: Candidate, reference: Reference) -> str:
    what = f'variant "{best.label}"' if best.label else "the bare image"
    return f"Selected {what} of {reference.name} version {reference.tag}"


@app.command()
def pull(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="registry/name:version")],
    index: IndexOpt = None,
    platform: PlatformOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the choice only.")] = False,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
) -> None:
    """Pull the best variant of REF for this host and tag it as REF and as its own tag."""
    from docker_variant.docker import Engine, LayerProgress, pull_candidate
    from docker_variant.oci.reference import parse_reference

    opts = _options(ctx, json_, providers_file, enable)
    reference = parse_reference(ref)
    if reference.tag is None or reference.digest is not None:
        raise InvalidInputError(f"{ref}: pull needs registry/name:version (a tag, no digest)")
    engine = None if dry_run else Engine()
    try:
        if engine is not None:
            engine.ping()  # fail fast, before any registry traffic
        target = Target(_load_index(index), reference) if index else _target(ref, None)
        selection = _select(opts, target, platform)
        best = selection.best
        if best is None:
            if not opts.json:
                stderr_console().print(selection_table(selection, f"Variants of {reference}"))
            _report_no_match(selection, target)
            raise typer.Exit(1)
        message = _chosen_message(best, reference)
        result = None
        if engine is not None:
            with LayerProgress("pull", console=stderr_console(), enabled=not opts.json) as progress:
                result = pull_candidate(engine, reference, best, progress)
    finally:
        if engine is not None:
            engine.close()
    if opts.json:
        _emit_json(
            {
                "reference": str(reference),
                "chosen": target.chosen_ref(best.tag),
                "label": best.label,
                "kind": best.kind,
                "digest": best.digest,
                "image_id": result.image_id if result else None,
                "tags": list(result.tags) if result else [],
            }
        )
    else:
        sys.stdout.write(message + "\n")


@app.command()
def push(
    ctx: typer.Context,
    ref: Annotated[
        str, typer.Argument(help="registry/name:version-label (or :version for a bare image)")
    ],
    no_verify: NoVerifyOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Check the local image's variant labels against its tag and its binaries, then push it."""
    from docker_variant.docker import Engine, LayerProgress, push_image
    from docker_variant.oci.reference import parse_reference
    from docker_variant.oci.source import refresh_proxy_index

    opts = _options(ctx, json_)
    with Engine() as engine:
        _verify_local(engine, parse_reference(ref), no_verify, opts.json)
        with LayerProgress("push", console=stderr_console(), enabled=not opts.json) as progress:
            reference, variant = push_image(engine, ref, progress)
    label = variant.label if variant else None
    version = reference.tag[: -len(label) - 1] if label and reference.tag else reference.tag
    refreshed = refresh_proxy_index(reference, version or "")
    if opts.json:
        _emit_json(
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


@app.command()
def publish(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="registry/name:version")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the index; push nothing.")
    ] = False,
    no_verify: NoVerifyOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Write the version's variant image index at tag VERSION (SPEC section 10), so that
    any registry serves the whole set in one request."""
    from docker_variant.oci.reference import parse_reference
    from docker_variant.publish.publisher import publish as publish_index

    opts = _options(ctx, json_)
    if no_verify:
        _warn(f"{ref}: --no-verify: labels are not checked against the images' binaries")
    published = publish_index(parse_reference(ref), dry_run=dry_run, verify=not no_verify)
    for warning in published.warnings:
        _warn(warning)
    if dry_run and not opts.json:
        sys.stdout.write(json.dumps(json.loads(published.body), indent=2) + "\n")
        return
    if opts.json:
        _emit_json(
            {
                "reference": str(published.reference),
                "digest": published.digest,
                "changed": published.changed,
                "dry_run": dry_run,
                "index": json.loads(published.body),
            }
        )
        return
    stdout_console().print(published_table(published.entries, f"Variant image index of {ref}"))
    state = "published" if published.changed else "already published (unchanged)"
    sys.stdout.write(
        f"{published.reference}: variant image index {state}, {published.digest}, "
        f"{len(published.entries)} entries\n"
    )


@app.command()
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
    json_: JsonOpt = False,
) -> None:
    """Build one image per matrix entry from one Dockerfile, labelled and tagged
    VERSION-<label>; with --push push them, with --publish also write the index."""
    from rich.table import Table

    from docker_variant.docker import BuildProgress, Engine, LayerProgress, push_image
    from docker_variant.docker.context import context_archive
    from docker_variant.oci.reference import parse_reference
    from docker_variant.publish.build import build_matrix, matrix_targets
    from docker_variant.publish.matrix import load_matrix
    from docker_variant.publish.publisher import publish as publish_index

    opts = _options(ctx, json_)
    # Everything that can be refused is checked before the first build starts.
    matrix = load_matrix(matrix_file)
    reference = parse_reference(ref)
    targets = matrix_targets(matrix, reference)
    context_archive(context, matrix.dockerfile)  # the context and its Dockerfile exist
    names = [str(t.tag) for _, t in targets]
    pushed: set[str] = set()
    with Engine() as engine:
        engine.ping()
        with BuildProgress(names, console=stderr_console(), enabled=not opts.json) as progress:
            built = build_matrix(
                engine,
                matrix,
                reference,
                context,
                lambda entry, event: progress.event(entry.tag(reference.tag or ""), event),
            )
            for image in built:
                progress.done(str(image.reference.tag), "built")
        if push_ or publish_:
            for image in built:  # every image is checked before the first push
                _verify_local(engine, image.reference, no_verify, opts.json)
            for image in built:
                with LayerProgress(
                    "push", console=stderr_console(), enabled=not opts.json
                ) as layers:
                    push_image(engine, str(image.reference), layers)
                pushed.add(str(image.reference))
    published = (
        publish_index(
            reference, verify=not no_verify, verified_tags={t.tag for _, t in targets if t.tag}
        )
        if publish_
        else None
    )
    for warning in published.warnings if published else ():
        _warn(warning)
    rows = [
        {
            "entry": image.entry.name,
            "label": image.entry.label,
            "platform": str(image.entry.platform) if image.entry.platform else None,
            "reference": str(image.reference),
            "image_id": image.image_id,
            "pushed": str(image.reference) in pushed,
        }
        for image in built
    ]
    if opts.json:
        _emit_json(
            {
                "images": rows,
                "index_digest": published.digest if published else None,
            }
        )
        return
    table = Table(title=f"Built {len(rows)} images of {ref}", title_justify="left")
    for column in ("entry", "platform", "reference", "image", "pushed"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            str(row["entry"]),
            str(row["platform"] or "(engine's)"),
            str(row["reference"]),
            str(row["image_id"])[7:19],
            "yes" if row["pushed"] else "no",
        )
    stdout_console().print(table)
    if published is not None:
        sys.stdout.write(
            f"{published.reference}: variant image index published, {published.digest}, "
            f"{len(published.entries)} entries\n"
        )


@app.command("install-plugin")
def install_plugin(
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Plugin directory (default $DOCKER_CONFIG/cli-plugins)."),
    ] = None,
) -> None:
    """Make `docker variant ...` run this docker-variant."""
    import os
    import shutil

    root = (
        directory
        or Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "cli-plugins"
    )
    executable = shutil.which("docker-variant") or str(
        Path(sys.executable).parent / "docker-variant"
    )
    if not Path(executable).exists():
        raise InvalidInputError(
            f"cannot find the docker-variant executable (looked at {executable})"
        )
    target = root / "docker-variant"
    tmp = target.with_suffix(".tmp")
    try:
        root.mkdir(parents=True, exist_ok=True)
        # A wrapper, not a copy: the console script needs its own interpreter and environment.
        tmp.write_text(f'#!/bin/sh\nexec "{Path(executable).resolve()}" "$@"\n')
        tmp.chmod(0o755)
        tmp.replace(target)
    except OSError as exc:
        raise InvalidInputError(
            f"--dir {str(root)!r}: cannot install the plugin there "
            f"({exc.strerror or type(exc).__name__}); it must be a writable directory"
        ) from exc
    sys.stdout.write(f"Installed the Docker CLI plugin at {target}; try: docker variant --help\n")


# --------------------------------------------------------------------------- k8s (SPEC 9)

# k8s.claim's DEFAULT_DEVICE_CLASS and MAX_COUNT, written out so that building the command
# line does not import the k8s package (20 to 45 ms); tests/test_cli_cost.py checks they agree.
K8S_DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"
K8S_MAX_COUNT = 32

k8s_app = typer.Typer(
    name="k8s",
    help="Kubernetes: a DRA ResourceClaimTemplate, node labels, a containerd hosts.toml.",
    no_args_is_help=True,
)
app.add_typer(k8s_app, name="k8s")


def _warn(message: str) -> None:
    sys.stderr.write(f"docker-variant: warning: {message}\n")


def _claim_name_hint(target: Target, index: str | None) -> str:
    """``app-1.0.0`` for ``reg/team/app:1.0.0`` and for a proxy's ``_variants`` URL; else the
    index file's name without its extension."""
    import re
    from urllib.parse import urlsplit

    if target.reference is not None:
        repository = str(target.reference.repository).rsplit("/", 1)[-1]
        tag = target.reference.tag
        return f"{repository}-{tag}" if tag else repository
    source = index or ""
    path = urlsplit(source).path if source.startswith(("http://", "https://")) else source
    if match := re.search(r"/v2/(?:.+/)?([^/]+)/_variants/([^/]+)$", path):
        return f"{match[1]}-{match[2]}"
    return Path(path).stem


@k8s_app.command("claim")
def k8s_claim(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Argument(help="registry/name:version")] = None,
    index: IndexOpt = None,
    count: Annotated[
        int,
        typer.Option("--count", min=1, max=K8S_MAX_COUNT, help="Devices per claim (all alike)."),
    ] = 1,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Template name (default: from the repository and version)."),
    ] = None,
    device_class: Annotated[
        str, typer.Option("--device-class", help="DeviceClass of every subrequest.")
    ] = K8S_DEFAULT_DEVICE_CLASS,
    json_: JsonOpt = False,
) -> None:
    """Print a resource.k8s.io/v1 ResourceClaimTemplate asking for devices that fit a variant,
    best variant first (YAML; JSON with --json)."""
    from docker_variant.k8s.claim import (
        check_dns_subdomain,
        claim_template,
        dns_subdomain,
        plan_claim,
    )
    from docker_variant.k8s.yamltext import dump_yaml

    opts = _options(ctx, json_)
    if name is not None:
        check_dns_subdomain(name, "--name")
    check_dns_subdomain(device_class, "--device-class")
    target = _target(ref, index)
    plan = plan_claim(target.index)
    for warning in plan.warnings:
        _warn(warning)
    if not plan.subrequests:
        sys.stderr.write(
            f"docker-variant: no variant of {target.describe()} can be asked of a device:\n"
        )
        for label, why in plan.left_out.items():
            sys.stderr.write(f"  {label}: {why}\n")
        for invalid in target.index.invalid:
            sys.stderr.write(f"  {invalid.tag}: {invalid.error}\n")
        if not plan.left_out and not target.index.invalid:
            sys.stderr.write("  (the version has no images)\n")
        raise typer.Exit(1)
    document = claim_template(
        plan,
        name=name or dns_subdomain(_claim_name_hint(target, index), "variants"),
        count=count,
        device_class=device_class,
        source=str(target.reference) if target.reference is not None else index,
    )
    if opts.json:
        _emit_json(document)
    else:
        sys.stdout.write(dump_yaml(document))


@k8s_app.command("node-labels")
def k8s_node_labels(
    ctx: typer.Context,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
) -> None:
    """Print this host's supported properties as node labels (key=value lines; --json)."""
    from docker_variant.k8s.labels import node_labels

    opts = _options(ctx, json_, providers_file, enable)
    result = node_labels(opts.host().host)
    if result.skipped:
        _warn(
            f"no label name can carry {', '.join(result.skipped)} (at most 63 characters "
            "of [A-Za-z0-9._-], a letter or digit at both ends)"
        )
    if opts.json:
        _emit_json(result.labels)
    else:
        sys.stdout.write("".join(f"{key}={value}\n" for key, value in result.labels.items()))


@k8s_app.command("containerd-hosts")
def k8s_containerd_hosts(
    ctx: typer.Context,
    registry: Annotated[str, typer.Argument(help="host[:port], as image references name it")],
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="variant-proxy URL (default http://REGISTRY on loopback, else https://).",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", help="Write DIR/REGISTRY/hosts.toml (atomically) instead."),
    ] = None,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
) -> None:
    """Print a containerd hosts.toml that sends this node's X-Variant-Properties."""
    from docker_variant.k8s.containerd import (
        HEADER,
        HEADER_WARN_BYTES,
        check_registry,
        check_server,
        default_server,
        header_value,
        hosts_toml,
        write_hosts_toml,
    )

    opts = _options(ctx, json_, providers_file, enable)
    check_registry(registry)
    url = check_server(server) if server is not None else default_server(registry)
    host = opts.host().host
    if (size := len(header_value(host))) > HEADER_WARN_BYTES:
        _warn(f"the {HEADER} header is {size} bytes; proxies on the way may refuse it")
    text = hosts_toml(registry, url, host)
    path = write_hosts_toml(output, registry, text) if output is not None else None
    if opts.json:
        _emit_json(
            {
                "registry": registry,
                "server": url,
                "path": str(path) if path is not None else None,
                "hosts_toml": text,
            }
        )
    elif path is not None:
        sys.stdout.write(f"{path}\n")
    else:
        sys.stdout.write(text)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "docker-variant"
    if args[:1] == ["variant"]:  # run by the Docker CLI as a plugin
        args, prog = args[1:], "docker variant"
    try:
        code = app(args=args, prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.stderr.write("docker-variant: interrupted\n")
        sys.exit(130)
    except click.exceptions.ClickException as exc:  # usage errors: bad option, unknown command
        exc.show()
        sys.exit(2)
    except DockerVariantError as exc:
        # a value quoted in a message may hold a newline (a fuzzed index key did): escape it,
        # so that the message stays one line and still shows the value as it is
        message = str(exc).replace("\r", "\\r").replace("\n", "\\n")
        sys.stderr.write(f"docker-variant: {message}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("docker-variant: interrupted\n")
        sys.exit(130)
    except Exception as exc:  # a bug: still one line, never a traceback
        sys.stderr.write(f"docker-variant: internal error: {type(exc).__name__}: {exc}\n")
        sys.exit(4)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
