"""``variant-scheduler serve [--db URL] [--listen HOST:PORT]``: run the scheduler under uvicorn.
``variant-scheduler what-if --templates FILE REQUEST`` asks a running scheduler (``--scheduler
URL``) whether a placement request fits its pool, or how many nodes of each template would
make it fit (docs/reference/scheduler-api.md, ``whatif.py``); it exits 0 when it fits or a template helps, else 1.
``variant-scheduler cordon AGENT`` and ``uncordon AGENT`` (an admin's token) stop and resume
new placements on an agent; it keeps reporting.

Bad arguments (a bad database URL or listen address, a busy port) end with one line on stderr
and exit code 2; a database that cannot be reached at start, one line and exit code 3. Never a
traceback.

``--help`` loads argparse and this package's option helpers only (bench/bench_startup.py): each
command imports what it runs on.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from docker_variant.agent.command import add_agent_command, run_agent_command
from docker_variant.errors import InvalidInputError, UnreachableError, one_line
from docker_variant.server.options import (
    ServerArgumentParser,
    add_client_tls_arguments,
    add_connection_limit_arguments,
    add_duration_argument,
    add_listen_argument,
    add_log_level_argument,
    add_tls_arguments,
    add_version_argument,
    tls_options,
    use_client_tls,
)

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DEFAULT_LISTEN", "main"]

DEFAULT_LISTEN = "127.0.0.1:5090"
DB_ENV = "VARIANT_SCHEDULER_DB"
#: ``scheduler.database.DEFAULT_DB_URL``, written out so that --help loads no SQLAlchemy
#: (tests/test_scheduler_cli.py checks they agree)
DEFAULT_DB_URL = "sqlite:///./variant-scheduler.db"
TOKENS_ENV = "VARIANT_SCHEDULER_TOKENS"
REGISTRIES_ENV = "VARIANT_SCHEDULER_REGISTRIES"
SCHEDULER_ENV = "VARIANT_SCHEDULER_URL"
MAX_PLACEMENTS_ENV = "VARIANT_SCHEDULER_MAX_PLACEMENTS"
MAX_REQUEST_ENV = "VARIANT_SCHEDULER_MAX_PLACEMENT_REQUEST"
#: ``scheduler.store.DEFAULT_MAX_PLACEMENTS`` and ``DEFAULT_MAX_REQUEST``, written out as
#: DEFAULT_DB_URL is (tests/test_scheduler_cli.py checks they agree)
DEFAULT_MAX_PLACEMENTS = 1_000
DEFAULT_MAX_REQUEST = 65_536
#: The largest what-if answer the command reads (the server refuses larger requests first).
_WHAT_IF_ANSWER_LIMIT = 64 << 20


def _parser() -> argparse.ArgumentParser:
    parser = ServerArgumentParser(
        prog="variant-scheduler",
        description="Agent-device variant registry and matcher: places one variant of an "
        "image on nodes whose devices fit it (PEP 817/825 wheel variants for containers).",
    )
    add_version_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve_command(commands)
    add_agent_command(commands)
    _add_what_if_command(commands)
    _add_cordon_commands(commands)
    return parser


def _add_serve_command(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the HTTP API")
    serve.add_argument(
        "--db",
        default=os.environ.get(DB_ENV, DEFAULT_DB_URL),
        metavar="URL",
        help=f"sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB "
        f"(default ${DB_ENV}, else {DEFAULT_DB_URL})",
    )
    add_listen_argument(serve, DEFAULT_LISTEN)
    add_duration_argument(
        serve,
        "--agent-ttl",
        what="agent TTL",
        strict=False,
        default=0.0,
        help="leave out agents without a heartbeat for this long, and degrade their placements (default 0: never)",
    )
    serve.add_argument(
        "--tokens",
        default=os.environ.get(TOKENS_ENV),
        metavar="FILE",
        help=f"bearer tokens and their roles (TOML; default ${TOKENS_ENV}); without it the "
        "server listens on loopback only",
    )
    serve.add_argument(
        "--registry",
        action="append",
        default=[r for r in os.environ.get(REGISTRIES_ENV, "").split(",") if r],
        metavar="HOST[:PORT]",
        help='a registry {"image": REF} may name (repeat; default $'
        f'{REGISTRIES_ENV}, comma-separated); without any, only {{"index": ...}} is taken',
    )
    serve.add_argument(
        "--max-placements",
        type=_limit,
        default=os.environ.get(MAX_PLACEMENTS_ENV, str(DEFAULT_MAX_PLACEMENTS)),
        metavar="N",
        help=f"placements one client may keep, active or degraded (default "
        f"${MAX_PLACEMENTS_ENV}, else {DEFAULT_MAX_PLACEMENTS}; 0: no limit)",
    )
    serve.add_argument(
        "--max-placement-request",
        type=_limit,
        default=os.environ.get(MAX_REQUEST_ENV, str(DEFAULT_MAX_REQUEST)),
        metavar="BYTES",
        help=f"bytes of the request kept with each placement, for replace (default "
        f"${MAX_REQUEST_ENV}, else {DEFAULT_MAX_REQUEST}; 0: no limit)",
    )
    _add_agent_auth_arguments(serve.add_argument_group("agent identity"))
    add_tls_arguments(serve, client_ca=True)
    add_connection_limit_arguments(serve, max_head_bytes=64 << 10, keep_alive=5)
    add_log_level_argument(serve)


def _add_agent_auth_arguments(group: Any) -> None:
    group.add_argument(
        "--agent-auth",
        choices=("tokens", "kubernetes"),
        default="tokens",
        help="how agents prove who they are: their [[token]] entries (default), or also their "
        "projected ServiceAccount token, reviewed by the apiserver and bound to its pod's Node",
    )
    group.add_argument(
        "--agent-service-account",
        default="docker-variant/variant-agent",
        metavar="NAMESPACE/NAME",
        help="--agent-auth kubernetes: the agents' ServiceAccount (default docker-variant/variant-agent)",
    )
    group.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="--agent-auth kubernetes: the apiserver (default: in-cluster, else $KUBECONFIG)",
    )


def _limit(text: str) -> int:
    """An argparse ``type``: a whole number >= 0 (0: no limit)."""
    if not text.isascii() or not text.isdigit() or len(text) > 12:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return int(text)


def _add_scheduler_arguments(command: Any, role: str) -> None:
    """``--scheduler URL`` and ``--token-file FILE``: the running scheduler asked."""
    command.add_argument(
        "--scheduler",
        default=os.environ.get(SCHEDULER_ENV, f"http://{DEFAULT_LISTEN}"),
        metavar="URL",
        help=f"the running scheduler (default ${SCHEDULER_ENV}, else http://{DEFAULT_LISTEN})",
    )
    command.add_argument("--token-file", metavar="FILE", help=f"{role} bearer token (one line)")
    add_client_tls_arguments(command)


def _add_cordon_commands(commands: Any) -> None:
    for name, does in (
        ("cordon", "no new placements on the agent (it keeps reporting)"),
        ("uncordon", "place on the agent again (a drained one too)"),
    ):
        command = commands.add_parser(name, help=does)
        _add_scheduler_arguments(command, "an admin's")
        command.add_argument("agent_id", metavar="AGENT", help="the agent's id")


def _run_cordon(args: Any, error: Callable[[str], Any]) -> int:
    """``POST /v1/agents/AGENT/cordon`` (or ``uncordon``); one line on stdout. 0: done; 2: bad
    input or refused (401, 403); 3: the scheduler cannot be reached, or no such agent; 4: the
    scheduler failed."""
    from pathlib import Path

    from docker_variant.agent.client import check_scheduler_url, read_token
    from docker_variant.api.names import check_agent_id

    try:
        scheduler = check_scheduler_url(args.scheduler)
        token = read_token(Path(args.token_file)) if args.token_file else None
        agent_id = check_agent_id(args.agent_id)
        use_client_tls(args)
    except InvalidInputError as exc:
        error(one_line(str(exc)))
        return 2
    asked = _post(scheduler, f"/v1/agents/{agent_id}/{args.command}", token, None, 1 << 20, 30)
    if isinstance(asked, int):
        return asked
    status, reason, data, answer = asked
    if status != 200 or not isinstance(answer, dict):
        return _failed(status, reason, data)
    already = "" if answer.get("changed") else "already "
    sys.stdout.write(f"agent {agent_id}: {already}{args.command}ed\n")
    return 0


def _post(
    scheduler: str, path: str, token: str | None, body: object, limit: int, timeout: float
) -> tuple[int, str, bytes, Any] | int:
    """POST ``body`` (JSON; None: no body) to ``scheduler`` + ``path``: the answer's status,
    reason, bytes (at most ``limit``) and, for a 200, its JSON; or exit code 3 when no answer
    came (the line on stderr says why)."""
    import httpx

    from docker_variant.agent.client import scheduler_failure
    from docker_variant.jsondoc import load_json
    from docker_variant.oci.http import read_response, sync_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{scheduler}{path}"
    try:
        with (
            sync_client(timeout=timeout, headers=headers) as http,
            http.stream("POST", url, json=body) as response,
        ):
            data = read_response(response, limit, url)
        answer = load_json(data, f"{url} answer") if response.status_code == 200 else None
    except httpx.HTTPError as exc:
        why = scheduler_failure(exc, scheduler)
        sys.stderr.write(f"variant-scheduler: error: {scheduler}: {why}\n")
        return 3
    except (UnreachableError, InvalidInputError) as exc:
        sys.stderr.write(f"variant-scheduler: error: {scheduler}: {one_line(str(exc))}\n")
        return 3
    return response.status_code, response.reason_phrase, data, answer


def _failed(status: int, reason: str, data: bytes) -> int:
    """One line for a scheduler's error answer; the exit code its status means."""
    from docker_variant.oci.errcode import read_error

    found = read_error(data)
    message = found.message if found is not None and found.message else None
    message = message or data[:200].decode("utf-8", "replace") or reason
    sys.stderr.write(f"variant-scheduler: error: {status} {one_line(message)}\n")
    return 2 if status < 404 or status == 413 else 3 if status in (404, 502, 503, 504) else 4


