"""Our ordering equals variantlib's sort_and_filter_supported_variants (docs/reference/labels.md)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from variantlib.models.variant import VariantProperty
from variantlib.resolver.lib import sort_and_filter_supported_variants

from docker_variant.variant import NULL_LABEL, SupportedLists, Variant, VariantIndex, select

NAMESPACES = ["acc_a", "acc_b", "aarch64", "npu_c"]
FEATURES = ["f0", "f1", "f2", "level"]
VALUES = ["v0", "v1", "v2", "v3", "v4", "1.2"]


@st.composite
def hosts(draw: st.DrawFn) -> SupportedLists:
    host: SupportedLists = {}
    for ns in draw(st.lists(st.sampled_from(NAMESPACES), min_size=3, unique=True)):
        features = draw(st.lists(st.sampled_from(FEATURES), min_size=3, unique=True))
        host[ns] = {
            f: draw(st.permutations(VALUES).map(lambda vs: vs[: draw(st.integers(2, len(VALUES)))]))
            for f in features
        }
    return host


@st.composite
def variants(draw: st.DrawFn) -> Variant:
    label = draw(
        st.from_regex(r"[a-z0-9._]{1,12}", fullmatch=True).filter(lambda s: s != NULL_LABEL)
    )
    props: dict[str, dict[str, list[str]]] = {}
    for ns in draw(st.lists(st.sampled_from(NAMESPACES), min_size=1, max_size=2, unique=True)):
        for f in draw(st.lists(st.sampled_from(FEATURES), min_size=1, max_size=2, unique=True)):
            # aarch64 features are single-valued (the provider declares none multi-value)
            size = 1 if ns == "aarch64" else 3
            props.setdefault(ns, {})[f] = draw(
                st.lists(st.sampled_from(VALUES), min_size=1, max_size=size, unique=True)
            )
    return Variant.from_json(label, props)


def variantlib_order(found: list[Variant], host: SupportedLists, order: list[str]) -> list[str]:
    supported = [
        VariantProperty(ns, f, v)
        for ns in order
        if ns in host
        for f, values in host[ns].items()
        for v in values
    ]
    # variantlib keeps input order on ties; the spec breaks them by label.
    vdescs = [v.to_description() for v in sorted(found, key=lambda v: v.label)]
    result = sort_and_filter_supported_variants(
        vdescs, supported, namespace_priorities=list(order), filter_values=True
    )
    return [d.label for d in result]


@settings(max_examples=600, deadline=None)
@given(
    host=hosts(),
    found=st.lists(variants(), max_size=12, unique_by=lambda v: v.label),
    order=st.permutations(NAMESPACES),
)
def test_order_equals_variantlib(
    host: SupportedLists, found: list[Variant], order: list[str]
) -> None:
    index = VariantIndex(
        list(order), {v.label: v for v in found} | {NULL_LABEL: Variant(NULL_LABEL)}
    )
    ours = [c.label for c in select(index, host).ranked]
    assert ours == variantlib_order(found, host, list(order))


def test_more_properties_win_and_label_breaks_ties() -> None:
    host: SupportedLists = {
        "nvidia": {
            "cuda_version_lower_bound": ["12.8", "12.6"],
            "sm_arch": ["90_real", "90_virtual"],
        }
    }
    index = VariantIndex(
        ["nvidia"],
        {
            "b": Variant.from_json("b", {"nvidia": {"cuda_version_lower_bound": ["12.8"]}}),
            "a": Variant.from_json("a", {"nvidia": {"cuda_version_lower_bound": ["12.8"]}}),
            "both": Variant.from_json(
                "both", {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}}
            ),
            "old": Variant.from_json("old", {"nvidia": {"cuda_version_lower_bound": ["12.6"]}}),
        },
    )
    assert [c.label for c in select(index, host).ranked] == ["both", "a", "b", "old"]


@st.composite
def host_and_fitting_variants(draw: st.DrawFn) -> tuple[SupportedLists, list[Variant]]:
    """Variants made of the host's own properties: all compatible, so the order is stressed."""
    host = draw(hosts())
    keys = [(ns, f) for ns, feats in host.items() for f in feats]
    found: list[Variant] = []
    for i in range(draw(st.integers(2, 15))):
        props: dict[str, dict[str, list[str]]] = {}
        for ns, f in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
            size = 1 if ns == "aarch64" else 2
            props.setdefault(ns, {})[f] = draw(
                st.lists(st.sampled_from(host[ns][f]), min_size=1, max_size=size, unique=True)
            )
        found.append(Variant.from_json(f"v{i}", props))
    return host, found


@settings(max_examples=300, deadline=None)
@given(case=host_and_fitting_variants(), order=st.permutations(NAMESPACES))
def test_order_of_compatible_variants_equals_variantlib(
    case: tuple[SupportedLists, list[Variant]], order: list[str]
) -> None:
    host, found = case
    index = VariantIndex(list(order), {v.label: v for v in found})
    ours = [c.label for c in select(index, host).ranked]
    assert len(ours) == len(found)
    assert ours == [
        label for label in variantlib_order(found, host, list(order)) if label != NULL_LABEL
    ]


def pep825_order(found: list[Variant], host: SupportedLists, order: list[str]) -> list[str]:
    """PEP 825 "Variant ordering", steps 1 to 7, written from the PEP's text: an oracle
    independent of both our matcher and variantlib."""
    feature_order = {ns: list(host.get(ns, {})) for ns in order}
    value_order = {ns: dict(host.get(ns, {})) for ns in order}

    def compatible(v: Variant) -> bool:
        return all(
            any(val in host.get(ns, {}).get(f, []) for val in vals)
            for ns, feats in v.properties.items()
            for f, vals in feats.items()
        )

    def sorted_best(v: Variant) -> list[tuple[int, int, int]]:
        keys = []
        for ns, feats in v.properties.items():
            for f, vals in feats.items():
                best = next(x for x in value_order[ns][f] if x in vals)  # step 4
                keys.append(
                    (order.index(ns), feature_order[ns].index(f), value_order[ns][f].index(best))
                )  # step 5
        return sorted(keys)  # step 6

    def before(a: Variant, b: Variant) -> bool:  # step 7
        ka, kb = sorted_best(a), sorted_best(b)
        for x, y in zip(ka, kb, strict=False):
            if x != y:
                return x < y
        if len(ka) != len(kb):
            return len(ka) > len(kb)
        return a.label < b.label

    ranked: list[Variant] = []
    for v in (v for v in found if compatible(v)):  # insertion sort with the PEP's comparison
        at = next((i for i, w in enumerate(ranked) if before(v, w)), len(ranked))
        ranked.insert(at, v)
    return [v.label for v in ranked]


@settings(max_examples=300, deadline=None)
@given(
    case=host_and_fitting_variants(),
    extra=st.lists(variants(), max_size=6),
    order=st.permutations(NAMESPACES),
)
def test_order_equals_pep825_reference_algorithm(
    case: tuple[SupportedLists, list[Variant]], extra: list[Variant], order: list[str]
) -> None:
    host, fitting = case
    found = {v.label: v for v in [*extra, *fitting]}  # fitting ones win label clashes
    index = VariantIndex(list(order), found)
    ours = [c.label for c in select(index, host).ranked]
    assert ours == pep825_order(list(found.values()), host, list(order))
