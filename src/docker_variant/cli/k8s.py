"""``k8s claim``, ``k8s gang``, ``k8s node-labels`` and ``k8s containerd-hosts``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from docker_variant.cli.options import IndexOpt, options_of
from docker_variant.cli.output import emit_json, error, warn
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
    help="Kubernetes: a DRA ResourceClaimTemplate, a gang on one variant, node labels, a containerd hosts.toml.",
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
        error(f"no variant of {target.describe()} can be asked of a device:")
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
    whose GPUs differ: what every GPU runs, and each GPU's lists in X-Variant-Devices);
    --ca-file and --client-cert/--client-key become the server's ca and client."""
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
    # --ca-file and --client-cert are what containerd trusts and presents for the server;
    # absolute, as this node's containerd reads them
    ca = os.path.abspath(opts.ca_file) if opts.ca_file is not None else None
    cert, key = opts.client_cert, opts.client_key
    client = (
        (os.path.abspath(cert), os.path.abspath(key) if key is not None else None)
        if cert is not None
        else None
    )
    text = hosts_toml(registry, url, host, devices, ca=ca, client=client)
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


K8S_MAX_PODS = 10_000  # k8s.gang.MAX_PODS (tests/test_kube_gang.py checks they agree)
K8S_MAX_CLUSTER_BYTES = 64 << 20  # one --cluster file


def _cluster_file(path: Path) -> list[object]:
    """The YAML (or JSON) documents of one ``--cluster`` file, read bounded."""
    import yaml  # type: ignore[import-untyped]  # PyYAML: lightkube brings it

    from docker_variant.errors import InvalidInputError, one_line
    from docker_variant.textdoc import decode_utf8, read_regular_file

    what = f"--cluster {str(path)!r}"
    try:
        data = read_regular_file(path, K8S_MAX_CLUSTER_BYTES + 1)
    except OSError as exc:
        raise InvalidInputError(f"{what}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > K8S_MAX_CLUSTER_BYTES:
        raise InvalidInputError(
            f"{what}: larger than {K8S_MAX_CLUSTER_BYTES >> 20} MiB (the limit of one file)"
        )
    try:
        return list(yaml.safe_load_all(decode_utf8(data, what, "YAML")))
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"{what}: not YAML or JSON ({one_line(str(exc), 200)})") from None


# k8s gang's options
_PodsOpt = Annotated[
    int, typer.Option("--pods", min=1, max=K8S_MAX_PODS, help="Pods of the gang, one a node.")
]
_CountOpt = Annotated[
    int, typer.Option("--count", min=1, max=K8S_MAX_COUNT, help="Devices per pod (all alike).")
]
_NameOpt = Annotated[
    str | None,
    typer.Option("--name", help="Name of every object (default: from the repository)."),
]
_ImageOpt = Annotated[
    str | None,
    typer.Option("--image", help="Repository the pods pull (default: REF's; --index needs it)."),
]
_ClusterOpt = Annotated[
    list[Path] | None,
    typer.Option("--cluster", help="Read Nodes, ResourceSlices, ResourceClaims from files."),
]
_KubeconfigOpt = Annotated[
    Path | None,
    typer.Option("--kubeconfig", help="Read the cluster here (default: in-cluster, $KUBECONFIG)."),
]
_NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", help="Namespace of the objects (default: the context's)."),
]
_ApplyOpt = Annotated[
    bool, typer.Option("--apply", help="Create the objects (strict field validation), not print.")
]


