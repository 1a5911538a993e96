"""The node agent, which keeps this node's report at the scheduler current.

Each heartbeat is a whole report, ``PUT /v1/agents/{agent_id}``:

- ``host`` and ``devices``: detected afresh, with the providers of ``docker-variant providers
  --devices``: NVIDIA GPUs through NVML (``devices.nvidia.<UUID>``), AMD GPUs from the KFD
  sysfs topology and the PCI devices that device descriptors describe
  (``devices.<namespace>.<PCI address>``), those files read under the host root
  (``settings.host_root``: an agent in a container with the host's ``/sys`` mounted
  elsewhere). A ``--providers-file`` replaces detection, as everywhere; it may be plain
  supported lists, host only, or what ``docker-variant providers --devices --json`` prints;
- ``platform``: this machine's (with a providers file: the one its CPU namespace implies);
- ``unhealthy``: the NVIDIA devices that, through NVML, stop answering (any NVML error but
  "not supported", e.g. ``NVMLError_GpuIsLost``), count uncorrectable ECC errors since the
  driver loaded (``nvmlDeviceGetTotalEccErrors``, volatile counter: a reset clears it, so a
  mended GPU comes back), or have retired pages pending (``nvmlDeviceGetRetiredPagesPendingStatus``:
  it needs a reset). A GPU detected earlier in this run that NVML no longer finds is reported
  with its last lists and marked unhealthy, rather than silently dropped; so is a device of
  any other kind (an AMD GPU, a descriptor's NPU) that detection stops listing. NVML judges
  only NVIDIA devices: it never marks another vendor's device unhealthy.
- ``capacity``: only where a providers file states it (the scheduler's default is 1.0 share
  a device, what a whole GPU has).

With ``settings.containerd_hosts`` (``--containerd-hosts REGISTRY``) each detection also
keeps ``<containerd_dir>/<REGISTRY>/hosts.toml`` what ``k8s containerd-hosts`` writes for this
node (``k8s.containerd``: the header saying what every device runs): rewritten atomically
when it differs from the file, so that a driver upgrade, a GPU added or gone, or a file
someone changed is set right within one interval. A failed write is one logged line and a
retry on the next detection.

With ``settings.node_name`` (``--label-node``) each detection also keeps that Kubernetes
Node's ``variant.pep817.dev/`` labels what ``k8s.labels.node_labels`` says of the host
lists (``k8s.apiserver.NodeLabeller``: a merge patch of those labels only): when they change,
and every ``LABEL_RESYNC_S`` in case someone changed them. A failed patch is one logged line
and a retry on the next detection; it never stops the heartbeats. Without ``--scheduler``
the agent only labels.

The PUT is an upsert and carries everything, so re-registering after a scheduler restart, a
lost database or an admin's ``DELETE /v1/agents/{id}`` is simply the next heartbeat. Beats come
every ``interval`` seconds +-10 % (so a fleet started together does not beat in step); a failed
one is retried after 1 s, then 2, 4 ... up to ``max(interval, 30 s)``, +-20 %. A scheduler
that cannot be reached, even at start, is retried forever: an agent outlives scheduler
outages. A report the scheduler refuses (400/413) will be refused again: exit 2.

Answers are read as untrusted: at most ``MAX_ANSWER_BYTES`` while streaming (never more is
buffered, whatever the scheduler or a man in the middle sends), not content-encoded, through
``jsondoc.load_json`` (strict UTF-8, a depth limit), and a heartbeat counts only when it is
answered 2xx with a JSON object. Anything else (a redirect, a huge or deeply nested answer) is
one logged line and a retry with backoff, never an exit.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from docker_variant.agent.client import read_token, scheduler_failure
from docker_variant.agent.health import NVML_KIND, nvml_health
from docker_variant.agent.inputs import read_agent_providers_file
from docker_variant.agent.settings import AgentSettings
from docker_variant.errors import (
    DockerVariantError,
    InvalidInputError,
    UnreachableError,
    one_line,
)
from docker_variant.jsondoc import load_json
from docker_variant.oci.bodies import BodyLimit, read_bounded
from docker_variant.oci.errcode import read_error
from docker_variant.oci.http import sync_client
from docker_variant.providers import detect_host
from docker_variant.retry import Backoff
from docker_variant.textdoc import read_regular_file
from docker_variant.variant.model import SupportedLists
from docker_variant.variant.platform import host_platform, platform_of_lists

if TYPE_CHECKING:
    from pathlib import Path

    from docker_variant.k8s.apiserver import NodeLabeller

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_BACKOFF_S",
    "Agent",
    "AgentSettings",
    "HeartbeatError",
    "ReportRefusedError",
    "backoff_delay",
    "jittered",
]

FIRST_RETRY_S = 1.0
MAX_BACKOFF_S = 30.0
REQUEST_TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 1 << 20  # the scheduler's view of one agent is a few KiB
LABEL_RESYNC_S = 300.0  # node labels unchanged by detection are checked this often
_BEAT_JITTER = 0.1
_RETRY_JITTER = 0.2
_OUTAGE_STATUSES = frozenset({502, 503, 504})  # a proxy in front of a scheduler that is away

_log = logging.getLogger("docker_variant.agent")


class ReportRefusedError(InvalidInputError):
    """The scheduler answered 400/413: this report is invalid and will stay so."""


class HeartbeatError(UnreachableError):
    """A heartbeat that did not count and may next time: the scheduler could not be reached
    (``outage``), or its answer was not a heartbeat's (not 2xx, too large, not a JSON
    object). ``status``: the answer's status code, if one came."""

    def __init__(self, message: str, *, status: int | None = None, outage: bool = False):
        super().__init__(message)
        self.status = status
        self.outage = outage


