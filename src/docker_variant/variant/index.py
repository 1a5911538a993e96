"""The variant index document (docs/reference/index-document.md): its model, parser and builder.

The proxy serves it and the client builds it when there is no proxy; both call
``build_index`` so the two documents are the same byte for byte after key sorting.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from variantlib.constants import (
    VALIDATION_PROVIDER_PLUGIN_API_REGEX,
    VALIDATION_PROVIDER_REQUIRES_REGEX,
)

from docker_variant.errors import InvalidInputError, one_line
from docker_variant.oci.grammar import digest_problem, tag_problem
from docker_variant.variant.labels import LABEL_KEY, LABEL_PREFIX, read_labels
from docker_variant.variant.model import (
    SupportedLists,
    Variant,
    check_feature,
    check_namespace,
    parse_supported_lists,
)
from docker_variant.variant.ordering import complete_namespace_order, merge_namespace_orders
from docker_variant.variant.platform import Platform
from docker_variant.vendors import for_namespace

__all__ = [
    "SCHEMA_URL",
    "ImageRecord",
    "ImageRef",
    "InvalidImage",
    "ProviderInfo",
    "VariantIndex",
    "build_index",
]

#: The first shape of the document (still read).
SCHEMA_URL = "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
#: What documents are written in, as variantlib 0.2.2 writes: PEP 825 as revised (python/peps#5086) moved per-provider
#: ``feature-order`` and ``static-properties`` under ``providers.<namespace>`` and dropped
#: ``default-priorities.feature``/``.property``. Documents of either shape are read.
SCHEMA_URL_V020 = "https://variants-schema.wheelnext.dev/v0.2.0.json"
_PROVIDER_KEYS = frozenset(
    {"static-properties", "feature-order", "requires", "optional", "plugin-api", "builtin"}
)
#: What a provider entry's plain keys must hold, as variantlib 0.2.x reads them (PEP 825
#: v0.2.0): a wrong one is refused rather than kept and written back out.
_PROVIDER_RULES = {
    "requires": "a list of requirement strings (at least one; no tab or newline)",
    "optional": "true or false",
    "plugin-api": "null or a 'module.path[:attribute]' string",
    "builtin": "null or a string",
}


@dataclass(frozen=True)
class ProviderInfo:
    """``providers.<namespace>`` of a PEP 825 (v0.2.0) document, the parts selection uses:
    a static provider's properties (what every host supports, no plugin to run) and their
    feature order. The other keys (``requires``, ``plugin-api``, ...) are kept as given."""

    static_properties: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    feature_order: tuple[str, ...] = ()
    other: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.other)
        if self.static_properties:
            data["static-properties"] = {f: list(v) for f, v in self.static_properties.items()}
        if self.feature_order:
            data["feature-order"] = list(self.feature_order)
        return data

    def static_lists(self) -> dict[str, list[str]]:
        """The static properties as a namespace's supported lists, in ``feature-order``."""
        order = [f for f in self.feature_order if f in self.static_properties]
        order += [f for f in self.static_properties if f not in order]
        return {f: list(self.static_properties[f]) for f in order}


@dataclass(frozen=True)
class ImageRef:
    """An image of the version. ``platforms`` maps ``os/arch[/variant]`` to that platform's
    manifest digest; empty means the image is for whatever platform the host has (docs/reference/image-index.md).
    With several platforms, ``digest`` is the first platform's (in sorted order), so the
    document is the same whether it was built from a scan or from a variant image index."""

    tag: str
    digest: str
    platforms: Mapping[str, str] = field(default_factory=dict)

    def on(self, platform: Platform | None) -> tuple[str, str | None] | None:
        """``(digest to pull, platform key)`` for a host of ``platform``; ``None`` when the
        image lists platforms and none matches (Docker's matching)."""
        if platform is None or not self.platforms:
            return self.digest, None
        for key, digest in sorted(self.platforms.items()):
            if platform.matches(Platform.parse(key)):
                return digest, key
        return None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"tag": self.tag, "digest": self.digest}
        if self.platforms:
            data["platforms"] = dict(sorted(self.platforms.items()))
        return data