def _add_what_if_command(commands: Any) -> None:
    what_if = commands.add_parser(
        "what-if",
        help="would the request place now; else how many nodes of each template would make it",
    )
    what_if.add_argument(
        "--templates",
        required=True,
        metavar="FILE",
        help='node templates: a JSON list, or {"templates": [...]} (docs/reference/scheduler-api.md)',
    )
    _add_scheduler_arguments(what_if, "a client's")
    what_if.add_argument(
        "request", metavar="REQUEST", help="a placement request, JSON ('-': stdin)"
    )


def _run_what_if(args: Any, error: Callable[[str], Any]) -> int:
    """Ask the scheduler's ``POST /v1/what-if``; print its JSON answer. 0: it fits now or a
    template helps; 1: neither; 2: bad input; 3: the scheduler (or the registry it asks)
    cannot be reached, or the image is missing; 4: the scheduler failed."""
    import json
    from pathlib import Path

    from docker_variant.agent.client import check_scheduler_url, read_token
    from docker_variant.jsondoc import load_json, read_json_file
    from docker_variant.scheduler.whatif import parse_what_if

    try:
        scheduler = check_scheduler_url(args.scheduler)
        token = read_token(Path(args.token_file)) if args.token_file else None
        use_client_tls(args)
        if args.request == "-":
            wanted = load_json(sys.stdin.buffer.read(), "REQUEST (stdin)")
        else:
            wanted = read_json_file(args.request, f"REQUEST {args.request!r}")
        templates = read_json_file(args.templates, f"--templates {args.templates!r}")
        if isinstance(templates, dict) and set(templates) == {"templates"}:
            templates = templates["templates"]
        body = {"request": wanted, "templates": templates}
        parse_what_if(body)  # bad input is told here, the same way the server would
    except InvalidInputError as exc:
        error(one_line(str(exc)))
        return 2
    asked = _post(scheduler, "/v1/what-if", token, body, _WHAT_IF_ANSWER_LIMIT, 60)
    if isinstance(asked, int):
        return asked
    status, reason, data, answer = asked
    if status != 200:
        return _failed(status, reason, data)
    if not isinstance(answer, dict):
        sys.stderr.write(
            f"variant-scheduler: error: {scheduler}/v1/what-if: the answer is not a JSON object\n"
        )
        return 3
    sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    return 0 if answer.get("fits_now") or answer.get("options") else 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "agent":
        return run_agent_command(args, parser.error)
    if args.command == "what-if":
        return _run_what_if(args, parser.error)
    if args.command in ("cordon", "uncordon"):
        return _run_cordon(args, parser.error)
    return _serve(args, parser.error)


