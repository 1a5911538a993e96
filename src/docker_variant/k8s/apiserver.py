"""Talking to a Kubernetes apiserver, through lightkube (the ``[kubernetes]`` extra).

The one module that does: everything else in ``k8s`` builds objects and is pure. Here the
node agent keeps its own Node's ``variant.pep817.dev/`` labels what ``node_labels`` says:
a JSON merge patch of ``metadata.labels`` alone, adding and changing the prefix's labels and
removing (``null``) those of the prefix that are stale, never touching another label.

``k8s gang`` reads the cluster (``cluster_state``: Nodes, ResourceSlices, every namespace's
ResourceClaims) and creates its objects (``create_all``) with ``fieldValidation=Strict``,
as ``kubectl create --validate=strict``: an unknown field is refused, never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from docker_variant.errors import InvalidInputError, UnreachableError, one_line
from docker_variant.k8s.labels import LABEL_PREFIX

if TYPE_CHECKING:
    from lightkube import Client

__all__ = [
    "FIELD_MANAGER",
    "NodeLabeller",
    "StrictFields",
    "cluster_state",
    "connect",
    "create_all",
    "label_patch",
]

FIELD_MANAGER = "variant-agent"
GANG_FIELD_MANAGER = "docker-variant-gang"
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


def connect(
    kubeconfig: Path | None = None,
    transport: httpx.BaseTransport | None = None,
    *,
    strict: bool = False,
    field_manager: str = FIELD_MANAGER,
) -> Client:
    """A client with ``kubeconfig``'s current context, else the pod's service account (in
    a cluster), else ``$KUBECONFIG`` or ``~/.kube/config``. A configuration that cannot be
    read is ``InvalidInputError``. ``strict``: every write asks ``fieldValidation=Strict``
    (``StrictFields``)."""
    from lightkube import Client, KubeConfig
    from lightkube.config.client_adapter import verify_cluster
    from lightkube.config.models import User

    from docker_variant.oci.http import sync_transport

    try:
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
        else:
            config = KubeConfig.from_env()
        if strict:
            if transport is None:
                # the transport lightkube would make: the cluster's CA, the user's certificate
                single = config.get()
                if single is None:
                    raise ValueError("no current context")
                verify = verify_cluster(single.cluster, single.user or User(), single.abs_file)
                transport = sync_transport(tls=verify)
            transport = StrictFields(transport)
        elif transport is not None:
            transport = Handed(transport)
        extra: dict[str, Any] = {} if transport is None else {"transport": transport}
        return Client(
            config, timeout=httpx.Timeout(REQUEST_TIMEOUT_S), field_manager=field_manager, **extra
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


class Handed(httpx.BaseTransport):
    """A transport handed to lightkube as it is. lightkube 0.19 and later deep-copy the
    client's connection parameters (``dataclasses.asdict``), which would copy the transport:
    its SSL context (that cannot be copied) and any state of its own. This one is not copied."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def __deepcopy__(self, memo: dict[int, Any]) -> Handed:
        return self

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class StrictFields(Handed):
    """An httpx transport that asks ``fieldValidation=Strict`` of every write (lightkube's
    ``create`` has no such parameter), then sends the request through ``inner``."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method in ("POST", "PUT", "PATCH"):
            request.url = request.url.copy_merge_params({"fieldValidation": "Strict"})
        return self.inner.handle_request(request)


def _refused(what: str, exc: Exception) -> UnreachableError:
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        status = exc.status
        return UnreachableError(f"{what}: {status.code} {one_line(status.message or '', 300)}")
    return UnreachableError(f"{what}: {one_line(str(exc)) or type(exc).__name__}")


def cluster_state(client: Client) -> list[dict[str, Any]]:
    """Every Node, ResourceSlice and ResourceClaim (of every namespace), as dicts."""
    from lightkube import ALL_NS, ApiError
    from lightkube.resources.core_v1 import Node
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

    found: list[dict[str, Any]] = []
    listings: list[tuple[str, Any]] = [
        ("Node", lambda: client.list(Node)),
        ("ResourceSlice", lambda: client.list(ResourceSlice)),
        ("ResourceClaim", lambda: client.list(ResourceClaim, namespace=ALL_NS)),
    ]
    for kind, listing in listings:
        try:
            for obj in listing():
                document: dict[str, Any] = obj.to_dict()
                document.setdefault("kind", kind)
                found.append(document)
        except (ApiError, httpx.HTTPError) as exc:
            raise _refused(f"listing {kind}s", exc) from None
    return found


def create_all(
    client: Client, objects: list[dict[str, Any]], namespace: str | None = None
) -> list[str]:
    """Create ``objects`` in order (in ``namespace``, else the client's); ``kind/name`` of
    each created. The first refusal stops, as ``UnreachableError`` naming the object."""
    from lightkube import ApiError
    from lightkube.codecs import from_dict

    created = []
    for document in objects:
        what = f"{document['kind']}/{document['metadata']['name']}"
        try:
            # the overloads tell global from namespaced kinds statically; a document is either
            resource: Any = from_dict(document)
            client.create(resource, namespace=namespace)
        except (ApiError, httpx.HTTPError) as exc:
            raise _refused(f"creating {what}", exc) from None
        created.append(what)
    return created
