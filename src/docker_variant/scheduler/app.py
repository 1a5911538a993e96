"""The ``variant-scheduler`` HTTP API (docs/reference/scheduler-api.md), a Starlette app over a ``Store``.

| route | does |
|---|---|
| ``PUT /v1/agents/{agent_id}`` | heartbeat: the agent's host and device lists (upsert) |
| ``GET /v1/agents[?resource_group=G]``, ``GET /v1/agents/{agent_id}`` | agents, free and allocated devices |
| ``DELETE /v1/agents/{agent_id}`` | admin: drain (delete its placements), deregister and cordon |
| ``POST /v1/agents/{agent_id}/cordon``, ``POST /v1/agents/{agent_id}/uncordon`` | admin: no new placements on it; or again |
| ``POST /v1/placements`` | place an image (or an index) on nodes: 201, or 409 with per-variant reasons |
| ``GET /v1/placements[?state=degraded]``, ``GET``/``DELETE /v1/placements/{id}`` | placements; DELETE frees the devices |
| ``POST /v1/placements/{id}/replace`` | move a degraded placement onto healthy devices: 201, or 409 |
| ``POST /v1/what-if`` | would it place now; else how many nodes of each template would make it (``whatif.py``) |
| ``GET /healthz`` | 200 when the database answers, else 503 |
| ``GET /metrics`` | Prometheus text: agents, devices, placements, outcomes, latencies (``metrics.py``; any valid token) |
| ``GET /openapi.json`` | this API's OpenAPI document (``docker_variant.openapi``) |
| ``GET /ui`` | the fleet view, one HTML page (``ui.py``); a browser may send the token as a Basic password |
| ``POST /ui/cordon`` | the page's cordon and uncordon buttons (an admin's; the form's key against CSRF) |

The endpoints are ``SchedulerEndpoints``' methods; who may call is ``Callers``', which
registries ``{"image": REF}`` may name ``RegistryPolicy``'s. Refusals are raised and answered
by the exception handlers (``_HANDLERS``, over ``server.errors``' shared ones), each with its
code's status (``oci.errcode``).

Errors are one line in ``{"errors": [{"code", "message", "detail"}]}``: 400 bad input, 401
no or unknown token, 403 wrong role or another client's placement, 404 unknown id or image,
413 body (or the request kept with a placement) too large, 429 the client keeps as many
placements as it may, 502/504 registry failures, 503 database unavailable.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from docker_variant.api.names import ID, check_agent_id
from docker_variant.errors import InvalidInputError, UnreachableError
from docker_variant.jsondoc import load_json
from docker_variant.oci.errcode import ErrorCode
from docker_variant.oci.errors import NotFoundError, RegistryError
from docker_variant.oci.reference import Reference
from docker_variant.oci.source import fetch_index
from docker_variant.openapi import document as openapi_document
from docker_variant.planner.placement import Refusal
from docker_variant.scheduler import ui
from docker_variant.scheduler.database import DatabaseUnavailableError
from docker_variant.scheduler.documents import (
    PlacementRequest,
    parse_agent_report,
    parse_image,
    parse_placement_body,
)
from docker_variant.scheduler.kubeauth import KubernetesAgents
from docker_variant.scheduler.metrics import SchedulerMetrics
from docker_variant.scheduler.store import (
    STATES,
    QuotaExceededError,
    RequestTooLargeError,
    Store,
)
from docker_variant.scheduler.tokens import ANONYMOUS, Principal, TokenFile, TokenTable
from docker_variant.scheduler.whatif import parse_what_if, what_if_in_groups
from docker_variant.server.auth import basic_token, bearer_token
from docker_variant.server.bodies import read_body
from docker_variant.server.errors import error_handlers, error_kind, handler_for, oci_error
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.selection import Candidate

__all__ = ["Callers", "IndexFetcher", "RegistryPolicy", "SchedulerEndpoints", "create_app"]

IndexFetcher = Callable[[Reference], tuple[Reference, VariantIndex]]

_MAX_BODY = 16 * 1024 * 1024
_REALM = "variant-scheduler"


class _NotFound(Exception):
    pass


class _Unauthorized(Exception):
    """401: no token, or one the table does not hold."""

    def __init__(self, message: str, *, invalid: bool = False, basic: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid
        self.basic = basic  # a browser (GET /ui): ask for the token as a Basic password


class _Forbidden(Exception):
    """403: a valid token whose role may not do this."""


async def _not_found(_request: Request, exc: _NotFound) -> Response:
    return oci_error(ErrorCode.NOT_FOUND, str(exc))


async def _unauthorized(_request: Request, exc: _Unauthorized) -> Response:
    challenge = f'{"Basic" if exc.basic else "Bearer"} realm="{_REALM}"'
    if exc.invalid and not exc.basic:
        challenge += ', error="invalid_token"'
    return oci_error(ErrorCode.UNAUTHORIZED, str(exc), headers={"WWW-Authenticate": challenge})


async def _forbidden(_request: Request, exc: _Forbidden) -> Response:
    return oci_error(ErrorCode.DENIED, str(exc))


async def _too_large(_request: Request, exc: RequestTooLargeError) -> Response:
    return oci_error(ErrorCode.REQUEST_TOO_LARGE, str(exc))


async def _quota(_request: Request, exc: QuotaExceededError) -> Response:
    # not 403 (that role may place) nor 409 (the pool could take it): the client must
    # delete placements first; OCI registries answer their own limits so
    detail = {"owner": exc.owner, "placements": exc.count, "limit": exc.limit}
    return oci_error(ErrorCode.TOOMANYREQUESTS, str(exc), detail)


async def _database(_request: Request, exc: DatabaseUnavailableError) -> Response:
    return oci_error(ErrorCode.DATABASE_UNAVAILABLE, str(exc))


async def _unreachable(_request: Request, exc: UnreachableError) -> Response:
    # the apiserver reviewing an agent's token (a registry's own answer: _registry_failure)
    return oci_error(ErrorCode.UNAVAILABLE, str(exc))


async def _cut_short(_request: Request, _exc: ClientDisconnect) -> Response:
    # gone, or cut off by --body-timeout (408): nobody reads this
    return oci_error(ErrorCode.INVALID_INPUT, "the request body was cut short")


async def _registry_failure(_request: Request, exc: RegistryError) -> Response:
    detail = {"registry": exc.url} if exc.url else None
    kind = error_kind(exc)
    if isinstance(exc, NotFoundError):
        return oci_error(ErrorCode.IMAGE_UNKNOWN, str(exc), detail)
    if kind == "timeout":
        return oci_error(ErrorCode.REGISTRY_TIMEOUT, f"the registry timed out: {exc}", detail)
    if kind == "auth":
        message = f"the registry refused the scheduler: {exc}"
        return oci_error(ErrorCode.REGISTRY_DENIED, message, detail)
    return oci_error(ErrorCode.REGISTRY_UNAVAILABLE, f"the registry is unavailable: {exc}", detail)


#: Every failure becomes one JSON line with its code's status; never a traceback. Looked up
#: along the exception's MRO: RegistryError and DatabaseUnavailableError are answered as
#: themselves before UnreachableError, RequestTooLargeError before InvalidInputError.
_HANDLERS = error_handlers(
    {
        _NotFound: _not_found,
        _Unauthorized: _unauthorized,
        _Forbidden: _forbidden,
        RequestTooLargeError: _too_large,
        QuotaExceededError: _quota,
        DatabaseUnavailableError: _database,
        RegistryError: _registry_failure,
        UnreachableError: _unreachable,
        ClientDisconnect: _cut_short,
    }
)


async def _json_body(request: Request) -> Any:
    # bodies are read off the event loop, as each parse_* of them: 16 MiB takes seconds,
    # which on the loop would hold /healthz and every heartbeat
    return await run_in_threadpool(load_json, await read_body(request, _MAX_BODY), "request body")


class Callers:
    """Who calls, and whether the call's role allows it: a token of ``tokens`` (``None``:
    every caller acts as admin, on loopback only), or for a heartbeat a projected
    ServiceAccount token that ``agents`` reviews with the apiserver."""

    def __init__(
        self, tokens: TokenTable | TokenFile | None, agents: KubernetesAgents | None
    ) -> None:
        self.tokens = tokens
        self.agents = agents

    def caller(self, request: Request, *roles: str, browser: bool = False) -> Principal:
        """The caller, refused (401, 403) unless it holds one of ``roles`` (any with none)."""
        if self.tokens is None:
            return ANONYMOUS
        token = bearer_token(request) or (basic_token(request) if browser else None)
        if token is None:
            raise _Unauthorized(
                "a bearer token is required (Authorization: Bearer TOKEN)", basic=browser
            )
        principal = self.tokens.find(token)
        if principal is None:
            raise _Unauthorized("the bearer token is not valid", invalid=True, basic=browser)
        if roles and principal.role not in roles and principal.role != "admin":
            raise _Forbidden(
                f"a {principal.role} token may not {request.method} {request.url.path}; "
                f"it needs the {' or '.join(roles)} role"
            )
        return principal

    async def reporter(self, request: Request) -> Principal:
        """Who sends a heartbeat: a token of the table, else a projected token's agent."""
        token = bearer_token(request)
        if (
            self.agents is None
            or token is None
            or (self.tokens is not None and self.tokens.find(token))
        ):
            return self.caller(request, "agent")
        found = await run_in_threadpool(self.agents.find, token)  # a TokenReview: off the loop
        if found is None:
            raise _Unauthorized("the bearer token is not valid", invalid=True)
        return found

    def credential(self, request: Request) -> str | None:
        """The token a browser's form must be bound to (ui.py's key against CSRF)."""
        if self.tokens is None:
            return None
        return bearer_token(request) or basic_token(request)