def _kubernetes_agents(args: Any) -> Any:
    """``kubeauth.KubernetesAgents`` on the apiserver of ``--kubeconfig`` (else in-cluster)."""
    from pathlib import Path

    from docker_variant.extras import KUBERNETES
    from docker_variant.k8s.apiserver import connect
    from docker_variant.scheduler.kubeauth import KubernetesAgents

    KUBERNETES.require("variant-scheduler serve --agent-auth kubernetes")
    namespace, slash, name = args.agent_service_account.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise InvalidInputError(
            f"--agent-service-account {args.agent_service_account!r}: expected NAMESPACE/NAME"
        )
    kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None
    return KubernetesAgents(connect(kubeconfig), args.agent_service_account)


def _serve(args: Any, error: Callable[[str], Any]) -> int:
    """``variant-scheduler serve``: the server's modules are loaded here, not for --help."""
    from docker_variant.extras import SCHEDULER

    SCHEDULER.require("variant-scheduler serve")
    import signal
    from pathlib import Path

    from sqlalchemy import exc as sa_exc

    from docker_variant.oci.reference import check_registry
    from docker_variant.scheduler.app import create_app
    from docker_variant.scheduler.database import DatabaseUnavailableError
    from docker_variant.scheduler.store import Store
    from docker_variant.scheduler.tokens import TokenFile
    from docker_variant.server.limits import ConnectionLimits
    from docker_variant.server.net import is_loopback, parse_listen
    from docker_variant.server.serve import serve, uvicorn_config

    try:
        host, port = parse_listen(args.listen)
        tls = tls_options(args)
        tokens = TokenFile(Path(args.tokens)) if args.tokens else None
        for warning in tokens.warnings if tokens is not None else ():
            sys.stderr.write(f"variant-scheduler: warning: {warning}\n")
        registries = [check_registry(r) for r in args.registry]
        if tokens is None and not is_loopback(host):
            raise InvalidInputError(
                f"--listen {args.listen}: without --tokens the scheduler serves loopback only "
                "(anyone who can reach it may do anything); give --tokens FILE"
            )
        agents = _kubernetes_agents(args) if args.agent_auth == "kubernetes" else None
        if agents is not None and tokens is None:
            raise InvalidInputError("--agent-auth kubernetes needs --tokens (the clients' tokens)")
        store = Store.open(
            args.db,
            agent_ttl=args.agent_ttl,
            max_placements=args.max_placements,
            max_request=args.max_placement_request,
        )
    except InvalidInputError as exc:
        error(str(exc))
    except (DatabaseUnavailableError, sa_exc.SQLAlchemyError) as exc:
        sys.stderr.write(f"variant-scheduler: error: {one_line(str(exc))}\n")
        return 3
    app = create_app(store, tokens=tokens, registries=registries, agents=agents)
    config = uvicorn_config(
        app, args.log_level, ConnectionLimits.from_args(args), lifespan="off", **tls
    )

    authentication = (
        f"{len(tokens)} tokens" if tokens is not None else "no authentication (loopback only)"
    )
    transport = (
        "TLS" + (" with client certificates" if "ssl_ca_certs" in tls else "")
        if tls
        else "plain HTTP"
    )
    if tokens is not None:  # `kill -HUP`: read the tokens again (a change is seen anyway)
        ask_reload = tokens.ask_reload
        signal.signal(signal.SIGHUP, lambda _signum, _frame: ask_reload())
    details = f", database {store.url}, {authentication}, {transport}"
    return serve(
        config,
        args.listen,
        (host, port),
        program="variant-scheduler",
        details=details,
        error=error,
        close=store.close,
    )


if __name__ == "__main__":
    sys.exit(main())
