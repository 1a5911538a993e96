"""``variant-scheduler agent``: the node agent's options, and its run until SIGTERM/SIGINT.

Only the options are defined at import (the scheduler's command line builds its parser from
them, with argparse alone: ``variant-scheduler --help`` loads nothing else); the providers, and
the settings' dataclass, are loaded when the agent runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from docker_variant.agent import DEFAULT_INTERVAL_S
from docker_variant.errors import DockerVariantError, InvalidInputError, one_line
from docker_variant.server.options import (
    add_client_tls_arguments,
    add_duration_argument,
    add_log_level_argument,
    use_client_tls,
)

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True
if TYPE_CHECKING:
    import threading
    from pathlib import Path
    from typing import Any

__all__ = ["add_agent_command", "run_agent_command", "stop_on_signals"]


def add_agent_command(commands: Any) -> None:
    """``variant-scheduler agent ...`` on the scheduler parser's subcommands."""
    agent: argparse.ArgumentParser = commands.add_parser(
        "agent", help="run the node agent (heartbeats this node, labels its Kubernetes Node)"
    )
    agent.add_argument(
        "--scheduler",
        metavar="URL",
        help="http(s)://HOST:PORT (without it, --label-node alone: no heartbeats)",
    )
    # paths stay text here (pathlib is loaded when the agent runs)
    agent.add_argument("--token-file", metavar="FILE", help="the agent's bearer token (one line)")
    add_client_tls_arguments(agent)
    add_duration_argument(
        agent,
        "--interval",
        what="interval",
        strict=True,
        default=DEFAULT_INTERVAL_S,
        help="between heartbeats, +-10 %% (default %(default)g)",
    )
    agent.add_argument(
        "--agent-id", metavar="ID", help="default: this machine's host name (short form)"
    )
    agent.add_argument("--resource-group", default="default", metavar="G")
    _add_detection_arguments(agent.add_argument_group("detection"))
    _add_kubernetes_arguments(agent.add_argument_group("Kubernetes"))
    add_log_level_argument(agent)


def _add_detection_arguments(group: Any) -> None:
    """What the agent reads its host's lists from (as ``docker-variant providers`` does)."""
    group.add_argument(
        "--providers-file",
        metavar="FILE",
        help="supported lists, or `docker-variant providers --devices --json` output, "
        "instead of detection (default $DOCKER_VARIANT_PROVIDERS_FILE)",
    )
    group.add_argument(
        "--host-root",
        metavar="DIR",
        help="read the host's files (sys/..., opt/rocm/...) under DIR, as an agent in a "
        "container with the host's /sys mounted under DIR does; NVML is not affected "
        "(default $DOCKER_VARIANT_HOST_ROOT, else /)",
    )
    group.add_argument(
        "--descriptors",
        metavar="DIR",
        help="also read the device descriptors (*.toml) in DIR, after "
        "/etc/docker-variant/providers.d and $XDG_CONFIG_HOME/docker-variant/providers.d "
        "(default $DOCKER_VARIANT_DESCRIPTORS)",
    )
    group.add_argument(
        "--enable-provider",
        action="append",
        default=[],
        metavar="NS",
        help="also run the third-party provider plugin for namespace NS",
    )


