"""From findings to variant properties, and labels checked against findings.

The providers' rules come from ``vendors`` (what a value promises, what code runs where);
this module applies them to what the binaries hold:

- A host of compute capability M.m supports ``sm_arch`` values ``Mm_real`` ... ``M0_real`` and
  ``M0_virtual``. So a value ``XY_real`` or ``X0_virtual`` promises that the image runs on a
  device of capability X.Y (the least capable host that value admits).
- A cubin for ``sm_XY`` runs on capability X.Z with Z >= Y (same major); PTX for
  ``compute_XY`` is JIT-compiled on any capability >= X.Y. An image runs on a device when every
  ELF with fatbins has code for it.
- Proposed: ``XY_real`` for each cubin ``sm_XY``, ``X0_virtual`` for PTX ``compute_X0`` and
  ``XY_real`` for PTX ``compute_XY`` with Y > 0 (no host ever lists ``XY_virtual`` for Y > 0),
  each kept only where every fatbin ELF runs. PTX reaching newer majors is not proposed: the
  provider lists only a host's own major.
- ``cuda_version_lower_bound``: the bundled runtime's ``major.minor``. A label's bound below
  the runtime's major is refused (a 12.x runtime never runs on an 11.x driver); below its minor
  it is a warning (CUDA minor-version compatibility).
- ``x86_64 :: level``: the highest ``GNU_PROPERTY_X86_ISA_1_NEEDED`` level of the image's
  x86-64 ELFs (libraries under ``glibc-hwcaps/`` are optional and left out). Binaries without
  the note are unknown, never baseline; ``v1`` is not proposed (every x86-64 host has it).
- ``amd :: gfx_arch``: the gfx targets every offload bundle has (a code object runs only on
  its own target, ``vendors.amd``); a label naming a target some bundle lacks is refused;
  ``amd :: rocm_version``: ROCm's ``major.minor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from docker_variant.contents.evidence import (
    CUDA_RUNTIME,
    FATBIN,
    OFFLOAD,
    ROCM_VERSION,
    X86_ISA,
    Finding,
    arch_text,
)
from docker_variant.contents.walker import ImageContents
from docker_variant.errors import InvalidInputError
from docker_variant.variant.labels import read_labels
from docker_variant.variant.model import NULL_LABEL, Property, Variant
from docker_variant.vendors import amd, cpu, nvidia

__all__ = ["Proposal", "Verdict", "propose", "runs_on", "verify"]

Arch = nvidia.Arch


@dataclass(frozen=True)
class Proposal:
    properties: tuple[Property, ...]
    # the image's own label where it has one and there is something to propose; else one
    # made from the properties; ``null`` when nothing is proposed
    label: str
    notes: tuple[str, ...] = ()


@dataclass
class Verdict:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # the properties that were checked


def runs_on(fatbin: Finding, device: Arch) -> bool:
    """Whether the ELF's fatbins have code that a device of capability ``device`` runs."""
    if any(nvidia.cubin_runs_on(cubin, device) for cubin in fatbin.cubins):
        return True
    return any(nvidia.ptx_runs_on(ptx, device) for ptx in fatbin.ptx)


def _sm_values(fatbins: list[Finding]) -> list[str]:
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


def _runtime(contents: ImageContents) -> Finding | None:
    runtimes = [f for f in contents.of_kind(CUDA_RUNTIME) if len(f.version) >= 2]
    return max(runtimes, key=lambda f: f.version[:2], default=None)


def _needed_levels(contents: ImageContents) -> list[Finding]:
    return [f for f in contents.of_kind(X86_ISA) if "/glibc-hwcaps/" not in f.path]


def _gfx_common(bundles: list[Finding]) -> list[str]:
    sets = [set(f.targets) for f in bundles if f.targets]
    return sorted(set.intersection(*sets)) if sets else []


