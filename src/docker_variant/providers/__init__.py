"""Host providers: what this host and each of its devices support.

``detect_host`` is the one entry point: a providers file replaces detection; otherwise the
built-in providers run (CPU through the wheelnext plugins, then each registered vendor's
detector, ``vendors.Vendor.detector``: ``nvidia`` through NVML, ``amd`` from the KFD sysfs
topology), device descriptors apply to the PCI devices they match, and
third-party plugins run when opted in by name (a plugin replaces a descriptor of its
namespace). File-based detection reads under the host root (``--host-root``,
``$DOCKER_VARIANT_HOST_ROOT``, default ``/``); NVML is not affected by it.

The CPU plugins and NVML are slow to ask, so their answer is cached (``providers.cache``);
the sysfs files and descriptors are read every time.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from docker_variant import vendors
from docker_variant.jsondoc import read_json_file
from docker_variant.providers.cache import cached_detection
from docker_variant.providers.hostroot import HOST_ROOT_ENV, HostRoot
from docker_variant.providers.report import HostReport
from docker_variant.variant.model import SupportedLists, parse_supported_lists

__all__ = [
    "HOST_ROOT_ENV",
    "PROVIDERS_FILE_ENV",
    "REPORT_KEYS",
    "HostReport",
    "HostRoot",
    "detect_host",
    "is_report",
    "read_providers_file",
]

PROVIDERS_FILE_ENV = "DOCKER_VARIANT_PROVIDERS_FILE"
ENABLE_PROVIDERS_ENV = "DOCKER_VARIANT_ENABLE_PROVIDERS"


def read_providers_file(path: str | Path) -> HostReport:
    """The PEP's user-supplied static list: ``{namespace: {feature: [values]}}``, or
    ``{"host": LISTS, "devices": {namespace: {device id: LISTS}}}`` (what
    ``providers --devices --json`` prints), which also describes each device."""
    what = f"providers file {str(path)!r}"
    data = read_json_file(path, what)
    if is_report(data):
        return HostReport.from_json(data, what)
    return HostReport(parse_supported_lists(data, what), sources={"*": f"providers file {path}"})


#: The keys of what ``providers --devices --json`` prints.
REPORT_KEYS = frozenset({"host", "devices", "sources"})


def is_report(data: object, more_keys: frozenset[str] = frozenset()) -> bool:
    """``{"host": {ns: {feature: [...]}}, "devices": ...}`` rather than a flat document (whose
    namespace could be called ``host``, but then maps features to lists, not to objects);
    ``more_keys``: those a reader takes besides ``REPORT_KEYS`` (the agent's ``capacity``)."""
    if not isinstance(data, dict) or "host" not in data:
        return False
    if not set(data) <= REPORT_KEYS | more_keys:
        return False
    host = data["host"]
    return isinstance(host, dict) and all(isinstance(v, dict) for v in host.values())


class Detected(Protocol):
    """What a vendor's detector answers: the namespace's host lists, and each device's
    ``{namespace: lists}`` by device id."""

    @property
    def host(self) -> dict[str, list[str]]: ...
    @property
    def devices(self) -> dict[str, SupportedLists]: ...


def _builtin_detection(
    host: dict[str, dict[str, list[str]]],
    devices: dict[str, dict[str, SupportedLists]],
    sources: dict[str, str],
    *,
    cached: bool,
    enabled: Sequence[str],
    env: Mapping[str, str],
    root: HostRoot,
) -> None:
    """Run the registered vendors' detectors (the ``cached`` ones, or the others), adding
    what they find; a plugin opted in for a namespace answers for it instead."""
    for vendor in vendors.registered():
        detector = vendor.detector
        if detector is None or detector.cached != cached or vendor.namespace in enabled:
            continue
        module, _, function = detector.target.partition(":")
        detect: Callable[[HostRoot, Mapping[str, str]], Detected]
        detect = getattr(importlib.import_module(module), function)
        found = detect(root, env)
        host[vendor.namespace] = found.host
        if found.devices:
            devices[vendor.namespace] = found.devices
        if found.host:
            sources[vendor.namespace] = f"built-in ({detector.source.format(root=root)})"


def _detect_cached(enabled: Sequence[str], env: Mapping[str, str], root: HostRoot) -> HostReport:
    """What the CPU plugins, the slow detectors (NVML) and opted-in plugins say (the
    cached part; a cached detector reads nothing under the host root)."""
    from docker_variant.providers.cpu import detect_cpu
    from docker_variant.providers.plugins import find_plugin

    host = detect_cpu()
    sources = {ns: "built-in (wheelnext CPU plugin)" for ns, lists in host.items() if lists}
    devices: dict[str, dict[str, SupportedLists]] = {}
    _builtin_detection(host, devices, sources, cached=True, enabled=enabled, env=env, root=root)
    for namespace in enabled:
        if namespace in vendors.CPU_NAMESPACES:
            # built in: the host's own CPU plugin answered (the other's absent hardware; run
            # on the wrong machine it fails, the two plugins sharing one bundled module name)
            host.setdefault(namespace, {})
            continue
        host[namespace] = find_plugin(namespace).supported_lists()
        sources[namespace] = f"plugin {namespace} (--enable-provider)"
    return HostReport(host, devices, sources)


def _detect_files(
    report: HostReport,
    enabled: Sequence[str],
    env: Mapping[str, str],
    root: HostRoot,
    descriptors: str | Path | None,
) -> HostReport:
    """Add what the files under the host root say: the other vendors' detectors (the
    ``amd`` GPUs) and the descriptors' devices (a plugin opted in for a namespace replaces
    the built-in detection or the descriptor of that namespace)."""
    from docker_variant.providers.descriptors import (
        apply_descriptors,
        descriptor_dirs,
        read_descriptors,
    )

    host = {ns: dict(lists) for ns, lists in report.host.items()}
    devices = {kind: dict(ids) for kind, ids in report.devices.items()}
    sources = dict(report.sources)
    _builtin_detection(host, devices, sources, cached=False, enabled=enabled, env=env, root=root)
    for described in apply_descriptors(read_descriptors(descriptor_dirs(descriptors, env)), root):
        namespace = described.descriptor.namespace
        if namespace in enabled:
            sources[namespace] += f"; replaces descriptor {described.descriptor.source}"
            continue
        host[namespace] = described.host
        if described.devices:  # else an empty namespace: no such device here
            devices[namespace] = dict(described.devices)
            sources[namespace] = f"descriptor {described.descriptor.source}"
    return HostReport(host, devices, sources)


def detect_host(
    providers_file: str | Path | None = None,
    enable: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    use_cache: bool = True,
    host_root: str | Path | None = None,
    descriptors: str | Path | None = None,
) -> HostReport:
    """The host's report. ``host_root`` (else ``$DOCKER_VARIANT_HOST_ROOT``, else ``/``)
    is where sysfs and ``opt/rocm`` are read; ``descriptors`` a directory of descriptors
    read after the system's and the user's."""
    env = os.environ if env is None else env
    providers_file = providers_file or env.get(PROVIDERS_FILE_ENV) or None
    if providers_file:
        return read_providers_file(providers_file)
    root = HostRoot.resolve(host_root, env)
    from_env = [ns.strip() for ns in env.get(ENABLE_PROVIDERS_ENV, "").split(",") if ns.strip()]
    enabled = sorted({*enable, *from_env})
    if use_cache:
        slow = cached_detection(lambda: _detect_cached(enabled, env, root), env, enabled)
    else:
        slow = _detect_cached(enabled, env, root)
    return _detect_files(slow, enabled, env, root, descriptors)
