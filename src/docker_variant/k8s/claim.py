"""A DRA ``ResourceClaimTemplate`` that asks for devices fitting an image's variants (docs/reference/kubernetes.md).

One request whose ``firstAvailable`` subrequests are the variants in the order they rank on a
*virtual host* that supports all of them: built from the index's own properties, each
feature's values newest first (``variant.virtual.newest_first``), and ranked by ``select`` like any host,
so the ordering is decided in one place (``variant.ordering``). The scheduler takes the first
subrequest that devices on a node can satisfy.

What becomes of a variant:

- its accelerator properties become CEL selectors on its vendor's DRA driver attributes
  (``cel.feature_selector``): ``nvidia`` on ``gpu.nvidia.com``, ``amd`` on ``gpu.amd.com``;
  each subrequest asks its vendor's device class. Where that class admits devices no
  variant is built for (``gpu.amd.com``: VFIO passthrough devices and GPU partitions), every
  subrequest of the vendor first selects the device kind: whole GPUs, and their partitions
  with ``partitions=True`` (``vendors.base.DraMapping.kind_selector``);
- ``x86_64`` and ``aarch64`` properties describe the node's CPU, not a device: they are left
  out of the selectors (``k8s node-labels`` publishes them for node affinity);
- a variant with no accelerator property asks nothing of the device: it, the ``null``
  variant and the bare image share one last subrequest without selectors (any device of the
  best device subrequest's class). Placed earlier, a selector-free subrequest would make
  every later one unreachable;
- a variant whose device selectors equal an earlier subrequest's is folded into it (it could
  never be chosen: the earlier one is tried first and needs exactly the same devices);
- a variant with properties of a namespace no DRA driver maps (a descriptor's or an NPU
  plugin's), or of two accelerator vendors at once, is left out, with a warning.

With ``--count`` above 1, a ``matchAttribute`` constraint per vendor (on the subrequests of
that vendor) keeps the claim's devices one product (and, with partitions, one kind).

Each claim made from the template carries the subrequest -> variant mapping (the
annotations sit in the template's ``spec.metadata``, which the ResourceClaim controller
copies into every claim), next to its ``status.allocation.devices.results[].request``
(``gpu/<subrequest>``).

DRA allows at most 8 subrequests: the lowest-ranked device subrequests are dropped (with a
warning) so that the selector-free one, when there is one, stays last.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from docker_variant import vendors
from docker_variant.errors import InvalidInputError
from docker_variant.k8s.cel import (
    MAX_EXPRESSION_BYTES,
    MAX_SELECTORS,
    MAX_VALUES_PER_FEATURE,
    feature_selector,
)
from docker_variant.variant import NULL_LABEL, Variant, VariantIndex, select
from docker_variant.variant.virtual import virtual_host

__all__ = [
    "ANNOTATION_PREFIX",
    "DEFAULT_DEVICE_CLASS",
    "MAX_COUNT",
    "MAX_SUBREQUESTS",
    "REQUEST_NAME",
    "ClaimPlan",
    "Subrequest",
    "check_dns_subdomain",
    "claim_template",
    "cli_selectors",
    "dns_label",
    "dns_subdomain",
    "plan_claim",
    "selectors_of",
]

API_VERSION = "resource.k8s.io/v1"
REQUEST_NAME = "gpu"
MAX_SUBREQUESTS = 8  # resource.k8s.io FirstAvailableDeviceRequestMaxSize
MAX_COUNT = 32  # resource.k8s.io AllocationResultsMaxSize: devices per claim
ANNOTATION_PREFIX = "variant.pep817.dev"
# The first registered vendor with a DRA driver (NVIDIA's): ``--device-class`` names the
# class of its subrequests, and a claim no variant asks anything of a device of takes its
# devices.
DEFAULT_VENDOR, DEFAULT_DEVICE_CLASS = next(
    (vendor.namespace, vendor.dra.device_class) for vendor in vendors.registered() if vendor.dra
)


_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_LABEL_MAX = 63
_DNS_SUBDOMAIN_MAX = 253


# --------------------------------------------------------------------------- names


def dns_label(text: str, fallback: str) -> str:
    """``text`` as an RFC 1123 label: lowercase, ``-`` for anything else, at most 63 characters."""
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    label = label[:_DNS_LABEL_MAX].rstrip("-")
    return label or fallback


def dns_subdomain(text: str, fallback: str) -> str:
    """``text`` as an RFC 1123 subdomain (dot-separated labels, at most 253 characters)."""
    labels = [dns_label(part, "") for part in text.lower().split(".")]
    name = ".".join(label for label in labels if label)
    while len(name) > _DNS_SUBDOMAIN_MAX:
        name = name[:_DNS_SUBDOMAIN_MAX].rstrip("-.")
    return name or fallback


def check_dns_subdomain(name: str, what: str) -> str:
    labels = name.split(".")
    if len(name) > _DNS_SUBDOMAIN_MAX or not all(
        _DNS_LABEL_RE.fullmatch(label) for label in labels
    ):
        raise InvalidInputError(
            f"{what} {name!r} is not a DNS subdomain: lowercase letters, digits, '-' and '.', "
            f"each dot-separated part starting and ending with a letter or digit, at most "
            f"{_DNS_SUBDOMAIN_MAX} characters"
        )
    return name


def _unique(name: str, taken: set[str]) -> str:
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        suffix = f"-{number}"
        candidate = name[: _DNS_LABEL_MAX - len(suffix)].rstrip("-") + suffix
    taken.add(candidate)
    return candidate


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Subrequest:
    """One ``firstAvailable`` entry."""

    name: str
    members: tuple[str | None, ...]  # the variant labels it stands for; None is the bare image
    selectors: tuple[str, ...] = ()  # CEL expressions, all must hold; none: any device
    vendor: str = DEFAULT_VENDOR  # the namespace whose DRA driver's devices it asks for
    tags: tuple[str, ...] = ()  # the image tag of each member, in the same order


@dataclass(frozen=True)
class ClaimPlan:
    subrequests: tuple[Subrequest, ...]
    warnings: tuple[str, ...] = ()
    #: labels with no subrequest, each with the reason (left out, cut, fits no device)
    left_out: dict[str, str] = field(default_factory=dict)
    partitions: bool = False  # devices may be GPU partitions (``--amd-partitions``)


def _names(labels: Iterable[str | None]) -> str:
    return ", ".join("the bare image" if label is None else label for label in labels)


@dataclass
class _Entry:
    vendor: str
    selectors: tuple[str, ...]
    members: list[str | None]
    tags: list[str]


def _device_selectors(
    variant: Variant, warnings: list[str]
) -> tuple[str | None, tuple[str, ...]] | str:
    """``(vendor, selectors)`` of the variant (``(None, ())``: it asks nothing of a device),
    or why it cannot be asked of a device."""
    accelerators = [ns for ns in variant.namespaces if ns not in vendors.CPU_NAMESPACES]
    if not accelerators:
        return None, ()
    if len(accelerators) > 1:
        return f"it asks for devices of {' and '.join(accelerators)} at once"
    namespace = accelerators[0]
    dra = vendors.for_namespace(namespace).dra
    if dra is None:
        drivers = ", ".join(v.dra.device_class for v in vendors.registered() if v.dra)
        return (
            f"{namespace} properties are not the device attributes of a DRA driver "
            f"({drivers}) nor CPU properties"
        )
    selectors: list[str] = []
    for feature, values in variant.properties[namespace].items():
        if dra.guard(feature) is None:
            return f"{namespace} :: {feature} is not an attribute of {dra.device_class} devices"
        selector = feature_selector(feature, values, namespace)
        if selector.left_out:
            warnings.append(
                f"variant {variant.label}: the selector keeps the {MAX_VALUES_PER_FEATURE} "
                f"newest values of {namespace} :: {feature}; left out "
                f"{', '.join(selector.left_out)}"
            )
        if selector.expression is None:
            return (
                f"no {dra.device_class} device can have "
                f"{namespace} :: {feature} :: {','.join(values)}"
            )
        selectors.append(selector.expression)
    return namespace, tuple(selectors)


def plan_claim(
    index: VariantIndex, max_subrequests: int = MAX_SUBREQUESTS, *, partitions: bool = False
) -> ClaimPlan:
    """The subrequests for ``index``, best first; see the module docstring for the rules.
    ``partitions``: AMD subrequests take GPU partitions as well as whole GPUs."""
    selection = select(index, virtual_host(index))
    assert not any(c.kind != "invalid" for c in selection.rejected), "virtual host rejects"
    warnings: list[str] = []
    left_out: dict[str, str] = {}
    device: list[_Entry] = []
    by_selectors: dict[tuple[str, tuple[str, ...]], _Entry] = {}
    anywhere: list[str | None] = []  # run with any device: CPU-only variants, null, bare
    anywhere_tags: list[str] = []
    for candidate in selection.ranked:
        variant = candidate.variant
        if candidate.kind == "bare" or variant is None or variant.is_null:
            anywhere.append(candidate.label)
            anywhere_tags.append(candidate.tag)
            continue
        outcome = _device_selectors(variant, warnings)
        if isinstance(outcome, str):
            left_out[variant.label] = outcome
            continue
        vendor, selectors = outcome
        if vendor is None or not selectors:
            anywhere.append(variant.label)
            anywhere_tags.append(candidate.tag)
        elif (vendor, selectors) in by_selectors:
            by_selectors[(vendor, selectors)].members.append(variant.label)
            by_selectors[(vendor, selectors)].tags.append(candidate.tag)
        else:
            entry = _Entry(vendor, selectors, [variant.label], [candidate.tag])
            by_selectors[(vendor, selectors)] = entry
            device.append(entry)
    if left_out:
        warnings.append(
            "left out " + "; ".join(f"{label} ({why})" for label, why in left_out.items())
        )
    device = _within_limit(device, max_subrequests, bool(anywhere), left_out, warnings)
    taken: set[str] = set()
    subrequests = [
        Subrequest(
            _unique(dns_label(str(e.members[0]), "variant"), taken),
            tuple(e.members),
            _kind_selectors(e.vendor, partitions) + e.selectors,
            e.vendor,
            tuple(e.tags),
        )
        for e in device
    ]
    if anywhere:
        # any device of the class the best device subrequest asks for
        vendor = device[0].vendor if device else DEFAULT_VENDOR
        if not device:
            warnings.append(
                "no variant asks anything of a device (CPU-only, null or bare): the claim "
                f"takes any {vendor} device"
            )
        subrequests.append(
            Subrequest(
                _unique(_fallback_name(anywhere), taken),
                tuple(anywhere),
                _kind_selectors(vendor, partitions),
                vendor,
                tuple(anywhere_tags),
            )
        )
    for sub in subrequests:
        _check_limits(sub)
    return ClaimPlan(tuple(subrequests), tuple(warnings), left_out, partitions)


def _within_limit(
    device: list[_Entry],
    max_subrequests: int,
    anywhere: bool,
    left_out: dict[str, str],
    warnings: list[str],
) -> list[_Entry]:
    """The device subrequests that fit beside the selector-free one (when ``anywhere``):
    the lowest-ranked are dropped, with a warning and the reason of each label."""
    room = max_subrequests - (1 if anywhere else 0)
    if len(device) <= room:
        return device
    dropped = [label for entry in device[room:] for label in entry.members]
    for label in dropped:
        if label is not None:
            left_out[label] = f"beyond the {max_subrequests} subrequests DRA allows"
    fallback = " (the last, selector-free subrequest still takes any device)" if anywhere else ""
    warnings.append(
        f"DRA allows at most {max_subrequests} subrequests: left out the lowest-ranked "
        f"{_names(dropped)}{fallback}"
    )
    return device[:room]


def _kind_selectors(vendor: str, partitions: bool) -> tuple[str, ...]:
    """The vendor's device-kind selector, first (the cheapest test), where it has one."""
    dra = vendors.for_namespace(vendor).dra
    if dra is None or dra.kind_selector is None:
        return ()
    return (dra.kind_selector(partitions),)


