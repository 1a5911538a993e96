"""The ``variant-scheduler`` HTTP API (SPEC section 8), a Starlette app over a ``Store``.

| route | does |
|---|---|
| ``PUT /v1/agents/{agent_id}`` | heartbeat: the agent's host and device lists (upsert) |
| ``GET /v1/agents[?resource_group=G]``, ``GET /v1/agents/{agent_id}`` | agents, free and allocated devices |
| ``POST /v1/placements`` | place an image (or an index) on nodes: 201, or 409 with per-variant reasons |
| ``GET /v1/placements``, ``GET``/``DELETE /v1/placements/{id}`` | placements; DELETE frees the devices |
| ``GET /healthz`` | 200 when the database answers, else 503 |

Errors are one line in ``{"errors": [{"code", "message", "detail"}]}``: 400 bad input, 404
unknown id or image, 502/504 registry failures, 503 database unavailable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from docker_variant.errors import InvalidInputError
from docker_variant.oci.errors import NotFoundError, RegistryError, one_line
from docker_variant.oci.reference import Reference
from docker_variant.oci.source import fetch_index
from docker_variant.proxy.responses import error_kind, oci_error
from docker_variant.scheduler.database import DatabaseUnavailableError
from docker_variant.scheduler.documents import (
    check_agent_id,
    parse_agent_report,
    parse_placement_request,
)
from docker_variant.scheduler.placement import Refusal
from docker_variant.scheduler.store import Store
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.selection import Candidate

__all__ = ["IndexFetcher", "create_app"]

IndexFetcher = Callable[[str], tuple[Reference, VariantIndex]]
Endpoint = Callable[[Request], Awaitable[Response]]

_log = logging.getLogger("docker_variant.scheduler")
_MAX_BODY = 16 * 1024 * 1024


class _NotFound(Exception):
    pass


def _guard(handler: Endpoint) -> Endpoint:
    """Every failure becomes one JSON line with the right status; never a traceback."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except _NotFound as exc:
            return oci_error(404, "NOT_FOUND", str(exc))
        except InvalidInputError as exc:
            return oci_error(400, "INVALID_INPUT", str(exc))
        except DatabaseUnavailableError as exc:
            return oci_error(503, "DATABASE_UNAVAILABLE", str(exc))
        except RegistryError as exc:
            return _registry_failure(exc)
        except Exception as exc:
            _log.exception("%s %s failed", request.method, request.url.path)
            return oci_error(500, "INTERNAL", f"internal error: {type(exc).__name__}: {exc}")

    return endpoint


def _registry_failure(exc: RegistryError) -> Response:
    detail = {"registry": exc.url} if exc.url else None
    kind = error_kind(exc)
    if isinstance(exc, NotFoundError):
        return oci_error(404, "IMAGE_UNKNOWN", str(exc), detail)
    if kind == "timeout":
        return oci_error(504, "REGISTRY_TIMEOUT", f"the registry timed out: {exc}", detail)
    if kind == "auth":
        return oci_error(
            502, "REGISTRY_DENIED", f"the registry refused the scheduler: {exc}", detail
        )
    return oci_error(502, "REGISTRY_UNAVAILABLE", f"the registry is unavailable: {exc}", detail)


async def _json_body(request: Request) -> Any:
    body = await request.body()
    if len(body) > _MAX_BODY:
        raise InvalidInputError(f"request body is {len(body)} bytes; at most {_MAX_BODY}")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise InvalidInputError(f"request body is not JSON: {one_line(str(exc))}") from None


def create_app(store: Store, *, fetch: IndexFetcher = fetch_index) -> Starlette:
    """The API over ``store``; ``fetch`` turns ``registry/name:version`` into its index."""

    @_guard
    async def put_agent(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        report = parse_agent_report(await _json_body(request), agent_id)
        return JSONResponse(await run_in_threadpool(store.report_agent, report))

    @_guard
    async def list_agents(request: Request) -> Response:
        group = request.query_params.get("resource_group")
        return JSONResponse({"agents": await run_in_threadpool(store.list_agents, group)})

    @_guard
    async def get_agent(request: Request) -> Response:
        agent_id = check_agent_id(request.path_params["agent_id"])
        view = await run_in_threadpool(store.get_agent, agent_id)
        if view is None:
            raise _NotFound(f"no agent {agent_id!r}")
        return JSONResponse(view)

    @_guard
    async def post_placement(request: Request) -> Response:
        wanted = parse_placement_request(await _json_body(request))
        if wanted.index is not None:
            index = wanted.index

            def image_of(candidate: Candidate) -> str:
                return candidate.tag

        else:
            assert wanted.image is not None
            reference, index = await run_in_threadpool(fetch, wanted.image)

            def image_of(candidate: Candidate) -> str:
                return str(reference.with_tag(candidate.tag))

        outcome = await run_in_threadpool(store.place, index, wanted, image_of)
        if isinstance(outcome, Refusal):
            what = wanted.image or "the index"
            message = f"no variant of {what} can be placed on {wanted.nodes} node(s)"
            return JSONResponse({"message": message, "reasons": outcome.reasons}, 409)
        location = f"/v1/placements/{outcome['id']}"
        return JSONResponse(outcome, 201, headers={"Location": location})

    @_guard
    async def list_placements(_request: Request) -> Response:
        return JSONResponse({"placements": await run_in_threadpool(store.list_placements)})

    @_guard
    async def get_placement(request: Request) -> Response:
        placement_id = request.path_params["placement_id"]
        document = await run_in_threadpool(store.get_placement, placement_id)
        if document is None:
            raise _NotFound(f"no placement {placement_id!r}")
        return JSONResponse(document)

    @_guard
    async def delete_placement(request: Request) -> Response:
        placement_id = request.path_params["placement_id"]
        if not await run_in_threadpool(store.delete_placement, placement_id):
            raise _NotFound(f"no placement {placement_id!r}")
        return Response(status_code=204)

    @_guard
    async def healthz(_request: Request) -> Response:
        await run_in_threadpool(store.ping)
        return JSONResponse({"status": "ok", "database": store.url})

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/v1/agents", list_agents, methods=["GET"]),
            Route("/v1/agents/{agent_id}", put_agent, methods=["PUT"]),
            Route("/v1/agents/{agent_id}", get_agent, methods=["GET"]),
            Route("/v1/placements", post_placement, methods=["POST"]),
            Route("/v1/placements", list_placements, methods=["GET"]),
            Route("/v1/placements/{placement_id}", get_placement, methods=["GET"]),
            Route("/v1/placements/{placement_id}", delete_placement, methods=["DELETE"]),
        ]
    )
