"""Agents that prove themselves with their projected ServiceAccount token
(``variant-scheduler serve --agent-auth kubernetes``): no shared Secret of every node's token.

The agent's pod mounts a projected token of the audience ``AUDIENCE``; the scheduler asks
the apiserver to review it (``TokenReview``) and takes it as the agent of the Node the pod
is bound to: the apiserver puts that Node's name in the token's
``authentication.kubernetes.io/node-name`` extra when the pod is bound to a Node. The token
must be of the agents' ServiceAccount (``--agent-service-account NAMESPACE/NAME``) and of the
audience; a token of no pod, of another ServiceAccount or of another audience is not an
agent's. So an agent may report for its own Node only, whatever it sends.

A review is kept for ``CACHE_S`` (tokens live an hour or more; the kubelet renews them well
before), so a heartbeat costs a review only once a minute per node.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from docker_variant.errors import UnreachableError, one_line
from docker_variant.scheduler.tokens import Principal

if TYPE_CHECKING:
    from lightkube import Client

__all__ = ["AUDIENCE", "NODE_NAME_EXTRA", "KubernetesAgents"]

AUDIENCE = "docker-variant-scheduler"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
CACHE_S = 60.0
_CACHED = 100_000  # reviews kept at most (one per node and token)


class KubernetesAgents:
    """``find(token)``: the agent whose Node a projected token names, by a TokenReview."""

    def __init__(
        self,
        client: Client,
        service_account: str,
        audience: str = AUDIENCE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        namespace, _, name = service_account.partition("/")
        self.client = client
        self.username = f"system:serviceaccount:{namespace}:{name}"
        self.audience = audience
        self.clock = clock
        self._lock = threading.Lock()
        self._reviews: dict[bytes, tuple[float, Principal | None]] = {}

    def find(self, token: str) -> Principal | None:
        """The agent of ``token``'s Node; None when it is not an agent's projected token.
        ``UnreachableError`` when the apiserver cannot be asked."""
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        now = self.clock()
        with self._lock:
            kept = self._reviews.get(key)
        if kept is not None and now - kept[0] < CACHE_S:
            return kept[1]
        found = self._review(token)
        with self._lock:
            if len(self._reviews) >= _CACHED:
                self._reviews.clear()
            self._reviews[key] = (now, found)
        return found

    def _review(self, token: str) -> Principal | None:
        from lightkube import ApiError
        from lightkube.models.authentication_v1 import TokenReviewSpec
        from lightkube.resources.authentication_v1 import TokenReview

        review = TokenReview(spec=TokenReviewSpec(token=token, audiences=[self.audience]))
        try:
            status = self.client.create(review).status
        except (ApiError, httpx.HTTPError) as exc:
            why = one_line(str(exc)) or type(exc).__name__
            raise UnreachableError(f"reviewing an agent's token at the apiserver: {why}") from None
        if status is None or not status.authenticated or status.user is None:
            return None
        if self.audience not in (status.audiences or []) or status.user.username != self.username:
            return None
        nodes = (status.user.extra or {}).get(NODE_NAME_EXTRA) or []
        if len(nodes) != 1:  # a token bound to no pod, or to a pod not yet on a Node
            return None
        return Principal("agent", nodes[0], nodes[0])
