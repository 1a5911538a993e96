"""proxy/handoff.py leans on uvicorn's private HTTP protocol: the uvicorn releases it supports
are bounded in pyproject.toml, the installed one is inside that range, and every private name
the module uses exists on a live connection of it."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.protocols.http import flow_control, httptools_impl

from docker_variant.proxy.__main__ import QuietServer
from docker_variant.proxy.handoff import PRIVATE_NAMES, HandoffHttpToolsProtocol, socket_handoff
from proxyrunner import eventually

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# The releases handoff.py was checked on; pyproject.toml must say the same.
SUPPORTED_UVICORN = ">=0.30,<0.56"


def _requirement(name: str) -> Requirement:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    (found,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == name]
    return found


def test_uvicorn_is_bounded_to_the_supported_range_and_the_installed_one_is_in_it() -> None:
    required = _requirement("uvicorn")
    assert str(required.specifier) == str(Requirement(f"uvicorn{SUPPORTED_UVICORN}").specifier)
    assert any(spec.operator == "<" for spec in required.specifier), "no upper bound"
    installed = Version(version("uvicorn"))
    assert required.specifier.contains(installed), f"uvicorn {installed} is not {required}"


def test_the_private_classes_handoff_uses_exist() -> None:
    assert issubclass(HandoffHttpToolsProtocol, httptools_impl.HttpToolsProtocol)
    assert isinstance(httptools_impl.RequestResponseCycle, type)
    assert isinstance(flow_control.FlowControl, type)
    for name in ("on_headers_complete", "on_response_complete"):
        assert callable(getattr(httptools_impl.HttpToolsProtocol, name))
    assert callable(flow_control.FlowControl.pause_reading)


def test_every_private_name_exists_on_a_live_connection() -> None:
    """A request through uvicorn with handoff's protocol: the objects its ``SocketHandoff``
    holds have every attribute that handoff.py reads or writes."""
    missing: dict[str, list[str]] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        handoff = socket_handoff(scope)
        assert handoff is not None
        objects = {
            "HttpToolsProtocol": handoff._protocol,
            "RequestResponseCycle": handoff._cycle,
            "FlowControl": handoff._protocol.flow,
        }
        for cls, names in PRIVATE_NAMES.items():
            absent = [n for n in names if not hasattr(objects[cls], n)]
            if absent:
                missing[cls] = absent
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=HandoffHttpToolsProtocol, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        eventually(lambda: server.started or not thread.is_alive(), 15.0, "uvicorn started")
        answer = httpx.get(f"http://127.0.0.1:{port}/")
        assert answer.status_code == 200 and answer.text == "ok"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
    assert missing == {}


def test_the_quiet_server_ticks_as_uvicorn_does_and_exits_at_once_when_told() -> None:
    """``QuietServer`` (variant-proxy's uvicorn server) replaces uvicorn's main loop: it
    still calls ``on_tick`` with a counter on which uvicorn's once-a-second work runs, and
    an exit signal (``handle_exit``) ends it without waiting for the next tick."""
    ticks: list[int] = []

    class Counted(QuietServer):
        async def on_tick(self, counter: int) -> bool:
            ticks.append(counter)
            return await super().on_tick(counter)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        pass

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Counted(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        eventually(lambda: server.started or not thread.is_alive(), 15.0, "uvicorn started")
        assert server.started
        server.handle_exit(signal.SIGINT, None)
        thread.join(timeout=15)
        assert not thread.is_alive()
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
    assert ticks and all(counter % 10 == 0 for counter in ticks)


def test_an_idle_kept_alive_connection_is_closed_after_the_time_out_and_a_busy_one_is_not() -> None:
    """The protocol's keep-alive timer (one per connection): a connection whose request is
    still being answered when the timer fires stays open, is answered, and is closed once
    it has then been idle for the time-out."""
    release = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":
            await asyncio.to_thread(release.wait, 30)
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, http=HandoffHttpToolsProtocol, log_level="warning", lifespan="off",
        timeout_keep_alive=1,
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def ask(caller: socket.socket, path: str) -> bytes:
        caller.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        got = b""
        while not got.endswith(b"ok"):
            piece = caller.recv(65536)
            assert piece, got
            got += piece
        return got

    try:
        eventually(lambda: server.started or not thread.is_alive(), 15.0, "uvicorn started")
        with socket.create_connection(("127.0.0.1", port), timeout=15) as caller:
            assert ask(caller, "/").startswith(b"HTTP/1.1 200 ")
            (protocol,) = server.server_state.connections
            timer = protocol.timeout_keep_alive_task
            assert timer is not None
            caller.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            # the timer set after the first answer fires while /slow is being answered
            eventually(lambda: protocol.timeout_keep_alive_task is not timer, 15, "timer fired")
            release.set()
            got = b""
            while not got.endswith(b"ok"):
                piece = caller.recv(65536)
                assert piece, "closed while busy"
                got += piece
            assert ask(caller, "/").startswith(b"HTTP/1.1 200 ")  # still open
            assert caller.recv(1) == b""  # closed once idle for the time-out
    finally:
        release.set()
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
