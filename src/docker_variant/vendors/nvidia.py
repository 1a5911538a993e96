"""NVIDIA: the ``nvidia`` namespace's rules, everywhere they are asked.

The features and values are the wheelnext NVIDIA provider's, so that a variant image is
chosen the way pip/uv choose a variant wheel on the same host:

- ``cuda_version_lower_bound :: v`` (needs CUDA >= v): a driver of CUDA D lists every
  v <= D, newest first, over majors 15..11 and minors 20..0, each major followed by its bare
  major (``12`` is 12.0);
- ``cuda_version_upper_bound :: v`` (needs CUDA < v): every v > D from ``15.20`` down;
- ``sm_arch`` (multi-value): a GPU of compute capability M.m lists ``Mm_real`` ...
  ``M0_real``, then ``M0_virtual``.

What code runs where (for checking an image's binaries against its labels): a cubin for
sm_XY runs on capability X.Z with Z >= Y (same major); PTX for compute_XY is JIT-compiled on
any capability >= X.Y. So ``propose`` offers ``XY_real`` (or ``X0_virtual``) values every
ELF with fatbins runs, and the bundled runtime's version as ``cuda_version_lower_bound``;
``verify`` refuses an ``sm_arch`` value whose least device some fatbin has no code for, and a
lower bound below the runtime's major (below its minor is a warning).

The NVIDIA DRA driver (``gpu.nvidia.com``) publishes ``cudaDriverVersion`` (e.g. ``12.8.0``)
and ``cudaComputeCapability`` (e.g. ``9.0.0``) on every GPU: ``dra_clause`` maps one value
onto them, so a device passes a variant's selectors exactly when a host with that device and
driver lists every feature the variant names.

Every number is read through a bounded pattern (``numbers.DIGITS``): a value of thousands
of digits is refused as bad input, never turned into an int.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import partial

from docker_variant.numtext import DIGITS
from docker_variant.vendors.base import (
    DraMapping,
    NamespaceRules,
    ValueRule,
    clauses_in_order,
    shown,
)
from docker_variant.vendors.evidence import (
    CUDA_RUNTIME,
    FATBIN,
    Evidence,
    ImageEvidence,
    Proposed,
    Verdict,
)
from docker_variant.vendors.vendor import (
    ContentsRules,
    Described,
    Detector,
    Interval,
    ListShape,
    PerMajor,
    Threshold,
    Vendor,
)

__all__ = [
    "DRA_DOMAIN",
    "FEATURES",
    "HOMOGENEOUS_ATTRIBUTE",
    "NAMESPACE",
    "RULES",
    "VENDOR",
    "Arch",
    "arch_text",
    "capability_of",
    "cubin_runs_on",
    "cuda_lower_bounds",
    "cuda_upper_bounds",
    "cuda_value",
    "describe",
    "device_runs",
    "dra_clause",
    "dra_clauses",
    "dra_guard",
    "driver_branch",
    "least_device",
    "newest_first",
    "product_name",
    "propose",
    "ptx_runs_on",
    "runs_on",
    "sm_arch_value",
    "sm_arch_values",
    "supported_features",
    "verify",
]

NAMESPACE = "nvidia"
FEATURES = ("cuda_version_lower_bound", "cuda_version_upper_bound", "sm_arch")
Arch = tuple[int, int]

# The wheelnext provider's catalogue: CUDA majors 15..11 with minors 20..0.
MAJORS = range(11, 16)
MINORS = range(21)
MAX_MAJOR, MIN_MAJOR, MAX_MINOR = max(MAJORS), min(MAJORS), max(MINORS)
MIN_SM: Arch = (5, 0)  # wheelnext omits sm_arch below Maxwell

_NUMBER = r"(0|[1-9][0-9]{0,8})"  # as the provider writes numbers: no leading zeros, bounded
_CUDA_RE = re.compile(rf"{_NUMBER}(?:\.{_NUMBER})?")
_SM_RE = re.compile(r"([1-9][0-9]{0,7})([0-9])_(real|virtual)")
_CUDA_RULE = ValueRule(re.compile(rf"{DIGITS}(\.{DIGITS})?"), "a CUDA version such as 12.8 or 13")
_SM_RULE = ValueRule(
    re.compile(rf"{DIGITS}_(real|virtual)"), "an architecture such as 90_real or 90_virtual"
)

# REFERENCE: compute capability -> products.
_PRODUCTS: dict[Arch, str] = {
    (7, 0): "V100",
    (7, 5): "T4",
    (8, 0): "A100",
    (8, 6): "A10, A40, RTX 30",
    (8, 9): "L4, L40S, RTX 40",
    (9, 0): "H100, H200, GH200",
    (10, 0): "B200, GB200",
    (10, 3): "B300, GB300",
    (12, 0): "RTX 50, RTX PRO 6000",
}
# A driver branch's highest CUDA version.
_BRANCHES = {
    (12, 2): "R535",
    (12, 4): "R550",
    (12, 6): "R560",
    (12, 8): "R570",
    (12, 9): "R575",
    (13, 0): "R580",
}


# --------------------------------------------------------------------------- values


def cuda_value(value: str) -> tuple[int, int, bool] | None:
    """``"12.8"`` -> (12, 8, True); ``"12"`` -> (12, 0, False): a bare major means major.0."""
    match = _CUDA_RE.fullmatch(value)
    if match is None:
        return None
    return int(match[1]), int(match[2] or 0), match[2] is not None


def sm_arch_value(value: str) -> tuple[int, int, bool] | None:
    """``"90_real"`` -> (9, 0, True); ``"120_virtual"`` -> (12, 0, False)."""
    match = _SM_RE.fullmatch(value)
    if match is None:
        return None
    return int(match[1]), int(match[2]), match[3] == "real"


def _order_key(feature: str, value: str) -> tuple[int, ...] | None:
    """Newest first: CUDA versions numerically, ``12.0`` before the bare ``12``; ``sm_arch``
    by major, then ``real`` before ``virtual``, then minor (``100_real, 90_real, 90_virtual,
    89_real``)."""
    if feature == "sm_arch":
        sm = sm_arch_value(value)
        return None if sm is None else (sm[0], int(sm[2]), sm[1])
    if feature in ("cuda_version_lower_bound", "cuda_version_upper_bound"):
        cuda = cuda_value(value)
        return None if cuda is None else (cuda[0], cuda[1], int(cuda[2]))
    return None


# --------------------------------------------------------------------------- host lists


def _text(major: int, minor: int | None) -> str:
    return f"{major}" if minor is None else f"{major}.{minor}"


def cuda_lower_bounds(cuda: tuple[int, int]) -> list[str]:
    """Every ``v <= cuda``, newest first; a bare major follows its minors (``"12"`` is 12.0)."""
    major, minor = cuda
    values: list[str] = []
    # Same loop bounds as wheelnext, so forced versions outside 11..15 behave identically.
    for m in range(major, MIN_MAJOR - 1, -1):
        top = minor if m == major else MAX_MINOR
        values.extend(_text(m, n) for n in range(top, -1, -1))
        values.append(_text(m, None))
    return values


def cuda_upper_bounds(cuda: tuple[int, int]) -> list[str]:
    """Every ``v > cuda`` from ``"15.20"`` down; no bare ``major`` of ``cuda`` (it means major.0)."""
    major, minor = cuda
    values: list[str] = []
    for m in range(MAX_MAJOR, major - 1, -1):
        if m > major:
            values.extend(_text(m, n) for n in range(MAX_MINOR, -1, -1))
            values.append(_text(m, None))
        else:
            values.extend(_text(m, n) for n in range(MAX_MINOR, minor, -1))
    return values


def sm_arch_values(cc: Arch) -> list[str]:
    """``Mm_real`` down to ``M0_real``, then ``M0_virtual`` (the CMake arch flags that run here)."""
    major, minor = cc
    return [*(f"{major}{n}_real" for n in range(minor, -1, -1)), f"{major}0_virtual"]


# How these lists are made, for node labels (``Vendor.list_shapes``): a driver of CUDA D as
# one integer D.major * 100 + D.minor (minors of a driver are well under 100), and a GPU's
# sm_arch list by its compute capability.
_CUDA_BASE = 100


def _cuda_number(value: str) -> tuple[int, int] | None:
    parsed = cuda_value(value)
    if parsed is None or parsed[1] >= _CUDA_BASE:
        return None
    return parsed[0], parsed[1]


def _lower_interval(value: str) -> Interval | None:
    """A driver of CUDA D lists ``v`` as a lower bound when 11 <= v.major and v <= D, and
    v.minor <= 20 unless v.major is D's."""
    cuda = _cuda_number(value)
    if cuda is None or cuda[0] < MIN_MAJOR:
        return None
    major, minor = cuda
    t = major * _CUDA_BASE + minor
    return (t, None) if minor <= MAX_MINOR else (t, major * _CUDA_BASE + _CUDA_BASE - 1)


