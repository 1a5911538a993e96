"""Plain reads answered from the event loop's callbacks: no task, ASGI scope or coroutine.

A GET or HEAD that ``ReadPassThrough`` would pass through (a manifest by tag, a blob, a tag
list...) is offered here by the server's protocol (``handoff.QuickCycle``) as soon as its
head is parsed. Its request head goes upstream at once on an idle kept-alive connection
(``UpstreamPool.send_nowait``), and the upstream's answer, when it is small and came whole,
goes down from the upstream connection's ``data_received`` as one write (bytes for bytes as
it came, where it is as plain as ``heads.PlainAnswers`` takes), then counted and logged as
every request (``RequestLog``). Everything else is handed on to ASGI from where it
stands, with the same answers as ``Upstream.pass_read`` gives: a large or streamed body
(``RelayedResponse``, blob relays included), an upstream that timed out, broke off or
answered garbage (504, 502). A request that finds no idle upstream connection, carries a
body, ``X-Variant-Properties``, ``X-Forwarded-Proto`` or ``Expect``, and an upstream
connection that closed before answering (a stale keep-alive), go ``pass_read``'s way.
"""

from __future__ import annotations

import logging
import time

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from docker_variant.proxy.blobrelay import RelayedResponse
from docker_variant.proxy.handoff import QuickCycle
from docker_variant.proxy.metrics import RequestLog, Sent
from docker_variant.proxy.names import Route
from docker_variant.proxy.passthrough import Upstream, response_head
from docker_variant.proxy.upstreampool import Answer

__all__ = ["start_quick_read"]

_log = logging.getLogger("docker_variant.proxy")

# Request headers that send a request the ASGI way: a body, transparent resolution, a
# scheme that uvicorn's proxy-headers middleware would rewrite, an expectation.
_REFUSED = frozenset(
    {b"content-length", b"transfer-encoding", b"x-variant-properties", b"x-forwarded-proto",
     b"expect"}
)  # fmt: skip


def start_quick_read(
    upstream: Upstream, cycle: QuickCycle, route: Route, requests: RequestLog, slow: ASGIApp
) -> bool:
    """Sends ``cycle``'s request upstream at ``route``, to be answered from callbacks;
    False (nothing done) where it is not for the quick path. ``slow`` is the app that
    answers it ``pass_read``'s way (after a stale keep-alive)."""
    method = cycle.method
    head = upstream.request_head(method, route, cycle.query, cycle.headers, _REFUSED)
    if head is None:
        return False
    read = _QuickRead(upstream, cycle, route, requests, slow)
    return upstream.raw.send_nowait(
        head, has_body=method != "HEAD", timeout=upstream.timeout, listener=read
    )


class _QuickRead:
    """One quick request, told its upstream answer (``upstreampool.AnswerListener``)."""

    __slots__ = ("cycle", "requests", "route", "slow", "started", "upstream")

    def __init__(
        self,
        upstream: Upstream,
        cycle: QuickCycle,
        route: Route,
        requests: RequestLog,
        slow: ASGIApp,
    ) -> None:
        self.upstream = upstream
        self.cycle = cycle
        self.route = route
        self.requests = requests
        self.slow = slow
        self.started = time.perf_counter()

    def on_answer(self, answer: Answer) -> None:
        cycle = self.cycle
        try:
            headers = self.upstream.response_headers(
                answer.headers, cycle.scope, lowered=True, tokens=answer.connection_tokens
            )
            body = answer.complete()
        except Exception:
            answer.close()
            self._failed()
            return
        if body is None:
            what = f"{cycle.method} {self.route.upstream_path()}"
            relayed = RelayedResponse(answer, headers, what, self.upstream.blob_relay)
            cycle.continue_with(self._answer_with(relayed))
            return
        self._send(answer.status, headers, body)

    def on_plain(self, data: bytes, status: int, head_end: int) -> None:
        cycle = self.cycle
        size = len(data) - head_end
        if not cycle.send_as_is(data, head_end):
            status, size = 0, 0  # the caller was gone
        self.requests.count(cycle.method, self.route.kind, cycle.path, status, size, self.started)

    def _send(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        cycle = self.cycle
        if not cycle.send_whole(response_head(status, headers), body):
            status, body = 0, b""  # the caller was gone
        self.requests.count(
            cycle.method, self.route.kind, cycle.path, status, len(body), self.started
        )

    def _failed(self) -> None:
        _log.exception("quick read of %s failed", self.route.upstream_path())
        self.cycle.continue_with(self._answer_with(None))

    def on_failure(self, error: BaseException | None) -> None:
        if error is None:  # a stale keep-alive: asked again, on a fresh connection
            self.cycle.continue_with(self.slow)
            return
        response = self.upstream.no_answer(self.cycle.method, self.route, error)
        self.cycle.continue_with(self._answer_with(response))

    def _answer_with(self, response: Response | None) -> ASGIApp:
        """An app that sends ``response`` (None: fails, so the server answers 500), then
        counts and logs the request."""
        requests, kind, started = self.requests, self.route.kind, self.started

        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            sent = Sent()
            try:
                if response is None:
                    raise RuntimeError("the quick read failed (logged above)")
                await response(scope, receive, sent.counting(send))
            except Exception:
                sent.status = sent.status or 500  # what the server answers for it
                raise
            finally:
                requests.record(scope, kind, sent, started)

        return answer
