"""What an agent is told to do: where to report, as whom, how often, from which lists, and
whether it keeps its Kubernetes Node's labels and containerd's hosts.toml files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from docker_variant.agent import DEFAULT_INTERVAL_S

__all__ = ["AgentSettings"]


@dataclass(frozen=True)
class AgentSettings:
    scheduler: str | None  # checked base URL; None: no heartbeats (node labels only)
    agent_id: str
    resource_group: str = "default"
    interval: float = DEFAULT_INTERVAL_S
    token_file: Path | None = None
    providers_file: Path | None = None
    enable: tuple[str, ...] = ()  # third-party provider plugins opted in
    # where file-based detection reads the host's files (None: $DOCKER_VARIANT_HOST_ROOT, /)
    host_root: Path | None = None
    descriptors: Path | None = None  # a directory of device descriptors, read after the system's
    # --label-node: keep this Node's variant.pep817.dev/ labels (None: not asked)
    node_name: str | None = None
    kubeconfig: Path | None = None  # None: the pod's service account, else $KUBECONFIG
    cpu_flags: bool = False  # label CPU flags too
    # --containerd-hosts: keep containerd_dir/REGISTRY/hosts.toml for each of these registries
    containerd_hosts: tuple[str, ...] = ()
    containerd_dir: Path = Path("/etc/containerd/certs.d")
    containerd_server: str | None = None  # the variant-proxy (None: http(s)://REGISTRY)
    # what containerd trusts and presents for that server: copied beside each hosts.toml
    containerd_ca: Path | None = None
    containerd_client_cert: Path | None = None
    containerd_client_key: Path | None = None  # None: in the certificate's file, or none
