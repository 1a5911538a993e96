"""Index documents in both PEP 825 shapes: v0.1.x, and v0.2.0 as variantlib 0.2.2 writes it
(``providers.<ns>.static-properties`` / ``feature-order``); static providers decide
selection without a plugin."""

from __future__ import annotations

import json
from typing import Any

import pytest
from variantlib.constants import VARIANT_INFO_SCHEMA_URL
from variantlib.models.variant import VariantProperty
from variantlib.resolver.lib import sort_and_filter_supported_variants
from variantlib.variants_json import VariantsJson

from docker_variant.errors import InvalidInputError
from docker_variant.variant import VariantIndex, select

VARIANTS = {
    "npu": {"furiosa": {"arch": ["renegade"]}},
    "cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"]}},
    "null": {},
}
IMAGES = {label: {"tag": f"1.0.0-{label}", "digest": ""} for label in VARIANTS}


def v020() -> dict[str, Any]:
    """A v0.2.0 document, checked by variantlib's own reader and writer."""
    document = {
        "$schema": VARIANT_INFO_SCHEMA_URL,
        "default-priorities": {"namespace": ["furiosa", "nvidia"]},
        "providers": {
            "furiosa": {
                "static-properties": {"arch": ["renegade", "warboy"], "level": ["b", "a"]},
                "feature-order": ["level", "arch"],
            },
            "nvidia": {"requires": ["nvidia-variant-provider"], "plugin-api": "nvidia_vp:P"},
        },
        "variants": VARIANTS,
    }
    written = json.loads(VariantsJson(document).to_str())
    assert written["$schema"] == "https://variants-schema.wheelnext.dev/v0.2.0.json"
    return {**written, "images": IMAGES}


def test_v020_static_properties_decide_without_a_plugin() -> None:
    index = VariantIndex.from_json(v020(), "v020")
    assert index.providers["furiosa"].static_lists() == {
        "level": ["b", "a"],
        "arch": ["renegade", "warboy"],
    }
    best = select(index, {"x86_64": {"level": ["v2", "v1"]}}).best
    assert best is not None and best.label == "npu"  # furiosa is static: every host has it
    # a host's own lists for the namespace win over the static ones
    rejected = select(index, {"furiosa": {"arch": ["warboy"]}})
    assert "npu" in {c.label for c in rejected.rejected}


def test_v020_providers_survive_a_round_trip_and_v01_is_unchanged() -> None:
    index = VariantIndex.from_json(v020(), "v020")
    again = VariantIndex.from_json(index.to_json(), "again")
    assert again.providers == index.providers
    assert index.to_json()["providers"]["nvidia"] == {
        "requires": ["nvidia-variant-provider"],
        "plugin-api": "nvidia_vp:P",
    }
    old = {
        "$schema": "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json",
        "default-priorities": {
            "namespace": ["nvidia"],
            "feature": {"nvidia": ["cuda_version_lower_bound"]},  # v0.1.x keys, dropped since
            "property": {"nvidia": {"cuda_version_lower_bound": ["12.8"]}},
        },
        "variants": VARIANTS,
        "images": IMAGES,
    }
    index = VariantIndex.from_json(old, "v011")
    assert index.providers == {}
    written = index.to_json()  # read in either shape, written in variantlib's
    assert written["$schema"] == VARIANT_INFO_SCHEMA_URL
    assert written["providers"] == {
        "furiosa": {"requires": ["docker-variant"], "optional": True},
        "nvidia": {"requires": ["nvidia-variant-provider"]},
    }
    assert "feature" not in written["default-priorities"]


