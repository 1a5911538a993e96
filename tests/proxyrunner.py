"""Run ``variant-proxy`` in a background thread of the test process (uvicorn, real sockets)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

from docker_variant.proxy import create_app
from docker_variant.proxy.__main__ import server_config
from docker_variant.proxy.metrics import ProxyMetrics

_START_TIMEOUT_S = 15.0


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
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("variant-proxy did not start")
            time.sleep(0.01)
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
