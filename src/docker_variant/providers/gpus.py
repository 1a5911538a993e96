"""``--gpus`` in Docker's syntax: which of the host's accelerator devices a container gets.

Forms, as ``docker run --gpus`` (``opts/gpus.go``: comma-separated CSV fields, quotes keep a
list together): ``all``; a count ``N`` (the first N devices); ``device=0,2`` or
``"device=0,1"`` (indexes or device ids: a GPU UUID, a PCI address); ``count=N``;
``capabilities=...``, ``driver=...`` and ``options=...`` are accepted and ignored (they do
not change what runs).

Devices are numbered as the host lists them: NVIDIA GPUs in NVML order, then AMD GPUs in
KFD node order, then descriptor namespaces' devices by PCI address. ``lists_for_devices``
gives what choosing means: the host's CPU lists plus, per accelerator namespace, the chosen
devices' lists merged (first-seen order), and each chosen device's own lists, so that
selection admits a variant only if every chosen device runs it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

from docker_variant import vendors
from docker_variant.errors import InvalidInputError
from docker_variant.numtext import parse_number
from docker_variant.providers.report import HostReport
from docker_variant.variant.model import SupportedLists

__all__ = ["ChosenDevices", "GpuRequest", "all_devices", "choose_devices", "parse_gpus"]

_IGNORED = ("capabilities", "driver", "options")
MAX_FIELDS = 256


@dataclass(frozen=True)
class GpuRequest:
    count: int | None = None  # None: all
    devices: tuple[str, ...] = ()  # indexes or ids; empty with count None: all devices


@dataclass(frozen=True)
class ChosenDevices:
    names: tuple[str, ...]  # "<index> (<device id>)" of each chosen device, in order
    host: SupportedLists  # what the selection ranks by
    devices: dict[str, SupportedLists]  # each chosen device's lists, CPU namespaces included


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
    order = ["nvidia", "amd", *sorted(k for k in report.devices if k not in ("nvidia", "amd"))]
    found = [
        (device_id, lists)
        for kind in order
        if kind not in vendors.CPU_NAMESPACES
        for device_id, lists in report.devices.get(kind, {}).items()
    ]
    return [(index, device_id, lists) for index, (device_id, lists) in enumerate(found)]


def _with_cpu(report: HostReport, chosen: list[Numbered]) -> ChosenDevices:
    cpu = {ns: lists for ns, lists in report.host.items() if ns in vendors.CPU_NAMESPACES}
    host: SupportedLists = dict(cpu)
    devices: dict[str, SupportedLists] = {}
    for index, device_id, lists in chosen:
        devices[f"{index} ({device_id})"] = {**cpu, **lists}
        for namespace, features in lists.items():
            merged = host.setdefault(namespace, {})
            for feature, values in features.items():
                into = merged.setdefault(feature, [])
                into.extend(v for v in values if v not in into)
    return ChosenDevices(tuple(devices), host, devices)


def all_devices(report: HostReport) -> dict[str, SupportedLists]:
    """Every accelerator device's lists (CPU namespaces included), named as ``--gpus``
    numbers them: to say which devices a variant fits when no ``--gpus`` chose them."""
    return _with_cpu(report, _numbered(report)).devices


def choose_devices(report: HostReport, request: GpuRequest, text: str) -> ChosenDevices:
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
    return _with_cpu(report, list(unique.values()))
