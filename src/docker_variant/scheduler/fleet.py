"""The fleet in words and counts: what a device's lists say of it (its product and driver,
from its vendor's ``describe`` hook; a descriptor's namespace by its own values) and the
live devices grouped into classes. The fleet view (``ui.py``) shows them; the metrics
(``metrics.py``) count them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from docker_variant import vendors
from docker_variant.numtext import natural_key
from docker_variant.planner.placement import Judge
from docker_variant.planner.pool import Pool
from docker_variant.scheduler.documents import SHARE
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.model import SupportedLists
from docker_variant.vendors.base import shown

__all__ = ["BestValue", "Description", "FleetClass", "best_values", "describe", "fleet_classes"]


@dataclass(frozen=True)
class Description:
    """What a device's lists say of it, in words: ``product`` and ``driver`` (``-``: nothing)."""

    product: str = "-"
    driver: str = "-"

    def said(self) -> list[str]:
        return [text for text in (self.product, self.driver) if text != "-"]


def _described(namespace: str, features: Mapping[str, list[str]]) -> Description:
    """A namespace without a vendor (a device descriptor's, a plugin's): its first
    feature's best value names the product, a feature about the driver the driver."""
    driver_features = [f for f in features if "driver" in f and features[f]]
    others = [f for f in features if f not in driver_features and features[f]]
    product = f"{namespace} {shown(features[others[0]][0])}" if others else namespace
    driver = "-"
    if driver_features:
        feature = driver_features[0]
        driver = f"{feature.replace('_', ' ')} {shown(features[feature][0])}"
    return Description(product, driver)


def describe(lists: SupportedLists) -> Description:
    """What the lists say of the accelerator they describe (a heartbeat carries lists, not
    product names): the first accelerator namespace's words, a vendor's by its ``describe``
    hook, any other namespace but a CPU's by its own values."""
    for namespace, features in lists.items():
        vendor = vendors.vendor_of(namespace)
        if not features or (vendor is not None and not vendor.device):
            continue
        if vendor is None or vendor.describe is None:
            return _described(namespace, features)
        said = vendor.describe(features)
        return Description(said.product or "-", said.driver or "-")
    return Description()


@dataclass(frozen=True)
class BestValue:
    namespace: str
    feature: str
    value: str
    more: int  # further values in the list


def best_values(lists: SupportedLists) -> Iterator[BestValue]:
    """Each feature's best value (the page shows the whole lists on demand)."""
    for namespace, features in lists.items():
        for feature, values in features.items():
            if values:
                yield BestValue(namespace, feature, values[0], len(values) - 1)


@dataclass
class FleetClass:
    """Devices of one name with identical lists on one platform."""

    device_name: str
    lists: SupportedLists
    platform: str | None
    agents: set[str] = field(default_factory=set)
    devices: int = 0
    free: int = 0  # healthy and unused: a whole-device request can take it
    used: int = 0  # healthy, some or all of its shares allocated
    unhealthy: int = 0
    capacity: int = 0  # shares of the healthy devices, in millionths
    room: int = 0  # shares left on them

    @property
    def description(self) -> Description:
        return describe(self.lists)

    @property
    def product(self) -> str:
        return self.description.product

    @property
    def driver(self) -> str:
        return self.description.driver

    @property
    def shown_agents(self) -> str:
        agents = sorted(self.agents, key=natural_key)
        more = f" +{len(agents) - 3}" if len(agents) > 3 else ""
        return ", ".join(agents[:3]) + more

    @property
    def shares(self) -> str:
        return f"{self.room / SHARE:g} of {self.capacity / SHARE:g}"


def fleet_classes(pool: Pool) -> list[FleetClass]:
    """The live devices grouped by name, lists and platform (every device visited once)."""
    judge = Judge(VariantIndex([], {}), pool.profiles)  # for the platform rule only
    classes: dict[tuple[str, str, str | None], FleetClass] = {}
    for node in pool.nodes:
        platform = judge.platform(node)
        for name, members in node.devices.items():
            for device in members:
                key = (name, device.profile, platform)
                row = classes.get(key)
                if row is None:
                    row = classes[key] = FleetClass(name, pool.profiles[device.profile], platform)
                row.agents.add(node.agent_id)
                row.devices += 1
                if not device.healthy:
                    row.unhealthy += 1
                    continue
                row.capacity += device.capacity
                row.room += device.room
                if device.free:
                    row.free += 1
                else:
                    row.used += 1
    return sorted(
        classes.values(),
        key=lambda c: (c.device_name, c.product, c.driver, c.platform or ""),
    )
