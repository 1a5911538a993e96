"""Findings: what one file of an image says its binaries need, with the evidence.

``elf_findings`` reads one ELF (seekable) through the pure parsers; ``path_finding`` and
``small_file_finding`` read what a path's name or a small text file says (CUDA and ROCm
versions, glibc-hwcaps directories). Nothing here touches tar streams or registries.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from typing import IO, Any

from docker_variant.contents.elf import EM_AARCH64, EM_X86_64, ElfFile, gnu_properties
from docker_variant.contents.fatbin import FatbinError, read_fatbins
from docker_variant.contents.offload import read_bundles
from docker_variant.errors import InvalidInputError
from docker_variant.jsondoc import load_json
from docker_variant.numtext import DIGITS
from docker_variant.vendors.evidence import (
    CUDA_RUNTIME,
    ELF,
    FATBIN,
    OFFLOAD,
    ROCM_VERSION,
    X86_ISA,
)
from docker_variant.vendors.nvidia import arch_text

__all__ = [
    "AARCH64_FEATURES",
    "CUDA_RUNTIME",
    "DIST_INFO",
    "ELF",
    "FATBIN",
    "LIBCUDART",
    "OFFLOAD",
    "ROCM_VERSION",
    "X86_HWCAPS",
    "X86_ISA",
    "Finding",
    "arch_text",
    "elf_findings",
    "path_finding",
    "small_file_finding",
    "wants_content",
]

# kinds: those a vendor reads are named in ``vendors.evidence``
X86_HWCAPS = "glibc_hwcaps"
AARCH64_FEATURES = "aarch64_features"
LIBCUDART = "libcudart"  # a pip wheel's libcudart.so.N: its version is in the dist-info
DIST_INFO = "dist_info"  # nvidia_cuda_runtime_cuN-X.Y.Z.dist-info

GNU_PROPERTY_X86_ISA_1_NEEDED = 0xC0008002
GNU_PROPERTY_AARCH64_FEATURE_1_AND = 0xC0000000
_AARCH64_BITS = {1: "BTI", 2: "PAC", 4: "GCS"}
X86_LEVEL_NAMES = {1: "x86-64-baseline", 2: "x86-64-v2", 3: "x86-64-v3", 4: "x86-64-v4"}

# Every number is DIGITS (at most nine digits) and may not run on: a 5,000-digit version in a
# file name or a version file matches nothing and is ignored (int() of it would raise).
_END = r"(?![0-9]|\.[0-9])"
_LIBCUDART_VERSIONED = re.compile(rf"libcudart\.so\.({DIGITS})\.({DIGITS})\.({DIGITS})")
_LIBCUDART_WHEEL = re.compile(rf"(?:.*/)?nvidia/cuda_runtime/lib/libcudart\.so\.({DIGITS})")
_DIST_INFO = re.compile(
    rf"(?:(.*)/)?nvidia_cuda_runtime_cu({DIGITS})-({DIGITS})\.({DIGITS})(?:\.({DIGITS}))?{_END}"
    r"[^/]*\.dist-info/METADATA"
)
_CUDA_VERSION_FILE = re.compile(r"(?:.*/)?cuda(?:-[0-9.]+)?/version\.(json|txt)")
_ROCM_VERSION_FILE = re.compile(r"(?:.*/)?rocm(?:-[0-9.]+)?/\.info/version")
_HWCAPS = re.compile(r"(?:.*/)?glibc-hwcaps/x86-64-v([234])(?:/.*)?")
_VERSION_TEXT = re.compile(rf"(?<![0-9.])({DIGITS})\.({DIGITS})(?:\.({DIGITS}))?{_END}")
SMALL_FILE_LIMIT = 64 << 10


@dataclass(frozen=True)
class Finding:
    """One piece of evidence: ``path`` in the image, ``section`` (an ELF section, a file name
    rule, ``config Env``), ``value`` as shown, and the parsed facts of its kind."""

    kind: str
    path: str
    section: str
    value: str
    cubins: tuple[tuple[int, int], ...] = ()
    ptx: tuple[tuple[int, int], ...] = ()
    version: tuple[int, ...] = ()
    level: int = 0  # x86-64 level 1..4
    targets: tuple[str, ...] = ()

    def moved(self, path: str) -> Finding:
        return replace(self, path=path)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "path": self.path,
            "section": self.section,
            "value": self.value,
        }
        if self.kind == FATBIN:
            data["cubins"] = [f"sm_{a}{b}" for a, b in self.cubins]
            data["ptx"] = [f"compute_{a}{b}" for a, b in self.ptx]
        if self.version:
            data["version"] = ".".join(map(str, self.version))
        if self.level:
            data["level"] = f"v{self.level}"
        if self.targets:
            data["targets"] = list(self.targets)
        return data


def _x86_level(bits: int) -> int:
    return max((n for n, bit in ((1, 1), (2, 2), (3, 4), (4, 8)) if bits & bit), default=0)


def elf_findings(stream: IO[bytes], elf: ElfFile, path: str) -> list[Finding]:
    """What ``elf`` (read from ``stream``) needs; raises ``ElfError``, ``FatbinError`` or
    ``OffloadError`` when its structures are corrupt."""
    found = [Finding(ELF, path, "ELF header", elf.machine_name)]
    properties = gnu_properties(stream, elf)
    if elf.machine == EM_X86_64 and GNU_PROPERTY_X86_ISA_1_NEEDED in properties:
        bits = properties[GNU_PROPERTY_X86_ISA_1_NEEDED]
        level = _x86_level(bits)
        if level:
            names = [X86_LEVEL_NAMES[n] for n in range(1, 5) if bits & (1 << (n - 1))]
            found.append(
                Finding(X86_ISA, path, ".note.gnu.property", ", ".join(names), level=level)
            )
    if elf.machine == EM_AARCH64 and GNU_PROPERTY_AARCH64_FEATURE_1_AND in properties:
        bits = properties[GNU_PROPERTY_AARCH64_FEATURE_1_AND]
        names = [name for bit, name in _AARCH64_BITS.items() if bits & bit]
        found.append(
            Finding(AARCH64_FEATURES, path, ".note.gnu.property", ", ".join(names) or "none")
        )
    cubins: set[tuple[int, int]] = set()
    ptx: set[tuple[int, int]] = set()
    fatbins = 0
    for offset, size in _fatbin_ranges(elf):
        summary = read_fatbins(stream, offset, size)
        cubins |= summary.cubins
        ptx |= summary.ptx
        fatbins += summary.fatbins
    if fatbins:
        cub, vir = tuple(sorted(cubins)), tuple(sorted(ptx))
        text = f"{fatbins} fatbins: cubin {arch_text('sm', cub) or '(none)'}"
        text += f"; PTX {arch_text('compute', vir) or '(none)'}"
        found.append(Finding(FATBIN, path, ".nv_fatbin", text, cubins=cub, ptx=vir))
    hip = elf.section(".hip_fatbin")
    if hip is not None and hip.kind != 8 and hip.size:
        bundles = read_bundles(stream, hip.offset, hip.size)
        targets = tuple(sorted(bundles.targets))
        text = ", ".join(targets) if targets else "(none)"
        if bundles.compressed:
            text += f"; {bundles.compressed} compressed bundle(s): targets not readable"
        found.append(Finding(OFFLOAD, path, ".hip_fatbin", text, targets=targets))
    return found


def _fatbin_ranges(elf: ElfFile) -> list[tuple[int, int]]:
    """The byte ranges of the ``.nv_fatbin`` sections, each once: headers that point at the
    same bytes are read once, and ranges that partly overlap (no linker writes them) are a
    ``FatbinError``, so the fatbin parser reads each byte of the file at most once."""
    ranges = sorted(
        {
            (s.offset, s.size)
            for s in elf.sections
            if s.name == ".nv_fatbin" and s.kind != 8 and s.size  # 8: SHT_NOBITS
        }
    )
    for (offset, size), (next_offset, _) in itertools.pairwise(ranges):
        if next_offset < offset + size:
            raise FatbinError(f".nv_fatbin sections at {offset}+{size} and {next_offset} overlap")
    return ranges


def path_finding(path: str) -> Finding | None:
    """What a path says by its name alone (``path`` is absolute, normalised)."""
    name = path.rsplit("/", 1)[-1]
    if match := _LIBCUDART_VERSIONED.fullmatch(name):
        version = tuple(int(g) for g in match.groups())
        return Finding(CUDA_RUNTIME, path, "file name", ".".join(match.groups()), version=version)
    if match := _LIBCUDART_WHEEL.fullmatch(path):
        return Finding(LIBCUDART, path, "file name", name, version=(int(match[1]),))
    if match := _DIST_INFO.fullmatch(path):
        parts = [int(g) for g in match.groups()[2:] if g is not None]
        where = path.rsplit("/", 1)[0]
        return Finding(
            DIST_INFO,
            where,
            "dist-info",
            ".".join(map(str, parts)),
            version=(int(match[2]), *parts),
        )
    if match := _HWCAPS.fullmatch(path):
        level = int(match[1])
        where = path[: path.index("glibc-hwcaps/") + len("glibc-hwcaps/x86-64-vN")]
        return Finding(X86_HWCAPS, where, "directory", f"x86-64-v{level}", level=level)
    return None


def wants_content(path: str) -> bool:
    """Whether ``small_file_finding`` needs this file's content."""
    return bool(_CUDA_VERSION_FILE.fullmatch(path) or _ROCM_VERSION_FILE.fullmatch(path))