def _lower_candidate(value: str) -> int | None:
    cuda = _cuda_number(value)
    return None if cuda is None else cuda[0] * _CUDA_BASE + cuda[1]


def _upper_interval(value: str) -> Interval | None:
    """A driver of CUDA D lists ``v`` as an upper bound when v > D, v.major <= 15 and
    v.minor <= 20 (a bare major is major.0)."""
    cuda = _cuda_number(value)
    if cuda is None or cuda[0] > MAX_MAJOR or cuda[1] > MAX_MINOR:
        return None
    return None, cuda[0] * _CUDA_BASE + cuda[1] - 1


def _upper_candidate(value: str) -> int | None:
    """The highest driver whose upper bounds begin at ``value``."""
    cuda = _cuda_number(value)
    if cuda is None:
        return None
    major, minor = cuda
    if minor > 0:
        return major * _CUDA_BASE + minor - 1
    return (major - 1) * _CUDA_BASE + MAX_MINOR if major > 0 else None


def _least_listing(value: str) -> Arch | None:
    """The least GPU whose ``sm_arch`` list holds ``value``; none lists ``Mm_virtual`` but
    for ``m == 0``."""
    sm = sm_arch_value(value)
    if sm is None or (not sm[2] and sm[1] != 0):
        return None
    return sm[0], sm[1]


