"""Device descriptors on this host: read the files, match them against the PCI bus.

Descriptors are configuration of the machine running docker-variant, so they are read from
its own ``/etc/docker-variant/providers.d/*.toml``, then
``$XDG_CONFIG_HOME/docker-variant/providers.d/*.toml`` (default ``~/.config``), then
``--descriptors DIR`` (env ``DOCKER_VARIANT_DESCRIPTORS``); a later directory's descriptor of
a namespace replaces an earlier one's. The devices they match are the host's, under the host
root (``sys/bus/pci/devices``), and so are the ``[[file]]`` features.

Being data, descriptors apply without opt-in. Each matched device is a device of the
namespace keyed by its PCI address; the host's lists merge the matched devices' lists
(values in first-seen order). A descriptor that matches no device adds nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from docker_variant import vendors
from docker_variant.errors import InvalidInputError
from docker_variant.providers.hostroot import HostRoot
from docker_variant.providers.pci import PciDevice, read_pci_devices
from docker_variant.tomldoc import read_toml_file
from docker_variant.vendors.descriptor import Descriptor, parse_descriptor

__all__ = [
    "DESCRIPTORS_ENV",
    "MAX_DESCRIPTOR_BYTES",
    "SYSTEM_DIR",
    "DescribedNamespace",
    "apply_descriptors",
    "descriptor_dirs",
    "read_descriptors",
]

DESCRIPTORS_ENV = "DOCKER_VARIANT_DESCRIPTORS"
SYSTEM_DIR = Path("/etc/docker-variant/providers.d")
MAX_DESCRIPTOR_BYTES = 256 * 1024
_VALUE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.")

Lists = dict[str, list[str]]


@dataclass(frozen=True)
class DescribedNamespace:
    descriptor: Descriptor
    host: Lists
    devices: dict[str, dict[str, Lists]]  # PCI address -> {namespace: lists}


def descriptor_dirs(
    extra: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    system_dir: Path = SYSTEM_DIR,
) -> list[Path]:
    """The directories descriptors are read from, in order (later ones win)."""
    env = os.environ if env is None else env
    config = env.get("XDG_CONFIG_HOME") or str(
        Path(env.get("HOME") or "~").expanduser() / ".config"
    )
    dirs = [system_dir, Path(config) / "docker-variant" / "providers.d"]
    chosen = extra or env.get(DESCRIPTORS_ENV)
    if chosen:
        path = Path(chosen)
        if not path.is_dir():
            where = "--descriptors" if extra else DESCRIPTORS_ENV
            raise InvalidInputError(f"{where} {str(chosen)!r}: not a directory")
        dirs.append(path)
    return dirs


def _read_one(path: Path) -> Descriptor:
    data = read_toml_file(path, f"descriptor {path}", max_bytes=MAX_DESCRIPTOR_BYTES)
    return parse_descriptor(data, str(path), vendors.builtin_namespaces())


def read_descriptors(dirs: Sequence[Path]) -> list[Descriptor]:
    """Every descriptor in ``dirs``; a later directory's namespace replaces an earlier one's;
    two files of one directory for one namespace are refused."""
    chosen: dict[str, Descriptor] = {}
    for directory in dirs:
        try:
            paths = sorted(directory.glob("*.toml"))  # a non-regular one is refused, not skipped
        except OSError:
            continue
        here: dict[str, Descriptor] = {}
        for path in paths:
            descriptor = _read_one(path)
            if (other := here.get(descriptor.namespace)) is not None:
                raise InvalidInputError(
                    f"descriptor {path}: namespace: {descriptor.namespace!r} is described by "
                    f"{other.source} too"
                )
            here[descriptor.namespace] = descriptor
        chosen.update(here)
    return list(chosen.values())


def _merge(into: Lists, lists: Mapping[str, Sequence[str]]) -> None:
    for feature, values in lists.items():
        merged = into.setdefault(feature, [])
        merged.extend(v for v in values if v not in merged)


def _file_features(descriptor: Descriptor, root: HostRoot) -> Lists:
    found: Lists = {}
    for entry in descriptor.files:
        line = root.first_line(entry.path)
        value = None if line is None else line.lower()
        # a file that is absent or holds no valid value (e.g. "1.2-rc") adds nothing
        if value and len(value) <= 128 and set(value) <= _VALUE_CHARS:
            found.setdefault(entry.feature, []).append(value)
    return found


def _match(descriptor: Descriptor, pci: Sequence[PciDevice], root: HostRoot) -> DescribedNamespace:
    files = _file_features(descriptor, root)
    host: Lists = {}
    devices: dict[str, dict[str, Lists]] = {}
    for device in pci:
        described = next(
            (d for d in descriptor.devices if d.matches(device.vendor, device.device)), None
        )
        if described is None:
            continue
        lists: Lists = {f: list(v) for f, v in described.features.items()}
        _merge(lists, files)
        devices[device.address] = {descriptor.namespace: lists}
        _merge(host, lists)
    return DescribedNamespace(descriptor, host, devices)


def apply_descriptors(
    descriptors: Sequence[Descriptor], root: HostRoot
) -> list[DescribedNamespace]:
    """Each descriptor's namespace on this host: what its matched PCI devices support, or
    nothing (an empty namespace, as for absent hardware) where none matches."""
    if not descriptors:
        return []
    pci = read_pci_devices(root)
    return [_match(d, pci, root) for d in descriptors]