def test_a_written_document_is_read_and_ordered_by_variantlib() -> None:
    """A document as the proxy and the CLI write it, fed to variantlib's own reader
    (``VariantsJson``) and ordering (``sort_and_filter_supported_variants``): every
    namespace has its provider entry, and variantlib orders the variants as ``select``."""
    variants = {
        "cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"]}, "x86_64": {"level": ["v3"]}},
        "cu126": {"nvidia": {"cuda_version_lower_bound": ["12.6"]}},
        "v4": {"x86_64": {"level": ["v4"]}},
        "arm": {"aarch64": {"version": ["8.2a"]}},
        "npu": {"furiosa": {"arch": ["rngd"]}},
        "null": {},
    }
    document = {
        "default-priorities": {"namespace": ["nvidia"]},
        "variants": variants,
        "images": {label: {"tag": f"1.0.0-{label}", "digest": ""} for label in variants},
    }
    written = VariantIndex.from_json(document, "built").to_json()
    read = VariantsJson(json.loads(json.dumps(written)))  # variantlib's checks, unchanged
    assert read.namespace_priorities == written["default-priorities"]["namespace"]
    assert set(read.providers) == {"nvidia", "x86_64", "aarch64", "furiosa"}
    assert read.providers["x86_64"].requires == ["provider-variant-x86-64"]
    assert read.providers["furiosa"].optional  # only docker-variant reports it
    host = {
        "nvidia": {"cuda_version_lower_bound": ["12.8", "12.6"]},
        "x86_64": {"level": ["v3", "v2", "v1"]},
    }
    supported = [
        VariantProperty(ns, feature, value)
        for ns in read.namespace_priorities
        if ns in host
        for feature, values in host[ns].items()
        for value in values
    ]
    theirs = sort_and_filter_supported_variants(
        [read.variants[label] for label in sorted(read.variants)],
        supported,
        namespace_priorities=read.namespace_priorities,
        filter_values=True,
    )
    ours = select(VariantIndex.from_json(written, "again"), host).ranked
    assert [d.label for d in theirs] == [c.label for c in ours if c.label is not None]
    assert [d.label for d in theirs] == ["cu128", "cu126", "null"]


@pytest.mark.parametrize(
    ("providers", "needle"),
    [
        ({"furiosa": {"bogus": 1}}, "unknown key 'bogus'"),
        ({"furiosa": {"static-properties": {"arch": "renegade"}}}, "non-empty list"),
        ({"furiosa": {"feature-order": ["Arch"]}}, "feature 'Arch'"),
        ({"Furiosa": {}}, "namespace 'Furiosa'"),
        ([], "'providers' must be an object"),
    ],
)
def test_bad_providers_are_refused(providers: object, needle: str) -> None:
    with pytest.raises(InvalidInputError, match=needle):
        VariantIndex.from_json(
            {"variants": VARIANTS, "images": IMAGES, "providers": providers}, "x"
        )


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"requires": ["p"], "plugin-api": 12345}, "plugin-api: 12345 is not null or a 'module"),
        ({"requires": ["p"], "plugin-api": "not a module"}, 'plugin-api: "not a module" is not'),
        ({"requires": ["p"], "optional": "maybe"}, 'optional: "maybe" is not true or false'),
        ({"requires": ["p"], "optional": 1}, "optional: 1 is not true or false"),
        ({"requires": "nvidia-variant-provider"}, 'requires: "nvidia-variant-provider" is not a'),
        ({"requires": []}, r"requires: \[\] is not a list of requirement strings"),
        ({"requires": ["p\nq"]}, "requires: .* is not a list of requirement strings"),
        ({"requires": [7]}, r"requires: \[7\] is not"),
        ({"builtin": 3}, "builtin: 3 is not null or a string"),
        ({"static-properties": []}, "static-properties: must be"),
        ({"static-properties": {"arch": ["a"]}, "feature-order": {}}, "feature-order: must be"),
        ({"static-properties": 0}, "static-properties: must be"),
    ],
)
def test_every_provider_field_is_type_checked(entry: dict[str, object], needle: str) -> None:
    """A wrong type in a v0.2.0 provider entry is refused naming the field and the rule,
    never kept and written back out (variantlib would refuse the document)."""
    providers = {"nvidia": entry}
    with pytest.raises(InvalidInputError, match=f"x: providers.nvidia.{needle}"):
        VariantIndex.from_json(
            {"variants": VARIANTS, "images": IMAGES, "providers": providers}, "x"
        )


def test_provider_fields_as_variantlib_writes_them_are_kept() -> None:
    entry = {"requires": ["nvidia-variant-provider >= 0.1"], "optional": True, "plugin-api": None}
    document = {"variants": VARIANTS, "images": IMAGES, "providers": {"nvidia": entry}}
    written = VariantIndex.from_json(document, "x").to_json()["providers"]["nvidia"]
    assert written == entry
    read = VariantsJson(
        {
            "default-priorities": {"namespace": ["nvidia"]},
            "providers": {"nvidia": written},
            "variants": {},
        }
    )
    assert read.providers["nvidia"].optional