@dataclass(frozen=True)
class InvalidImage:
    tag: str
    error: str


@dataclass(frozen=True)
class ImageRecord:
    """One image manifest as read from a registry: its tag, its labels (or why they could
    not be read) and, where known, its platform. A multi-platform tag gives one record per
    platform."""

    tag: str
    digest: str
    labels: Mapping[str, str] | None = None
    error: str | None = None
    platform: str | None = None


@dataclass(frozen=True)
class VariantIndex:
    namespace_order: list[str]
    variants: dict[str, Variant]
    images: dict[str, ImageRef] = field(default_factory=dict)
    bare: ImageRef | None = None
    invalid: list[InvalidImage] = field(default_factory=list)
    providers: dict[str, ProviderInfo] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The document in the schema variantlib writes (v0.2.0): every namespace of
        ``default-priorities`` has its ``providers`` entry, as read or as its vendor module
        names it (``NamespaceRules.provider_entry``)."""
        order = [*self.namespace_order, *sorted(set(self.providers) - set(self.namespace_order))]
        providers = {
            ns: self.providers[ns].to_json()
            if ns in self.providers
            else for_namespace(ns).provider_entry()
            for ns in order
        }
        return {
            "$schema": SCHEMA_URL_V020,
            "default-priorities": {"namespace": order},
            "providers": dict(sorted(providers.items())),
            "variants": {label: v.to_json() for label, v in sorted(self.variants.items())},
            "images": {label: ref.to_json() for label, ref in sorted(self.images.items())},
            "bare": None if self.bare is None else self.bare.to_json(),
            "invalid": [{"tag": i.tag, "error": i.error} for i in self.invalid],
        }

    @property
    def is_empty(self) -> bool:
        """No image of the version at all: no variant, no bare image, no invalid one (as
        the manifest of a missing tag, a version to report missing)."""
        return not self.variants and self.bare is None and not self.invalid

    def with_static_properties(self, host: SupportedLists) -> SupportedLists:
        """``host`` plus the static providers' properties for namespaces it has no lists
        for: a static provider needs no plugin to run, on any host."""
        static = {
            ns: info.static_lists()
            for ns, info in self.providers.items()
            if info.static_properties and not host.get(ns)
        }
        return {**host, **static} if static else host

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: object, source: str) -> VariantIndex:
        """Validate an index document (docs/reference/index-document.md): a PEP 825
        ``variants.json`` with ``images`` (every variant needs its image), ``bare`` and
        ``invalid``."""
        if not isinstance(data, dict):
            raise InvalidInputError(f"{source}: an index document must be a JSON object")
        raw_variants = data.get("variants")
        if not isinstance(raw_variants, dict):
            raise InvalidInputError(
                f"{source}: 'variants' must be an object of label -> properties"
            )
        variants = {
            label: Variant.from_json(label, props, f"{source}: variant {label!r}")
            for label, props in raw_variants.items()
        }
        priorities = data.get("default-priorities", {})
        stated = priorities.get("namespace", []) if isinstance(priorities, dict) else None
        if not isinstance(stated, list):
            raise InvalidInputError(
                f"{source}: 'default-priorities' must be {{\"namespace\": [names]}}"
            )
        for name in stated:
            check_namespace(name, f"{source}: default-priorities.namespace")
        used = (ns for v in variants.values() for ns in v.namespaces)
        images = {
            label: _image_ref(ref, f"{source}: images.{label}")
            for label, ref in _object(data, "images", source).items()
        }
        if unknown := sorted(set(images) - set(variants)):
            raise InvalidInputError(f"{source}: images.{unknown[0]} names no variant")
        # Without its image a variant would be pulled by its label as a tag: refuse it.
        if imageless := sorted(set(variants) - set(images)):
            raise InvalidInputError(
                f"{source}: variant {imageless[0]!r} has no entry in 'images' "
                '({"tag": ..., "digest": ...}); every variant needs its image'
            )
        bare = data.get("bare")
        invalid = data.get("invalid") or []
        if not isinstance(invalid, list):
            raise InvalidInputError(f"{source}: 'invalid' must be a list")
        return cls(
            namespace_order=complete_namespace_order(stated, used),
            variants=variants,
            images=images,
            providers=_providers(data.get("providers"), source),
            bare=None if bare is None else _image_ref(bare, f"{source}: bare"),
            invalid=[
                InvalidImage(str(i.get("tag", "")), str(i.get("error", "")))
                for i in invalid
                if isinstance(i, dict)
            ],
        )


def _providers(raw: object, source: str) -> dict[str, ProviderInfo]:
    """``providers`` of a v0.2.0 document; absent in v0.1.x ones."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInputError(f"{source}: 'providers' must be an object of namespace -> info")
    found: dict[str, ProviderInfo] = {}
    for namespace, info in raw.items():
        where = f"{source}: providers.{namespace}"
        check_namespace(namespace, f"{source}: providers")
        if not isinstance(info, dict):
            raise InvalidInputError(f"{where}: must be an object")
        if unknown := sorted(set(info) - _PROVIDER_KEYS):
            raise InvalidInputError(f"{where}: unknown key {unknown[0]!r}")
        # null is absent, as variantlib reads it; any other falsy value is the wrong type
        static = info.get("static-properties")
        static = {} if static is None else static
        order = info.get("feature-order")
        order = [] if order is None else order
        if not isinstance(static, dict):
            raise InvalidInputError(f"{where}.static-properties: must be {{feature: [values]}}")
        lists = parse_supported_lists({namespace: static}, f"{where}.static-properties")
        if not isinstance(order, list) or not all(isinstance(f, str) for f in order):
            raise InvalidInputError(f"{where}.feature-order: must be a list of feature names")
        for feature in order:
            check_feature(feature, f"{where}.feature-order")
        other = {k: v for k, v in info.items() if k not in ("static-properties", "feature-order")}
        for key, value in other.items():
            if not _provider_value_ok(key, value):
                shown = one_line(json.dumps(value), 60)
                raise InvalidInputError(f"{where}.{key}: {shown} is not {_PROVIDER_RULES[key]}")
        found[namespace] = ProviderInfo(
            {f: tuple(v) for f, v in lists[namespace].items()}, tuple(order), other
        )
    return found


