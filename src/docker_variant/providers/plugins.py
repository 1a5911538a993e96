"""PEP 817 provider plugins, whichever API generation they were written against.

variantlib 0.2.2 expects class methods ``get_all_configs()``/``get_supported_configs()``;
the wheelnext CPU plugins on PyPI (0.0.1.post2) have instance methods
``get_supported_configs(known_properties)``. ``PluginAdapter`` calls either shape in-process
(no subprocess per command: results are cached by ``providers.cache``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from docker_variant.errors import DockerVariantError, InvalidInputError
from docker_variant.variant.model import check_feature, check_namespace, check_value

__all__ = [
    "ENTRY_POINT_GROUP",
    "FeatureConfig",
    "PluginAdapter",
    "PluginFailedError",
    "find_plugin",
]

ENTRY_POINT_GROUP = "variant_plugins"


class PluginFailedError(DockerVariantError):
    """A provider plugin raised or answered something that is not a config list."""


@dataclass(frozen=True)
class FeatureConfig:
    name: str
    values: list[str]
    multi_value: bool = False


class PluginAdapter:
    """One plugin object, class or module, behind a single call."""

    def __init__(self, plugin: Any, namespace: str | None = None) -> None:
        # Classes written for the older API need an instance; class methods work either way.
        self._plugin = plugin() if inspect.isclass(plugin) else plugin
        self.namespace = check_namespace(
            namespace or getattr(self._plugin, "namespace", None), "provider plugin"
        )

    def supported_configs(self) -> list[FeatureConfig]:
        method = getattr(self._plugin, "get_supported_configs", None)
        if method is None:
            raise PluginFailedError(f"provider {self.namespace}: no get_supported_configs()")
        try:
            required = [
                p
                for p in inspect.signature(method).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            # Older generation: get_supported_configs(known_properties); None means "all".
            raw = method(None) if required else method()
        except Exception as exc:  # a third-party plugin may raise anything
            raise PluginFailedError(
                f"provider {self.namespace}: get_supported_configs() failed: {exc}"
            ) from exc
        return [self._convert(cfg) for cfg in raw or []]

    def supported_lists(self) -> dict[str, list[str]]:
        return {cfg.name: cfg.values for cfg in self.supported_configs() if cfg.values}

    def _convert(self, cfg: Any) -> FeatureConfig:
        where = f"provider {self.namespace}"
        try:
            name = check_feature(cfg.name, where)
            values = [check_value(v, f"{where} :: {name}") for v in cfg.values]
        except (AttributeError, TypeError, InvalidInputError) as exc:
            raise PluginFailedError(f"{where}: bad feature config {cfg!r}: {exc}") from exc
        return FeatureConfig(name, values, bool(getattr(cfg, "multi_value", False)))


def _entry_point_namespace(ep: EntryPoint) -> str:
    return ep.name.removeprefix("provider_variant_").removeprefix("variant_")


def find_plugin(namespace: str) -> PluginAdapter:
    """Load the third-party plugin for ``namespace``; only ever called on explicit opt-in."""
    check_namespace(namespace, "--enable-provider")
    candidates = list(entry_points(group=ENTRY_POINT_GROUP))
    by_name = [ep for ep in candidates if namespace in (ep.name, _entry_point_namespace(ep))]
    for ep in by_name or candidates:
        try:
            plugin = ep.load()
            # another namespace's plugin is never made or asked anything: its class says
            if getattr(plugin, "namespace", namespace) != namespace:
                continue
            adapter = PluginAdapter(plugin)
        except (DockerVariantError, Exception):
            continue
        if adapter.namespace == namespace:
            return adapter
    raise InvalidInputError(
        f"--enable-provider {namespace}: no installed plugin in entry point group "
        f"{ENTRY_POINT_GROUP!r} provides namespace {namespace!r}"
    )
