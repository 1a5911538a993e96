"""``variant-scheduler agent``: the node agent, which keeps this node's report current.

Each heartbeat is a whole report (SPEC 8), ``PUT /v1/agents/{agent_id}``:

- ``host`` and ``devices``: detected afresh, with the providers of ``docker-variant providers
  --devices`` (a ``--providers-file`` replaces detection, as everywhere; it may be SPEC 4
  supported lists, host only, or what ``docker-variant providers --devices --json`` prints);
- ``platform``: this machine's (with a providers file: the one its CPU namespace implies);
- ``unhealthy``: the NVIDIA devices that, through NVML, stop answering (any NVML error but
  "not supported", e.g. ``NVMLError_GpuIsLost``), count uncorrectable ECC errors since the
  driver loaded (``nvmlDeviceGetTotalEccErrors``, volatile counter: a reset clears it, so a
  mended GPU comes back), or have retired pages pending (``nvmlDeviceGetRetiredPagesPendingStatus``:
  it needs a reset). A GPU detected earlier in this run that NVML no longer finds is reported
  with its last lists and marked unhealthy, rather than silently dropped.
- ``capacity``: only where a providers file states it (the scheduler's default is 1.0 share
  a device, what a whole GPU has).

The PUT is an upsert and carries everything, so re-registering after a scheduler restart, a
lost database or an admin's ``DELETE /v1/agents/{id}`` is simply the next heartbeat. Beats come
every ``interval`` seconds +-10 % (so a fleet started together does not beat in step); a failed
one is retried after 1 s, then 2, 4 ... up to ``max(interval, 30 s)``, +-20 %. A scheduler
that cannot be reached, even at start, is retried forever: an agent outlives scheduler
outages. A report the scheduler refuses (400/413) will be refused again: exit 2.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from docker_variant import __version__
from docker_variant.errors import DockerVariantError, InvalidInputError, one_line
from docker_variant.jsondoc import read_json_file
from docker_variant.providers import HostReport, detect_host, read_providers_file
from docker_variant.variant.platform import host_platform, platform_of_lists

__all__ = [
    "DEFAULT_INTERVAL_S",
    "Agent",
    "AgentSettings",
    "ReportRefusedError",
    "backoff_delay",
    "check_scheduler_url",
    "jittered",
    "nvml_health",
    "read_agent_providers_file",
    "read_token",
]

DEFAULT_INTERVAL_S = 10.0
FIRST_RETRY_S = 1.0
MAX_BACKOFF_S = 30.0
REQUEST_TIMEOUT_S = 10.0
_BEAT_JITTER = 0.1
_RETRY_JITTER = 0.2
_GPU_KIND = "nvidia"  # the providers' device kind (a namespace) that NVML can judge

_log = logging.getLogger("docker_variant.scheduler.agent")


class ReportRefusedError(InvalidInputError):
    """The scheduler answered 400/413: this report is invalid and will stay so."""


# --------------------------------------------------------------------------- inputs


def check_scheduler_url(text: str) -> str:
    """``http(s)://HOST[:PORT][/PREFIX]``, without a trailing slash."""
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as exc:
        raise InvalidInputError(f"--scheduler {text!r}: not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InvalidInputError(
            f"--scheduler {text!r}: expected http://HOST:PORT or https://HOST:PORT"
        )
    if url.query or url.fragment:
        raise InvalidInputError(f"--scheduler {text!r}: a base URL has no query or fragment")
    return str(url).rstrip("/")


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace ignored)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise InvalidInputError(f"--token-file {str(path)!r}: cannot read it ({reason})") from None
    if not token or any(c.isspace() for c in token):
        raise InvalidInputError(
            f"--token-file {str(path)!r}: expected one token (no spaces), "
            + ("the file is empty" if not token else "found whitespace inside")
        )
    return token


@dataclass(frozen=True)
class AgentFile:
    """A providers file as the agent reads it: the lists, and the capacity it may state."""

    report: HostReport
    capacity: dict[str, dict[str, float]] = field(default_factory=dict)


def _is_report_shape(data: object) -> bool:
    """``{"host": {ns: {...}}, "devices": {...}}`` (``providers --devices --json``), told
    apart from SPEC 4 lists, whose namespaces (even one named ``host``) hold value lists."""
    if not isinstance(data, dict) or "host" not in data:
        return False
    if not set(data) <= {"host", "devices", "capacity"}:
        return False
    host = data["host"]
    return isinstance(host, dict) and all(isinstance(v, dict) for v in host.values())


