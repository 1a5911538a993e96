"""``GET /metrics``: what an operator watches of the scheduler, in Prometheus text.

Counted when scraped, from the database and the pool in memory:

| metric | labels |
|---|---|
| ``variant_scheduler_agents`` | ``resource_group``, ``state`` (``alive``: a heartbeat within ``--agent-ttl``; ``stale``) |
| ``variant_scheduler_devices`` | ``device_name``, ``product`` (``fleet.describe``), ``state`` (``free``, ``allocated``, ``unhealthy``) of live agents |
| ``variant_scheduler_placements`` | ``state`` (``active``, ``degraded``) |

Observed as they happen:

| metric | labels |
|---|---|
| ``variant_scheduler_placement_requests_total`` | ``operation`` (``place``, ``replace``, ``what_if``), ``outcome`` |
| ``variant_scheduler_plan_seconds`` | the placement search, one per try |
| ``variant_scheduler_commit_seconds`` | the transaction that takes the devices, one per try |
| ``variant_scheduler_what_if_seconds`` | a what-if answer, planning included |

``outcome`` is ``placed`` (201), ``refused`` (409: cannot be placed), ``answered`` (a what-if's
200), ``invalid`` (400), ``denied`` (401, 403), ``not_found`` (404) or ``failed`` (413, 5xx).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from docker_variant.scheduler.fleet import fleet_classes
from docker_variant.scheduler.store import Store

__all__ = ["OPERATIONS", "OUTCOMES", "SchedulerMetrics", "outcome_of"]

OPERATIONS = ("place", "replace", "what_if")
OUTCOMES = ("placed", "refused", "answered", "invalid", "denied", "not_found", "failed")
# a plan takes milliseconds (bench/README: 3 ms at 50k agents), a commit a few more
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


_OUTCOMES = {201: "placed", 200: "answered", 409: "refused", 400: "invalid", 401: "denied",
             403: "denied", 429: "denied", 404: "not_found"}  # fmt: skip


def outcome_of(status: int) -> str:
    """The ``outcome`` label of an answer's status."""
    return _OUTCOMES.get(status, "failed")


class _Fleet(Collector):
    """The agents, devices and placements, counted when scraped."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        agents = GaugeMetricFamily(
            "variant_scheduler_agents",
            "Agents by resource group; stale: no heartbeat within --agent-ttl.",
            labels=["resource_group", "state"],
        )
        seen = Tally(self.store.agents_seen())
        for group in sorted({group for group, _ in seen}):
            agents.add_metric([group, "alive"], seen[(group, True)])
            agents.add_metric([group, "stale"], seen[(group, False)])
        yield agents

        devices = GaugeMetricFamily(
            "variant_scheduler_devices",
            "Devices of live agents by device name, product and state.",
            labels=["device_name", "product", "state"],
        )
        counts: dict[tuple[str, str], list[int]] = {}
        for cls in self.store.read_pool(fleet_classes):
            figures = counts.setdefault((cls.device_name, cls.product), [0, 0, 0])
            figures[0] += cls.free
            figures[1] += cls.used
            figures[2] += cls.unhealthy
        for (name, product), (free, allocated, unhealthy) in sorted(counts.items()):
            devices.add_metric([name, product, "free"], free)
            devices.add_metric([name, product, "allocated"], allocated)
            devices.add_metric([name, product, "unhealthy"], unhealthy)
        yield devices

        placements = GaugeMetricFamily(
            "variant_scheduler_placements",
            "Placements by state (degraded: a device unhealthy or gone, or its agent past "
            "the TTL).",
            labels=["state"],
        )
        for state, count in self.store.placement_states().items():
            placements.add_metric([state], count)
        yield placements


class SchedulerMetrics:
    """One app's metrics (tests run several apps: each has its own registry)."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Fleet(store))
        self.requests = Counter(
            "variant_scheduler_placement_requests",
            "Placement, replace and what-if requests by outcome.",
            ["operation", "outcome"],
            registry=self.registry,
        )
        for operation in OPERATIONS:  # every series from the start, at 0
            for outcome in OUTCOMES:
                self.requests.labels(operation, outcome)
        self.stages = {
            stage: Histogram(
                f"variant_scheduler_{stage}_seconds",
                f"Time of one placement {stage} (per try; a lost race tries again).",
                buckets=_BUCKETS,
                registry=self.registry,
            )
            for stage in ("plan", "commit")
        }
        self.what_if = Histogram(
            "variant_scheduler_what_if_seconds",
            "Time to answer a what-if, planning included.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        store.observe_stage = self.observe_stage

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.stages[stage].observe(seconds)

    def count(self, operation: str, status: int) -> None:
        self.requests.labels(operation, outcome_of(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
