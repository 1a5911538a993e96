"""The pure parsers, the layer walker and the property rules on real binaries: NVIDIA's wheels
from PyPI and a C program built for x86-64-v3; and the bad inputs each must survive."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crafted import add_members
from docker_variant.contents.elf import ElfError, gnu_properties, read_elf
from docker_variant.contents.evidence import (
    CUDA_RUNTIME,
    FATBIN,
    OFFLOAD,
    ROCM_VERSION,
    X86_HWCAPS,
    X86_ISA,
    Finding,
    elf_findings,
    env_finding,
)
from docker_variant.contents.fatbin import FatbinError, read_fatbins
from docker_variant.contents.offload import BUNDLE_MAGIC, read_bundles
from docker_variant.contents.properties import propose, verify
from docker_variant.contents.walker import (
    ContentsError,
    ImageContents,
    merge_layers,
    scan_layer,
)
from docker_variant.variant.labels import read_labels
from realbinaries import (
    CURAND_CUBINS,
    CURAND_FATBINS,
    CURAND_PTX,
    SITE,
    compile_avx2,
    download_wheels,
    install_wheel,
    layer,
    readelf_notes,
)


@pytest.fixture(scope="session")
def wheels(request: pytest.FixtureRequest) -> dict[str, Path]:
    return download_wheels(request.config.cache.mkdir("docker-variant-nvidia-wheels"))


@pytest.fixture(scope="session")
def installed(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both wheels unpacked into one site-packages, as pip installs them."""
    root = tmp_path_factory.mktemp("rootfs")
    for wheel in wheels.values():
        install_wheel(wheel, root)
    return root