class RegistryPolicy:
    """The registries (``host[:port]``) whose images ``{"image": REF}`` may name, so that no
    caller can make the scheduler contact a host it was not configured for. ``open_to_any``:
    a server without tokens (loopback only: its callers reach every registry it reaches)."""

    def __init__(self, registries: Collection[str] | None, *, open_to_any: bool) -> None:
        self.allowed = frozenset(registries or ())
        self.any_registry = not self.allowed and open_to_any

    def check(self, reference: Reference) -> Reference:
        """``reference`` (parsed and tagged: ``documents.parse_image``) if its registry may
        be contacted."""
        if reference.registry not in self.allowed and not self.any_registry:
            image = reference.familiar()  # as the client is likely to have written it
            if not self.allowed:
                raise InvalidInputError(
                    f"image {image!r}: this scheduler resolves no registry images (start it "
                    'with --registry HOST[:PORT]); send {"index": ...} instead'
                )
            raise InvalidInputError(
                f"image {image!r}: registry {reference.registry!r} is not one this scheduler "
                f"may contact ({', '.join(sorted(self.allowed))})"
            )
        return reference


Method = Callable[["SchedulerEndpoints", Request], Awaitable[Response]]


def _counted(operation: str) -> Callable[[Method], Method]:
    """Count each answer of ``operation`` by its outcome (``metrics.outcome_of``), refusals
    included: those are answered here, by the handler the app would use."""

    def wrap(method: Method) -> Method:
        @functools.wraps(method)
        async def endpoint(self: SchedulerEndpoints, request: Request) -> Response:
            try:
                response = await method(self, request)
            except Exception as exc:
                refusal = handler_for(exc, _HANDLERS)
                if refusal is None:
                    self.metrics.count(operation, 500)
                    raise
                response = await refusal(request, exc)
            self.metrics.count(operation, response.status_code)
            return response

        return endpoint

    return wrap


