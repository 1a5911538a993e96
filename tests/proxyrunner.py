"""Run ``variant-proxy`` in a background thread of the test process (uvicorn, real sockets),
and wait for what a test cannot be told about (another process, a server's state)."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn

import devstack
from docker_variant.proxy import create_app
from docker_variant.proxy.__main__ import server_config
from docker_variant.proxy.metrics import ProxyMetrics

_START_TIMEOUT_S = 15.0
_POLL_S = 0.01


def settles(check: Callable[[], bool], seconds: float) -> bool:
    """Whether ``check`` holds within ``seconds``, polled (for events a test cannot be told
    about: another process's state); looks first, so a condition already true costs nothing."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def eventually(check: Callable[[], bool], seconds: float, what: str) -> None:
    """``settles``, or fail naming ``what`` (a deadline on an outside event, not a measured
    duration)."""
    if not settles(check, seconds):
        raise AssertionError(f"not seen within {seconds} s: {what}")


class ProxyServer:
    """``with ProxyServer(upstream_url, cache_ttl=...) as proxy:`` ... ``proxy.url``."""

    def __init__(self, upstream_url: str, **kwargs: Any) -> None:
        self.app = create_app(upstream_url, **kwargs)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"  # the reference form, for skopeo
        self.url = f"http://{self.host}"
        self.server = uvicorn.Server(server_config(self.app, "warning"))
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def metrics(self) -> ProxyMetrics:
        metrics: ProxyMetrics = self.app.state.metrics
        return metrics

    def start(self) -> ProxyServer:
        self._thread.start()
        eventually(
            lambda: self.server.started or not self._thread.is_alive(),
            _START_TIMEOUT_S,
            "variant-proxy started",
        )
        if not self.server.started:
            raise RuntimeError("variant-proxy did not start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A metric's current value (0 when never observed)."""
        value = self.metrics.registry.get_sample_value(name, labels or {})
        return value or 0.0


class FrontedProxy(ProxyServer):
    """A ``ProxyServer`` behind the shipped nginx front (``deploy/nginx/variant-proxy.conf``):
    ``url``, ``host`` and ``port`` are nginx's, which sends the proxy its routes and the
    registry at ``registry_address`` the rest; metrics stay the proxy's."""

    def __init__(self, registry_address: str, upstream_url: str, **kwargs: Any) -> None:
        super().__init__(upstream_url, **kwargs)
        self.registry_address = registry_address
        self.proxy_host = self.host
        self.nginx: devstack.Service | None = None
        self._root = tempfile.mkdtemp(prefix="dv-front-")

    def start(self) -> FrontedProxy:
        super().start()
        self.nginx = devstack.start_nginx_front(
            self.registry_address, self.proxy_host, Path(self._root)
        )
        self.host = self.nginx.address
        self.port = int(self.host.rsplit(":", 1)[1])
        self.url = self.nginx.url
        return self

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        super().stop()


def proxy_for(registry_address: str, upstream_url: str, front: str, **kwargs: Any) -> ProxyServer:
    """The proxy of a test parametrized over ``front``: ``"alone"`` or ``"nginx"``."""
    if front == "nginx":
        return FrontedProxy(registry_address, upstream_url, **kwargs)
    return ProxyServer(upstream_url, **kwargs)


FRONTS = ["alone", "nginx"]