def _capacity(
    data: object, devices: Mapping[str, Mapping[str, Any]], what: str
) -> dict[str, dict[str, float]]:
    if not isinstance(data, dict):
        raise InvalidInputError(f"{what}: capacity must be {{device kind: {{device id: shares}}}}")
    capacity: dict[str, dict[str, float]] = {}
    for kind, shares in data.items():
        if not isinstance(shares, dict):
            raise InvalidInputError(f"{what}: capacity.{kind} must map device ids to shares")
        for device_id, value in shares.items():
            if device_id not in devices.get(kind, {}):
                raise InvalidInputError(f"{what}: capacity names {kind}/{device_id}, no device")
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidInputError(
                    f"{what}: capacity of {kind}/{device_id} must be a number > 0, got {value!r}"
                )
            capacity.setdefault(kind, {})[device_id] = float(value)
    return capacity


def read_agent_providers_file(path: Path) -> AgentFile:
    """SPEC 4 lists (the host only), or the ``{"host", "devices"[, "capacity"]}`` report."""
    what = f"providers file {str(path)!r}"
    data = read_json_file(path, what)
    if not _is_report_shape(data):
        return AgentFile(read_providers_file(path))
    try:
        report = HostReport.from_json(data, what)
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(
            f"{what}: expected {{host: LISTS, devices: {{kind: {{id: LISTS}}}}}} ({exc})"
        ) from None
    return AgentFile(report, _capacity(data.get("capacity", {}), report.devices, what))


# --------------------------------------------------------------------------- NVML health


def _load_nvml(nvml: Any) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except (ImportError, OSError):
        return None
    return pynvml


def nvml_health(
    uuids: Iterable[str], nvml: Any = None, *, known: Iterable[str] = ()
) -> dict[str, str]:
    """Why each unhealthy GPU of ``uuids`` is so (healthy ones are absent); ``{}`` where NVML
    cannot be used at all (no driver), since nothing can be judged then.

    ``known``: GPUs NVML found earlier in this run; one of them that NVML no longer finds
    stopped answering. Any other id NVML does not know (e.g. from a providers file) is left
    alone."""
    nvml = _load_nvml(nvml)
    if nvml is None:
        return {}
    error: Any = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except (error, OSError):  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded
        return {}
    try:
        known_ids = set(known)
        verdicts = {}
        for uuid in uuids:
            why = _judge_gpu(nvml, error, uuid, uuid in known_ids)
            if why is not None:
                verdicts[uuid] = why
        return verdicts
    finally:
        with contextlib.suppress(error, OSError):
            nvml.nvmlShutdown()


def _codes(nvml: Any, *names: str) -> set[int]:
    return {getattr(nvml, name) for name in names if hasattr(nvml, name)}


