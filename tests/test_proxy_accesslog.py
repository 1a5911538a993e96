"""The proxy's access log: one JSON line per request, the same fields whether it is written
straight to stderr in batches (the server) or as a logging record (an embedding app)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from pathlib import Path

import httpx

import devstack
from docker_variant.proxy.metrics import (
    ACCESS_LOGGER,
    AccessLines,
    ProxyMetrics,
    RequestLog,
    access_line,
)
from docker_variant.server.logs import JsonFormatter
from fakeupstream import FakeUpstream, Reply


def _as_record(fields: dict[str, object]) -> dict[str, object]:
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "request", None, None)
    record.fields = fields
    entry: dict[str, object] = json.loads(JsonFormatter().format(record))
    return entry


def test_a_line_is_what_the_json_formatter_writes_for_the_record() -> None:
    for path in ("/v2/a/manifests/1", '/v2/"quoted"\\/x', "/v2/caf\u00e9/\x1b[31m/\u2028"):
        line = access_line("GET", "manifest", path, 200, 0.57, 1234)
        assert line.endswith("\n") and line.count("\n") == 1
        ours = json.loads(line)
        theirs = _as_record(
            {"method": "GET", "route": "manifest", "path": path, "status": 200,
             "duration_ms": 0.57, "bytes": 1234},
        )  # fmt: skip
        assert ours.pop("ts") > 0 and theirs.pop("ts") > 0
        assert ours == theirs
        assert list(json.loads(line)) == sorted(json.loads(line))  # the same key order
    assert json.loads(access_line("GET", "blob", "/", 0, 1.0, 0))["status"] is None  # aborted


def test_lines_are_written_whole_in_order_in_batches() -> None:
    stream = io.StringIO()
    metrics = ProxyMetrics()
    requests = RequestLog(metrics, AccessLines(stream), batch=3)
    for n in range(7):
        requests.count("GET", "blob", f"/{n}", 200, n, 0.0)
    assert len(stream.getvalue().splitlines()) == 7  # no loop here: each line at once
    stream.truncate(0)
    stream.seek(0)

    async def burst() -> tuple[list[int], bytes]:
        seen = []
        for n in range(7):
            requests.count("GET", "blob", f"/{n}", 200 if n else 0, n, time.perf_counter())
            seen.append(len(stream.getvalue().splitlines()))
        scraped = metrics.render()  # counts every request so far, and logs the waiting ones
        requests.flush()
        return seen, scraped

    seen, scraped = asyncio.run(burst())
    assert seen == [0, 0, 3, 3, 3, 6, 6]
    assert b'route="blob",status="200"} 13.0' in scraped
    assert b'route="blob",status="aborted"} 1.0' in scraped
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [entry["path"] for entry in entries] == [f"/{n}" for n in range(7)]
    assert [entry["bytes"] for entry in entries] == list(range(7))
    assert entries[0]["status"] is None and entries[1]["status"] == 200
    # stamped when each request ended, not when its batch was written
    assert all(abs(entry["ts"] - time.time()) < 60 for entry in entries)


def test_the_server_logs_every_request_once(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    """1,000 requests, then SIGTERM: the batched lines are all written before the proxy
    exits (docs/security.md says what a SIGKILL can lose)."""
    count = 1000
    fake_upstream.routes["/v2/"] = Reply(200, b"{}")
    for n in range(count):
        fake_upstream.routes[f"/v2/log/manifests/{n}"] = Reply(200, b"{}")
    proxy = devstack.start_proxy(fake_upstream.url, tmp_path / "proxy")
    try:
        with httpx.Client(base_url=proxy.url) as client:
            for n in range(count):
                assert client.get(f"/v2/log/manifests/{n}").status_code == 200
    finally:
        proxy.stop()  # a graceful stop writes what is waiting
    entries = [json.loads(line) for line in proxy.log.read_text().splitlines()]
    access = [e for e in entries if e.get("logger") == ACCESS_LOGGER]
    manifests = [e["path"] for e in access if e["route"] == "manifest"]
    assert manifests == [f"/v2/log/manifests/{n}" for n in range(count)]
    assert all(e["status"] == 200 and e["method"] == "GET" for e in access[-count:])
    # the start line says what the proxy fronts
    assert any(fake_upstream.url in e.get("message", "") for e in entries), entries[:3]
