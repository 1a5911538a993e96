"""The layer walker: streams each layer's tar members once, hands files to the parsers, and
merges the layers as the image's filesystem shows them (whiteouts applied).

Nothing is extracted. Members come from ``tarstream`` (a bounded window: see its bounds). An
ELF member is copied into a spooled temp file (in memory up to ``SPOOL_MEMORY``, then on disk
in the caller's temp dir, at most ``MAX_ELF`` bytes) so that its section table, at the end of
the file, can be read; other members are skipped as the stream passes. A layer is gzip or a
plain tar; anything else is one ``ContentsError``. A member whose name escapes the root
(``../../etc/passwd``), an ELF over ``MAX_ELF`` or a file the parsers cannot read is skipped
with a warning.
"""

from __future__ import annotations

import posixpath
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker_variant.contents.elf import ELF_MAGIC, ElfError, read_elf
from docker_variant.contents.evidence import (
    CUDA_RUNTIME,
    DIST_INFO,
    ELF,
    LIBCUDART,
    SMALL_FILE_LIMIT,
    Finding,
    elf_findings,
    path_finding,
    small_file_finding,
    wants_content,
)
from docker_variant.contents.fatbin import FatbinError
from docker_variant.contents.offload import OffloadError
from docker_variant.contents.tarstream import (
    CHUNK,
    GZIP_MAGIC,
    ContentsError,
    Member,
    MemberData,
    Readable,
    TarLimits,
    TarStats,
    open_layer,
)
from docker_variant.errors import DockerVariantError

__all__ = [
    "MAX_ELF",
    "SPOOL_MEMORY",
    "ContentsError",
    "ImageContents",
    "LayerScan",
    "looks_like_layer",
    "merge_layers",
    "scan_layer",
]

SPOOL_MEMORY = 16 << 20  # an ELF above this goes to a temp file while its headers are read
MAX_ELF = 4 << 30  # a bigger ELF is skipped with a warning: the spool's bound on disk
MAX_PATH = 4096  # Linux's PATH_MAX: a longer member name or link target is skipped
_MAX_SYMLINK_HOPS = 40  # Linux's ELOOP limit
_MAX_RESOLVE_STEPS = 4096

ProgressCallback = Callable[[int], None]


@dataclass
class LayerScan:
    """What one layer holds: findings by path, and what it does to the layers below."""

    name: str
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    entries: set[str] = field(default_factory=set)
    whiteouts: set[str] = field(default_factory=set)
    opaque: set[str] = field(default_factory=set)
    symlinks: dict[str, str] = field(default_factory=dict)
    hardlinks: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    bytes_read: int = 0
    tar: TarStats = field(default_factory=TarStats)  # what reading the stream cost


@dataclass(frozen=True)
class ImageContents:
    """The merged findings of an image, sorted by path, and what was skipped."""

    findings: tuple[Finding, ...]
    warnings: tuple[str, ...]
    layers: int
    bytes_read: int

    def of_kind(self, *kinds: str) -> list[Finding]:
        return [f for f in self.findings if f.kind in kinds]

    def with_finding(self, finding: Finding | None) -> ImageContents:
        if finding is None:
            return self
        return ImageContents((*self.findings, finding), self.warnings, self.layers, self.bytes_read)


class _Counting:
    """Counts the (compressed) bytes read from ``raw``, for progress."""

    def __init__(self, raw: Readable, on_bytes: ProgressCallback | None) -> None:
        self._raw = raw
        self._on_bytes = on_bytes
        self.count = 0

    def read(self, size: int = -1, /) -> bytes:
        data = self._raw.read(size)
        n = len(data)
        self.count += n
        if self._on_bytes is not None and n:
            self._on_bytes(n)
        return data


def normalise(name: str) -> str | None:
    """``./usr/lib/x`` -> ``/usr/lib/x``; ``None`` for a name that escapes the root."""
    path = posixpath.normpath("/" + name.lstrip("/")) if name else "/"
    relative = posixpath.normpath(name.lstrip("/")) if name else "."
    if relative == ".." or relative.startswith("../"):
        return None
    return "/" if path == "//" else path


def looks_like_layer(head: bytes) -> bool:
    """Whether the first 512 bytes of a file start a gzip stream or a tar archive."""
    return head.startswith(GZIP_MAGIC) or head[257:262] == b"ustar"