def selectors_of(plan: ClaimPlan) -> tuple[str, ...]:
    """Every CEL expression ``claim_template(plan, ...)`` writes, each once, in order."""
    return tuple(dict.fromkeys(e for sub in plan.subrequests for e in sub.selectors))


def cli_selectors(index: VariantIndex) -> tuple[str, ...]:
    """Every CEL expression ``k8s claim`` can write for ``index``: with and without
    ``--amd-partitions`` (``--count``, ``--name`` and ``--device-class`` change none)."""
    return tuple(
        dict.fromkeys(
            selectors_of(plan_claim(index)) + selectors_of(plan_claim(index, partitions=True))
        )
    )


def _fallback_name(members: Sequence[str | None]) -> str:
    """Named for the variant that runs on any host: ``null``, else the bare image, else the
    best CPU-only variant (which still needs a matching node CPU)."""
    if NULL_LABEL in members:
        return NULL_LABEL
    if None in members:
        return "bare"
    return dns_label(str(members[0]), "variant")


def _check_limits(sub: Subrequest) -> None:
    if len(sub.selectors) > MAX_SELECTORS:
        raise InvalidInputError(
            f"subrequest {sub.name}: {len(sub.selectors)} selectors; DRA allows {MAX_SELECTORS}"
        )
    for expression in sub.selectors:
        size = len(expression.encode())
        if size > MAX_EXPRESSION_BYTES:
            raise InvalidInputError(
                f"subrequest {sub.name}: a CEL expression of {size} bytes; DRA allows "
                f"{MAX_EXPRESSION_BYTES}"
            )


