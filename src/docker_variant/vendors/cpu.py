"""CPU namespaces (``x86_64``, ``aarch64``): the wheelnext CPU plugins' rules.

The plugins' flag lists change between releases, so their features are not checked; only
the x86-64 microarchitecture level has a fixed form. CPU namespaces describe a node, not a
device: they rank after accelerator namespaces when no image states an order, and a DRA
claim leaves them out of its device selectors. The CPU plugins are asked by
``providers.cpu``, not by a vendor detector.

``x86_64 :: level`` from the binaries: the highest ``GNU_PROPERTY_X86_ISA_1_NEEDED`` level of
the image's x86-64 ELFs (libraries under ``glibc-hwcaps/`` are optional and left out).
Binaries without the note are unknown, never baseline; ``v1`` is not proposed (every x86-64
host has it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from docker_variant.vendors.base import NamespaceRules, ValueRule
from docker_variant.vendors.evidence import X86_ISA, Evidence, ImageEvidence, Proposed, Verdict
from docker_variant.vendors.vendor import ContentsRules, Interval, Threshold, Vendor

__all__ = ["AARCH64", "AARCH64_VENDOR", "CPU_NAMESPACES", "X86_64", "X86_64_VENDOR"]

_LEVEL = ValueRule(re.compile(r"v[1-4]"), "a microarchitecture level v1, v2, v3 or v4")
X86_64 = NamespaceRules(
    "x86_64",
    None,
    values={"level": _LEVEL},
    provider=("provider-variant-x86-64", "provider_variant_x86_64.plugin:X8664Plugin"),
)
AARCH64 = NamespaceRules(
    "aarch64",
    None,
    provider=("provider-variant-aarch64", "provider_variant_aarch64.plugin:AArch64Plugin"),
)
CPU_NAMESPACES = frozenset({X86_64.namespace, AARCH64.namespace})

# Features in the order the plugins list them first.
FEATURE_ORDER = {"x86_64": ("level",), "aarch64": ("version",)}


def _needed_levels(evidence: ImageEvidence) -> list[Evidence]:
    return [f for f in evidence.of_kind(X86_ISA) if "/glibc-hwcaps/" not in f.path]


def propose_level(evidence: ImageEvidence) -> Proposed:
    level = max((f.level for f in _needed_levels(evidence)), default=0)
    return Proposed((("level", f"v{level}"),) if level > 1 else ())


def verify_level(
    evidence: ImageEvidence, features: Mapping[str, Sequence[str]], verdict: Verdict
) -> None:
    """A level below what some ELF needs is refused."""
    needed = _needed_levels(evidence)
    for value in features.get("level", ()):
        if not needed or _LEVEL.pattern.fullmatch(value) is None:
            continue
        verdict.checked.append(f"x86_64 :: level :: {value}")
        top = max(needed, key=lambda f: f.level)
        if int(value[1]) < top.level:
            verdict.errors.append(
                f"x86_64 :: level :: {value} admits CPUs below what {top.path} needs: its "
                f"{top.section} says x86 ISA needed: {top.value} (v{top.level})"
            )


def _level_part(feature: str, value: str) -> str | None:
    return value if feature == "level" else None  # ``v3``


def _level_number(value: str) -> int | None:
    """``v3`` -> 3: a host of level k lists ``vk`` down to ``v1``."""
    match = re.fullmatch(r"v([1-9][0-9]{0,2})", value)
    return None if match is None else int(match[1])


def _levels(level: int) -> list[str]:
    return [f"v{k}" for k in range(level, 0, -1)]


def _level_interval(value: str) -> Interval | None:
    level = _level_number(value)
    return None if level is None else (level, None)


X86_64_VENDOR = Vendor(
    X86_64,
    contents=ContentsRules(frozenset({"level"}), propose_level, verify_level, _level_part),
    device=False,
    list_shapes={"level": Threshold(_levels, _level_number, _level_interval, highest=True)},
)
AARCH64_VENDOR = Vendor(AARCH64, device=False)
