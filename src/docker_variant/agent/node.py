"""The node agent, which keeps this node's report at the scheduler current.

Each heartbeat is a whole report, ``PUT /v1/agents/{agent_id}``:

- ``host`` and ``devices``: detected afresh, with the providers of ``docker-variant providers
  --devices`` (a ``--providers-file`` replaces detection, as everywhere; it may be plain
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
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from docker_variant import __version__
from docker_variant.agent.client import read_token
from docker_variant.agent.health import NVML_KIND, nvml_health
from docker_variant.agent.inputs import read_agent_providers_file
from docker_variant.agent.settings import AgentSettings
from docker_variant.errors import DockerVariantError, InvalidInputError, one_line
from docker_variant.providers import detect_host
from docker_variant.variant.platform import host_platform, platform_of_lists

__all__ = [
    "MAX_BACKOFF_S",
    "Agent",
    "AgentSettings",
    "ReportRefusedError",
    "backoff_delay",
    "jittered",
]

FIRST_RETRY_S = 1.0
MAX_BACKOFF_S = 30.0
REQUEST_TIMEOUT_S = 10.0
_BEAT_JITTER = 0.1
_RETRY_JITTER = 0.2

_log = logging.getLogger("docker_variant.agent")


class ReportRefusedError(InvalidInputError):
    """The scheduler answered 400/413: this report is invalid and will stay so."""


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
            self._gpus_seen.update(devices.get(NVML_KIND, {}))
            if self._gpus_seen:
                devices[NVML_KIND] = {**self._gpus_seen, **devices.get(NVML_KIND, {})}
            known = self._gpus_seen
        verdicts = nvml_health(devices.get(NVML_KIND, {}), self.nvml, known=known)
        self._log_health(verdicts)
        body: dict[str, Any] = {
            "agent_id": settings.agent_id,
            "resource_group": settings.resource_group,
            "platform": str(platform),
            "host": found.host,
            "devices": devices,
        }
        if verdicts:
            body["unhealthy"] = {NVML_KIND: sorted(verdicts)}
        if capacity:
            body["capacity"] = capacity
        self.reported = sum(len(ids) for ids in devices.values())
        return body

    def _log_health(self, verdicts: Mapping[str, str]) -> None:
        for uuid, why in sorted(verdicts.items()):
            if self._unhealthy.get(uuid) != why:
                _log.warning("device %s/%s is unhealthy: %s", NVML_KIND, uuid, why)
        for uuid in sorted(self._unhealthy.keys() - verdicts.keys()):
            _log.info("device %s/%s is healthy again", NVML_KIND, uuid)
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