LIST_SHAPES: dict[str, ListShape] = {
    "cuda_version_lower_bound": Threshold(
        lambda t: cuda_lower_bounds(divmod(t, _CUDA_BASE)),
        _lower_candidate,
        _lower_interval,
        highest=True,
    ),
    "cuda_version_upper_bound": Threshold(
        lambda t: cuda_upper_bounds(divmod(t, _CUDA_BASE)),
        _upper_candidate,
        _upper_interval,
        highest=False,
    ),
    "sm_arch": PerMajor(
        sm_arch_values,
        _least_listing,
        "the list of a GPU (Mm_real down to M0_real, then M0_virtual)",
    ),
}


def supported_features(cuda: tuple[int, int] | None, cc: Arch | None) -> dict[str, list[str]]:
    """The namespace's lists for a driver of CUDA ``cuda`` and a GPU of capability ``cc``,
    in wheelnext's feature order; unknown inputs are left out."""
    features: dict[str, list[str]] = {}
    if cuda is not None:
        # wheelnext drops a bound whose list comes out empty (forced versions beyond 11..15).
        if lower := cuda_lower_bounds(cuda):
            features["cuda_version_lower_bound"] = lower
        if upper := cuda_upper_bounds(cuda):
            features["cuda_version_upper_bound"] = upper
    if cc is not None and cc >= MIN_SM:
        features["sm_arch"] = sm_arch_values(cc)
    return features


def device_runs(feature: str, value: str, cuda: tuple[int, int], cc: Arch) -> bool:
    """Whether a GPU of capability ``cc`` on a driver of CUDA ``cuda`` lists ``value``."""
    return value in supported_features(cuda, cc).get(feature, ())


# --------------------------------------------------------------------------- binaries


def cubin_runs_on(cubin: Arch, device: Arch) -> bool:
    """A cubin for sm_XY runs on capability X.Z with Z >= Y."""
    return cubin[0] == device[0] and cubin[1] <= device[1]


def ptx_runs_on(ptx: Arch, device: Arch) -> bool:
    """PTX for compute_XY is JIT-compiled on any capability >= X.Y."""
    return ptx <= device


def least_device(value: str) -> Arch | None:
    """The least capable GPU whose host lists the ``sm_arch`` value (``89_real`` -> 8.9)."""
    sm = sm_arch_value(value)
    return None if sm is None else (sm[0], sm[1])


# --------------------------------------------------------------------------- names