@k8s_app.command("gang")
def k8s_gang(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Argument(help="registry/name:version")] = None,
    index: IndexOpt = None,
    pods: _PodsOpt = 1,
    count: _CountOpt = 1,
    name: _NameOpt = None,
    image: _ImageOpt = None,
    cluster: _ClusterOpt = None,
    kubeconfig: _KubeconfigOpt = None,
    namespace: _NamespaceOpt = None,
    apply: _ApplyOpt = False,
) -> None:
    """Plan a gang of pods on one variant, from the cluster's free devices, and print (or
    --apply) a claim template, Workload, PodGroup and Indexed Job that hold it there."""
    from docker_variant.errors import InvalidInputError
    from docker_variant.extras import KUBERNETES

    KUBERNETES.require("docker-variant k8s gang")

    from docker_variant.k8s.claim import dns_label
    from docker_variant.k8s.gang import gang_objects, plan_gang
    from docker_variant.planner.placement import Refusal

    opts = options_of(ctx)
    _check_gang_options(cluster, apply, kubeconfig, name, namespace, image)
    target = target_of(ref, index)
    if image is None and target.reference is None:
        raise InvalidInputError("--index needs --image REGISTRY/NAME: the repository the pods pull")
    if image is None:
        assert target.reference is not None
        repository_text = f"{target.reference.registry}/{target.reference.repository}"
    else:
        repository_text = image  # checked above: a repository alone
    client, state = _gang_cluster(cluster, kubeconfig)
    found = plan_gang(target.index, state, pods, count)
    if isinstance(found, Refusal):
        error(
            f"no variant of {target.describe()} fits a gang of {pods} pods "
            f"with {count} free device{'s' if count > 1 else ''} each now:"
        )
        _print_reasons(found.reasons)
        raise typer.Exit(1)
    if not found.plan.candidate.digest:
        warn(
            f"images.{found.label}.digest is empty: the pods pull the variant's tag, which names "
            "that variant but not its bytes"
        )
    objects = gang_objects(
        target.index,
        found,
        name=name or dns_label(claim_name_hint(target, index), "gang"),
        pods=pods,
        count=count,
        repository=repository_text,
        source=str(target.reference) if target.reference is not None else index,
    )
    if apply:
        from docker_variant.k8s.apiserver import create_all

        assert client is not None
        for created in create_all(client, objects, namespace):
            sys.stdout.write(f"{created} created\n")
        return
    _print_objects(objects, namespace, opts.json)


def _check_gang_options(
    cluster: list[Path] | None,
    apply: bool,
    kubeconfig: Path | None,
    name: str | None,
    namespace: str | None,
    image: str | None,
) -> None:
    """``k8s gang``'s options, each checked alone or against another: exit 2 naming it."""
    from docker_variant.errors import InvalidInputError
    from docker_variant.k8s.claim import check_dns_subdomain
    from docker_variant.oci.reference import parse_reference

    if cluster and (apply or kubeconfig is not None):
        raise InvalidInputError(
            "--cluster reads files: it goes with neither --apply nor --kubeconfig"
        )
    if name is not None:
        check_dns_subdomain(name, "--name")
        if len(name) > 63 or "." in name:
            raise InvalidInputError(
                f"--name {name!r}: a Job's name is a DNS label (no '.', at most 63)"
            )
    if namespace is not None:
        check_dns_subdomain(namespace, "--namespace")
    if image is not None:
        repository = parse_reference(image)
        if repository.tag or repository.digest:
            raise InvalidInputError(
                f"--image {image!r}: name the repository alone; the gang pins the variant's digest"
            )


def _print_reasons(reasons: dict[str, str]) -> None:
    for label, why in sorted(reasons.items()):
        sys.stderr.write(safe_text(f"  {label}: {why}", markup=False) + "\n")


def _gang_cluster(cluster: list[Path] | None, kubeconfig: Path | None) -> tuple[Any, Any]:
    """The apiserver's client (None for ``--cluster`` files) and the cluster's state."""
    from docker_variant.k8s.gang import cluster_objects, read_cluster

    client = None
    if cluster:
        documents = [doc for path in cluster for doc in _cluster_file(path)]
    else:
        from docker_variant.k8s.apiserver import GANG_FIELD_MANAGER, cluster_state, connect

        client = connect(kubeconfig, strict=True, field_manager=GANG_FIELD_MANAGER)
        documents = list(cluster_state(client))
    return client, read_cluster(cluster_objects(documents))


def _print_objects(objects: list[dict[str, Any]], namespace: str | None, as_json: bool) -> None:
    """The objects as YAML documents (or JSON), in ``namespace`` when one is given."""
    from docker_variant.k8s.yamltext import dump_yaml

    if namespace is not None:
        for obj in objects:
            obj["metadata"]["namespace"] = namespace
    if as_json:
        emit_json(objects)
    else:
        sys.stdout.write(
            "".join(("---\n" if i else "") + dump_yaml(o) for i, o in enumerate(objects))
        )