def _version(text: str) -> tuple[int, ...] | None:
    match = _VERSION_TEXT.search(text)
    if match is None:
        return None
    return tuple(int(g) for g in match.groups() if g is not None)


def small_file_finding(path: str, content: bytes) -> Finding | None:
    """CUDA's ``version.json``/``version.txt`` and ROCm's ``.info/version``; ``None`` when
    the content says no version."""
    text = content.decode("utf-8", "replace")
    if match := _CUDA_VERSION_FILE.fullmatch(path):
        if match[1] == "json":
            try:
                data = load_json(content, f"{path} (version.json)")
                stated = data["cuda"]["version"]
            except (InvalidInputError, KeyError, TypeError):
                return None  # not the toolkit's document: it says no version
            if not isinstance(stated, str) or (version := _version(stated)) is None:
                return None
            return Finding(CUDA_RUNTIME, path, "version.json", stated, version=version)
        if "CUDA Version" not in text or (version := _version(text)) is None:
            return None
        return Finding(
            CUDA_RUNTIME, path, "version.txt", ".".join(map(str, version)), version=version
        )
    if _ROCM_VERSION_FILE.fullmatch(path) and (version := _version(text)) is not None:
        return Finding(
            ROCM_VERSION, path, ".info/version", text.strip().splitlines()[0], version=version
        )
    return None


def env_finding(env: list[str] | None) -> Finding | None:
    """``CUDA_VERSION=12.8.1`` in the image config's ``Env`` (NVIDIA's CUDA base images)."""
    for item in env or []:
        if isinstance(item, str) and item.startswith("CUDA_VERSION="):
            value = item.partition("=")[2]
            version = _version(value)
            if version is not None:
                return Finding(CUDA_RUNTIME, "(image config)", "config Env", item, version=version)
    return None