def propose(contents: ImageContents, labels: Mapping[str, str] | None = None) -> Proposal:
    """The properties the binaries support, in the providers' terms."""
    props: list[Property] = []
    notes: list[str] = []
    runtime = _runtime(contents)
    if runtime is not None:
        major, minor = runtime.version[:2]
        props.append(Property("nvidia", "cuda_version_lower_bound", f"{major}.{minor}"))
    fatbins = contents.of_kind(FATBIN)
    sm_values = _sm_values(fatbins)
    props.extend(Property("nvidia", "sm_arch", v) for v in sm_values)
    if fatbins and not sm_values:
        notes.append("no GPU architecture is common to every ELF with fatbins")
    needed = _needed_levels(contents)
    level = max((f.level for f in needed), default=0)
    if level > 1:
        props.append(Property("x86_64", "level", f"v{level}"))
    bundles = contents.of_kind(OFFLOAD)
    props.extend(Property("amd", "gfx_arch", t) for t in _gfx_common(bundles))
    rocm = contents.of_kind(ROCM_VERSION)
    if rocm:
        best = max(rocm, key=lambda f: f.version[:2])
        if len(best.version) >= 2:
            props.append(Property("amd", "rocm_version", f"{best.version[0]}.{best.version[1]}"))
    try:
        existing = read_labels(labels).variant if labels else None
    except InvalidInputError:  # labels to be replaced: propose a label of its own
        existing = None
    label = _label_for(props)
    if existing is not None and props and existing.label != NULL_LABEL:
        label = existing.label
    return Proposal(tuple(props), label, tuple(notes))


def _label_for(props: list[Property]) -> str:
    """``cu128``, ``v3``, ``rocm62``, ``cu128_v3``; ``null`` for none."""
    parts: list[str] = []
    for prop in props:
        if prop.feature == "cuda_version_lower_bound":
            parts.append("cu" + prop.value.replace(".", ""))
        elif prop.feature == "rocm_version":
            parts.append("rocm" + prop.value.replace(".", ""))
        elif prop.namespace == "x86_64" and prop.feature == "level":
            parts.append(prop.value)
    if not parts and any(p.feature == "sm_arch" for p in props):
        parts.append("cuda")
    return "_".join(parts) or "null"


def _version_of(value: str) -> tuple[int, int] | None:
    cuda = nvidia.cuda_value(value)
    return None if cuda is None else (cuda[0], cuda[1])


def verify(contents: ImageContents, variant: Variant | None) -> Verdict:
    """Whether the labels of ``variant`` promise only what the binaries deliver."""
    verdict = Verdict()
    if variant is None:
        return verdict
    features = variant.properties
    fatbins = contents.of_kind(FATBIN)
    for value in features.get("nvidia", {}).get("sm_arch", ()):
        device = nvidia.least_device(value)
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
    runtime = _runtime(contents)
    for value in features.get("nvidia", {}).get("cuda_version_lower_bound", ()):
        bound = _version_of(value)
        if bound is None or runtime is None:
            continue
        verdict.checked.append(f"nvidia :: cuda_version_lower_bound :: {value}")
        have = ".".join(map(str, runtime.version))
        evidence = f"{runtime.path} ({runtime.section}: {have})"
        if bound[0] < runtime.version[0]:
            verdict.errors.append(
                f"nvidia :: cuda_version_lower_bound :: {value} admits CUDA {bound[0]}.x drivers, "
                f"but the image bundles the CUDA {runtime.version[0]}.{runtime.version[1]} "
                f"runtime, {evidence}, which needs a driver of major {runtime.version[0]}"
            )
        elif bound[0] == runtime.version[0] and bound[1] < runtime.version[1]:
            verdict.warnings.append(
                f"nvidia :: cuda_version_lower_bound :: {value} is below the bundled CUDA "
                f"{runtime.version[0]}.{runtime.version[1]} runtime ({evidence}): it relies on "
                "CUDA minor-version compatibility, which runs the runtime on an older driver of "
                "the same major, but not features that need a newer driver, and the older "
                "driver cannot JIT PTX newer than itself"
            )
    needed = _needed_levels(contents)
    for value in features.get("x86_64", {}).get("level", ()):
        if not needed or cpu.X86_64.values["level"].pattern.fullmatch(value) is None:
            continue
        verdict.checked.append(f"x86_64 :: level :: {value}")
        top = max(needed, key=lambda f: f.level)
        if int(value[1]) < top.level:
            verdict.errors.append(
                f"x86_64 :: level :: {value} admits CPUs below what {top.path} needs: its "
                f"{top.section} says x86 ISA needed: {top.value} (v{top.level})"
            )
    bundles = [f for f in contents.of_kind(OFFLOAD) if f.targets]
    for value in features.get("amd", {}).get("gfx_arch", ()):
        if not bundles or amd.gfx_value(value) is None:
            continue
        verdict.checked.append(f"amd :: gfx_arch :: {value}")
        for bundle in bundles:
            if value not in bundle.targets:
                verdict.errors.append(
                    f"amd :: gfx_arch :: {value}: {bundle.path} ({bundle.section}) has code "
                    f"objects for {', '.join(bundle.targets)} only"
                )
    return verdict