def product_name(cc: Arch) -> str | None:
    """The products of compute capability ``cc`` (``(9, 0)`` -> ``H100, H200, GH200``)."""
    return _PRODUCTS.get(cc)


def driver_branch(cuda: tuple[int, int]) -> str | None:
    """The driver branch whose highest CUDA version is ``cuda`` (``(12, 8)`` -> ``R570``)."""
    return _BRANCHES.get(cuda)


def capability_of(lists: Mapping[str, Sequence[str]]) -> Arch | None:
    """The compute capability a device's (or host's) ``nvidia`` lists describe."""
    for value in lists.get("sm_arch", ()):
        sm = sm_arch_value(value)
        if sm is not None and sm[2]:
            return sm[0], sm[1]
    return None


def describe(lists: Mapping[str, Sequence[str]]) -> Described:
    """What a device's ``nvidia`` lists say of it: ``sm 9.0 (H100, H200, GH200)`` and
    ``CUDA 12.8 (R570)``; an ``sm_arch`` value the rule cannot read is shown as it is."""
    product = None
    cc = capability_of(lists)
    if cc is not None:
        known = product_name(cc)
        product = f"sm {cc[0]}.{cc[1]}" + (f" ({known})" if known else "")
    elif real := [v for v in lists.get("sm_arch", ()) if v.endswith("_real")]:
        product = shown(real[0])
    driver = None
    if lower := lists.get("cuda_version_lower_bound", ()):
        cuda = cuda_value(lower[0])
        branch = driver_branch(cuda[:2]) if cuda is not None else None
        driver = f"CUDA {shown(lower[0])}" + (f" ({branch})" if branch else "")
    return Described(product, driver)


# --------------------------------------------------------------------------- DRA

DRA_DOMAIN = "gpu.nvidia.com"
_ATTRIBUTES = f'device.attributes["{DRA_DOMAIN}"]'
_CUDA_ATTRIBUTE = "cudaDriverVersion"
_CC_ATTRIBUTE = "cudaComputeCapability"
HOMOGENEOUS_ATTRIBUTE = f"{DRA_DOMAIN}/productName"
_GUARDS = {
    "cuda_version_lower_bound": _CUDA_ATTRIBUTE,
    "cuda_version_upper_bound": _CUDA_ATTRIBUTE,
    "sm_arch": _CC_ATTRIBUTE,
}


def _attribute(name: str) -> str:
    return f"{_ATTRIBUTES}.{name}"


def dra_guard(feature: str) -> str | None:
    """``has(...)`` on the attribute the feature reads; ``None``: no device attribute."""
    name = _GUARDS.get(feature)
    return None if name is None else f"has({_attribute(name)})"


def _sm_requirement(value: str) -> Arch | None:
    """(major, lowest minor) of the devices whose host lists ``value``; ``None``: none do."""
    sm = sm_arch_value(value)
    if sm is None:
        return None
    major, minor, real = sm
    if not real and minor != 0:
        return None  # the provider only ever lists M0_virtual
    return major, minor


def dra_clauses(feature: str, values: Sequence[str], limit: int) -> tuple[list[str], list[str]]:
    """The alternatives (OR-ed) for one feature's values, newest first, at most ``limit``;
    and the values left out beyond it. ``sm_arch`` values of one major merge into one
    alternative, the lowest minor's: the same devices, said once."""
    ordered = newest_first(feature, values)
    if feature == "sm_arch":
        clauses: list[str] = []
        left_out: list[str] = []
        lowest: dict[int, int] = {}  # major -> lowest minor, majors newest first
        for value in ordered:
            requirement = _sm_requirement(value)
            if requirement is None:
                continue
            major, minor = requirement
            if major not in lowest and len(lowest) == limit:
                left_out.append(value)
                continue
            lowest[major] = min(minor, lowest.get(major, minor))
        cc = _attribute(_CC_ATTRIBUTE)
        for major, minor in lowest.items():
            if minor == 0:
                clauses.append(f"{cc}.major() == {major}")
            else:
                clauses.append(f"{cc}.major() == {major} && {cc}.minor() >= {minor}")
        return clauses, left_out
    return clauses_in_order(ordered, partial(dra_clause, feature), limit)


