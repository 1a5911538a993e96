"""CEL device selectors for Kubernetes DRA drivers, derived from a variant's properties.

Each vendor maps its properties onto its DRA driver's device attributes
(``vendors.Vendor.dra``), with the meaning its provider gives them, so that a device
passes a variant's selectors exactly when a host with that device and driver would list every
feature the variant names:

========================================  ================================================
property                                  device
========================================  ================================================
``nvidia :: cuda_version_lower_bound :: v``  ``cudaDriverVersion >= v`` (needs CUDA >= v)
``nvidia :: cuda_version_upper_bound :: v``  ``cudaDriverVersion <  v`` (needs CUDA < v)
``nvidia :: sm_arch :: Mm_real``             compute capability ``M.n`` with ``n >= m``
``nvidia :: sm_arch :: M0_virtual``          compute capability ``M.n`` (PTX for major ``M``)
``amd :: gfx_arch :: gfxNNN``                ``deviceID`` one of the target's PCI device IDs
``amd :: rocm_version :: X.Y``               ``driverVersion`` of a driver release running X.Y
========================================  ================================================

A value no provider can list (``91_virtual``, ``5_real``, ``12.08``, a gfx target with no
known device) fits no device and is left out. Values of one feature are OR-ed, features
AND-ed (one selector per feature: DRA ANDs the selectors of a request). Each selector first
checks that the device has the attribute: in DRA a missing attribute is an evaluation error
that aborts the whole allocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from docker_variant import vendors

__all__ = [
    "MAX_EXPRESSION_BYTES",
    "MAX_SELECTORS",
    "MAX_VALUES_PER_FEATURE",
    "FeatureSelector",
    "feature_selector",
]

MAX_VALUES_PER_FEATURE = 8  # each feature's values newest first, at most 8
MAX_EXPRESSION_BYTES = 10 * 1024  # resource.k8s.io CELSelectorExpressionMaxLength
MAX_SELECTORS = 32  # resource.k8s.io DeviceSelectorsMaxSize


@dataclass(frozen=True)
class FeatureSelector:
    """The CEL selector for one feature of a variant."""

    feature: str
    expression: str | None  # None: none of the values can describe any device
    left_out: tuple[str, ...] = ()  # values beyond the MAX_VALUES_PER_FEATURE newest


def feature_selector(feature: str, values: Sequence[str], namespace: str) -> FeatureSelector:
    """``has(attribute) && (value1 || value2 ...)``, newest first, at most 8 alternatives."""
    dra = vendors.for_namespace(namespace).dra
    guard = None if dra is None else dra.guard(feature)
    if dra is None or guard is None:
        raise ValueError(f"{namespace} :: {feature} has no device attribute")
    clauses, left_out = dra.clauses(feature, values, MAX_VALUES_PER_FEATURE)
    if not clauses:
        return FeatureSelector(feature, None, tuple(left_out))
    if len(clauses) == 1:
        return FeatureSelector(feature, f"{guard} && {clauses[0]}", tuple(left_out))
    alternatives = " || ".join(f"({c})" if "&&" in c or "||" in c else c for c in clauses)
    return FeatureSelector(feature, f"{guard} && ({alternatives})", tuple(left_out))