def _judge_gpu(nvml: Any, error: Any, uuid: str, known: bool) -> str | None:
    # "Not supported" (consumer GPUs have no ECC), "no permission" and a driver without the
    # call say nothing about the GPU's health.
    unjudged = _codes(
        nvml,
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_NO_PERMISSION",
        "NVML_ERROR_FUNCTION_NOT_FOUND",
    )
    not_found = _codes(nvml, "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    except error as exc:
        if getattr(exc, "value", None) in not_found and not known:
            return None  # not a GPU this NVML has (an id from a providers file)
        return f"stopped answering (NVML: {exc})"
    checks: list[tuple[str, Callable[[], Any]]] = [
        (
            "ecc",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        ),
        ("pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
    ]
    for name, check in checks:
        try:
            answer = int(check())
        except error as exc:
            if getattr(exc, "value", None) in unjudged:
                continue
            return f"stopped answering (NVML: {exc})"
        if name == "ecc" and answer > 0:
            return f"{answer} uncorrectable ECC error{'s' if answer != 1 else ''} since the driver loaded"
        if name == "pending" and answer == nvml.NVML_FEATURE_ENABLED:
            return "retired pages pending (the GPU needs a reset)"
    return None


# --------------------------------------------------------------------------- timing


def jittered(interval: float, rng: random.Random) -> float:
    """The next beat: ``interval`` +-10 %."""
    return interval * rng.uniform(1 - _BEAT_JITTER, 1 + _BEAT_JITTER)


def backoff_delay(failures: int, interval: float, rng: random.Random) -> float:
    """After ``failures`` failed beats in a row (>= 1): 1 s, 2 s, 4 s ... up to
    ``max(interval, 30 s)``, +-20 %."""
    cap = max(interval, MAX_BACKOFF_S)
    base = min(FIRST_RETRY_S * 2 ** min(failures - 1, 32), cap)
    return float(base * rng.uniform(1 - _RETRY_JITTER, 1 + _RETRY_JITTER))


# --------------------------------------------------------------------------- the agent


@dataclass(frozen=True)
class AgentSettings:
    scheduler: str  # checked base URL
    agent_id: str
    resource_group: str = "default"
    interval: float = DEFAULT_INTERVAL_S
    token_file: Path | None = None
    providers_file: Path | None = None
    enable: tuple[str, ...] = ()  # third-party provider plugins opted in


class Agent:
    """Detect, judge, report; again and again until ``stop`` is set."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        client: httpx.Client | None = None,
        nvml: Any = None,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.client = client or httpx.Client(
            timeout=REQUEST_TIMEOUT_S,
            headers={"User-Agent": f"variant-scheduler-agent/{__version__}"},
        )
        self.nvml = nvml
        self.stop = stop or threading.Event()
        self.rng = rng or random.Random()
        self.token = read_token(settings.token_file) if settings.token_file else None
        self._gpus_seen: dict[str, Any] = {}  # GPU UUID -> last lists, NVML-detected
        self._unhealthy: dict[str, str] = {}  # last verdicts, to log changes only
        self.beats = 0  # heartbeats the scheduler took
        self.reported = 0  # devices in the last report

    @property
    def url(self) -> str:
        return f"{self.settings.scheduler}/v1/agents/{self.settings.agent_id}"

    def report(self) -> dict[str, Any]:
        """This heartbeat's body."""
        settings = self.settings
        capacity: dict[str, dict[str, float]] = {}
        if settings.providers_file is not None:
            read = read_agent_providers_file(settings.providers_file)
            found, capacity = read.report, read.capacity
            implied = platform_of_lists(found.host)
            platform = implied if implied is not None else host_platform()
            devices = {kind: dict(ids) for kind, ids in found.devices.items()}
            known: Iterable[str] = ()
        else:
            found = detect_host(None, settings.enable, use_cache=False)
            platform = host_platform()
            devices = {kind: dict(ids) for kind, ids in found.devices.items()}
            # a GPU that NVML stops listing is kept, with its last lists, to be judged below
            self._gpus_seen.update(devices.get(_GPU_KIND, {}))
            if self._gpus_seen:
                devices[_GPU_KIND] = {**self._gpus_seen, **devices.get(_GPU_KIND, {})}
            known = self._gpus_seen
        verdicts = nvml_health(devices.get(_GPU_KIND, {}), self.nvml, known=known)
        self._log_health(verdicts)
        body: dict[str, Any] = {
            "agent_id": settings.agent_id,
            "resource_group": settings.resource_group,
            "platform": str(platform),
            "host": found.host,
            "devices": devices,
        }
        if verdicts:
            body["unhealthy"] = {_GPU_KIND: sorted(verdicts)}
        if capacity:
            body["capacity"] = capacity
        self.reported = sum(len(ids) for ids in devices.values())
        return body

    def _log_health(self, verdicts: Mapping[str, str]) -> None:
        for uuid, why in sorted(verdicts.items()):
            if self._unhealthy.get(uuid) != why:
                _log.warning("device %s/%s is unhealthy: %s", _GPU_KIND, uuid, why)
        for uuid in sorted(self._unhealthy.keys() - verdicts.keys()):
            _log.info("device %s/%s is healthy again", _GPU_KIND, uuid)
        self._unhealthy = dict(verdicts)

    def beat(self) -> dict[str, Any]:
        """One heartbeat; the scheduler's view of this agent. Raises ``httpx.HTTPError`` for
        what may pass (unreachable, 5xx, 401/403...), ``ReportRefusedError`` for 400/413."""
        body = self.report()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = self.client.put(self.url, json=body, headers=headers)
        if response.status_code in (400, 413):
            raise ReportRefusedError(
                f"the scheduler refused the report of agent {self.settings.agent_id!r}: "
                f"{response.status_code} {_message(response)}"
            )
        if response.status_code in (401, 403) and self.settings.token_file is not None:
            # the token may have been rotated on disk: take the new one next time
            with contextlib.suppress(InvalidInputError):
                self.token = read_token(self.settings.token_file)
        if response.is_error:
            raise httpx.HTTPStatusError(
                f"{response.status_code} {_message(response)}",
                request=response.request,
                response=response,
            )
        self.beats += 1
        view: dict[str, Any] = response.json()
        return view

    def run(self) -> int:
        """Beat until ``stop`` is set: 0; 2 when the scheduler refuses the report."""
        settings = self.settings
        failures = 0
        _log.info(
            "agent %s reporting to %s every %g s",
            settings.agent_id,
            settings.scheduler,
            settings.interval,
        )
        while not self.stop.is_set():
            try:
                self.beat()
            except ReportRefusedError as exc:
                _log.error("%s", exc)
                return 2
            except (httpx.HTTPError, ValueError) as exc:  # ValueError: a non-JSON answer
                failures += 1
                delay = backoff_delay(failures, settings.interval, self.rng)
                log = _log.warning if failures == 1 else _log.debug
                log(
                    "heartbeat %d to %s failed (%s); retrying in %.1f s",
                    failures,
                    settings.scheduler,
                    one_line(str(exc)) or type(exc).__name__,
                    delay,
                )
            except DockerVariantError as exc:  # e.g. the providers file went bad: keep trying
                failures += 1
                delay = backoff_delay(failures, settings.interval, self.rng)
                _log.error("%s; retrying in %.1f s", exc, delay)
            else:
                if failures or self.beats == 1:
                    _log.info(
                        "%s with %s as agent %s (%d devices, %d unhealthy)",
                        "registered"
                        if self.beats == 1
                        else f"re-registered after {failures} failed heartbeats",
                        settings.scheduler,
                        settings.agent_id,
                        self.reported,
                        len(self._unhealthy),
                    )
                failures = 0
                delay = jittered(settings.interval, self.rng)
            self.stop.wait(delay)
        _log.info("agent %s stopped", settings.agent_id)
        return 0

    def close(self) -> None:
        self.client.close()


def _message(response: httpx.Response) -> str:
    """The scheduler's one-line error message, else the start of the body."""
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError, AttributeError):
        return one_line(str(response.json()["errors"][0]["message"]))
    return one_line(response.text[:200]) or response.reason_phrase


# --------------------------------------------------------------------------- command line


def add_agent_command(commands: Any) -> None:
    """``variant-scheduler agent ...`` on the ``serve`` parser's subcommands."""
    from docker_variant.server.options import add_duration_argument, add_log_level_argument

    agent = commands.add_parser("agent", help="run the node agent (heartbeats this node)")
    agent.add_argument("--scheduler", required=True, metavar="URL", help="http(s)://HOST:PORT")
    agent.add_argument(
        "--token-file", type=Path, metavar="FILE", help="the agent's bearer token (one line)"
    )
    add_duration_argument(
        agent,
        "--interval",
        what="interval",
        strict=True,
        default=DEFAULT_INTERVAL_S,
        help="between heartbeats, +-10 %% (default %(default)g)",
    )
    agent.add_argument(
        "--providers-file",
        type=Path,
        metavar="FILE",
        help="supported lists (SPEC 4) or `docker-variant providers --devices --json` output, "
        "instead of detection (default $DOCKER_VARIANT_PROVIDERS_FILE)",
    )
    agent.add_argument(
        "--agent-id", metavar="ID", help="default: this machine's host name (short form)"
    )
    agent.add_argument("--resource-group", default="default", metavar="G")
    agent.add_argument(
        "--enable-provider",
        action="append",
        default=[],
        metavar="NS",
        help="also run the third-party provider plugin for namespace NS",
    )
    add_log_level_argument(agent)


def run_agent_command(args: Any, error: Callable[[str], Any]) -> int:
    """Check the arguments (``error``: one line, exit 2), then beat until SIGTERM/SIGINT."""
    import os
    import signal
    import socket
    import sys

    from docker_variant.providers import PROVIDERS_FILE_ENV
    from docker_variant.scheduler.documents import check_agent_id
    from docker_variant.server.logs import configure_logging

    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    # before the first detection, so that a stop during it is clean too
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        scheduler = check_scheduler_url(args.scheduler)
        agent_id = check_agent_id(args.agent_id or socket.gethostname().split(".")[0])
        group = args.resource_group
        try:
            check_agent_id(group)  # resource groups follow the agent ids' rule
        except InvalidInputError as exc:
            raise InvalidInputError(str(exc).replace("agent_id", "--resource-group", 1)) from None
        providers_file = args.providers_file or os.environ.get(PROVIDERS_FILE_ENV) or None
        settings = AgentSettings(
            scheduler,
            agent_id,
            group,
            args.interval,
            args.token_file,
            Path(providers_file) if providers_file else None,
            tuple(args.enable_provider),
        )
        configure_logging(args.log_level)
        agent = Agent(settings, stop=stop)
        agent.report()  # a bad providers file or provider is bad input now, not at 3 a.m.
    except InvalidInputError as exc:
        error(one_line(str(exc)))
        return 2
    except DockerVariantError as exc:  # a provider plugin failed (exit 4, SPEC 7)
        sys.stderr.write(f"variant-scheduler agent: error: {one_line(str(exc))}\n")
        return exc.exit_code
    try:
        return agent.run()
    finally:
        agent.close()