def _provider_value_ok(key: str, value: object) -> bool:
    """Whether ``providers.<ns>.<key>`` holds what ``_PROVIDER_RULES`` says."""
    if key == "requires":
        return (
            isinstance(value, list)
            and bool(value)
            and all(
                isinstance(r, str) and VALIDATION_PROVIDER_REQUIRES_REGEX.fullmatch(r)
                for r in value
            )
        )
    if key == "optional":
        return isinstance(value, bool)
    if key == "plugin-api":
        return value is None or (
            isinstance(value, str)
            and VALIDATION_PROVIDER_PLUGIN_API_REGEX.fullmatch(value) is not None
        )
    return value is None or isinstance(value, str)  # builtin


def _object(data: Mapping[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"{source}: {key!r} must be an object")
    return value


def _image_ref(data: object, where: str) -> ImageRef:
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("tag"), str)
        or not isinstance(data.get("digest", ""), str)
    ):
        shown = one_line(repr(data), 120)
        raise InvalidInputError(f'{where}: expected {{"tag": ..., "digest": ...}}, got {shown}')
    if problem := tag_problem(data["tag"]):
        raise InvalidInputError(f"{where}.tag: {problem}")
    digest = data.get("digest", "")
    if digest and (problem := digest_problem(digest, strict=False)):
        raise InvalidInputError(f"{where}.digest: {problem}")
    platforms = data.get("platforms") or {}
    if not isinstance(platforms, dict) or not all(isinstance(d, str) for d in platforms.values()):
        raise InvalidInputError(
            f'{where}.platforms: expected {{"os/arch[/variant]": "<manifest digest>"}}'
        )
    for key, value in platforms.items():
        Platform.parse(key, f"{where}.platforms")
        if problem := digest_problem(value, strict=False):
            raise InvalidInputError(f"{where}.platforms.{key}: {problem}")
    return ImageRef(data["tag"], digest, dict(platforms))


