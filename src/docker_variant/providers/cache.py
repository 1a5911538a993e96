"""A detection cache, so a command does not pay for plugin imports and NVML every time.

Entries are keyed by everything that can change the answer without us noticing: the boot
(new hardware or driver needs one), the provider packages' versions, the override variables
and the opted-in plugins. An entry also expires after ``TTL_SECONDS``. A corrupt or unreadable
entry is ignored, and writes are atomic, so a crash never leaves a poisoned cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from docker_variant.errors import DockerVariantError
from docker_variant.localcache import read_entry, write_entry
from docker_variant.providers.report import HostReport

__all__ = ["TTL_SECONDS", "cached_detection"]

TTL_SECONDS = 3600
_PACKAGES = (
    "docker-variant",
    "variantlib",
    "provider-variant-x86-64",
    "provider-variant-aarch64",
    "nvidia-ml-py",
)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


def _versions(names: Sequence[str]) -> dict[str, str]:
    # importlib.metadata costs 10 to 20 ms to import; only a detection needs it, and a
    # command given --providers-file detects nothing
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def cache_key(env: Mapping[str, str], enabled: Sequence[str]) -> str:
    material = {
        "boot": _boot_id(),
        "machine": platform.machine(),
        "versions": _versions(_PACKAGES),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith("NV_VARIANT_PROVIDER_")},
        "enabled": sorted(enabled),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def cached_detection(
    detect: Callable[[], HostReport], env: Mapping[str, str], enabled: Sequence[str]
) -> HostReport:
    name = f"host-{cache_key(env, enabled)}.json"
    cached = read_entry(name, TTL_SECONDS, env)
    if cached is not None:
        with contextlib.suppress(DockerVariantError, ValueError, KeyError, TypeError):
            return HostReport.from_json(cached, name)
    report = detect()
    write_entry(name, report.to_json(), env)
    return report