# --------------------------------------------------------------------------- timing


def jittered(interval: float, rng: random.Random) -> float:
    """The next beat: ``interval`` +-10 %."""
    return interval * rng.uniform(1 - _BEAT_JITTER, 1 + _BEAT_JITTER)


def backoff_delay(failures: int, interval: float, rng: random.Random) -> float:
    """After ``failures`` failed beats in a row (>= 1): 1 s, 2 s, 4 s ... up to
    ``max(interval, 30 s)``, +-20 %."""
    backoff = Backoff(
        FIRST_RETRY_S, max(interval, MAX_BACKOFF_S), 1 - _RETRY_JITTER, 1 + _RETRY_JITTER
    )
    return backoff.delay(failures - 1, rng)


# --------------------------------------------------------------------------- answers


def read_answer(response: httpx.Response, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """The body of a streamed ``response``, refused (``HeartbeatError``) as soon as it
    exceeds ``limit`` bytes or is content-encoded (the agent asks for ``identity``, so that
    what is counted is what would be buffered)."""
    status = response.status_code
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise HeartbeatError(
            f"{status}: the answer is {one_line(encoding, 40)!r}-encoded; the agent asks for "
            "identity",
            status=status,
        )

    def too_large(declared: str | None) -> HeartbeatError:
        if declared is not None:
            text = f"is {declared} bytes, more than the {limit} an agent reads"
        else:
            text = f"is larger than the {limit} bytes an agent reads"
        return HeartbeatError(f"{status}: the answer {text}", status=status)

    declared = response.headers.get("content-length")
    return read_bounded(response.iter_raw(), BodyLimit(limit, too_large, declared=declared))


def error_message(data: bytes, reason: str) -> str:
    """The scheduler's one-line error message (an OCI error body), else the start of the
    body, else the reason phrase."""
    found = read_error(data)
    if found is not None and found.message:
        return found.message
    text = data[:200].decode("utf-8", "replace")
    return one_line(text) or reason


# --------------------------------------------------------------------------- containerd's files

#: A CA bundle or a client certificate is a few KiB; a file past this is not one.
MAX_TLS_FILE_BYTES = 1 << 20


def _tls_file(path: Path) -> bytes:
    """A TLS file the agent copies for containerd: a regular file, read whole (bounded)."""
    try:
        data = read_regular_file(path, MAX_TLS_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TLS_FILE_BYTES:
        raise InvalidInputError(f"{path} is larger than {MAX_TLS_FILE_BYTES} bytes, no PEM file")
    return data


def _text_of(path: Path) -> str | None:
    """The file's text; None when absent or unreadable (then it is written)."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


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
        labeller: NodeLabeller | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.client = client or sync_client(timeout=REQUEST_TIMEOUT_S)
        self.nvml = nvml
        self.stop = stop or threading.Event()
        self.rng = rng or random.Random()
        self.token = read_token(settings.token_file) if settings.token_file else None
        # kind -> device id -> last lists, of the devices detection listed in this run
        self._seen: dict[str, dict[str, SupportedLists]] = {}
        self._unhealthy: dict[tuple[str, str], str] = {}  # last verdicts, to log changes only
        self._sources: dict[str, str] | None = None  # which provider answered, last report
        self.beats = 0  # heartbeats the scheduler took
        self.reported = 0  # devices in the last report
        self._said_no_devices = False  # warned once that none are reported
        if labeller is None and settings.node_name is not None:
            from docker_variant.k8s.apiserver import NodeLabeller, connect

            labeller = NodeLabeller(connect(settings.kubeconfig), settings.node_name)
        self.labeller = labeller
        self.clock = clock
        self._labelled: dict[str, str] | None = None  # the labels the Node last had
        self._label_check = 0.0  # when to check them again though detection is unchanged
        self._label_failure: str | None = None  # logged once while it repeats
        self._label_skipped: dict[str, str] = {}  # values no label says, to log changes only
        self._hosts_failure: dict[str, str] = {}  # registry -> last write failure, logged once

    @property
    def url(self) -> str:
        return f"{self.settings.scheduler}/v1/agents/{self.settings.agent_id}"

    def label_node(self, host: SupportedLists) -> bool:
        """Keep the Node's labels those of ``host`` (with a labeller); whether they are."""
        if self.labeller is None:
            return True
        from docker_variant.k8s.labels import node_labels

        result = node_labels(host, cpu_flags=self.settings.cpu_flags)
        if result.skipped != self._label_skipped:
            for prop, why in result.skipped.items():
                _log.warning("no node label says %s (%s)", prop, why)
            self._label_skipped = dict(result.skipped)
        now = self.clock()
        if result.labels == self._labelled and now < self._label_check:
            return True
        try:
            patch = self.labeller.sync(result.labels)
        except UnreachableError as exc:
            why = one_line(str(exc))
            level = logging.DEBUG if why == self._label_failure else logging.WARNING
            _log.log(level, "labelling node %s failed (%s); retrying", self.labeller.node_name, why)
            self._label_failure, self._labelled = why, None
            return False
        if patch or self._label_failure:
            removed = sum(value is None for value in patch.values())
            _log.info(
                "node %s labelled: %d set, %d removed",
                self.labeller.node_name,
                len(patch) - removed,
                removed,
            )
        self._labelled, self._label_check = result.labels, now + LABEL_RESYNC_S
        self._label_failure = None
        return True

    def keep_hosts(self, host: SupportedLists, devices: Mapping[str, Any]) -> bool:
        """Keep each registry's containerd ``hosts.toml`` the one for this report (with
        ``--containerd-hosts``); whether every file is."""
        settings = self.settings
        if not settings.containerd_hosts:
            return True
        from docker_variant.k8s.containerd import default_server, hosts_toml, write_hosts_toml
        from docker_variant.providers import HostReport
        from docker_variant.providers.gpus import node_header

        lists, kinds = node_header(HostReport(host, dict(devices)))
        kept = True
        for registry in settings.containerd_hosts:
            server = settings.containerd_server or default_server(registry)
            path = settings.containerd_dir / registry / "hosts.toml"
            try:
                ca, client = self._keep_tls_files(registry)  # before the file that names them
                text = hosts_toml(registry, server, lists, kinds, ca=ca, client=client)
                if _text_of(path) != text:
                    write_hosts_toml(settings.containerd_dir, registry, text)
                    _log.info(
                        "wrote %s: %s",
                        path,
                        "what every device runs" if kinds else "this node's lists",
                    )
            except InvalidInputError as exc:
                why = one_line(str(exc))
                level = (
                    logging.DEBUG if self._hosts_failure.get(registry) == why else logging.WARNING
                )
                _log.log(level, "keeping %s failed (%s); retrying", path, why)
                self._hosts_failure[registry] = why
                kept = False
                continue
            self._hosts_failure.pop(registry, None)
        return kept

    def _keep_tls_files(self, registry: str) -> tuple[str | None, tuple[str, str | None] | None]:
        """Copy ``--containerd-ca-file`` and the client certificate into ``registry``'s
        directory where they differ (read again each time: a Secret's rotation is seen);
        hosts.toml's ``ca`` and ``client``, relative: containerd reads them there, wherever
        the node mounts the directory. ``InvalidInputError`` for a file not read or written."""
        from docker_variant.k8s.containerd import (
            CA_FILE,
            CLIENT_CERT_FILE,
            CLIENT_KEY_FILE,
            write_host_file,
        )

        settings = self.settings
        wanted = [
            (CA_FILE, settings.containerd_ca, 0o644),
            (CLIENT_CERT_FILE, settings.containerd_client_cert, 0o644),
            (CLIENT_KEY_FILE, settings.containerd_client_key, 0o600),
        ]
        for name, source, mode in wanted:
            if source is None:
                continue
            data = _tls_file(source)
            target = settings.containerd_dir / registry / name
            with contextlib.suppress(OSError):
                if target.read_bytes() == data:
                    continue
            write_host_file(settings.containerd_dir, registry, name, data, mode)
            _log.info("wrote %s from %s", target, source)
        ca = CA_FILE if settings.containerd_ca is not None else None
        if settings.containerd_client_cert is None:
            return ca, None
        key = CLIENT_KEY_FILE if settings.containerd_client_key is not None else None
        return ca, (CLIENT_CERT_FILE, key)

    def report(self) -> dict[str, Any]:
        """This heartbeat's body."""
        settings = self.settings
        capacity: dict[str, dict[str, float]] = {}
        verdicts: dict[tuple[str, str], str] = {}
        if settings.providers_file is not None:
            read = read_agent_providers_file(settings.providers_file)
            found, capacity = read.report, read.capacity
            implied = platform_of_lists(found.host)
            platform = implied if implied is not None else host_platform()
            devices = {kind: dict(ids) for kind, ids in found.devices.items()}
            known: Mapping[str, SupportedLists] = {}
        else:
            found = detect_host(
                None,
                settings.enable,
                use_cache=False,
                host_root=settings.host_root,
                descriptors=settings.descriptors,
            )
            self._log_sources(found.sources)
            platform = host_platform()
            devices = {kind: dict(ids) for kind, ids in found.devices.items()}
            # a device that detection stops listing is kept, with its last lists, and judged
            for kind, ids in devices.items():
                self._seen.setdefault(kind, {}).update(ids)
            for kind, seen in self._seen.items():
                listed = devices.setdefault(kind, {})
                for device_id in seen.keys() - listed.keys():
                    listed[device_id] = seen[device_id]
                    if kind != NVML_KIND:  # NVML tells what became of its own GPUs
                        verdicts[kind, device_id] = f"no longer detected by the {kind} provider"
            known = self._seen.get(NVML_KIND, {})
        gpus = nvml_health(devices.get(NVML_KIND, {}), self.nvml, known=known)
        verdicts.update({(NVML_KIND, uuid): why for uuid, why in gpus.items()})
        self._log_health(verdicts)
        body: dict[str, Any] = {
            "agent_id": settings.agent_id,
            "resource_group": settings.resource_group,
            "platform": str(platform),
            "host": found.host,
            "devices": devices,
        }
        if verdicts:
            unhealthy: dict[str, list[str]] = {}
            for kind, device_id in sorted(verdicts):
                unhealthy.setdefault(kind, []).append(device_id)
            body["unhealthy"] = unhealthy
        if capacity:
            body["capacity"] = capacity
        reported = sum(len(ids) for ids in devices.values())
        if reported == 0 and (self.reported or not self._said_no_devices):
            # at start, and whenever the last device goes: a GPU node that reports none is
            # a driver or mount problem, and the scheduler places nothing on it that needs one
            _log.warning(
                "agent %s reports no devices: no NVIDIA GPU answered NVML, no AMD GPU is "
                "in %s/sys/class/kfd, no device descriptor matched; it takes only "
                "placements with devices_per_node 0",
                self.settings.agent_id,
                self.settings.host_root or "",
            )
            self._said_no_devices = True
        self.reported = reported
        return body

    def _log_sources(self, sources: Mapping[str, str]) -> None:
        """Say which provider answers for each namespace, at start and when that changes."""
        if sources != self._sources:
            said = "; ".join(f"{ns}: {source}" for ns, source in sorted(sources.items()))
            _log.info("detecting with %s", said or "no provider answering")
            self._sources = dict(sources)

    def _log_health(self, verdicts: Mapping[tuple[str, str], str]) -> None:
        for (kind, device_id), why in sorted(verdicts.items()):
            if self._unhealthy.get((kind, device_id)) != why:
                _log.warning("device %s/%s is unhealthy: %s", kind, device_id, why)
        for kind, device_id in sorted(self._unhealthy.keys() - verdicts.keys()):
            _log.info("device %s/%s is healthy again", kind, device_id)
        self._unhealthy = dict(verdicts)

    def beat(self) -> dict[str, Any]:
        """One heartbeat; the scheduler's view of this agent. Raises ``HeartbeatError`` for
        what may pass (unreachable, any answer but a 2xx JSON object), ``ReportRefusedError``
        for 400/413."""
        body = self.report()
        self.keep_hosts(body["host"], body["devices"])
        self.label_node(body["host"])
        if self.settings.scheduler is None:  # labels only
            self.beats += 1
            return {}
        headers = {"Accept-Encoding": "identity"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            with self.client.stream("PUT", self.url, json=body, headers=headers) as response:
                status, reason = response.status_code, response.reason_phrase
                location = response.headers.get("location")
                data = read_answer(response)
        except httpx.HTTPError as exc:
            raise HeartbeatError(
                f"{self.settings.scheduler}: {scheduler_failure(exc, self.settings.scheduler)}",
                outage=True,
            ) from None
        if status in (400, 413):
            raise ReportRefusedError(
                f"the scheduler refused the report of agent {self.settings.agent_id!r}: "
                f"{status} {error_message(data, reason)}"
            )
        if status in (401, 403) and self.settings.token_file is not None:
            # the token may have been rotated on disk: take the new one next time
            with contextlib.suppress(InvalidInputError):
                self.token = read_token(self.settings.token_file)
        if 300 <= status < 400:
            where = f" to {one_line(location, 200)!r}" if location else ""
            raise HeartbeatError(
                f"{status} {reason}: a redirect{where}, not a heartbeat's answer (an agent "
                "follows no redirect; give --scheduler the scheduler's own URL)",
                status=status,
            )
        if not 200 <= status < 300:
            raise HeartbeatError(
                f"{status} {error_message(data, reason)}",
                status=status,
                outage=status in _OUTAGE_STATUSES,
            )
        try:
            view = load_json(data, f"the scheduler's {status} answer")
        except InvalidInputError as exc:
            raise HeartbeatError(str(exc), status=status) from None
        if not isinstance(view, dict):
            raise HeartbeatError(
                f"the scheduler's {status} answer is not a JSON object", status=status
            )
        self.beats += 1
        return view

    def run(self) -> int:
        """Beat until ``stop`` is set: 0; 2 when the scheduler refuses the report."""
        settings = self.settings
        failures = 0
        last_failure: str | None = None  # logged once while it repeats
        _log.info(
            "agent %s %s every %g s",
            settings.agent_id,
            f"reporting to {settings.scheduler}" if settings.scheduler else "detecting",
            settings.interval,
        )
        while not self.stop.is_set():
            try:
                self.beat()
            except ReportRefusedError as exc:
                _log.error("%s", exc)
                return 2
            except DockerVariantError as exc:  # HeartbeatError; or the providers file went bad
                failures += 1
                delay = backoff_delay(failures, settings.interval, self.rng)
                why = one_line(str(exc)) or type(exc).__name__
                if why == last_failure:
                    level = logging.DEBUG
                elif isinstance(exc, HeartbeatError) and exc.outage:
                    level = logging.WARNING
                else:
                    level = logging.ERROR
                last_failure = why
                _log.log(
                    level,
                    "heartbeat %d to %s failed (%s); retrying in %.1f s",
                    failures,
                    settings.scheduler,
                    why,
                    delay,
                )
            else:
                if settings.scheduler is not None and (failures or self.beats == 1):
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
                else:
                    _log.debug("heartbeat %d taken (%d devices)", self.beats, self.reported)
                failures, last_failure = 0, None
                delay = jittered(settings.interval, self.rng)
            self.stop.wait(delay)
        _log.info("agent %s stopped", settings.agent_id)
        return 0

    def close(self) -> None:
        self.client.close()
