"""Image labels <-> variants, the index builder, and bad input (docs/reference/labels.md, docs/reference/index-document.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docker_variant.errors import InvalidInputError
from docker_variant.variant import (
    ImageRecord,
    Variant,
    VariantIndex,
    build_index,
    labels_for,
    parse_property,
    read_labels,
)
from docker_variant.variant.labels import LABEL_KEY, NAMESPACE_ORDER_KEY, PROPERTY_PREFIX

CU128 = {
    LABEL_KEY: "cu128",
    f"{PROPERTY_PREFIX}nvidia.cuda_version_lower_bound": "12.8",
    f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real,100_real",
}


def test_labels_round_trip() -> None:
    props = [
        parse_property(p)
        for p in (
            "nvidia :: sm_arch :: 90_real",
            "nvidia::sm_arch::100_real",
            " nvidia :: cuda_version_lower_bound :: 12.8 ",
        )
    ]
    labels = labels_for("cu128", props, ["nvidia", "x86_64"])
    assert labels == CU128 | {NAMESPACE_ORDER_KEY: "nvidia,x86_64"}
    parsed = read_labels(labels)
    assert parsed.variant == Variant.from_json(
        "cu128",
        {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real", "100_real"]}},
    )
    assert parsed.namespace_order == ("nvidia", "x86_64")


def test_bare_and_null() -> None:
    assert read_labels({"maintainer": "x"}).variant is None
    assert read_labels(None).variant is None
    null = read_labels({LABEL_KEY: "null"}).variant
    assert null is not None and null.is_null


@pytest.mark.parametrize(
    ("labels", "needle"),
    [
        ({LABEL_KEY: "cu128", f"{PROPERTY_PREFIX}nvidia.sm_arch": "9.0 "}, "'9.0 '"),
        ({LABEL_KEY: "cu128", f"{PROPERTY_PREFIX}nvidia.sm_arch": ""}, "empty value"),
        ({LABEL_KEY: "cu128", f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real,,100_real"}, "''"),
        ({LABEL_KEY: "CU128", f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real"}, "'CU128'"),
        ({LABEL_KEY: "a" * 65, f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real"}, "at most 64"),
        ({LABEL_KEY: "", f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real"}, "''"),
        ({LABEL_KEY: "null", f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real"}, "reserved"),
        ({LABEL_KEY: "cu128"}, "no properties"),
        ({f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real"}, "missing"),
        ({LABEL_KEY: "x", f"{PROPERTY_PREFIX}nvidia": "90_real"}, "<namespace>.<feature>"),
        ({LABEL_KEY: "x", f"{PROPERTY_PREFIX}Nvidia.sm_arch": "90_real"}, "'Nvidia'"),
        ({LABEL_KEY: "x", f"{PROPERTY_PREFIX}nvidia.sm-arch": "90_real"}, "'sm-arch'"),
        ({LABEL_KEY: "x", f"{PROPERTY_PREFIX}nvidia.cuda_version": "12.8"}, "not a feature"),
        (
            {LABEL_KEY: "x", f"{PROPERTY_PREFIX}nvidia.cuda_version_lower_bound": "12.8,12.6"},
            "takes one value",
        ),
        ({LABEL_KEY: "x", f"{PROPERTY_PREFIX}x86_64.level": "v3,v4"}, "takes one value"),
        ({LABEL_KEY: "x", f"{PROPERTY_PREFIX}nvidia.sm_arch": "90_real,90_real"}, "repeats"),
        (
            {LABEL_KEY: "x", f"{PROPERTY_PREFIX}nvidia.sm_arch": "9.0"},
            "'9.0' is not an architecture",
        ),
        (
            {LABEL_KEY: "x", f"{PROPERTY_PREFIX}nvidia.cuda_version_lower_bound": "cu128"},
            "'cu128' is not a CUDA version",
        ),
        (
            {LABEL_KEY: "x", f"{PROPERTY_PREFIX}x86_64.level": "v5"},
            "'v5' is not a microarchitecture level",
        ),
        (
            {
                LABEL_KEY: "x",
                f"{PROPERTY_PREFIX}x86_64.level": "v3",
                NAMESPACE_ORDER_KEY: "x86_64,X",
            },
            "'X'",
        ),
        (
            {LABEL_KEY: "x", f"{PROPERTY_PREFIX}x86_64.level": "v3", NAMESPACE_ORDER_KEY: "a,a"},
            "repeated",
        ),
    ],
)
def test_bad_labels_name_the_value(labels: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        read_labels(labels)
    message = str(info.value)
    assert needle in message and "\n" not in message


@pytest.mark.parametrize(
    "text",
    [
        "nvidia :: sm_arch",
        "nvidia:sm_arch:90",
        "NVIDIA :: sm_arch :: 90_real",
        "a :: b :: c d",
        "",
        "a :: b :: ",
        "a :: b :: c :: d",
    ],
)
def test_bad_property_strings(text: str) -> None:
    with pytest.raises(InvalidInputError, match="does not match"):
        parse_property(text)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.sampled_from([LABEL_KEY, NAMESPACE_ORDER_KEY]),
            st.text(max_size=20).map(lambda s: PROPERTY_PREFIX + s),
            st.text(max_size=10),
        ),
        st.text(max_size=20),
        max_size=5,
    )
)
def test_label_parser_fuzz_only_raises_invalid_input(labels: dict[str, str]) -> None:
    try:
        read_labels(labels)
    except InvalidInputError as exc:
        # one line: bad values are quoted with repr(), which escapes newlines
        assert str(exc) and "\n" not in str(exc)


# Index documents carry real digests: sha256 and 64 lowercase hex digits.
BARE_DIGEST = "sha256:" + "ba" * 32
CU128_DIGEST = "sha256:" + "c1" * 32


def rec(tag: str, labels: dict[str, str] | None, digest: str = "sha256:" + "0" * 64) -> ImageRecord:
    return ImageRecord(tag, digest, labels)


def test_build_index_sorts_out_versions_bare_null_and_invalid() -> None:
    records = [
        rec("1.0.0", {}, BARE_DIGEST),
        rec("1.0.0-cu128", CU128, CU128_DIGEST),
        rec("1.0.0-null", {LABEL_KEY: "null"}),
        rec(
            "1.0.0-v3",
            {
                LABEL_KEY: "v3",
                f"{PROPERTY_PREFIX}x86_64.level": "v3",
                NAMESPACE_ORDER_KEY: "x86_64",
            },
        ),
        rec("1.0.0-bad", {LABEL_KEY: "bad", f"{PROPERTY_PREFIX}nvidia.sm_arch": "9.0 "}),
        rec(
            "1.0.0-wrong",
            {LABEL_KEY: "cu126", f"{PROPERTY_PREFIX}nvidia.cuda_version_lower_bound": "12.6"},
        ),
        rec("1.0.0-ubuntu24.04", {}),
        rec("1.0.0-ubuntu24.04-cu128", CU128),
        rec("1.0.0-broken", None, "sha256:x"),
        rec("1.0.1-cu128", CU128),
        ImageRecord("1.0.0-garbage", "sha256:g", error="config blob is not JSON"),
    ]
    index = build_index("1.0.0", records)
    assert sorted(index.variants) == ["cu128", "null", "v3"]
    assert index.images["cu128"].digest == CU128_DIGEST
    assert index.bare is not None and index.bare.digest == BARE_DIGEST
    assert [i.tag for i in index.invalid] == ["1.0.0-bad", "1.0.0-garbage", "1.0.0-wrong"]
    assert "'9.0 '" in index.invalid[0].error
    # x86_64 was stated; nvidia is used but not stated, so it follows the stated order
    assert index.namespace_order == ["x86_64", "nvidia"]
    doc = index.to_json()
    assert doc["variants"]["null"] == {} and doc["bare"] == {
        "tag": "1.0.0",
        "digest": BARE_DIGEST,
    }
    assert VariantIndex.from_json(doc, "round trip").to_json() == doc


def test_a_variant_asked_for_by_its_own_tag_is_that_variant() -> None:
    """pull app:1.0.0-cu128: the version named is the cu128 image's own tag."""
    records = [rec("1.0.0-cu128", CU128, CU128_DIGEST), rec("1.0.0", {}, BARE_DIGEST)]
    index = build_index("1.0.0-cu128", records)
    assert list(index.variants) == ["cu128"] and index.invalid == []
    assert index.images["cu128"].tag == "1.0.0-cu128" and index.bare is None
    # a label that the tag does not end with is still a mismatch
    wrong = build_index("1.0.0-cu126", [rec("1.0.0-cu126", CU128)])
    assert [i.tag for i in wrong.invalid] == ["1.0.0-cu126"] and not wrong.variants


