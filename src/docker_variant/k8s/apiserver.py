"""Talking to a Kubernetes apiserver, through lightkube (the ``[kubernetes]`` extra).

The one module that does: everything else in ``k8s`` builds objects and is pure. Here the
node agent keeps its own Node's ``variant.pep817.dev/`` labels what ``node_labels`` says:
a JSON merge patch of ``metadata.labels`` alone, adding and changing the prefix's labels and
removing (``null``) those of the prefix that are stale, never touching another label.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docker_variant.errors import InvalidInputError, UnreachableError, one_line
from docker_variant.k8s.labels import LABEL_PREFIX

if TYPE_CHECKING:
    import httpx
    from lightkube import Client

__all__ = ["FIELD_MANAGER", "NodeLabeller", "connect", "label_patch"]

FIELD_MANAGER = "variant-agent"
REQUEST_TIMEOUT_S = 10.0


def label_patch(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """The ``metadata.labels`` of a merge patch taking a node from ``current`` to ``wanted``
    for the prefix's labels (``None`` removes one); empty when nothing changes."""
    prefix = f"{LABEL_PREFIX}/"
    patch: dict[str, str | None] = {
        key: value for key, value in wanted.items() if current.get(key) != value
    }
    for key in current:
        if key.startswith(prefix) and key not in wanted:
            patch[key] = None
    return patch


def connect(kubeconfig: Path | None = None, transport: httpx.BaseTransport | None = None) -> Client:
    """A client with ``kubeconfig``'s current context, else the pod's service account (in
    a cluster), else ``$KUBECONFIG`` or ``~/.kube/config``. A configuration that cannot be
    read is ``InvalidInputError``."""
    import httpx
    from lightkube import Client, KubeConfig

    extra: dict[str, Any] = {} if transport is None else {"transport": transport}
    try:
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)  # type: ignore[no-untyped-call]
        else:
            config = KubeConfig.from_env()  # type: ignore[no-untyped-call]
        return Client(
            config, timeout=httpx.Timeout(REQUEST_TIMEOUT_S), field_manager=FIELD_MANAGER, **extra
        )
    # lightkube's loading raises ConfigError, OSError, YAML errors, KeyError or TypeError
    # on a malformed document: each is the file's fault, said in one line
    except Exception as exc:
        where = (
            f"--kubeconfig {str(kubeconfig)!r}"
            if kubeconfig
            else "the Kubernetes config (service account, $KUBECONFIG, ~/.kube/config)"
        )
        why = one_line(str(exc)) or type(exc).__name__
        raise InvalidInputError(f"{where}: cannot load it ({why})") from None


class NodeLabeller:
    """Keeps one Node's labels of the prefix current (``sync``)."""

    def __init__(self, client: Client, node_name: str) -> None:
        self.client = client
        self.node_name = node_name

    def sync(self, wanted: Mapping[str, str]) -> dict[str, str | None]:
        """Read the Node, patch what differs; the patch sent (empty: none was needed).
        ``UnreachableError`` when the apiserver cannot be reached or refuses."""
        import httpx
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        try:
            node = self.client.get(Node, self.node_name)
            current = dict((node.metadata.labels if node.metadata else None) or {})
            patch = label_patch(current, wanted)
            if patch:
                body: dict[str, Any] = {"metadata": {"labels": patch}}
                self.client.patch(Node, self.node_name, body, patch_type=PatchType.MERGE)
            return patch
        except ApiError as exc:
            status = exc.status
            raise UnreachableError(
                f"node {self.node_name}: {status.code} {one_line(status.message or '', 200)}"
            ) from None
        except httpx.HTTPError as exc:
            raise UnreachableError(
                f"node {self.node_name}: {one_line(str(exc)) or type(exc).__name__}"
            ) from None
