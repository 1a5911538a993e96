"""The scheduler reads request bodies off its event loop: a 16 MiB placement took seconds to
read, and on the loop it held ``/healthz`` and every heartbeat that long."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from docker_variant.scheduler import app as scheduler_app
from test_scheduler_api import client_for
from test_scheduler_support import INDEX, agent_body, open_store


@pytest.mark.parametrize("what", ["placement", "heartbeat"])
def test_a_body_is_read_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """While a body is being read (16 MiB took seconds), /healthz is answered: the reading
    is held here on an event until /healthz has come back, which it could not if the
    reading held the event loop."""
    reading, release = threading.Event(), threading.Event()
    name = "parse_placement_body" if what == "placement" else "parse_agent_report"
    parse = getattr(scheduler_app, name)

    def held(*args: object) -> object:
        reading.set()
        release.wait(30)  # bounded: a failing server is still stopped
        return parse(*args)

    monkeypatch.setattr(scheduler_app, name, held)
    with open_store("sqlite", tmp_path) as store, client_for(store) as api:
        answers: list[httpx.Response] = []
        if what == "placement":
            body = {"index": INDEX, "nodes": 1, "devices_per_node": 0}
            send = lambda: api.post("/v1/placements", json=body, timeout=60)  # noqa: E731
        else:
            send = lambda: api.put("/v1/agents/node-1", json=agent_body(None), timeout=60)  # noqa: E731
        sender = threading.Thread(target=lambda: answers.append(send()))
        sender.start()
        try:
            assert reading.wait(30), f"the {what} body was never read"
            health = api.get("/healthz", timeout=10)
            assert health.status_code == 200
            assert not answers  # answered while the body was still being read
        finally:
            release.set()
            sender.join(60)
        assert answers and answers[0].status_code in (200, 201, 409), answers
