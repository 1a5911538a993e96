"""The ``variant-scheduler`` HTTP API (docs/reference/scheduler-api.md), a Starlette app over a ``Store``.

| route | does |
|---|---|
| ``PUT /v1/agents/{agent_id}`` | heartbeat: the agent's host and device lists (upsert) |
| ``GET /v1/agents[?resource_group=G]``, ``GET /v1/agents/{agent_id}`` | agents, free and allocated devices |
| ``DELETE /v1/agents/{agent_id}`` | admin: drain (delete its placements), deregister and cordon |
| ``POST /v1/agents/{agent_id}/cordon``, ``/uncordon`` | admin: no new placements on it; or again |
| ``POST /v1/placements`` | place an image (or an index) on nodes: 201, or 409 with per-variant reasons |
| ``GET /v1/placements[?state=degraded]``, ``GET``/``DELETE /v1/placements/{id}`` | placements; DELETE frees the devices |
| ``POST /v1/placements/{id}/replace`` | move a degraded placement onto healthy devices: 201, or 409 |
| ``POST /v1/what-if`` | would it place now; else how many nodes of each template would make it (``whatif.py``) |
| ``GET /healthz`` | 200 when the database answers, else 503 |
| ``GET /metrics`` | Prometheus text: agents, devices, placements, outcomes, latencies (``metrics.py``; any valid token) |
| ``GET /ui`` | the fleet view, one HTML page (``ui.py``); a browser may send the token as a Basic password |
| ``POST /ui/cordon`` | the page's cordon and uncordon buttons (an admin's; the form's key against CSRF) |

Errors are one line in ``{"errors": [{"code", "message", "detail"}]}``: 400 bad input, 401
no or unknown token, 403 wrong role or another client's placement, 404 unknown id or image,
413 body (or the request kept with a placement) too large, 429 the client keeps as many
placements as it may, 502/504 registry failures, 503 database unavailable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
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
from docker_variant.server.bodies import BodyTooLargeError, read_body
from docker_variant.server.errors import error_kind, oci_error
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.selection import Candidate

__all__ = ["IndexFetcher", "create_app"]

IndexFetcher = Callable[[Reference], tuple[Reference, VariantIndex]]
Endpoint = Callable[[Request], Awaitable[Response]]

_log = logging.getLogger("docker_variant.scheduler")
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


def _guard(handler: Endpoint) -> Endpoint:
    """Every failure becomes one JSON line with the right status; never a traceback."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except _NotFound as exc:
            return oci_error(404, ErrorCode.NOT_FOUND, str(exc))
        except _Unauthorized as exc:
            challenge = f'{"Basic" if exc.basic else "Bearer"} realm="{_REALM}"'
            if exc.invalid and not exc.basic:
                challenge += ', error="invalid_token"'
            return oci_error(
                401, ErrorCode.UNAUTHORIZED, str(exc), headers={"WWW-Authenticate": challenge}
            )
        except _Forbidden as exc:
            return oci_error(403, ErrorCode.DENIED, str(exc))
        except (BodyTooLargeError, RequestTooLargeError) as exc:
            return oci_error(413, ErrorCode.SIZE_INVALID, str(exc))
        except QuotaExceededError as exc:
            # not 403 (that role may place) nor 409 (the pool could take it): the client
            # must delete placements first; OCI registries answer their own limits so
            detail = {"owner": exc.owner, "placements": exc.count, "limit": exc.limit}
            return oci_error(429, ErrorCode.TOOMANYREQUESTS, str(exc), detail)
        except InvalidInputError as exc:
            return oci_error(400, ErrorCode.INVALID_INPUT, str(exc))
        except DatabaseUnavailableError as exc:
            return oci_error(503, ErrorCode.DATABASE_UNAVAILABLE, str(exc))
        except RegistryError as exc:  # before UnreachableError: a registry's own answer
            return _registry_failure(exc)
        except UnreachableError as exc:  # the apiserver reviewing an agent's token
            return oci_error(503, ErrorCode.UNAVAILABLE, str(exc))
        except ClientDisconnect:  # gone, or cut off by --body-timeout (408): nobody reads this
            return oci_error(400, ErrorCode.INVALID_INPUT, "the request body was cut short")
        except Exception as exc:
            _log.exception("%s %s failed", request.method, request.url.path)
            return oci_error(
                500, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
            )

    return endpoint


