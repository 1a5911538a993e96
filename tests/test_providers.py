"""Provider plugins of both API generations, opt-in by name, and the detection cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from docker_variant.errors import InvalidInputError
from docker_variant.providers import HostReport, detect_host
from docker_variant.providers.cache import cached_detection
from docker_variant.providers.cpu import detect_cpu
from docker_variant.providers.plugins import FeatureConfig, PluginAdapter, PluginFailedError


@dataclass(frozen=True)
class Config:
    name: str
    values: list[str]
    multi_value: bool = False


class NewGeneration:
    """variantlib 0.2.2's protocol: class methods, no arguments, multi_value declared."""

    namespace = "acme"

    @classmethod
    def get_all_configs(cls) -> list[Config]:
        return [Config("gen", ["g2", "g1"], multi_value=True)]

    @classmethod
    def get_supported_configs(cls) -> list[Config]:
        return [Config("gen", ["g2", "g1"], multi_value=True)]


class OldGeneration:
    """provider-variant-x86-64 0.0.1.post2's shape: instance methods taking known_properties."""

    namespace = "acme"

    def __init__(self) -> None:
        self.seen: list[object] = []

    def get_supported_configs(self, known_properties: frozenset[object] | None) -> list[Config]:
        self.seen.append(known_properties)
        return [Config("gen", ["g1"])]


def test_adapter_bridges_both_generations() -> None:
    new = PluginAdapter(NewGeneration)
    assert new.namespace == "acme"
    assert new.supported_configs() == [FeatureConfig("gen", ["g2", "g1"], multi_value=True)]
    old = PluginAdapter(OldGeneration)
    assert old.supported_lists() == {"gen": ["g1"]}
    assert old.supported_configs()[0].multi_value is False


def test_adapter_runs_the_real_wheelnext_cpu_plugin() -> None:
    from provider_variant_x86_64.plugin import X8664Plugin

    lists = PluginAdapter(X8664Plugin).supported_lists()
    assert lists["level"][-1] == "v1" and lists["level"] == sorted(lists["level"], reverse=True)
    assert all(values == ["on"] for feature, values in lists.items() if feature != "level")
    assert detect_cpu("x86_64")["x86_64"] == lists
    assert detect_cpu("riscv64") == {"x86_64": {}, "aarch64": {}}


def test_broken_plugins_fail_clearly() -> None:
    class Raises:
        namespace = "acme"

        @classmethod
        def get_supported_configs(cls) -> list[Config]:
            raise RuntimeError("no device")

    class BadValue(NewGeneration):
        @classmethod
        def get_supported_configs(cls) -> list[Config]:
            return [Config("gen", ["G 1"])]

    with pytest.raises(PluginFailedError, match="no device"):
        PluginAdapter(Raises).supported_configs()
    with pytest.raises(PluginFailedError, match="'G 1'"):
        PluginAdapter(BadValue).supported_configs()
    with pytest.raises(InvalidInputError):
        PluginAdapter(object())  # no namespace


PLUGIN = """
import pathlib, os
pathlib.Path(os.environ["MARKER"]).write_text("imported")

class Config:
    def __init__(self, name, values):
        self.name, self.values, self.multi_value = name, values, False

class AcmePlugin:
    namespace = "acme"

    def __init__(self):
        pathlib.Path(os.environ["MARKER"] + ".made").write_text("made")

    @classmethod
    def get_all_configs(cls):
        return [Config("gen", ["g2", "g1"])]

    @classmethod
    def get_supported_configs(cls):
        return [Config("gen", ["g2", "g1"])]

class BetaPlugin:
    namespace = "beta"

    @classmethod
    def get_supported_configs(cls):
        return [Config("gen", ["b1"])]
"""


def test_third_party_plugins_run_only_when_opted_in(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "acme_variant_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "acme_variant_plugin.py").write_text(PLUGIN)
    info = site / "acme_variant_plugin-1.0.dist-info"
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-variant-plugin\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[variant_plugins]\nacme = acme_variant_plugin:AcmePlugin\n"
        "other = acme_variant_plugin:BetaPlugin\n"  # not named after its namespace
    )
    marker = tmp_path / "marker"
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "MARKER": str(marker),
        "XDG_CACHE_HOME": str(tmp_path / "c"),
    }

    def providers(*extra: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "docker_variant", "providers", "--json", *extra],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    assert "acme" not in providers()
    assert not marker.exists(), "a plugin that was not opted in must not even be imported"
    assert providers("--enable-provider", "acme")["acme"] == {"gen": ["g2", "g1"]}
    assert marker.exists()
    env["DOCKER_VARIANT_ENABLE_PROVIDERS"] = "acme"  # the config route
    assert providers()["acme"] == {"gen": ["g2", "g1"]}
    # a plugin found by its class's namespace: the other plugins it looks through are
    # imported (their module is one) but never made or asked anything
    del env["DOCKER_VARIANT_ENABLE_PROVIDERS"]
    Path(str(marker) + ".made").unlink()
    assert providers("--enable-provider", "beta")["beta"] == {"gen": ["b1"]}
    assert not Path(str(marker) + ".made").exists()


def test_opting_in_a_built_in_cpu_namespace_is_the_built_in_answer(tmp_path: Path) -> None:
    """x86_64 and aarch64 are built in: the host's own plugin answers, the other is an
    empty namespace (its plugin run on this machine would fail), never an error."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    plain = detect_host(env=env, use_cache=False)
    both = detect_host(enable=["aarch64", "x86_64"], env=env, use_cache=False)
    assert both.host == {**plain.host, "aarch64": plain.host.get("aarch64", {})}


def test_cache_serves_repeat_calls_and_survives_corruption(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    calls: list[int] = []

    def detect() -> HostReport:
        calls.append(1)
        return HostReport(
            {"acme": {"gen": ["g1"]}}, {"nvidia": {"GPU-1": {"nvidia": {"sm_arch": ["90_real"]}}}}
        )

    first = cached_detection(detect, env, [])
    assert cached_detection(detect, env, []) == first and len(calls) == 1
    assert cached_detection(detect, env, ["acme"]) == first and len(calls) == 2  # other key
    for entry in (tmp_path / "docker-variant").glob("host-*.json"):
        entry.write_text("{ truncated")
    assert cached_detection(detect, env, []) == first and len(calls) == 3
    assert not list((tmp_path / "docker-variant").glob(".host-*")), "no temp files left behind"


def test_providers_file_replaces_detection(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"furiosa": {"arch": ["rngd"]}}))
    assert detect_host(path, env={}).host == {"furiosa": {"arch": ["rngd"]}}
    assert detect_host(env={"DOCKER_VARIANT_PROVIDERS_FILE": str(path)}).host == {
        "furiosa": {"arch": ["rngd"]}
    }
