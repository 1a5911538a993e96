"""``k8s claim``, ``k8s node-labels`` and ``k8s containerd-hosts``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from docker_variant.cli.options import IndexOpt, options_of
from docker_variant.cli.output import emit_json, warn
from docker_variant.cli.select import Target, target_of
from docker_variant.safetext import safe_text
from docker_variant.vendors import nvidia

__all__ = ["K8S_DEFAULT_DEVICE_CLASS", "K8S_MAX_COUNT", "claim_name_hint", "k8s_app"]

# k8s.claim's DEFAULT_DEVICE_CLASS and MAX_COUNT, without importing the k8s package to build
# the command line (vendors/ is loaded already); tests/test_cli_cost.py checks they agree.
K8S_DEFAULT_DEVICE_CLASS = nvidia.DRA_DOMAIN
K8S_MAX_COUNT = 32

k8s_app = typer.Typer(
    name="k8s",
    help="Kubernetes: a DRA ResourceClaimTemplate, node labels, a containerd hosts.toml.",
    no_args_is_help=True,
)


def claim_name_hint(target: Target, index: str | None) -> str:
    """The template name a claim is given by default: ``app-1.0.0`` for ``reg/team/app:1.0.0`` and for a proxy's ``_variants`` URL; else the
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
        str,
        typer.Option(
            "--device-class",
            help="DeviceClass of the NVIDIA subrequests (AMD ones ask gpu.amd.com).",
        ),
    ] = K8S_DEFAULT_DEVICE_CLASS,
    amd_partitions: Annotated[
        bool,
        typer.Option(
            "--amd-partitions",
            help="AMD subrequests take GPU partitions too (default: whole GPUs only).",
        ),
    ] = False,
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

    opts = options_of(ctx)
    if name is not None:
        check_dns_subdomain(name, "--name")
    check_dns_subdomain(device_class, "--device-class")
    target = target_of(ref, index)
    plan = plan_claim(target.index, partitions=amd_partitions)
    for warning in plan.warnings:
        warn(warning)
    if not plan.subrequests:
        sys.stderr.write(
            f"docker-variant: no variant of {target.describe()} can be asked of a device:\n"
        )
        for label, why in plan.left_out.items():
            sys.stderr.write(safe_text(f"  {label}: {why}", markup=False) + "\n")
        for invalid in target.index.invalid:
            sys.stderr.write(safe_text(f"  {invalid.tag}: {invalid.error}", markup=False) + "\n")
        if not plan.left_out and not target.index.invalid:
            sys.stderr.write("  (the version has no images)\n")
        raise typer.Exit(1)
    document = claim_template(
        plan,
        name=name or dns_subdomain(claim_name_hint(target, index), "variants"),
        count=count,
        device_class=device_class,
        source=str(target.reference) if target.reference is not None else index,
    )
    if opts.json:
        emit_json(document)
    else:
        sys.stdout.write(dump_yaml(document))


@k8s_app.command("node-labels")
def k8s_node_labels(
    ctx: typer.Context,
    cpu_flags: Annotated[
        bool,
        typer.Option(
            "--cpu-flags",
            help="Also label each CPU flag (x86_64 :: avx2 :: on: 10 to 50 labels).",
        ),
    ] = False,
) -> None:
    """Print node labels saying this host's supported lists (key=value lines; --json)."""
    from docker_variant.k8s.labels import node_labels

    opts = options_of(ctx)
    result = node_labels(opts.host().host, cpu_flags=cpu_flags)
    for why in dict.fromkeys(result.skipped.values()):
        left = [prop for prop, reason in result.skipped.items() if reason == why]
        warn(f"no label says {', '.join(left)} ({why})")
    if opts.json:
        emit_json(result.labels)
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
) -> None:
    """Print a containerd hosts.toml that sends this node's X-Variant-Properties (on a node
    whose GPUs differ: what every GPU runs, and each GPU's lists in X-Variant-Devices)."""
    from docker_variant.k8s.containerd import (
        DEVICES,
        HEADER,
        HEADER_WARN_BYTES,
        check_registry,
        check_server,
        default_server,
        header_value,
        hosts_toml,
        write_hosts_toml,
    )

    opts = options_of(ctx)
    check_registry(registry)
    url = check_server(server) if server is not None else default_server(registry)
    from docker_variant.providers.gpus import node_header

    host, devices = node_header(opts.host())
    if (size := len(header_value(host))) > HEADER_WARN_BYTES:
        warn(f"the {HEADER} header is {size} bytes; proxies on the way may refuse it")
    if devices and (size := len(header_value(devices))) > HEADER_WARN_BYTES:
        warn(f"the {DEVICES} header is {size} bytes; proxies on the way may refuse it")
    text = hosts_toml(registry, url, host, devices)
    path = write_hosts_toml(output, registry, text) if output is not None else None
    if opts.json:
        emit_json(
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