def _registry_failure(exc: RegistryError) -> Response:
    detail = {"registry": exc.url} if exc.url else None
    kind = error_kind(exc)
    if isinstance(exc, NotFoundError):
        return oci_error(404, ErrorCode.IMAGE_UNKNOWN, str(exc), detail)
    if kind == "timeout":
        return oci_error(504, ErrorCode.REGISTRY_TIMEOUT, f"the registry timed out: {exc}", detail)
    if kind == "auth":
        return oci_error(
            502, ErrorCode.REGISTRY_DENIED, f"the registry refused the scheduler: {exc}", detail
        )
    return oci_error(
        502, ErrorCode.REGISTRY_UNAVAILABLE, f"the registry is unavailable: {exc}", detail
    )


async def _json_body(request: Request) -> Any:
    # bodies are read off the event loop, as each parse_* of them: 16 MiB takes seconds,
    # which on the loop would hold /healthz and every heartbeat
    return await run_in_threadpool(load_json, await read_body(request, _MAX_BODY), "request body")


def create_app(
    store: Store,
    *,
    fetch: IndexFetcher = fetch_index,
    tokens: TokenTable | TokenFile | None = None,
    registries: Collection[str] | None = None,
    agents: KubernetesAgents | None = None,
) -> Starlette:
    """The API over ``store``; ``fetch`` turns ``registry/name:version`` into its index.

    ``tokens``: who may call (docs/reference/scheduler-api.md roles); ``None`` lets every caller act as admin, for a
    server on loopback only. ``registries``: the registries (``host[:port]``) whose images
    ``{"image": REF}`` may name, so that no caller can make the scheduler contact a host it
    was not configured for. Without them a server with tokens takes only ``{"index": ...}``;
    one without tokens (loopback only: its callers are on this machine and reach every
    registry it reaches themselves) resolves any registry. ``agents``: heartbeats may also
    come with a projected ServiceAccount token, reviewed by the apiserver (``kubeauth``).
    """
    allowed = frozenset(registries or ())
    metrics = SchedulerMetrics(store)  # the store's plan and commit times included
    any_registry = not allowed and tokens is None

    def caller(request: Request, *roles: str, browser: bool = False) -> Principal:
        if tokens is None:
            return ANONYMOUS
        token = bearer_token(request) or (basic_token(request) if browser else None)
        if token is None:
            raise _Unauthorized(
                "a bearer token is required (Authorization: Bearer TOKEN)", basic=browser
            )
        principal = tokens.find(token)
        if principal is None:
            raise _Unauthorized("the bearer token is not valid", invalid=True, basic=browser)
        if roles and principal.role not in roles and principal.role != "admin":
            raise _Forbidden(
                f"a {principal.role} token may not {request.method} {request.url.path}; "
                f"it needs the {' or '.join(roles)} role"
            )
        return principal

    async def reporter(request: Request) -> Principal:
        """Who sends a heartbeat: a token of the table, else a projected token's agent."""
        token = bearer_token(request)
        if agents is None or token is None or (tokens is not None and tokens.find(token)):
            return caller(request, "agent")
        found = await run_in_threadpool(agents.find, token)  # a TokenReview: off the loop
        if found is None:
            raise _Unauthorized("the bearer token is not valid", invalid=True)
        return found

    @_guard
    async def put_agent(request: Request) -> Response:
        agent_id = check_agent_id(request.path_params["agent_id"])
        who = await reporter(request)
        if not who.may_report(agent_id):
            raise _Forbidden(f"the token of agent {who.agent_id!r} may not report {agent_id!r}")
        report = await run_in_threadpool(parse_agent_report, await _json_body(request), agent_id)
        return JSONResponse(await run_in_threadpool(store.report_agent, report))

    @_guard
    async def list_agents(request: Request) -> Response:
        caller(request)
        group = request.query_params.get("resource_group")
        if group is not None:
            group = ID.check(group, "resource_group")  # as a heartbeat's body has it
        views = await run_in_threadpool(store.list_agents, group)
        shares = await run_in_threadpool(store.pool_summary, group)  # free shares, fragmentation
        return JSONResponse({"agents": views, "pool": shares})

    @_guard
    async def get_agent(request: Request) -> Response:
        who = caller(request)
        agent_id = check_agent_id(request.path_params["agent_id"])
        # the placements on it: a client sees its own, an admin every one, an agent none
        may_see = None if who.role == "admin" else who.may_own
        view = await run_in_threadpool(store.get_agent, agent_id, may_see)
        if view is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return JSONResponse(view)

    @_guard
    async def delete_agent(request: Request) -> Response:
        caller(request, "admin")
        agent_id = check_agent_id(request.path_params["agent_id"])
        evicted = await run_in_threadpool(store.delete_agent, agent_id)
        if evicted is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return JSONResponse({"agent_id": agent_id, "placements_deleted": evicted})

    async def set_cordon(request: Request, cordoned: bool) -> Response:
        caller(request, "admin")
        agent_id = check_agent_id(request.path_params["agent_id"])
        changed = await run_in_threadpool(store.set_cordon, agent_id, cordoned)
        if changed is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return JSONResponse({"agent_id": agent_id, "cordoned": cordoned, "changed": changed})

    @_guard
    async def cordon_agent(request: Request) -> Response:
        return await set_cordon(request, True)

    @_guard
    async def uncordon_agent(request: Request) -> Response:
        return await set_cordon(request, False)

    def check_registry(reference: Reference) -> Reference:
        """``reference`` (parsed and tagged: ``parse_image``) if its registry may be contacted."""
        if reference.registry not in allowed and not any_registry:
            image = reference.familiar()  # as the client is likely to have written it
            if not allowed:
                raise InvalidInputError(
                    f"image {image!r}: this scheduler resolves no registry images (start it "
                    'with --registry HOST[:PORT]); send {"index": ...} instead'
                )
            raise InvalidInputError(
                f"image {image!r}: registry {reference.registry!r} is not one this scheduler "
                f"may contact ({', '.join(sorted(allowed))})"
            )
        return reference

    async def target_of(
        wanted: PlacementRequest,
    ) -> tuple[VariantIndex, Callable[[Candidate], str]]:
        """The request's index, and how a chosen variant is named in the answer: its tag
        for an index sent in, else its whole reference (the registry checked first)."""
        if wanted.index is not None:
            return wanted.index, lambda candidate: candidate.tag
        assert wanted.image is not None
        reference, index = await run_in_threadpool(fetch, check_registry(wanted.image))
        return index, lambda candidate: str(reference.with_tag(candidate.tag))

    def counted(operation: str) -> Callable[[Endpoint], Endpoint]:
        """Count each answer of ``operation`` by its outcome (``metrics.outcome_of``)."""

        def wrap(handler: Endpoint) -> Endpoint:
            async def endpoint(request: Request) -> Response:
                response = await handler(request)
                metrics.count(operation, response.status_code)
                return response

            return endpoint

        return wrap

    @counted("place")
    @_guard
    async def post_placement(request: Request) -> Response:
        who = caller(request, "client")
        body = await read_body(request, _MAX_BODY)
        wanted = await run_in_threadpool(parse_placement_body, body)  # off the loop: see _json_body
        index, image_of = await target_of(wanted)
        outcome = await run_in_threadpool(store.place, index, wanted, image_of, who.name)
        if isinstance(outcome, Refusal):
            what = wanted.image.familiar() if wanted.image else "the index"
            message = f"no variant of {what} can be placed on {wanted.nodes} node(s)"
            return JSONResponse({"message": message, "reasons": outcome.reasons}, 409)
        location = f"/v1/placements/{outcome['id']}"
        return JSONResponse(outcome, 201, headers={"Location": location})

    @counted("what_if")
    @_guard
    async def post_what_if(request: Request) -> Response:
        caller(request, "client")  # as a placement: it reveals no more than one would
        question = await run_in_threadpool(parse_what_if, await _json_body(request))
        wanted = question.request
        index, _ = await target_of(wanted)
        started = time.perf_counter()
        pools = await run_in_threadpool(store.snapshots, wanted)  # copies
        answer = await run_in_threadpool(
            what_if_in_groups, index, wanted, pools, question.templates
        )
        metrics.what_if.observe(time.perf_counter() - started)
        return JSONResponse(answer.to_json())

    @_guard
    async def list_placements(request: Request) -> Response:
        who = caller(request, "client")
        state = request.query_params.get("state")
        if state is not None and state not in STATES:
            raise InvalidInputError(f"state {state!r} is not one of {', '.join(STATES)}")
        documents = await run_in_threadpool(store.list_placements, state)
        mine = [d for d in documents if who.may_own(d.get("owner"))]
        return JSONResponse({"placements": mine})

    async def owned(request: Request) -> tuple[str, dict[str, Any]]:
        who = caller(request, "client")
        placement_id = request.path_params["placement_id"]
        document = await run_in_threadpool(store.get_placement, placement_id)
        if document is None:
            raise _NotFound(f"no placement {placement_id!r}")
        if not who.may_own(document.get("owner")):
            raise _Forbidden(f"placement {placement_id} belongs to another client")
        return placement_id, document

    @_guard
    async def get_placement(request: Request) -> Response:
        _, document = await owned(request)
        return JSONResponse(document)

    @counted("replace")
    @_guard
    async def replace_placement(request: Request) -> Response:
        placement_id, _ = await owned(request)
        wanted = await run_in_threadpool(store.placement_request, placement_id)
        if wanted is None:
            message = f"placement {placement_id} was made before replace was possible"
            return JSONResponse({"message": message, "reasons": {}}, 409)
        index, image_of = await target_of(wanted)
        outcome = await run_in_threadpool(store.replace, placement_id, index, wanted, image_of)
        if outcome is None:
            raise _NotFound(f"no placement {placement_id!r}")
        if isinstance(outcome, Refusal):
            message = f"placement {placement_id} cannot be replaced on {wanted.nodes} node(s)"
            return JSONResponse({"message": message, "reasons": outcome.reasons}, 409)
        return JSONResponse(outcome, 201, headers={"Location": f"/v1/placements/{placement_id}"})

    @_guard
    async def delete_placement(request: Request) -> Response:
        placement_id, _ = await owned(request)
        if not await run_in_threadpool(store.delete_placement, placement_id):
            raise _NotFound(f"no placement {placement_id!r}")
        return Response(status_code=204)

    @_guard
    async def healthz(_request: Request) -> Response:
        await run_in_threadpool(store.ping)
        # the database URL is for the operator of an unauthenticated loopback server only
        return JSONResponse({"status": "ok"} | ({} if tokens else {"database": store.url}))

    @_guard
    async def metrics_text(request: Request) -> Response:
        caller(request)  # any valid token: a scraper's
        text = await run_in_threadpool(metrics.render)  # reads the database
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def openapi(_request: Request) -> Response:
        return Response(openapi_document("scheduler"), media_type="application/json")

    async def resolve(image: str) -> VariantIndex:
        """The page's image field (``ui.py``), read as a placement's ``image``."""
        return (await run_in_threadpool(fetch, check_registry(parse_image(image))))[1]

    @_guard
    async def fleet_view(request: Request) -> Response:
        # a browser sends the token as a Basic password (ui.py); the role is a client's
        who = caller(request, "client", browser=True)
        return await ui.fleet_page(request, store, who, resolve, credential(request))

    def credential(request: Request) -> str | None:
        return None if tokens is None else bearer_token(request) or basic_token(request)

    @_guard
    async def fleet_cordon(request: Request) -> Response:
        caller(request, "admin", browser=True)
        try:
            agent_id, cordoned = await ui.cordon_form(request, credential(request))
        except ui.ForgedFormError as exc:
            raise _Forbidden(str(exc)) from None
        if await run_in_threadpool(store.set_cordon, agent_id, cordoned) is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return RedirectResponse("../ui", 303)  # relative: the page behind any path prefix

    async def no_route(request: Request, exc: Exception) -> Response:
        # the router's own 404 and 405 in the API's error body, as every other answer
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = ErrorCode.NOT_FOUND if status == 404 else ErrorCode.UNSUPPORTED
        what = "no such route" if status == 404 else f"{request.method} is not allowed here"
        headers = getattr(exc, "headers", None)
        return oci_error(status, code, f"{what}: {request.url.path}", headers=headers)

    return Starlette(
        exception_handlers={HTTPException: no_route},
        routes=[  # tried in order: the calls made most often first
            Route("/v1/placements", post_placement, methods=["POST"]),
            Route("/v1/agents/{agent_id}", put_agent, methods=["PUT"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_text, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/ui", fleet_view, methods=["GET", "POST"]),
            Route("/ui/cordon", fleet_cordon, methods=["POST"]),
            Route("/v1/agents", list_agents, methods=["GET"]),
            Route("/v1/agents/{agent_id}", get_agent, methods=["GET"]),
            Route("/v1/agents/{agent_id}", delete_agent, methods=["DELETE"]),
            Route("/v1/agents/{agent_id}/cordon", cordon_agent, methods=["POST"]),
            Route("/v1/agents/{agent_id}/uncordon", uncordon_agent, methods=["POST"]),
            Route("/v1/placements", list_placements, methods=["GET"]),
            Route("/v1/what-if", post_what_if, methods=["POST"]),
            Route("/v1/placements/{placement_id}", get_placement, methods=["GET"]),
            Route("/v1/placements/{placement_id}", delete_placement, methods=["DELETE"]),
            Route("/v1/placements/{placement_id}/replace", replace_placement, methods=["POST"]),
        ],
    )