@pytest.fixture(scope="session")
def installed_contents(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> ImageContents:
    """Both wheels as one plain tar layer, walked once (gzip layers: test_inspect_e2e)."""
    tmp = tmp_path_factory.mktemp("wheels-layer")
    path = layer(installed, tmp / "layer.tar", compress=False)
    with path.open("rb") as stream:
        contents = merge_layers([scan_layer(stream, "wheels", tmp)])
    path.unlink()
    return contents


@pytest.fixture(scope="session")
def curand(installed: Path) -> Path:
    return installed / SITE / "nvidia/curand/lib/libcurand.so.10"


@pytest.fixture(scope="session")
def avx2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_avx2(tmp_path_factory.mktemp("avx2"))


def _scan_tree(root: Path, tmp: Path, name: str = "layer") -> ImageContents:
    path = layer(root, tmp / f"{name}.tar.gz")
    with path.open("rb") as stream:
        return merge_layers([scan_layer(stream, name, tmp)])


def _tar(entries: list[tuple[str, bytes | str | None]], *, gz: bool = False) -> bytes:
    """A layer from ``(name, content)``: bytes a file, str a symlink target, None a dir."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as archive:
        add_members(archive, entries)
    return buffer.getvalue()


def _scan_bytes(*layers: bytes, spool: Path | None = None) -> ImageContents:
    return merge_layers(
        [scan_layer(io.BytesIO(data), f"layer{i}", spool) for i, data in enumerate(layers)]
    )


# --------------------------------------------------------------------------- real binaries


def test_libcurand_fatbins_hold_cubins_sm50_to_sm121_and_ptx_compute121(curand: Path) -> None:
    with curand.open("rb") as stream:
        elf = read_elf(stream, curand.stat().st_size)
        section = elf.section(".nv_fatbin")
        assert section is not None
        summary = read_fatbins(stream, section.offset, section.size)
    assert summary.fatbins == CURAND_FATBINS
    assert sorted(summary.cubins) == CURAND_CUBINS
    assert sorted(summary.ptx) == CURAND_PTX


def test_gcc_mneeded_binary_states_x86_64_v3(avx2: Path) -> None:
    assert "x86 ISA needed: x86-64-baseline, x86-64-v2, x86-64-v3" in readelf_notes(avx2)
    with avx2.open("rb") as stream:
        found = elf_findings(stream, read_elf(stream, avx2.stat().st_size), "/usr/bin/avx2")
    (isa,) = [f for f in found if f.kind == X86_ISA]
    assert isa.level == 3
    assert isa.value == "x86-64-baseline, x86-64-v2, x86-64-v3"


def test_a_binary_without_the_note_has_an_unknown_level_never_baseline(
    avx2: Path, tmp_path: Path
) -> None:
    stripped = tmp_path / "avx2-no-note"
    subprocess.run(
        ["objcopy", "--remove-section", ".note.gnu.property", str(avx2), str(stripped)],
        check=True,
    )
    with stripped.open("rb") as stream:
        elf = read_elf(stream, stripped.stat().st_size)
        assert gnu_properties(stream, elf) == {}
        found = elf_findings(stream, elf, "/usr/bin/x")
    assert not [f for f in found if f.kind == X86_ISA]
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy(stripped, root / "usr/bin/x")
    contents = _scan_tree(root, tmp_path)
    assert not [p for p in propose(contents).properties if p.namespace == "x86_64"]
    # so a v1 label is not refused: nothing is known against it
    labels = {"dev.pep817.variant-label": "cpu", "dev.pep817.variant.x86_64.level": "v1"}
    assert verify(contents, read_labels(labels).variant).errors == []


def test_a_layer_of_both_wheels_proposes_the_providers_values(
    installed_contents: ImageContents,
) -> None:
    contents = installed_contents
    (runtime,) = contents.of_kind(CUDA_RUNTIME)
    assert runtime.version == (12, 8, 90)
    assert runtime.path == f"/{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12"
    assert runtime.section == "nvidia_cuda_runtime_cu12-12.8.90.dist-info"
    (fatbin,) = contents.of_kind(FATBIN)
    assert fatbin.path == f"/{SITE}/nvidia/curand/lib/libcurand.so.10"
    assert list(fatbin.cubins) == CURAND_CUBINS and list(fatbin.ptx) == CURAND_PTX
    proposal = propose(contents)
    assert proposal.label == "cu128"
    assert [str(p) for p in proposal.properties] == [
        "nvidia :: cuda_version_lower_bound :: 12.8",
        *(f"nvidia :: sm_arch :: {a}{b}_real" for a, b in reversed(CURAND_CUBINS)),
    ]
    assert contents.warnings == ()


def _labels(label: str, **props: str) -> dict[str, str]:
    labels = {"dev.pep817.variant-label": label}
    labels |= {f"dev.pep817.variant.{k.replace('__', '.')}": v for k, v in props.items()}
    return labels


def _verdict(contents: ImageContents, label: str, **props: str) -> tuple[list[str], list[str]]:
    verdict = verify(contents, read_labels(_labels(label, **props)).variant)
    return verdict.errors, verdict.warnings


def test_labels_checked_against_libcurand_and_the_runtime(
    installed_contents: ImageContents,
) -> None:
    contents = installed_contents
    assert _verdict(contents, "cu128", nvidia__sm_arch="80_real,90_real,120_virtual") == ([], [])
    errors, _ = _verdict(contents, "k40", nvidia__sm_arch="35_real,90_real")
    assert len(errors) == 1
    assert "sm_arch :: 35_real promises capability 3.5" in errors[0]
    assert "libcurand.so.10 (.nv_fatbin) has cubin sm_50, sm_60" in errors[0]
    assert "PTX compute_121" in errors[0]
    errors, _ = _verdict(contents, "cu118", nvidia__cuda_version_lower_bound="11.8")
    assert len(errors) == 1 and "bundles the CUDA 12.8 runtime" in errors[0]
    errors, warnings = _verdict(contents, "cu124", nvidia__cuda_version_lower_bound="12.4")
    assert errors == []
    assert "minor-version compatibility" in warnings[0] and "JIT PTX" in warnings[0]
    assert _verdict(contents, "cu128", nvidia__cuda_version_lower_bound="12.8") == ([], [])
    assert _verdict(contents, "cu13", nvidia__cuda_version_lower_bound="13") == ([], [])


def test_cubin_and_ptx_rules() -> None:
    from docker_variant.vendors.nvidia import runs_on

    only_ptx = Finding(FATBIN, "/x.so", ".nv_fatbin", "", cubins=(), ptx=((8, 0),))
    assert runs_on(only_ptx, (8, 0)) and runs_on(only_ptx, (9, 0)) and runs_on(only_ptx, (12, 1))
    assert not runs_on(only_ptx, (7, 5))
    sm86 = Finding(FATBIN, "/y.so", ".nv_fatbin", "", cubins=((8, 6),), ptx=())
    assert runs_on(sm86, (8, 9)) and not runs_on(sm86, (8, 0)) and not runs_on(sm86, (9, 0))
    contents = ImageContents((only_ptx,), (), 1, 0)
    assert [p.value for p in propose(contents).properties] == ["80_virtual"]
    both = ImageContents((only_ptx, sm86), (), 1, 0)  # an image runs where every ELF runs
    assert [p.value for p in propose(both).properties] == ["86_real"]
    sm90_ptx121 = Finding(FATBIN, "/z.so", ".nv_fatbin", "", cubins=((9, 0),), ptx=((12, 1),))
    # compute_121 reaches 12.1 and newer: the provider's value for that is 121_real
    assert [p.value for p in propose(ImageContents((sm90_ptx121,), (), 1, 0)).properties] == [
        "121_real",
        "90_real",
    ]


def test_x86_level_checked_and_hwcaps_libraries_left_out(avx2: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy(avx2, root / "usr/bin/avx2")
    contents = _scan_tree(root, tmp_path, "a")
    assert [str(p) for p in propose(contents).properties] == ["x86_64 :: level :: v3"]
    assert propose(contents).label == "v3"
    errors, _ = _verdict(contents, "cpu", x86_64__level="v1")
    assert errors and "/usr/bin/avx2 needs" in errors[0] and "x86-64-v3" in errors[0]
    assert _verdict(contents, "v3", x86_64__level="v3") == ([], [])
    assert _verdict(contents, "v4", x86_64__level="v4") == ([], [])
    # the same binary as an optional glibc-hwcaps library: loaded only where the CPU has it
    hwcaps = tmp_path / "hw"
    (hwcaps / "usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3").mkdir(parents=True)
    shutil.copy(avx2, hwcaps / "usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libx.so")
    contents = _scan_tree(hwcaps, tmp_path, "b")
    assert [f.path for f in contents.of_kind(X86_HWCAPS)] == [
        "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3"
    ]
    assert propose(contents).properties == ()
    assert _verdict(contents, "cpu", x86_64__level="v1") == ([], [])


# --------------------------------------------------------------------------- runtimes


def test_runtime_versions_from_toolkit_files_and_the_config_env(tmp_path: Path) -> None:
    version_json = json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.6.3"}}).encode()
    contents = _scan_bytes(
        _tar(
            [
                ("usr/local/cuda-12.6/version.json", version_json),
                ("usr/local/cuda-11.8/version.txt", b"CUDA Version 11.8.89\n"),
                ("opt/rocm-6.2.0/.info/version", b"6.2.0-66\n"),
            ]
        )
    )
    runtimes = {f.path: f.version for f in contents.of_kind(CUDA_RUNTIME)}
    assert runtimes == {
        "/usr/local/cuda-12.6/version.json": (12, 6, 3),
        "/usr/local/cuda-11.8/version.txt": (11, 8, 89),
    }
    (rocm,) = contents.of_kind(ROCM_VERSION)
    assert rocm.version == (6, 2, 0)
    with_env = contents.with_finding(env_finding(["PATH=/usr/bin", "CUDA_VERSION=12.9.1"]))
    props = [str(p) for p in propose(with_env).properties]
    assert "nvidia :: cuda_version_lower_bound :: 12.9" in props
    assert "amd :: rocm_version :: 6.2" in props


def test_a_toolkit_libcudart_name_gives_the_version(avx2: Path, tmp_path: Path) -> None:
    elf = avx2.read_bytes()  # any ELF: the version is in the name
    contents = _scan_bytes(
        _tar(
            [
                ("usr/local/cuda/lib64/libcudart.so.12.4.127", elf),
                ("usr/local/cuda/lib64/libcudart.so.12", "libcudart.so.12.4.127"),
            ]
        )
    )
    (runtime,) = contents.of_kind(CUDA_RUNTIME)
    assert runtime.version == (12, 4, 127) and runtime.section == "file name"


# --------------------------------------------------------------------------- whiteouts


def test_whiteouts_and_opaque_dirs_hide_lower_layers(installed: Path, tmp_path: Path) -> None:
    runtime_lib = installed / SITE / "nvidia/cuda_runtime/lib/libcudart.so.12"
    elf = runtime_lib.read_bytes()
    dist = f"{SITE}/nvidia_cuda_runtime_cu12-12.8.90.dist-info/METADATA"
    lib = f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12"
    base = _tar([(lib, elf), (dist, b"Name: nvidia-cuda-runtime-cu12\n")])
    assert _scan_bytes(base).of_kind(CUDA_RUNTIME)
    removed = _tar([(f"{SITE}/nvidia/cuda_runtime/lib/.wh.libcudart.so.12", b"")])
    assert _scan_bytes(base, removed).of_kind(CUDA_RUNTIME) == []
    opaque = _tar([(f"{SITE}/nvidia/cuda_runtime/.wh..wh..opq", b"")])
    assert _scan_bytes(base, opaque).of_kind(CUDA_RUNTIME) == []
    replaced = _tar([(lib, b"not an ELF any more")])
    assert _scan_bytes(base, replaced).of_kind(CUDA_RUNTIME) == []
    # a whiteout hides only what is below it: the same layer may add the file again
    again = _tar([(f"{SITE}/nvidia/.wh..wh..opq", b""), (lib, elf), (dist, b"x")])
    assert _scan_bytes(base, again).of_kind(CUDA_RUNTIME)


# --------------------------------------------------------------------------- bad input


def test_a_corrupt_elf_is_skipped_with_a_warning(avx2: Path, tmp_path: Path) -> None:
    head = avx2.read_bytes()[:2000]  # the header, its section table cut off
    garbage = b"\x7fELF" + b"\xff" * 60
    contents = _scan_bytes(_tar([("usr/bin/cut", head), ("usr/bin/garbage", garbage)]))
    assert len(contents.warnings) == 2
    assert all(w.startswith("skipped /usr/bin/") for w in contents.warnings)
    assert "beyond the end of the file" in contents.warnings[0]
    assert all("\n" not in w for w in contents.warnings)


def _with_section(binary: Path, name: str, data: bytes, tmp_path: Path) -> bytes:
    blob = tmp_path / f"{name.strip('.')}.bin"
    blob.write_bytes(data)
    out = tmp_path / f"with-{name.strip('.')}"
    subprocess.run(
        ["objcopy", "--add-section", f"{name}={blob}", str(binary), str(out)], check=True
    )
    return out.read_bytes()


def test_a_truncated_fatbin_is_skipped_with_a_warning(
    curand: Path, avx2: Path, tmp_path: Path
) -> None:
    with curand.open("rb") as stream:
        section = read_elf(stream, curand.stat().st_size).section(".nv_fatbin")
        assert section is not None
        stream.seek(section.offset)
        real = stream.read(section.size)
    first = 16 + struct.unpack_from("<Q", real, 8)[0]  # the first fatbin, whole
    elf = _with_section(avx2, ".nv_fatbin", real[: first + 100_000], tmp_path)
    contents = _scan_bytes(_tar([("usr/lib/libcut.so", elf)]))
    assert contents.of_kind(FATBIN) == []
    (warning,) = contents.warnings
    assert warning.startswith("skipped /usr/lib/libcut.so: fatbin at offset")
    assert "truncated" in warning
    with pytest.raises(FatbinError):
        read_fatbins(io.BytesIO(real[:100]), 0, 100)


def test_a_layer_that_is_not_gzip_nor_tar_is_one_line_error() -> None:
    for data, words in [
        (b"PK\x03\x04 not a layer at all" * 40, "neither gzip-compressed nor a tar archive"),
        (b"\x28\xb5\x2f\xfd" + b"\0" * 600, "zstd-compressed layers are not supported"),
        (_tar([("a", os.urandom(5000))], gz=True)[:3000], "corrupt or truncated"),
    ]:
        with pytest.raises(ContentsError) as caught:
            scan_layer(io.BytesIO(data), "sha256:abc")
        assert words in str(caught.value) and "\n" not in str(caught.value)
        assert caught.value.exit_code == 2


def test_a_layer_lacking_only_its_end_blocks_is_read_one_cut_in_a_member_is_not(
    avx2: Path,
) -> None:
    whole = _tar([("usr/bin/a", avx2.read_bytes()), ("etc/b", b"seven!\n")])
    end_of_data = whole.index(b"seven!\n") + 7  # umoci 0.4 ends its layers here
    contents = _scan_bytes(whole[:end_of_data])
    assert {f.path for f in contents.findings} == {"/usr/bin/a"}
    with pytest.raises(ContentsError) as caught:
        _scan_bytes(whole[: end_of_data - 3])
    assert "corrupt or truncated tar stream" in str(caught.value)


def test_a_symlink_loop_is_skipped_with_a_warning(avx2: Path) -> None:
    contents = _scan_bytes(
        _tar(
            [
                ("usr/lib/libcudart.so.12.8.90", "libcudart.so.12"),
                ("usr/lib/libcudart.so.12", "libcudart.so.12.8.90"),
                ("usr/lib/loop", "loop"),
            ]
        )
    )
    assert contents.of_kind(CUDA_RUNTIME) == []
    (warning,) = contents.warnings
    assert warning.startswith("skipped /usr/lib/libcudart.so.12.8.90: too many levels")


def test_path_traversal_is_skipped_and_nothing_is_written_outside_the_spool(
    avx2: Path, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    before = Path("/etc/passwd").read_bytes()
    big = avx2.read_bytes() + b"\0" * (20 << 20)  # over the in-memory spool: a temp file
    data = _tar([("../../etc/passwd", b"root::0:0::/:/bin/sh\n"), ("../../tmp/evil", big)])
    contents = _scan_bytes(data, spool=spool)
    assert len(contents.warnings) == 2
    assert "'../../etc/passwd': its path escapes the image root" in contents.warnings[0]
    assert Path("/etc/passwd").read_bytes() == before
    assert list(spool.iterdir()) == []  # spooled files are gone too
    assert not (tmp_path.parent.parent / "etc/passwd").exists()


def test_offload_bundles_give_gfx_targets(avx2: Path, tmp_path: Path) -> None:
    ids = [b"host-x86_64-unknown-linux--", b"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"]
    ids.append(b"hipv4-amdgcn-amd-amdhsa--gfx942")
    table = b""
    offset = len(BUNDLE_MAGIC) + 8 + sum(24 + len(i) for i in ids)
    for bundle_id in ids:
        table += struct.pack("<QQQ", offset, 16, len(bundle_id)) + bundle_id
        offset += 16
    bundle = BUNDLE_MAGIC + struct.pack("<Q", len(ids)) + table + b"\0" * 16 * len(ids)
    assert read_bundles(io.BytesIO(bundle), 0, len(bundle)).targets == {"gfx90a", "gfx942"}
    elf = _with_section(avx2, ".hip_fatbin", bundle, tmp_path)
    contents = _scan_bytes(_tar([("opt/app/libkernels.so", elf)]))
    (found,) = contents.of_kind(OFFLOAD)
    assert found.targets == ("gfx90a", "gfx942")
    assert "amd :: gfx_arch :: gfx942" in [str(p) for p in propose(contents).properties]
    errors, _ = _verdict(contents, "mi300", amd__gfx_arch="gfx1100")
    assert "has code objects for gfx90a, gfx942 only" in errors[0]


def test_elf_header_lies_are_elf_errors() -> None:
    bad: list[Callable[[], object]] = [
        lambda: read_elf(io.BytesIO(b"\x7fELF\x03\x01" + b"\0" * 58), 64),
        lambda: read_elf(io.BytesIO(b"\x7fEL"), 3),
    ]
    for call in bad:
        with pytest.raises(ElfError):
            call()


AARCH64_ASM = """
    .text
    .globl f
f:
    bti c
    ret
    .section .note.gnu.property,"a"
    .p2align 3
    .word 4, 16, 5
    .asciz "GNU"
    .word 0xc0000000, 4, 3, 0
"""


def test_aarch64_machine_and_feature_note(tmp_path: Path) -> None:
    """An AArch64 object assembled by llvm-mc, with the BTI and PAC feature note."""
    if shutil.which("llvm-mc") is None:
        pytest.skip("llvm-mc (Debian package llvm) is not installed")
    source, obj = tmp_path / "f.s", tmp_path / "f.o"
    source.write_text(AARCH64_ASM)
    subprocess.run(
        ["llvm-mc", "-triple=aarch64-linux-gnu", "-mattr=+bti", "-filetype=obj",
         "-o", str(obj), str(source)],
        check=True,
    )  # fmt: skip
    assert "AArch64 feature: BTI, PAC" in readelf_notes(obj)
    contents = _scan_bytes(_tar([("usr/lib/aarch64-linux-gnu/libf.so", obj.read_bytes())]))
    assert [(f.kind, f.value) for f in contents.findings] == [
        ("elf", "aarch64"),
        ("aarch64_features", "BTI, PAC"),
    ]
    assert propose(contents).properties == ()  # no aarch64 property follows from these


class _GeneratedLayer(io.RawIOBase):
    """A tar stream of ``files`` (name, size, first bytes; zeros after), made as it is read:
    never in memory as a whole."""

    def __init__(self, files: list[tuple[str, int, bytes]]) -> None:
        self._parts = iter(self._generate(files))
        self._pending = b""

    @staticmethod
    def _generate(files: list[tuple[str, int, bytes]]) -> Iterator[bytes]:
        zeros = b"\0" * (1 << 20)
        for name, size, head in files:
            info = tarfile.TarInfo(name)
            info.size = size
            yield info.tobuf()
            yield head
            left = size - len(head)
            while left > 0:
                yield zeros[: min(left, len(zeros))]
                left -= min(left, len(zeros))
            yield b"\0" * (-size % 512)
        yield b"\0" * 1024

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:  # an empty part (no padding) is not the end
            part = next(self._parts, None)
            if part is None:
                return 0
            self._pending = part
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def test_a_big_layer_is_never_held_in_memory(tmp_path: Path) -> None:
    """1.2 GiB of layer (a 256 MiB ELF-looking file, spooled to disk, and a 1 GiB plain
    file) read with the peak RSS of the process growing by far less than either."""
    import resource

    files = [("usr/lib/libbig.so", 256 << 20, b"\x7fELF\x02\x01\x01"), ("data/blob", 1 << 30, b"")]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    scan = scan_layer(_GeneratedLayer(files), "big", tmp_path)  # type: ignore[arg-type]
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before
    assert scan.entries == {"/usr/lib/libbig.so", "/data/blob"}
    # the ELF was spooled whole and its (empty) section table read
    assert [f.kind for f in scan.findings["/usr/lib/libbig.so"]] == ["elf"]
    assert grown < 64 << 20, f"peak RSS grew by {grown >> 20} MiB"


def test_large_images_show_a_progress_bar_on_a_terminal_only() -> None:
    from rich.console import Console

    from docker_variant.docker.progress import PROGRESS_FROM, RichMeter

    for terminal, size, shown in [(True, 2 * PROGRESS_FROM, True), (True, 1 << 20, False)]:
        out = io.StringIO()
        console = Console(file=out, force_terminal=terminal, width=100)
        with RichMeter("inspect reg/app:1", console) as meter:
            meter.total(size)
            meter.advance(size // 2)
        assert ("inspect reg/app:1" in out.getvalue()) is shown
    out = io.StringIO()
    with RichMeter("inspect reg/app:1", Console(file=out, force_terminal=False)) as meter:
        meter.total(2 * PROGRESS_FROM)
        meter.advance(PROGRESS_FROM)
    assert out.getvalue() == ""  # logs and pipes get no bar


def test_the_proposed_label_is_the_images_own_unless_nothing_is_proposed() -> None:
    sm90 = Finding(FATBIN, "/k.so", ".nv_fatbin", "", cubins=((9, 0),), ptx=())
    labelled = _labels("h100", nvidia__sm_arch="90_real")
    assert propose(ImageContents((sm90,), (), 1, 0), labelled).label == "h100"
    assert propose(ImageContents((sm90,), (), 1, 0)).label == "cuda"
    assert propose(ImageContents((), (), 1, 0), labelled).label == "null"  # no binaries
    broken = {"dev.pep817.variant-label": "Bad Label"}
    assert propose(ImageContents((sm90,), (), 1, 0), broken).label == "cuda"