def scan_layer(
    stream: Readable,
    name: str,
    spool_dir: Path | None = None,
    on_bytes: ProgressCallback | None = None,
    limits: TarLimits | None = None,
) -> LayerScan:
    """Read one layer (gzip or plain tar) from ``stream`` once, front to back, within
    ``limits`` (``tarstream``'s bounds by default)."""
    counting = _Counting(stream, on_bytes)
    scan = LayerScan(name)
    tar = open_layer(counting, name, limits)
    for member, data in tar:
        _member(member, data, scan, spool_dir)
    scan.bytes_read = counting.count
    scan.tar = tar.stats
    return scan


def _member(member: Member, data: MemberData, scan: LayerScan, spool_dir: Path | None) -> None:
    if len(member.name) > MAX_PATH or len(member.linkname) > MAX_PATH:
        scan.warnings.append(
            f"layer {scan.name}: skipped member {member.name[:80]!r}...: a name or link "
            f"target longer than {MAX_PATH} bytes"
        )
        return
    path = normalise(member.name)
    if path is None:
        scan.warnings.append(
            f"layer {scan.name}: skipped member {member.name!r}: its path escapes the image root"
        )
        return
    parent, _, base = path.rpartition("/")
    if base.startswith(".wh."):
        if base == ".wh..wh..opq":
            scan.opaque.add(parent or "/")
        else:
            scan.whiteouts.add(f"{parent}/{base[4:]}")
        return
    scan.entries.add(path)
    if member.issym():
        target = member.linkname
        scan.symlinks[path] = target if target.startswith("/") else f"{parent}/{target}"
        return
    if member.islnk():
        linked = normalise(member.linkname)
        if linked is None:
            scan.warnings.append(
                f"skipped hard link {path}: its target {member.linkname!r} escapes the image root"
            )
        else:
            scan.hardlinks[path] = linked
        return
    found: list[Finding] = []
    named = path_finding(path)
    if named is not None:
        found.append(named)
    if member.isfile() and member.size >= 4:
        if wants_content(path) and member.size <= SMALL_FILE_LIMIT:
            small = small_file_finding(path, data.read(SMALL_FILE_LIMIT))
            if small is not None:
                found.append(small)
        else:
            head = data.read(4)
            if head == ELF_MAGIC:
                found.extend(_read_elf_member(data, head, member.size, path, scan, spool_dir))
    if found:
        scan.findings[path] = found


def _read_elf_member(
    data: MemberData,
    head: bytes,
    size: int,
    path: str,
    scan: LayerScan,
    spool_dir: Path | None,
) -> list[Finding]:
    if size > MAX_ELF:
        scan.warnings.append(
            f"skipped {path}: an ELF file of {size} bytes (inspection reads ELF files of up "
            f"to {MAX_ELF} bytes)"
        )
        return []
    with tempfile.SpooledTemporaryFile(
        max_size=SPOOL_MEMORY, dir=str(spool_dir) if spool_dir else None
    ) as spool:
        try:
            spool.write(head)
            while chunk := data.read(CHUNK):
                spool.write(chunk)
        except OSError as exc:  # the temp dir's disk is full
            raise DockerVariantError(
                f"cannot copy {path} ({size} bytes) to a temp file: "
                f"{exc.strerror or type(exc).__name__} (TMPDIR names where it goes)"
            ) from exc
        try:
            elf = read_elf(spool, size)
            return elf_findings(spool, elf, path)
        except (ElfError, FatbinError, OffloadError) as exc:
            scan.warnings.append(f"skipped {path}: {exc}")
            return []


class _Hiders:
    """What one layer hides of the layers below: its entries, its whiteouts and, below each
    whiteout or opaque directory, everything. Directories are kept as a tree of path
    components, so a check walks a path once (no string per ancestor)."""

    def __init__(self, scan: LayerScan) -> None:
        self._scan = scan
        self._all = "/" in scan.opaque
        self._tree: dict[str, Any] = {}
        for directory in scan.whiteouts | scan.opaque:
            node = self._tree
            for part in directory.split("/")[1:]:
                node = node.setdefault(part, {})
            node[""] = True  # no real component is empty: the mark of a hiding directory

    def hide(self, path: str) -> bool:
        if path in self._scan.entries or path in self._scan.whiteouts or self._all:
            return True
        node = self._tree
        for part in path.split("/")[1:-1]:
            node = node.get(part)  # type: ignore[assignment]
            if node is None:
                return False
            if "" in node:
                return True
        return False