# --------------------------------------------------------------------------- manifest


def claim_template(
    plan: ClaimPlan,
    *,
    name: str,
    count: int,
    device_class: str = DEFAULT_DEVICE_CLASS,
    source: str | None = None,
) -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` ``ResourceClaimTemplate`` for ``plan``. ``device_class``
    is the class of the NVIDIA subrequests (e.g. ``mig.nvidia.com``); other vendors'
    subrequests ask their vendor's class."""
    if not 1 <= count <= MAX_COUNT:
        raise InvalidInputError(f"--count {count}: a claim takes 1 to {MAX_COUNT} devices")
    check_dns_subdomain(name, "claim template name")
    check_dns_subdomain(device_class, "device class")
    if not plan.subrequests:
        raise InvalidInputError("the claim has no subrequest")
    first_available: list[dict[str, Any]] = []
    for sub in plan.subrequests:
        entry: dict[str, Any] = {
            "name": sub.name,
            "deviceClassName": _device_class(sub.vendor, device_class),
            "count": count,
        }
        if sub.selectors:
            entry["selectors"] = [{"cel": {"expression": e}} for e in sub.selectors]
        first_available.append(entry)
    devices: dict[str, Any] = {
        "requests": [{"name": REQUEST_NAME, "firstAvailable": first_available}]
    }
    if count > 1:
        # Every device of the claim the same product: one variant fits all of them. One
        # constraint per vendor, on that vendor's subrequests: a device lacking the
        # attribute would fail another vendor's constraint.
        by_vendor: dict[str, list[str]] = {}
        for sub in plan.subrequests:
            by_vendor.setdefault(sub.vendor, []).append(f"{REQUEST_NAME}/{sub.name}")
        constraints: list[dict[str, Any]] = []
        for vendor, names in by_vendor.items():
            # one vendor: the whole request (shorter, and the same devices)
            requests = [REQUEST_NAME] if len(by_vendor) == 1 else names
            for attribute in _homogeneous(vendor, plan.partitions):
                constraints.append({"requests": requests, "matchAttribute": attribute})
        devices["constraints"] = constraints
    annotations = {
        f"{ANNOTATION_PREFIX}/subrequests": _compact(
            {sub.name: list(sub.members) for sub in plan.subrequests}
        ),
        f"{ANNOTATION_PREFIX}/tags": _compact(
            {sub.name: list(sub.tags) for sub in plan.subrequests}
        ),
    }
    if source:
        annotations[f"{ANNOTATION_PREFIX}/source"] = source
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "annotations": annotations},
        # The ResourceClaim controller copies spec.metadata (labels and annotations only)
        # into each claim it creates: there the mapping sits beside the allocation result.
        "spec": {"metadata": {"annotations": dict(annotations)}, "spec": {"devices": devices}},
    }


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _device_class(vendor: str, default_class: str) -> str:
    if vendor == DEFAULT_VENDOR:
        return default_class
    dra = vendors.for_namespace(vendor).dra
    assert dra is not None, "a subrequest's vendor has a DRA mapping"
    return dra.device_class


def _homogeneous(vendor: str, partitions: bool) -> list[str]:
    """The attributes a claim's devices of ``vendor`` share: the product and, where
    partitions may be taken, the kind (all whole GPUs, or all partitions)."""
    dra = vendors.for_namespace(vendor).dra
    assert dra is not None, "a subrequest's vendor has a DRA mapping"
    attributes = [dra.homogeneous_attribute]
    if partitions and dra.kind_attribute is not None:
        attributes.append(dra.kind_attribute)
    return attributes