class SchedulerEndpoints:
    """The API's endpoints over ``store``, one method each (``routes`` lists them);
    ``fetch`` turns ``registry/name:version`` into its index. Refusals are raised and
    answered by the app's exception handlers (``_HANDLERS``)."""

    def __init__(
        self, store: Store, fetch: IndexFetcher, callers: Callers, registries: RegistryPolicy
    ) -> None:
        self.store = store
        self.fetch = fetch
        self.callers = callers
        self.registries = registries
        self.metrics = SchedulerMetrics(store)  # the store's plan and commit times included

    def routes(self) -> list[Route]:
        """Tried in order: the calls made most often first."""
        return [
            Route("/v1/placements", self.post_placement, methods=["POST"]),
            Route("/v1/agents/{agent_id}", self.put_agent, methods=["PUT"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/ui", self.fleet_view, methods=["GET", "POST"]),
            Route("/ui/cordon", self.fleet_cordon, methods=["POST"]),
            Route("/v1/agents", self.list_agents, methods=["GET"]),
            Route("/v1/agents/{agent_id}", self.get_agent, methods=["GET"]),
            Route("/v1/agents/{agent_id}", self.delete_agent, methods=["DELETE"]),
            Route("/v1/agents/{agent_id}/cordon", self.cordon_agent, methods=["POST"]),
            Route("/v1/agents/{agent_id}/uncordon", self.uncordon_agent, methods=["POST"]),
            Route("/v1/placements", self.list_placements, methods=["GET"]),
            Route("/v1/what-if", self.post_what_if, methods=["POST"]),
            Route("/v1/placements/{placement_id}", self.get_placement, methods=["GET"]),
            Route("/v1/placements/{placement_id}", self.delete_placement, methods=["DELETE"]),
            Route(
                "/v1/placements/{placement_id}/replace", self.replace_placement, methods=["POST"]
            ),
        ]

    # ------------------------------------------------------------------------ agents

    async def put_agent(self, request: Request) -> Response:
        agent_id = check_agent_id(request.path_params["agent_id"])
        who = await self.callers.reporter(request)
        if not who.may_report(agent_id):
            raise _Forbidden(f"the token of agent {who.agent_id!r} may not report {agent_id!r}")
        report = await run_in_threadpool(parse_agent_report, await _json_body(request), agent_id)
        return JSONResponse(await run_in_threadpool(self.store.report_agent, report))

    async def list_agents(self, request: Request) -> Response:
        self.callers.caller(request)
        group = request.query_params.get("resource_group")
        if group is not None:
            group = ID.check(group, "resource_group")  # as a heartbeat's body has it
        views = await run_in_threadpool(self.store.list_agents, group)
        # free shares, fragmentation
        shares = await run_in_threadpool(self.store.pool_summary, group)
        return JSONResponse({"agents": views, "pool": shares})

    async def get_agent(self, request: Request) -> Response:
        who = self.callers.caller(request)
        agent_id = check_agent_id(request.path_params["agent_id"])
        # the placements on it: a client sees its own, an admin every one, an agent none
        may_see = None if who.role == "admin" else who.may_own
        view = await run_in_threadpool(self.store.get_agent, agent_id, may_see)
        if view is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return JSONResponse(view)

    async def delete_agent(self, request: Request) -> Response:
        self.callers.caller(request, "admin")
        agent_id = check_agent_id(request.path_params["agent_id"])
        evicted = await run_in_threadpool(self.store.delete_agent, agent_id)
        if evicted is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return JSONResponse({"agent_id": agent_id, "placements_deleted": evicted})

    async def _set_cordon(self, request: Request, cordoned: bool) -> Response:
        self.callers.caller(request, "admin")
        agent_id = check_agent_id(request.path_params["agent_id"])
        changed = await run_in_threadpool(self.store.set_cordon, agent_id, cordoned)
        if changed is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return JSONResponse({"agent_id": agent_id, "cordoned": cordoned, "changed": changed})

    async def cordon_agent(self, request: Request) -> Response:
        return await self._set_cordon(request, True)

    async def uncordon_agent(self, request: Request) -> Response:
        return await self._set_cordon(request, False)

    # -------------------------------------------------------------------- placements

    async def _target_of(
        self, wanted: PlacementRequest
    ) -> tuple[VariantIndex, Callable[[Candidate], str]]:
        """The request's index, and how a chosen variant is named in the answer: its tag
        for an index sent in, else its whole reference (the registry checked first)."""
        if wanted.index is not None:
            return wanted.index, lambda candidate: candidate.tag
        assert wanted.image is not None
        checked = self.registries.check(wanted.image)
        reference, index = await run_in_threadpool(self.fetch, checked)
        return index, lambda candidate: str(reference.with_tag(candidate.tag))

    @_counted("place")
    async def post_placement(self, request: Request) -> Response:
        who = self.callers.caller(request, "client")
        body = await read_body(request, _MAX_BODY)
        wanted = await run_in_threadpool(parse_placement_body, body)  # off the loop: see _json_body
        index, image_of = await self._target_of(wanted)
        outcome = await run_in_threadpool(self.store.place, index, wanted, image_of, who.name)
        if isinstance(outcome, Refusal):
            what = wanted.image.familiar() if wanted.image else "the index"
            message = f"no variant of {what} can be placed on {wanted.nodes} node(s)"
            return JSONResponse({"message": message, "reasons": outcome.reasons}, 409)
        location = f"/v1/placements/{outcome['id']}"
        return JSONResponse(outcome, 201, headers={"Location": location})

    @_counted("what_if")
    async def post_what_if(self, request: Request) -> Response:
        self.callers.caller(request, "client")  # as a placement: it reveals no more than one would
        question = await run_in_threadpool(parse_what_if, await _json_body(request))
        wanted = question.request
        index, _ = await self._target_of(wanted)
        started = time.perf_counter()
        pools = await run_in_threadpool(self.store.snapshots, wanted)  # copies
        answer = await run_in_threadpool(
            what_if_in_groups, index, wanted, pools, question.templates
        )
        self.metrics.what_if.observe(time.perf_counter() - started)
        return JSONResponse(answer.to_json())

    async def list_placements(self, request: Request) -> Response:
        who = self.callers.caller(request, "client")
        state = request.query_params.get("state")
        if state is not None and state not in STATES:
            raise InvalidInputError(f"state {state!r} is not one of {', '.join(STATES)}")
        documents = await run_in_threadpool(self.store.list_placements, state)
        mine = [d for d in documents if who.may_own(d.get("owner"))]
        return JSONResponse({"placements": mine})

    async def _owned(self, request: Request) -> tuple[str, dict[str, Any]]:
        who = self.callers.caller(request, "client")
        placement_id = request.path_params["placement_id"]
        document = await run_in_threadpool(self.store.get_placement, placement_id)
        if document is None:
            raise _NotFound(f"no placement {placement_id!r}")
        if not who.may_own(document.get("owner")):
            raise _Forbidden(f"placement {placement_id} belongs to another client")
        return placement_id, document

    async def get_placement(self, request: Request) -> Response:
        _, document = await self._owned(request)
        return JSONResponse(document)

    @_counted("replace")
    async def replace_placement(self, request: Request) -> Response:
        placement_id, _ = await self._owned(request)
        wanted = await run_in_threadpool(self.store.placement_request, placement_id)
        if wanted is None:
            message = f"placement {placement_id} was made before replace was possible"
            return JSONResponse({"message": message, "reasons": {}}, 409)
        index, image_of = await self._target_of(wanted)
        outcome = await run_in_threadpool(self.store.replace, placement_id, index, wanted, image_of)
        if outcome is None:
            raise _NotFound(f"no placement {placement_id!r}")
        if isinstance(outcome, Refusal):
            message = f"placement {placement_id} cannot be replaced on {wanted.nodes} node(s)"
            return JSONResponse({"message": message, "reasons": outcome.reasons}, 409)
        return JSONResponse(outcome, 201, headers={"Location": f"/v1/placements/{placement_id}"})

    async def delete_placement(self, request: Request) -> Response:
        placement_id, _ = await self._owned(request)
        if not await run_in_threadpool(self.store.delete_placement, placement_id):
            raise _NotFound(f"no placement {placement_id!r}")
        return Response(status_code=204)

    # ----------------------------------------------------------------- the server's own

    async def healthz(self, _request: Request) -> Response:
        await run_in_threadpool(self.store.ping)
        # the database URL is for the operator of an unauthenticated loopback server only
        database = {} if self.callers.tokens else {"database": self.store.url}
        return JSONResponse({"status": "ok"} | database)

    async def metrics_text(self, request: Request) -> Response:
        self.callers.caller(request)  # any valid token: a scraper's
        text = await run_in_threadpool(self.metrics.render)  # reads the database
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, _request: Request) -> Response:
        return Response(openapi_document("scheduler"), media_type="application/json")

    # --------------------------------------------------------------------- the fleet page

    async def _resolve(self, image: str) -> VariantIndex:
        """The page's image field (``ui.py``), read as a placement's ``image``."""
        return (await run_in_threadpool(self.fetch, self.registries.check(parse_image(image))))[1]

    async def fleet_view(self, request: Request) -> Response:
        # a browser sends the token as a Basic password (ui.py); the role is a client's
        who = self.callers.caller(request, "client", browser=True)
        credential = self.callers.credential(request)
        return await ui.fleet_page(request, self.store, who, self._resolve, credential)

    async def fleet_cordon(self, request: Request) -> Response:
        self.callers.caller(request, "admin", browser=True)
        try:
            agent_id, cordoned = await ui.cordon_form(request, self.callers.credential(request))
        except ui.ForgedFormError as exc:
            raise _Forbidden(str(exc)) from None
        if await run_in_threadpool(self.store.set_cordon, agent_id, cordoned) is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return RedirectResponse("../ui", 303)  # relative: the page behind any path prefix


def create_app(
    store: Store,
    *,
    fetch: IndexFetcher = fetch_index,
    tokens: TokenTable | TokenFile | None = None,
    registries: Collection[str] | None = None,
    agents: KubernetesAgents | None = None,
) -> Starlette:
    """The API over ``store``; ``fetch`` turns ``registry/name:version`` into its index.

    ``tokens``: who may call (docs/reference/scheduler-api.md roles); ``None`` lets every
    caller act as admin, for a server on loopback only. ``registries``: the registries
    (``host[:port]``) whose images ``{"image": REF}`` may name. Without them a server with
    tokens takes only ``{"index": ...}``; one without tokens resolves any registry.
    ``agents``: heartbeats may also come with a projected ServiceAccount token, reviewed by
    the apiserver (``kubeauth``).
    """
    endpoints = SchedulerEndpoints(
        store,
        fetch,
        Callers(tokens, agents),
        RegistryPolicy(registries, open_to_any=tokens is None),
    )
    app = Starlette(exception_handlers=_HANDLERS, routes=endpoints.routes())
    app.state.endpoints = endpoints
    return app
