"""CPU namespaces through the wheelnext provider plugins (docs/reference/host-properties.md)."""

from __future__ import annotations

import platform

from docker_variant.providers.plugins import PluginAdapter

__all__ = ["detect_cpu"]


def detect_cpu(machine: str | None = None) -> dict[str, dict[str, list[str]]]:
    """``{"x86_64": {...}}`` or ``{"aarch64": {...}}``; the other CPU namespace is empty."""
    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64"):
        from provider_variant_x86_64.plugin import X8664Plugin

        return {"x86_64": PluginAdapter(X8664Plugin).supported_lists(), "aarch64": {}}
    if machine in ("aarch64", "arm64"):
        from provider_variant_aarch64.plugin import AArch64Plugin

        return {"x86_64": {}, "aarch64": PluginAdapter(AArch64Plugin).supported_lists()}
    return {"x86_64": {}, "aarch64": {}}