def resolve(path: str, links: dict[str, str]) -> str:
    """``path`` with every symlink on the way followed, inside the image root (``..`` at the
    root stays there); raises ``ElfError`` naming a loop, or a path that grows past
    ``MAX_PATH`` bytes or ``_MAX_RESOLVE_STEPS`` components on the way."""
    pending = deque(p for p in path.split("/") if p)
    resolved: list[str] = []  # the path so far, as its prefixes: each step costs one string
    hops = steps = 0
    while pending:
        steps += 1
        if steps > _MAX_RESOLVE_STEPS:
            raise ElfError(f"more than {_MAX_RESOLVE_STEPS} path components to resolve")
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = (resolved[-1] if resolved else "") + "/" + part
        if len(candidate) > MAX_PATH:
            raise ElfError(f"a path longer than {MAX_PATH} bytes on the way")
        target = links.get(candidate)
        if target is None:
            resolved.append(candidate)
            continue
        hops += 1
        if hops > _MAX_SYMLINK_HOPS:
            raise ElfError(f"too many levels of symbolic links (a loop through {candidate})")
        if target.startswith("/"):
            resolved = []
        pending.extendleft(reversed([p for p in target.split("/") if p]))
    return resolved[-1] if resolved else "/"


def merge_layers(scans: Sequence[LayerScan]) -> ImageContents:
    """The image's findings, lowest layer first, as its merged filesystem shows them."""
    files: dict[str, list[Finding]] = {}
    links: dict[str, str] = {}
    warnings: list[str] = []
    for scan in scans:
        hiders = _Hiders(scan)
        for path in [p for p in files if hiders.hide(p)]:
            del files[path]
        for path in [p for p in links if hiders.hide(p)]:
            del links[path]
        files.update(scan.findings)
        links.update(scan.symlinks)
        for link, target in scan.hardlinks.items():
            if target in files:
                files[link] = [f.moved(link) for f in files[target]]
        warnings.extend(scan.warnings)
    findings = [f for path in sorted(files) for f in files[path]]
    # a library's name counts as evidence only when the file is a library (an ELF)
    elves = {f.path for f in findings if f.kind == ELF}
    findings = [f for f in findings if not _named_library(f) or f.path in elves]
    findings.extend(_via_symlinks(links, files, warnings))
    findings.extend(_wheel_runtimes(findings))
    seen: set[tuple[str, str, str, str]] = set()
    unique = []
    for finding in findings:  # e.g. one glibc-hwcaps directory seen through each of its files
        key = (finding.kind, finding.path, finding.section, finding.value)
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return ImageContents(
        tuple(unique),
        tuple(warnings),
        len(scans),
        sum(s.bytes_read for s in scans),
    )


def _named_library(finding: Finding) -> bool:
    return finding.kind == LIBCUDART or (
        finding.kind == CUDA_RUNTIME and finding.section == "file name"
    )


def _via_symlinks(
    links: dict[str, str], files: dict[str, list[Finding]], warnings: list[str]
) -> list[Finding]:
    """A symlink named like evidence (``libcudart.so.12.8.90``) counts when it leads to an
    ELF in the image; a loop is skipped with a warning."""
    found: list[Finding] = []
    for link in sorted(links):
        named = path_finding(link)
        if named is None or named.kind not in (CUDA_RUNTIME, LIBCUDART):
            continue
        try:
            target = resolve(link, links)
        except ElfError as exc:
            warnings.append(f"skipped {link}: {exc}")
            continue
        if any(f.kind == ELF for f in files.get(target, [])):
            found.append(named)
    return found


def _wheel_runtimes(findings: Iterable[Finding]) -> list[Finding]:
    """The pip wheel's ``libcudart.so.12`` has no minor in its name: the version is that of
    the ``nvidia_cuda_runtime_cu12-X.Y.Z.dist-info`` in the same site-packages."""
    dist_infos = [f for f in findings if f.kind == DIST_INFO]
    found: list[Finding] = []
    for library in (f for f in findings if f.kind == LIBCUDART):
        site = library.path[: library.path.rindex("/nvidia/cuda_runtime/lib/")]
        for info in dist_infos:
            if info.path.rsplit("/", 1)[0] == site and info.version[0] == library.version[0]:
                version = info.version[1:]
                found.append(
                    Finding(
                        CUDA_RUNTIME,
                        library.path,
                        info.path.rsplit("/", 1)[1],
                        ".".join(map(str, version)),
                        version=version,
                    )
                )
    return found