def test_build_index_default_order_and_conflicts() -> None:
    v3 = {LABEL_KEY: "v3", f"{PROPERTY_PREFIX}x86_64.level": "v3"}
    index = build_index("2", [rec("2-cu128", CU128), rec("2-v3", v3)])
    assert index.namespace_order == ["nvidia", "x86_64"]  # accelerators first
    conflict = build_index(
        "2",
        [
            rec("2-a", v3 | {LABEL_KEY: "a", NAMESPACE_ORDER_KEY: "x86_64,nvidia"}),
            rec("2-b", CU128 | {LABEL_KEY: "b", NAMESPACE_ORDER_KEY: "nvidia"}),
            rec("2-c", CU128 | {LABEL_KEY: "c", NAMESPACE_ORDER_KEY: "x86_64"}),
        ],
    )
    assert conflict.namespace_order == ["x86_64", "nvidia"]
    assert [i.tag for i in conflict.invalid] == ["2-b"] and "conflicts" in conflict.invalid[0].error


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ([], "JSON object"),
        ({}, "'variants'"),
        ({"variants": {"Bad": {"x": {"y": ["z"]}}}}, "'Bad'"),
        ({"variants": {"a": {"x": {"y": "z"}}}}, "list of values"),
        ({"variants": {"a": {"x": {"y": ["Z"]}}}}, "'Z'"),
        ({"variants": {"a": {}}}, "no properties"),
        ({"variants": {"null": {"x": {"y": ["z"]}}}}, "reserved"),
        ({"variants": {"a": {"x": {"y": ["z"]}}}, "images": {"b": {"tag": "t"}}}, "images.b"),
        ({"variants": {"a": {"x": {"y": ["z"]}}}, "images": {"a": "t"}}, "images.a"),
        (
            {"variants": {"a": {"x": {"y": ["z"]}}}, "default-priorities": {"namespace": "x"}},
            "default-priorities",
        ),
        (
            {"variants": {"a": {"x": {"y": ["z"]}}}, "default-priorities": {"namespace": ["X"]}},
            "'X'",
        ),
    ],
)
def test_bad_index_documents(doc: object, needle: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        VariantIndex.from_json(doc, "index f.json")
    assert needle in str(info.value)