def _add_kubernetes_arguments(group: Any) -> None:
    """The Node labels and containerd's hosts.toml that the agent keeps current."""
    group.add_argument(
        "--label-node",
        action="store_true",
        help="keep this Kubernetes Node's variant.pep817.dev/ labels current on each "
        "detection (needs the [kubernetes] extra)",
    )
    group.add_argument(
        "--node-name",
        metavar="NAME",
        help="the Node to label (default $NODE_NAME, the Downward API's spec.nodeName)",
    )
    group.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="the apiserver and credentials (default: the pod's service account, else "
        "$KUBECONFIG or ~/.kube/config)",
    )
    group.add_argument(
        "--cpu-flags",
        action="store_true",
        help="also label each CPU flag (x86_64 :: avx2 :: on: 10 to 50 labels)",
    )
    group.add_argument(
        "--containerd-hosts",
        action="append",
        default=[],
        metavar="REGISTRY",
        help="keep DIR/REGISTRY/hosts.toml (--containerd-hosts-dir) what `docker-variant k8s "
        "containerd-hosts REGISTRY` writes for this node, rewritten atomically when detection "
        "changes it (repeat for more registries)",
    )
    group.add_argument(
        "--containerd-hosts-dir",
        metavar="DIR",
        default="/etc/containerd/certs.d",
        help="containerd's hosts directory (config_path; default %(default)s)",
    )
    group.add_argument(
        "--containerd-server",
        metavar="URL",
        help="the variant-proxy the hosts.toml files send pulls to (default http://REGISTRY "
        "on loopback, else https://REGISTRY)",
    )
    group.add_argument(
        "--containerd-ca-file",
        metavar="FILE",
        help="the CA bundle (PEM) containerd trusts for --containerd-server: kept beside "
        "each hosts.toml as ca.crt",
    )
    group.add_argument(
        "--containerd-client-cert",
        metavar="FILE",
        help="the client certificate (PEM) containerd presents to --containerd-server: kept "
        "beside each hosts.toml as client.cert",
    )
    group.add_argument(
        "--containerd-client-key",
        metavar="FILE",
        help="its key, unless in the certificate's file: kept as client.key (mode 0600)",
    )


def run_agent_command(args: Any, error: Callable[[str], Any]) -> int:
    """Check the arguments (``error``: one line, exit 2), then beat until SIGTERM/SIGINT."""
    import os
    import signal
    import socket
    import sys
    import threading
    from pathlib import Path

    from docker_variant.agent.client import check_scheduler_url
    from docker_variant.agent.node import Agent
    from docker_variant.agent.settings import AgentSettings
    from docker_variant.api.names import check_agent_id
    from docker_variant.providers import PROVIDERS_FILE_ENV, HostRoot
    from docker_variant.server.logs import configure_logging

    try:
        if args.scheduler is None and not args.label_node and not args.containerd_hosts:
            raise InvalidInputError(
                "give --scheduler URL, --label-node, --containerd-hosts REGISTRY, or several"
            )
        containerd_server = _containerd(args)
        scheduler = check_scheduler_url(args.scheduler) if args.scheduler is not None else None
        use_client_tls(args)
        node_name = _node_name(args) if args.label_node else None
        agent_id = check_agent_id(args.agent_id or socket.gethostname().split(".")[0])
        group = args.resource_group
        try:
            check_agent_id(group)  # resource groups follow the agent ids' rule
        except InvalidInputError as exc:
            raise InvalidInputError(str(exc).replace("agent_id", "--resource-group", 1)) from None
        providers_file = args.providers_file or os.environ.get(PROVIDERS_FILE_ENV) or None
        host_root = Path(args.host_root) if args.host_root is not None else None
        if host_root is not None:
            HostRoot.resolve(host_root)  # named in one line now, even with a providers file
        settings = AgentSettings(
            scheduler,
            agent_id,
            group,
            args.interval,
            Path(args.token_file) if args.token_file is not None else None,
            Path(providers_file) if providers_file else None,
            tuple(args.enable_provider),
            host_root=host_root,
            descriptors=Path(args.descriptors) if args.descriptors is not None else None,
            node_name=node_name,
            kubeconfig=Path(args.kubeconfig) if args.kubeconfig is not None else None,
            cpu_flags=args.cpu_flags,
            containerd_hosts=tuple(dict.fromkeys(args.containerd_hosts)),
            containerd_dir=Path(args.containerd_hosts_dir),
            containerd_server=containerd_server,
            **_containerd_tls(args),
        )
        configure_logging(args.log_level)
        stop = threading.Event()
        # before the first detection, so that a stop during it is clean too
        stop_on_signals(stop, signal.SIGTERM, signal.SIGINT)
        agent = Agent(settings, stop=stop)
        agent.report()  # a bad providers file or provider is bad input now, not at 3 a.m.
    except InvalidInputError as exc:
        error(one_line(str(exc)))
        return 2
    except DockerVariantError as exc:  # a provider plugin failed (exit 4)
        sys.stderr.write(f"variant-scheduler agent: error: {one_line(str(exc))}\n")
        return exc.exit_code
    try:
        return agent.run()
    finally:
        agent.close()


