"""Host providers (SPEC section 4): what this host and each of its devices support.

``detect_host`` is the one entry point: a providers file replaces detection; otherwise the
built-in CPU and NVIDIA providers run, plus third-party plugins opted in by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from docker_variant.jsondoc import read_json_file
from docker_variant.providers.cache import cached_detection
from docker_variant.providers.report import HostReport
from docker_variant.variant.model import parse_supported_lists

__all__ = ["PROVIDERS_FILE_ENV", "HostReport", "detect_host", "read_providers_file"]

PROVIDERS_FILE_ENV = "DOCKER_VARIANT_PROVIDERS_FILE"
ENABLE_PROVIDERS_ENV = "DOCKER_VARIANT_ENABLE_PROVIDERS"


def read_providers_file(path: str | Path) -> HostReport:
    """The PEP's user-supplied static list: ``{namespace: {feature: [values]}}``."""
    what = f"providers file {str(path)!r}"
    return HostReport(parse_supported_lists(read_json_file(path, what), what))


def _detect(enabled: Sequence[str], env: Mapping[str, str]) -> HostReport:
    from docker_variant.providers import nvidia
    from docker_variant.providers.cpu import detect_cpu
    from docker_variant.providers.plugins import find_plugin

    host = detect_cpu()
    gpus = nvidia.detect(env)
    host["nvidia"] = gpus.host
    for namespace in enabled:
        host[namespace] = find_plugin(namespace).supported_lists()
    return HostReport(host, {"nvidia": gpus.devices} if gpus.devices else {})


def detect_host(
    providers_file: str | Path | None = None,
    enable: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    use_cache: bool = True,
) -> HostReport:
    env = os.environ if env is None else env
    providers_file = providers_file or env.get(PROVIDERS_FILE_ENV) or None
    if providers_file:
        return read_providers_file(providers_file)
    from_env = [ns.strip() for ns in env.get(ENABLE_PROVIDERS_ENV, "").split(",") if ns.strip()]
    enabled = sorted({*enable, *from_env})
    if not use_cache:
        return _detect(enabled, env)
    return cached_detection(lambda: _detect(enabled, env), env, enabled)
