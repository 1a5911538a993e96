"""The dev stack's services start on a port of their own even when the probed one is taken."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import devstack


@pytest.fixture
def held_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A loopback port another process listens on, handed out by the first ``free_port``
    probe (as when something takes a probed port before the service binds it)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port: int = held.getsockname()[1]
        probes = iter([port])
        real = devstack.free_port
        monkeypatch.setattr(devstack, "free_port", lambda: next(probes, 0) or real())
        yield port


STARTERS: dict[str, Callable[[Path], devstack.Service]] = {
    "redis": devstack.start_redis,
    "scheduler": devstack.start_scheduler,
    "registry": devstack.start_registry,
}


@pytest.mark.parametrize("name", list(STARTERS))
def test_a_taken_port_is_not_taken_for_the_service(
    name: str, held_port: int, tmp_path: Path
) -> None:
    service = STARTERS[name](tmp_path / name)
    try:
        port = int(service.address.rsplit(":", 1)[1])
        assert port != held_port
        assert devstack.listens(service.process.pid, port)
        assert not devstack.listens(service.process.pid, held_port)
    finally:
        service.stop()


def test_listens_tells_the_owner_of_a_listener() -> None:
    with socket.socket(socket.AF_INET6) as six, socket.socket() as four:
        six.bind(("::1", 0))
        six.listen()
        four.bind(("127.0.0.1", 0))
        four.listen()
        assert devstack.listens(os.getpid(), six.getsockname()[1])
        assert devstack.listens(os.getpid(), four.getsockname()[1])
        assert not devstack.listens(1, four.getsockname()[1])  # init holds no such socket