def stop_on_signals(stop: threading.Event, *signums: int) -> None:
    """Set ``stop`` when one of ``signums`` arrives (main thread only).

    Not from a Python handler: a handler runs in the main thread between two bytecodes,
    possibly inside ``stop.wait()`` while that holds the event's lock, and ``stop.set()``
    would then wait for the lock forever (the agent ignored SIGTERM). The interpreter's C
    handler writes the signal's number to a pipe instead (``signal.set_wakeup_fd``), and a
    thread that reads it sets the event."""
    import os
    import signal
    import threading

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler must never block
    for signum in signums:
        signal.signal(signum, lambda _signum, _frame: None)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def relay() -> None:
        while (byte := os.read(read_fd, 1)) and byte[0] not in signums:
            pass  # another signal with a Python handler: not ours to act on
        stop.set()

    threading.Thread(target=relay, name="signal relay", daemon=True).start()


def _containerd(args: Any) -> str | None:
    """``--containerd-hosts``' registries and ``--containerd-server``, checked now (exit 2)."""
    from docker_variant.k8s.containerd import check_registry, check_server

    for registry in args.containerd_hosts:
        check_registry(registry)
    if args.containerd_server is None:
        return None
    if not args.containerd_hosts:
        raise InvalidInputError("--containerd-server: give --containerd-hosts REGISTRY too")
    return check_server(args.containerd_server)


def _containerd_tls(args: Any) -> dict[str, Path | None]:
    """``--containerd-ca-file`` and ``--containerd-client-cert/-key``, checked now as every
    TLS option is (``client_tls``: readable PEM, a CA bundle, a key that fits; exit 2), not
    a warning at every detection."""
    from pathlib import Path

    from docker_variant.oci.http import TLSFiles, client_tls

    ca, cert, key = args.containerd_ca_file, args.containerd_client_cert, args.containerd_client_key
    names = ("--containerd-ca-file", "--containerd-client-cert", "--containerd-client-key")
    given = [name for name, value in zip(names, (ca, cert, key), strict=True) if value is not None]
    if given and not args.containerd_hosts:
        raise InvalidInputError(f"{given[0]}: give --containerd-hosts REGISTRY too")
    client_tls(TLSFiles(() if ca is None else (ca,), cert, key, names))
    return {
        "containerd_ca": Path(ca) if ca is not None else None,
        "containerd_client_cert": Path(cert) if cert is not None else None,
        "containerd_client_key": Path(key) if key is not None else None,
    }


#: Where the Downward API puts the node's name (``fieldRef: spec.nodeName``).
NODE_NAME_ENV = "NODE_NAME"


def _node_name(args: Any) -> str:
    """The Node ``--label-node`` labels: a DNS subdomain, checked now (exit 2)."""
    import os
    import re

    from docker_variant.extras import KUBERNETES

    KUBERNETES.require("variant-scheduler agent --label-node")
    name = args.node_name or os.environ.get(NODE_NAME_ENV, "")
    if not name:
        raise InvalidInputError(
            f"--label-node: no node name (give --node-name, or set ${NODE_NAME_ENV} from the "
            "Downward API's spec.nodeName)"
        )
    # a Node's name is a DNS subdomain (RFC 1123): at most 253 characters
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    if len(name) > 253 or not re.fullmatch(rf"{label}(\.{label})*", name):
        raise InvalidInputError(
            f"--node-name {one_line(name, 80)!r}: not a node name (a DNS subdomain: lower-case "
            "letters, digits, '-' and '.', at most 253 characters)"
        )
    return name
