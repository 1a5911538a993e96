"""What a vendor reads of an image's binaries: the findings ``contents/`` extracts, as shapes.

``contents/`` reads ELF files, fatbins, offload bundles and version files into findings
(``contents.evidence.Finding``); a vendor's contents hooks (``vendors.vendor.ContentsRules``)
turn them into the properties the binaries support (``propose``) and check an image's labels
against them (``verify``). The hooks see the findings through the protocols here, so that
``vendors/`` stays below ``contents/``. The finding kinds are named here for the same reason;
``contents.evidence`` produces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "CUDA_RUNTIME",
    "ELF",
    "FATBIN",
    "OFFLOAD",
    "ROCM_VERSION",
    "X86_ISA",
    "Evidence",
    "ImageEvidence",
    "Proposed",
    "Verdict",
]

# finding kinds
ELF = "elf"  # every ELF: its machine (for counts; not shown one by one)
FATBIN = "fatbin"  # an ELF's CUDA fatbins: cubins and PTX
X86_ISA = "x86_isa_needed"  # an x86-64 ELF's GNU_PROPERTY_X86_ISA_1_NEEDED level
CUDA_RUNTIME = "cuda_runtime"  # a bundled CUDA runtime's version
ROCM_VERSION = "rocm_version"  # a bundled ROCm's version
OFFLOAD = "offload_bundle"  # an ELF's clang offload bundle: its gfx targets


class Evidence(Protocol):
    """One finding: ``path`` in the image, ``section`` (an ELF section, a file name rule),
    ``value`` as shown, and the parsed facts of its kind."""

    @property
    def kind(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def section(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def cubins(self) -> tuple[tuple[int, int], ...]: ...
    @property
    def ptx(self) -> tuple[tuple[int, int], ...]: ...
    @property
    def version(self) -> tuple[int, ...]: ...
    @property
    def level(self) -> int: ...
    @property
    def targets(self) -> tuple[str, ...]: ...


class ImageEvidence(Protocol):
    """An image's findings (``contents.walker.ImageContents``)."""

    def of_kind(self, *kinds: str) -> Sequence[Evidence]: ...


@dataclass(frozen=True)
class Proposed:
    """What a vendor's ``propose`` finds: ``(feature, value)`` pairs, best first, and notes
    on what it could not propose."""

    values: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class Verdict:
    """Labels checked against the binaries: refusals, warnings, and the properties checked
    (``namespace :: feature :: value``)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
