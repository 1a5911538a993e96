"""The build matrix (``docker variant build --matrix FILE``): one TOML file, one Dockerfile,
one image per entry. Parsing is pure and checks every entry before anything is built.

```toml
dockerfile = "Dockerfile"                 # in the build context (default "Dockerfile")
namespace-order = ["nvidia", "x86_64"]    # optional: dev.pep817.default-priorities.namespace
[build-args]                              # shared by every entry
APP_VERSION = "1.0.0"

[[variant]]
label = "cu128"
properties = ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"]
build-args = { CUDA = "12.8" }            # entry's own, over the shared ones
platform = "linux/amd64"                  # optional, as docker build --platform

[[variant]]
bare = true                               # the bare image, tagged VERSION
```
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from docker_variant.errors import InvalidInputError
from docker_variant.tomldoc import load_toml, read_toml_file
from docker_variant.variant.labels import labels_for
from docker_variant.variant.model import check_namespace, parse_property
from docker_variant.variant.platform import Platform

__all__ = ["Matrix", "MatrixEntry", "load_matrix", "parse_matrix"]

_BUILD_ARG = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOP_KEYS = {"dockerfile", "namespace-order", "build-args", "variant"}
_ENTRY_KEYS = {"label", "bare", "properties", "build-args", "platform"}


@dataclass(frozen=True)
class MatrixEntry:
    name: str  # how messages name it: variant[2] (cu128)
    label: str | None  # None: the bare image
    labels: dict[str, str]  # the variant labels the tool sets
    build_args: dict[str, str]  # shared ones merged with the entry's own
    platform: Platform | None

    def tag(self, version: str) -> str:
        return f"{version}-{self.label}" if self.label is not None else version


@dataclass(frozen=True)
class Matrix:
    dockerfile: str
    entries: list[MatrixEntry]


def load_matrix(path: Path) -> Matrix:
    """The matrix file at ``path``, read with ``tomldoc``'s bounds (1 MiB, nesting)."""
    source = f"matrix file {str(path)!r}"
    return _matrix(read_toml_file(path, source), source)


def parse_matrix(text: str, source: str = "matrix") -> Matrix:
    return _matrix(load_toml(text.encode("utf-8"), source), source)


def _dockerfile(value: object, source: str) -> str:
    """A relative path that stays inside the build context on its own: no ``..`` part
    (``context_archive`` also refuses a symlink that leads out)."""
    if (
        not isinstance(value, str)
        or not value
        or value.startswith("/")
        or ".." in PurePosixPath(value).parts
    ):
        raise InvalidInputError(
            f"{source}: dockerfile {value!r} must be a relative path inside the build "
            "context (no '..', not absolute)"
        )
    return value


def _matrix(data: dict[str, Any], source: str) -> Matrix:
    _no_unknown(data, _TOP_KEYS, source)
    dockerfile = _dockerfile(data.get("dockerfile", "Dockerfile"), source)
    order = data.get("namespace-order", [])
    if not isinstance(order, list):
        raise InvalidInputError(f"{source}: namespace-order must be a list of namespaces")
    for name in order:
        check_namespace(name, f"{source}: namespace-order")
    shared = _build_args(data.get("build-args", {}), f"{source}: build-args")
    raw_entries = data.get("variant")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise InvalidInputError(f"{source}: no [[variant]] entries; add one per image to build")
    entries = [
        _entry(raw, i, shared, [str(n) for n in order], source)
        for i, raw in enumerate(raw_entries, start=1)
    ]
    seen: dict[str, str] = {}
    for entry in entries:
        key = entry.label if entry.label is not None else "(bare)"
        if key in seen:
            raise InvalidInputError(
                f"{source}: {entry.name} repeats {seen[key]}: each label is one image "
                "(one tag), so it may appear once"
            )
        seen[key] = entry.name
    return Matrix(dockerfile, entries)


def _entry(
    raw: object, position: int, shared: Mapping[str, str], order: list[str], source: str
) -> MatrixEntry:
    name = f"variant[{position}]"
    if not isinstance(raw, dict):
        raise InvalidInputError(f"{source}: {name} must be a table")
    label = raw.get("label")
    if isinstance(label, str):
        name = f"{name} ({label})"
    where = f"{source}: {name}"
    _no_unknown(raw, _ENTRY_KEYS, where)
    bare = raw.get("bare", False)
    if not isinstance(bare, bool):
        raise InvalidInputError(f"{where}: bare must be true or false")
    properties = raw.get("properties", [])
    if not isinstance(properties, list) or not all(isinstance(p, str) for p in properties):
        raise InvalidInputError(
            f'{where}: properties must be a list of "namespace :: feature :: value" strings'
        )
    if bare:
        if label is not None or properties:
            raise InvalidInputError(f"{where}: a bare entry has no label and no properties")
        labels: dict[str, str] = {}
    else:
        if label is None:
            raise InvalidInputError(f"{where}: needs a label (or bare = true)")
        try:
            props = [parse_property(p) for p in properties]
            labels = labels_for(label, props, order)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{where}: {exc}") from exc
    platform = raw.get("platform")
    if platform is not None:
        if not isinstance(platform, str):
            raise InvalidInputError(f"{where}: platform must be a string such as linux/arm64")
        platform = Platform.parse(platform, f"{where}: platform")
    args = {**shared, **_build_args(raw.get("build-args", {}), f"{where}: build-args")}
    return MatrixEntry(name, None if bare else str(label), labels, args, platform)


def _build_args(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidInputError(f'{where}: must be a table of NAME = "value"')
    args: dict[str, str] = {}
    for key, item in value.items():
        if not _BUILD_ARG.fullmatch(key):
            raise InvalidInputError(f"{where}: {key!r} is not a build argument name")
        if not isinstance(item, str | int | float | bool):
            raise InvalidInputError(f"{where}: {key} must be a string")
        args[key] = str(item).lower() if isinstance(item, bool) else str(item)
    return args


def _no_unknown(data: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidInputError(
            f"{where}: unknown key {unknown[0]!r}; known keys are {', '.join(sorted(known))}"
        )