def dra_clause(feature: str, value: str) -> str | None:
    """One CUDA bound's condition on the device, or ``None`` if no host lists the value."""
    if feature not in ("cuda_version_lower_bound", "cuda_version_upper_bound"):
        return None
    cuda = cuda_value(value)
    if cuda is None:
        return None
    op = ">=" if feature == "cuda_version_lower_bound" else "<"
    semver = f'semver("{cuda[0]}.{cuda[1]}.0")'
    return f"{_attribute(_CUDA_ATTRIBUTE)}.compareTo({semver}) {op} 0"


def newest_first(feature: str, values: Sequence[str]) -> list[str]:
    return RULES.newest_first(feature, values)


DRA_TYPE_GPU = "gpu"  # the driver's ``type`` of a whole GPU (``mig`` for a MIG device)
_VERSION_RE = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})(?:\.[0-9]+)?(?:[-+].*)?")


def _major_minor(text: str | None) -> tuple[int, int] | None:
    match = None if text is None else _VERSION_RE.fullmatch(text)
    return None if match is None else (int(match[1]), int(match[2]))


def dra_device_lists(attributes: Mapping[str, str]) -> dict[str, list[str]] | None:
    """A ``gpu.nvidia.com`` device's lists, as the provider writes them for its CUDA driver
    (``cudaDriverVersion``) and compute capability (``cudaComputeCapability``); ``None``
    for what is not a whole GPU (a MIG device: the device class leaves it out)."""
    if attributes.get("type", DRA_TYPE_GPU) != DRA_TYPE_GPU:
        return None
    cuda = _major_minor(attributes.get(_CUDA_ATTRIBUTE))
    cc = _major_minor(attributes.get(_CC_ATTRIBUTE))
    return supported_features(cuda, cc)


# --------------------------------------------------------------------------- binaries


def arch_text(prefix: str, archs: tuple[Arch, ...]) -> str:
    """``sm_80, sm_90`` (``prefix`` ``sm``: cubins; ``compute``: PTX)."""
    return ", ".join(f"{prefix}_{a}{b}" for a, b in archs)


def runs_on(fatbin: Evidence, device: Arch) -> bool:
    """Whether the ELF's fatbins have code that a device of capability ``device`` runs."""
    if any(cubin_runs_on(cubin, device) for cubin in fatbin.cubins):
        return True
    return any(ptx_runs_on(ptx, device) for ptx in fatbin.ptx)


def _sm_values(fatbins: Sequence[Evidence]) -> list[str]:
    """``XY_real`` for each cubin ``sm_XY``, ``X0_virtual`` for PTX ``compute_X0`` and
    ``XY_real`` for PTX ``compute_XY`` with Y > 0 (no host lists ``XY_virtual`` for Y > 0),
    each kept only where every fatbin ELF runs; PTX reaching newer majors is not proposed:
    the provider lists only a host's own major."""
    candidates: dict[str, Arch] = {}
    for fatbin in fatbins:
        for a, b in fatbin.cubins:
            candidates[f"{a}{b}_real"] = (a, b)
        for a, b in fatbin.ptx:
            candidates[f"{a}{b}_virtual" if b == 0 else f"{a}{b}_real"] = (a, b)
    kept = [
        (arch, value)
        for value, arch in candidates.items()
        if all(runs_on(f, arch) for f in fatbins)
    ]
    # newest first; for one capability ``_real`` before ``_virtual``, as the provider lists them
    kept.sort(key=lambda item: (item[0], item[1].endswith("_real")), reverse=True)
    return [value for _, value in kept]


def _runtime(evidence: ImageEvidence) -> Evidence | None:
    runtimes = [f for f in evidence.of_kind(CUDA_RUNTIME) if len(f.version) >= 2]
    return max(runtimes, key=lambda f: f.version[:2], default=None)


def propose(evidence: ImageEvidence) -> Proposed:
    """The bundled runtime's ``major.minor`` as ``cuda_version_lower_bound``; the
    ``sm_arch`` values every ELF with fatbins runs on."""
    values: list[tuple[str, str]] = []
    runtime = _runtime(evidence)
    if runtime is not None:
        values.append(("cuda_version_lower_bound", f"{runtime.version[0]}.{runtime.version[1]}"))
    fatbins = evidence.of_kind(FATBIN)
    sm_values = _sm_values(fatbins)
    values.extend(("sm_arch", value) for value in sm_values)
    notes = ("no GPU architecture is common to every ELF with fatbins",)
    return Proposed(tuple(values), notes if fatbins and not sm_values else ())


