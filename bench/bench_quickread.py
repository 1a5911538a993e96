"""The proxy's own Python per manifest GET, in one process, without sockets.

Run: .venv/bin/python bench/bench_quickread.py [--requests N] [--tiny]
(a few seconds; ``--tiny``: a few hundred requests, a check that the bench runs.)

A manifest GET goes through the proxy's quick read path (``proxy/handoff.py``,
``proxy/quickread.py``, ``proxy/upstreampool.py``) as in the server: the client's request
bytes are fed to uvicorn's protocol as the proxy runs it, its head comes out on a fake
upstream connection, the registry's answer (a real one, as distribution 2.8 sends it) is fed
to that connection, and the answer comes out on the fake client transport. No system call
is made, so the figure is the proxy's Python alone. The baseline, in the same run, is a bare
relay's Python (each read written on, no HTTP): what ``bench_proxy.py``'s bare uvloop relay
runs per request.

Each is timed warm (requests back to back) and cold (the CPU caches flushed by writing 16 MiB
before each request): between two requests in a running proxy the registry's work evicts the
proxy's code and data, so the cold figure is nearer to what a request costs there
(``bench_proxy.py`` measures that from outside).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import uvloop
from uvicorn.server import ServerState

from docker_variant.proxy.__main__ import server_config
from docker_variant.proxy.app import create_app
from docker_variant.proxy.handoff import HandoffHttpToolsProtocol
from docker_variant.proxy.metrics import AccessLines
from docker_variant.proxy.upstreampool import _Connection

MANIFEST = (
    b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", '
    b'"config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": '
    b'"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2}, '
    b'"layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": '
    b'"sha256:b41bd5544d56a1b0ab7e16391eea5648e52582f5f5d2b60fc4fb55c2bcd1751f", "size": 1000}]}'
)
DIGEST = b"sha256:1aae491249e3638516794a2f103e6f729c73af55bfe3f1a1712f64bb221e20f4"
# what httpx sends, and what distribution 2.8 answers
REQUEST = (
    b"GET /v2/bench/blob/manifests/1 HTTP/1.1\r\nHost: 127.0.0.1:5000\r\n"
    b"Accept: application/vnd.oci.image.manifest.v1+json\r\nAccept-Encoding: gzip, deflate\r\n"
    b"Connection: keep-alive\r\nUser-Agent: python-httpx/0.28.1\r\n\r\n"
)
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
    b"Content-Type: application/vnd.oci.image.manifest.v1+json\r\n"
    b"Docker-Content-Digest: %s\r\nDocker-Distribution-Api-Version: registry/2.0\r\n"
    b'Etag: "%s"\r\nX-Content-Type-Options: nosniff\r\n'
    b"Date: Thu, 03 Dec 2026 17:21:12 GMT\r\n\r\n" % (len(MANIFEST), DIGEST, DIGEST)
) + MANIFEST
FLUSH_BYTES = 16 << 20


class FakeTransport:
    """Enough of a uvloop TCP transport for the protocols: writes are kept, not sent."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, chunks: list[bytes]) -> None:
        self.written.extend(chunks)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        addresses = {"sockname": ("127.0.0.1", 5000), "peername": ("127.0.0.1", 40000)}
        return addresses.get(name, default)


class BareSide(asyncio.Protocol):
    """The bare relay's side: each read written to the other side's transport."""

    def __init__(self, peer: FakeTransport) -> None:
        self.peer = peer

    def data_received(self, data: bytes) -> None:
        self.peer.write(data)


def timed_us(one: Callable[[], None], requests: int, cold: bool) -> float:
    """Median over 7 rounds of the mean time of ``one()`` (us); cold: the caches flushed
    before each call, outside the timing."""
    flush = bytearray(FLUSH_BYTES)
    zeros = bytes(FLUSH_BYTES // 64)
    clock = time.perf_counter
    rounds = []
    for _ in range(7):
        total = 0.0
        for _ in range(requests):
            if cold:
                flush[::64] = zeros  # one write per cache line
            start = clock()
            one()
            total += clock() - start
        rounds.append(total / requests * 1e6)
    return statistics.median(rounds)


async def measure(requests: int) -> None:
    with open("/dev/null", "w") as nowhere:
        await measure_with(requests, AccessLines(nowhere))


async def measure_with(requests: int, access_lines: AccessLines) -> None:
    app = create_app("http://127.0.0.1:5001", 3600, access_lines=access_lines)
    async with app.router.lifespan_context(app):
        config = server_config(app)
        config.load()
        protocol = HandoffHttpToolsProtocol(config=config, server_state=ServerState(), app_state={})
        down = FakeTransport()
        protocol.connection_made(down)  # type: ignore[arg-type]
        pool = app.reads.service().upstream.raw  # type: ignore[attr-defined]
        pool.loop = asyncio.get_running_loop()  # as after its first connection
        connection = _Connection()
        up = FakeTransport()
        connection.connection_made(up)  # type: ignore[arg-type]
        pool.release(connection, True)

        def proxy_get() -> None:
            protocol.data_received(REQUEST)
            connection.data_received(ANSWER)

        relay_up, relay_down = FakeTransport(), FakeTransport()
        client_side, upstream_side = BareSide(relay_up), BareSide(relay_down)

        def relay_get() -> None:
            client_side.data_received(REQUEST)
            upstream_side.data_received(ANSWER)

        proxy_get()  # the check: the quick path answered, over the one kept-alive connection
        assert len(up.written) == 1 and up.written[0].startswith(b"GET /v2/bench/blob/"), up.written
        assert down.written[-1].endswith(MANIFEST), down.written[-1][:300]
        assert b"200 OK" in down.written[-1], down.written[-1][:300]

        print(f"per manifest GET, median of 7 rounds of {requests} (us, Python only)")
        for cold in (False, True):
            figures = {}
            for name, one in (("proxy", proxy_get), ("bare relay", relay_get)):
                figures[name] = timed_us(one, requests, cold)
                up.written.clear()
                down.written.clear()
                relay_up.written.clear()
                relay_down.written.clear()
            proxy, relay = figures["proxy"], figures["bare relay"]
            print(
                f"  {'cold' if cold else 'warm'}: proxy quick read {proxy:6.1f}   bare relay "
                f"{relay:5.1f}   ratio proxy/relay {proxy / relay:.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per round")
    parser.add_argument("--tiny", action="store_true", help="a few hundred requests (CI)")
    args = parser.parse_args()
    uvloop.run(measure(50 if args.tiny else args.requests))


if __name__ == "__main__":
    main()
