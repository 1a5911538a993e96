"""``--gpus`` in Docker's syntax: which of the host's accelerator devices a container gets.

Forms, as ``docker run --gpus`` (``opts/gpus.go``: comma-separated CSV fields, quotes keep a
list together): ``all``; a count ``N`` (the first N devices); ``device=0,2`` or
``"device=0,1"`` (indexes or device ids: a GPU UUID, a PCI address); ``count=N``;
``capabilities=...``, ``driver=...`` and ``options=...`` are accepted and ignored (they do
not change what runs).

Devices are numbered as the host lists them: the vendors' devices in the registry's order
(``vendors.registered()``: NVIDIA GPUs in NVML order, then AMD GPUs in KFD node order), then
descriptor namespaces' devices by PCI address. ``choose_devices`` gives
what choosing means (no ``--gpus`` is ``all``, as a container given every GPU): the lists to
rank by (the host's CPU lists, and per accelerator namespace the chosen devices' lists
merged, first seen first) and each chosen device's own lists, so that selection admits a
variant only if every chosen device runs it (``variant.devices``). ``node_header`` is the
same for a node's containerd header: what every device runs, and the devices' own lists
where they differ.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

from docker_variant import vendors
from docker_variant.errors import InvalidInputError
from docker_variant.numtext import parse_number
from docker_variant.providers.report import HostReport
from docker_variant.variant import devices as several
from docker_variant.variant.model import SupportedLists

__all__ = [
    "ChosenDevices",
    "GpuRequest",
    "choose_devices",
    "device_title",
    "node_header",
    "parse_gpus",
]

_IGNORED = ("capabilities", "driver", "options")
MAX_FIELDS = 256


@dataclass(frozen=True)
class GpuRequest:
    count: int | None = None  # None: all
    devices: tuple[str, ...] = ()  # indexes or ids; empty with count None: all devices


@dataclass(frozen=True)
class ChosenDevices:
    """The devices a container gets, as a selection takes them."""

    host: SupportedLists  # what the selection ranks by
    devices: dict[str, SupportedLists]  # "<index> (<device id>)" -> its lists, CPU's included
    titles: tuple[str, ...] = ()  # "0 (sm 9.0: H100, H200, GH200)" of each, in order

    @property
    def mixed(self) -> bool:
        """Whether the chosen devices' lists differ (a choice for all of them can be
        another than for any one)."""
        return len(several.distinct(self.devices.values())) > 1


def _fields(text: str) -> list[str]:
    raw = text.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        raw = raw[1:-1]
    try:
        rows = list(csv.reader([raw]))
    except csv.Error as exc:
        raise InvalidInputError(f"--gpus {text!r}: {exc}") from exc
    fields = [f.strip() for f in rows[0]] if rows else []
    if not fields or len(fields) > MAX_FIELDS or any(not f for f in fields):
        raise InvalidInputError(
            f"--gpus {text!r}: expected all, a count, or device=INDEX|ID[,...] "
            "(docker run --gpus syntax)"
        )
    return fields


def parse_gpus(text: str) -> GpuRequest:
    """Docker's ``--gpus`` value; exit 2 naming the value when it is not one."""
    count: int | None = None
    devices: list[str] = []
    after_device = False
    for field in _fields(text):
        key, equals, value = field.partition("=")
        if not equals:
            if after_device and field != "all":  # device=0,2 without quotes
                devices.append(field)
                continue
            key, value = "count", field
        after_device = False
        if key == "count":
            count = None if value == "all" else parse_number(value, f"--gpus {text!r}: count")
        elif key == "device":
            devices.extend(v.strip() for v in value.split(",") if v.strip())
            after_device = True
        elif key not in _IGNORED:
            raise InvalidInputError(
                f"--gpus {text!r}: unknown option {key!r} (count, device, capabilities, "
                "driver, options)"
            )
    if devices and count is not None:
        raise InvalidInputError(f"--gpus {text!r}: give a count or devices, not both")
    if count == 0:
        raise InvalidInputError(f"--gpus {text!r}: a count of 0 chooses no device")
    return GpuRequest(count, tuple(devices))


Numbered = tuple[int, str, SupportedLists]  # index, device id, the device's lists


