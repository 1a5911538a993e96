"""The baseline the benchmarks compare against: variantlib's own ordering, called directly."""

from __future__ import annotations

from variantlib.models.variant import VariantProperty
from variantlib.resolver.lib import sort_and_filter_supported_variants

from docker_variant.variant import SupportedLists, VariantIndex


def variantlib_order(index: VariantIndex, host: SupportedLists) -> list[str]:
    """Compatible labels of ``index`` on ``host``, best first, as variantlib orders them
    (inputs sorted by label, as the spec breaks ties; variantlib's own null variant dropped)."""
    order = [ns for ns in index.namespace_order if ns in host]
    supported = [
        VariantProperty(ns, f, v) for ns in order for f, vs in host[ns].items() for v in vs
    ]
    vdescs = [v.to_description() for _, v in sorted(index.variants.items())]
    result = sort_and_filter_supported_variants(
        vdescs, supported, namespace_priorities=order, filter_values=True
    )
    return [d.label for d in result if d.label != "null"]