def _verify_sm(evidence: ImageEvidence, values: Sequence[str], verdict: Verdict) -> None:
    """An ``sm_arch`` value promises the least capable device whose host lists it."""
    fatbins = evidence.of_kind(FATBIN)
    for value in values:
        device = least_device(value)
        if device is None or not fatbins:
            continue
        verdict.checked.append(f"nvidia :: sm_arch :: {value}")
        for fatbin in fatbins:
            if not runs_on(fatbin, device):
                verdict.errors.append(
                    f"nvidia :: sm_arch :: {value} promises capability {device[0]}.{device[1]}, "
                    f"but {fatbin.path} ({fatbin.section}) has cubin "
                    f"{arch_text('sm', fatbin.cubins) or '(none)'} and PTX "
                    f"{arch_text('compute', fatbin.ptx) or '(none)'}: no cubin sm_{device[0]}Y "
                    f"with Y <= {device[1]} nor PTX at or below compute_{device[0]}{device[1]}"
                )


def _verify_cuda(evidence: ImageEvidence, values: Sequence[str], verdict: Verdict) -> None:
    """A lower bound below the runtime's major is refused (a 12.x runtime never runs on an
    11.x driver); below its minor it is a warning (CUDA minor-version compatibility)."""
    runtime = _runtime(evidence)
    for value in values:
        bound = cuda_value(value)
        if bound is None or runtime is None:
            continue
        verdict.checked.append(f"nvidia :: cuda_version_lower_bound :: {value}")
        major, minor = runtime.version[:2]
        have = ".".join(map(str, runtime.version))
        evidence_text = f"{runtime.path} ({runtime.section}: {have})"
        if bound[0] < major:
            verdict.errors.append(
                f"nvidia :: cuda_version_lower_bound :: {value} admits CUDA {bound[0]}.x drivers, "
                f"but the image bundles the CUDA {major}.{minor} runtime, {evidence_text}, "
                f"which needs a driver of major {major}"
            )
        elif bound[0] == major and bound[1] < minor:
            verdict.warnings.append(
                f"nvidia :: cuda_version_lower_bound :: {value} is below the bundled CUDA "
                f"{major}.{minor} runtime ({evidence_text}): it relies on "
                "CUDA minor-version compatibility, which runs the runtime on an older driver of "
                "the same major, but not features that need a newer driver, and the older "
                "driver cannot JIT PTX newer than itself"
            )


def verify(
    evidence: ImageEvidence, features: Mapping[str, Sequence[str]], verdict: Verdict
) -> None:
    """Whether the ``nvidia`` labels promise only what the fatbins and the runtime deliver."""
    _verify_sm(evidence, features.get("sm_arch", ()), verdict)
    _verify_cuda(evidence, features.get("cuda_version_lower_bound", ()), verdict)


def label_part(feature: str, value: str) -> str | None:
    """``cu128`` for a CUDA lower bound of 12.8."""
    return "cu" + value.replace(".", "") if feature == "cuda_version_lower_bound" else None


RULES = NamespaceRules(
    NAMESPACE,
    FEATURES,
    multi_value=frozenset({"sm_arch"}),
    values={
        "cuda_version_lower_bound": _CUDA_RULE,
        "cuda_version_upper_bound": _CUDA_RULE,
        "sm_arch": _SM_RULE,
    },
    order_key=_order_key,
    dra=DraMapping(
        DRA_DOMAIN, HOMOGENEOUS_ATTRIBUTE, dra_guard, dra_clauses, device_lists=dra_device_lists
    ),
    provider=("nvidia-variant-provider", None),  # wheelnext's; its plugin API by name
)

VENDOR = Vendor(
    RULES,
    describe=describe,
    contents=ContentsRules(
        frozenset({"sm_arch", "cuda_version_lower_bound"}),
        propose,
        verify,
        label_part,
        bare_label="cuda",  # sm_arch alone: a CUDA build of no known runtime
    ),
    detector=Detector(
        "docker_variant.providers.nvidia:detect_host", "NVML / nvidia-smi", cached=True
    ),
    list_shapes=LIST_SHAPES,
)