def build_index(version: str, records: Iterable[ImageRecord]) -> VariantIndex:
    """Index one version from its tags' labels (docs/reference/labels.md and index-document.md).

    Tags of other versions that share the prefix (``1.0.0-ubuntu24.04`` next to ``1.0.0``)
    are skipped: a tag belongs to ``version`` only if it is ``version`` itself or
    ``version-<label>`` with ``<label>`` its own variant label. A variant's own tag asked for
    as the version (``1.0.0-cu128``, label ``cu128``) is that variant.
    """
    variants: dict[str, Variant] = {}
    images: dict[str, ImageRef] = {}
    bare: ImageRef | None = None
    invalid: list[InvalidImage] = []
    stated: list[str] = []
    stated_by = ""

    for record, platforms in _by_tag(version, records):
        if record.error is not None:
            invalid.append(InvalidImage(record.tag, record.error))
            continue
        label = (record.labels or {}).get(LABEL_KEY)
        if label is None and record.tag != version:
            continue  # the bare image of another version
        # asked for by its own tag (pull app:1.0.0-cu128): the version names that variant
        own_tag = label is not None and record.tag == version and version.endswith(f"-{label}")
        if label is not None and record.tag != f"{version}-{label}" and not own_tag:
            if record.tag.endswith(f"-{label}") and record.tag != version:
                continue  # a variant of another version, e.g. 1.0.0-ubuntu24.04-cu128
            invalid.append(
                InvalidImage(
                    record.tag,
                    f"{LABEL_KEY}={label} does not match the tag; expected {version}-{label}",
                )
            )
            continue
        try:
            parsed = read_labels(record.labels)
        except InvalidInputError as exc:
            invalid.append(InvalidImage(record.tag, str(exc)))
            continue
        if parsed.namespace_order:
            merged = merge_namespace_orders(stated, parsed.namespace_order)
            if merged is None:
                invalid.append(
                    InvalidImage(
                        record.tag,
                        f"dev.pep817.default-priorities.namespace="
                        f"{','.join(parsed.namespace_order)} conflicts with "
                        f"{','.join(stated)} stated by {stated_by}",
                    )
                )
                continue
            if merged != stated:
                stated, stated_by = merged, record.tag
        ref = ImageRef(record.tag, record.digest, platforms)
        if parsed.variant is None:
            bare = ref
        else:
            variants[parsed.variant.label] = parsed.variant
            images[parsed.variant.label] = ref

    used = (ns for v in variants.values() for ns in v.namespaces)
    return VariantIndex(complete_namespace_order(stated, used), variants, images, bare, invalid)


def _by_tag(
    version: str, records: Iterable[ImageRecord]
) -> Iterable[tuple[ImageRecord, dict[str, str]]]:
    """The version's tags in order, each as one record and its ``{platform: digest}``.

    A multi-platform tag's records must agree on their variant labels; the tag's digest
    becomes its first platform's (sorted), as ``ImageRef`` says.
    """
    grouped: dict[str, list[ImageRecord]] = {}
    for record in records:
        if record.tag == version or record.tag.startswith(f"{version}-"):
            grouped.setdefault(record.tag, []).append(record)
    for tag in sorted(grouped):
        group = sorted(grouped[tag], key=lambda r: r.platform or "")
        first = group[0]
        errors = [r for r in group if r.error is not None]
        if errors:
            yield errors[0], {}
            continue
        platforms = {r.platform: r.digest for r in group if r.platform}
        if len(platforms) != len(group) and len(group) > 1:
            yield ImageRecord(tag, first.digest, error="several manifests for one platform"), {}
            continue
        own = _variant_labels(first.labels)
        for other in group[1:]:
            if _variant_labels(other.labels) != own:
                yield (
                    ImageRecord(
                        tag,
                        first.digest,
                        error=f"variant labels differ between platforms {first.platform} "
                        f"and {other.platform}; every platform of a tag must carry the same",
                    ),
                    {},
                )
                break
        else:
            yield first, platforms


def _variant_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if k.startswith(LABEL_PREFIX)}