def _numbered(report: HostReport) -> list[Numbered]:
    """(index, device id, lists) of every accelerator device, in the documented order."""
    known = [vendor.namespace for vendor in vendors.registered() if vendor.device]
    order = [*known, *sorted(kind for kind in report.devices if kind not in known)]
    found = [
        (device_id, lists)
        for kind in order
        if kind not in vendors.CPU_NAMESPACES
        for device_id, lists in report.devices.get(kind, {}).items()
    ]
    return [(index, device_id, lists) for index, (device_id, lists) in enumerate(found)]


def device_title(index: int, kind: str, lists: SupportedLists) -> str:
    """``0 (sm 9.0: H100, H200, GH200)``: the number ``--gpus`` takes and what the device
    is, in its vendor's words (its kind alone when they say nothing)."""
    described = vendors.describe(kind, lists.get(kind, {})) or kind
    what, paren, products = described.partition(" (")
    if paren and products.endswith(")"):  # "sm 9.0 (H100, ...)": one pair of brackets
        described = f"{what}: {products[:-1]}"
    return f"{index} ({described})"


def _chosen(report: HostReport, chosen: list[Numbered]) -> ChosenDevices:
    """The lists a selection for the ``chosen`` devices takes: the host's CPU namespaces
    and those no device lists (a plugin's without devices), the chosen devices' lists for
    the rest (a namespace none of whose devices was chosen is left out)."""
    with_devices = {kind for kind, ids in report.devices.items() if ids}
    host = {ns: lists for ns, lists in report.host.items() if ns not in with_devices}
    kinds = {device_id: kind for kind, ids in report.devices.items() for device_id in ids}
    named = {f"{index} ({device_id})": lists for index, device_id, lists in chosen}
    rank, devices = several.for_devices(host, named)
    titles = tuple(
        device_title(index, kinds[device_id], lists) for index, device_id, lists in chosen
    )
    return ChosenDevices(rank, devices, titles)


def node_header(report: HostReport) -> tuple[SupportedLists, list[SupportedLists]]:
    """What a node's containerd header says (``k8s containerd-hosts``, the agent): the
    lists every device runs (the host's where it has no devices), and, where the devices'
    lists differ, each different one's accelerator namespaces (the proxy then requires a
    variant to fit each: cu126 runs on an H200 and an L4, yet their ``sm_arch`` lists share
    no value). One kind of device: its lists, and no device list."""
    chosen = choose_devices(report)
    kinds = several.distinct(several.accelerators(lists) for lists in chosen.devices.values())
    if len(kinds) < 2:
        return report.host, []
    every = several.common(kinds)
    # the devices' namespaces say what every device runs; the CPU's (and a plugin's
    # without devices) stay as the host lists them
    host = {ns: every.get(ns, lists) for ns, lists in report.host.items()}
    return {**host, **{ns: lists for ns, lists in every.items() if ns not in host}}, kinds


def choose_devices(
    report: HostReport, request: GpuRequest | None = None, text: str = "all"
) -> ChosenDevices:
    """The devices ``request`` (``--gpus`` ``text``) chooses; None: all of them, as a
    container given every GPU (on a host without devices: the host's own lists)."""
    numbered = _numbered(report)
    if request is None:
        return _chosen(report, numbered) if numbered else ChosenDevices(report.host, {})
    numbered = _numbered(report)
    if not numbered:
        raise InvalidInputError(
            f"--gpus {text!r}: this host reports no accelerator devices "
            '(a providers file can describe them: {"host": ..., "devices": ...})'
        )
    if request.devices:
        chosen: list[Numbered] = []
        for wanted in request.devices:
            if wanted.isdigit():
                index = parse_number(wanted, f"--gpus {text!r}: device index")
                if index >= len(numbered):
                    raise InvalidInputError(
                        f"--gpus {text!r}: device {index} does not exist; this host has "
                        f"{len(numbered)} (0 to {len(numbered) - 1})"
                    )
                chosen.append(numbered[index])
                continue
            match = [d for d in numbered if d[1] == wanted or d[1].lower() == wanted.lower()]
            if not match:
                ids = ", ".join(d[1] for d in numbered[:8])
                raise InvalidInputError(
                    f"--gpus {text!r}: no device {wanted!r} on this host (it has {ids})"
                )
            chosen.append(match[0])
    elif request.count is not None:
        if request.count > len(numbered):
            raise InvalidInputError(
                f"--gpus {text!r}: {request.count} devices asked, this host has {len(numbered)}"
            )
        chosen = numbered[: request.count]
    else:
        chosen = numbered
    unique = {index: (index, device_id, lists) for index, device_id, lists in chosen}
    return _chosen(report, list(unique.values()))
