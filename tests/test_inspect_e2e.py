"""`docker variant inspect`, `labels --from-image` and the label checks of `push` and `publish`
on real binaries in real images: NVIDIA's curand and CUDA runtime wheels from PyPI and a
gcc -mneeded x86-64-v3 program, put into images with umoci, pushed to a real registry and
pulled into a real engine."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import devstack
from crafted import gzip_of_zeros
from imaging import OCI_MANIFEST, push_blob, push_manifest, raw_manifest
from realbinaries import (
    CURAND_CUBINS,
    SITE,
    compile_avx2,
    download_wheels,
    install_wheel,
    layer,
    readelf_notes,
)

pytestmark = pytest.mark.e2e

CUDA_PROPERTIES = [
    "nvidia :: cuda_version_lower_bound :: 12.8",
    *(f"nvidia :: sm_arch :: {a}{b}_real" for a, b in reversed(CURAND_CUBINS)),
]


@dataclass
class Stack:
    env: dict[str, str]
    root: Path
    registry: str
    url: str

    def run(
        self, *args: str, check: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(args),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check:
            assert done.returncode == 0, f"{args}: {done.stderr}"
        return done

    def umoci(self, *args: str) -> None:
        self.run("umoci", *args, check=True)

    def image(self, base: str, tag: str, labels: dict[str, str] | None = None) -> str:
        """A layout tag ``tag`` on top of ``base`` with ``labels``; pushed as
        ``contents/<tag>``; returns the registry reference."""
        args = ["config", "--image", f"{self.root}/layout:{base}", "--tag", tag]
        args += ["--architecture", "amd64", "--os", "linux"]
        for key, value in (labels or {}).items():
            args += ["--config.label", f"{key}={value}"]
        self.umoci(*args)
        repo, _, version = tag.partition("_")
        ref = f"{self.registry}/contents/{repo}:{version or 'latest'}"
        self.run(
            "skopeo", "copy", "--quiet", "--dest-tls-verify=false",
            f"oci:{self.root}/layout:{tag}", f"docker://{ref}", check=True,
        )  # fmt: skip
        return ref

    def inspect(self, *args: str) -> dict[str, object]:
        done = self.run("docker-variant", "inspect", "--json", *args, check=True)
        data: dict[str, object] = json.loads(done.stdout)
        return data

    def docker_build(self, ref: str, base: str, build_args: list[str]) -> None:
        context = self.root / "context"
        context.mkdir(exist_ok=True)
        (context / "Dockerfile").write_text(f"FROM {base}\n")
        self.run("docker", "build", "-q", "-t", ref, *build_args, str(context), check=True)


def _labels(label: str, *props: str) -> dict[str, str]:
    """The labels `docker-variant labels` makes (one value list per feature)."""
    labels = {"dev.pep817.variant-label": label}
    for prop in props:
        namespace, feature, value = (p.strip() for p in prop.split("::"))
        key = f"dev.pep817.variant.{namespace}.{feature}"
        labels[key] = f"{labels[key]},{value}" if key in labels else value
    return labels


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    for tool in ("docker", "dockerd", "docker-registry", "skopeo", "umoci", "gcc"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    wheels = download_wheels(request.config.cache.mkdir("docker-variant-nvidia-wheels"))
    work = tmp_path_factory.mktemp("inspect-images")
    cuda_root = work / "cuda-root"
    for wheel in wheels.values():
        install_wheel(wheel, cuda_root)
    avx2_root = work / "avx2-root"
    (avx2_root / "usr/local/bin").mkdir(parents=True)
    binary = compile_avx2(work)
    assert "x86 ISA needed: x86-64-baseline, x86-64-v2, x86-64-v3" in readelf_notes(binary)
    shutil.copy(binary, avx2_root / "usr/local/bin/avx2")
    with devstack.local_stack("dv-insp-", proxy=False) as local:
        env = local.client_env()
        state = Stack(env, local.root, local.registry.address, local.registry.url)
        state.run("docker-variant", "install-plugin", check=True)
        state.umoci("init", "--layout", f"{local.root}/layout")
        state.umoci("new", "--image", f"{local.root}/layout:empty")
        for name, tree in (("cuda", cuda_root), ("avx2", avx2_root)):
            state.umoci(
                "insert", "--rootless", "--image", f"{local.root}/layout:empty",
                "--tag", f"{name}-base", str(tree), "/",
            )  # fmt: skip
            state.image(f"{name}-base", f"{name}_base")
        yield state


def test_inspect_reports_curand_cubins_ptx_and_the_runtime(stack: Stack) -> None:
    data = stack.inspect(f"{stack.registry}/contents/cuda:base")
    findings = data["findings"]
    assert isinstance(findings, list)
    (fatbin,) = [f for f in findings if f["kind"] == "fatbin"]
    assert fatbin["path"] == f"/{SITE}/nvidia/curand/lib/libcurand.so.10"
    assert fatbin["section"] == ".nv_fatbin"
    assert fatbin["cubins"] == [f"sm_{a}{b}" for a, b in CURAND_CUBINS]
    assert fatbin["ptx"] == ["compute_121"]
    (runtime,) = [f for f in findings if f["kind"] == "cuda_runtime"]
    assert runtime["version"] == "12.8.90"
    assert runtime["section"] == "nvidia_cuda_runtime_cu12-12.8.90.dist-info"
    assert data["proposed"] == {"label": "cu128", "properties": CUDA_PROPERTIES, "notes": []}
    assert data["platform"] == "linux/amd64" and data["warnings"] == []
    table = stack.run(
        "docker-variant", "inspect", f"{stack.registry}/contents/cuda:base",
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert table.returncode == 0 and table.stderr == "", table.stderr
    for text in ("libcurand.so.10", ".nv_fatbin", "compute_121", "12.8.90", "cu128"):
        assert text in table.stdout, table.stdout


def test_inspect_reports_the_x86_64_level_the_binary_needs(stack: Stack) -> None:
    data = stack.inspect(f"{stack.registry}/contents/avx2:base")
    (isa,) = [f for f in data["findings"] if f["kind"] == "x86_isa_needed"]  # type: ignore[union-attr, index]
    assert isa["path"] == "/usr/local/bin/avx2"
    assert isa["value"] == "x86-64-baseline, x86-64-v2, x86-64-v3"
    assert data["proposed"] == {
        "label": "v3",
        "properties": ["x86_64 :: level :: v3"],
        "notes": [],
    }


def test_inspect_local_agrees_with_the_registry(stack: Stack) -> None:
    for name in ("cuda", "avx2"):
        ref = f"{stack.registry}/contents/{name}:base"
        stack.run("docker", "pull", "-q", ref, check=True)
        local = stack.inspect("--local", ref)
        remote = stack.inspect(ref)
        assert local["source"] == "engine" and remote["source"] == "registry"
        assert local["findings"] == remote["findings"]
        assert local["proposed"] == remote["proposed"]


@pytest.mark.parametrize(("name", "label"), [("cuda", "cu128"), ("avx2", "v3")])
def test_labels_from_image_round_trip(stack: Stack, name: str, label: str) -> None:
    base = f"{stack.registry}/contents/{name}:base"
    args = stack.run("docker-variant", "labels", "--from-image", base, check=True).stdout
    proposed = stack.inspect(base)["proposed"]
    props = [a for p in proposed["properties"] for a in ("--property", p)]  # type: ignore[index]
    same = stack.run("docker-variant", "labels", "--label", label, *props, check=True).stdout
    assert args == same
    ref = f"{stack.registry}/contents/{name}:1.0.0-{label}"
    stack.run("docker", "pull", "-q", base, check=True)
    stack.docker_build(ref, base, args.split())
    pushed = stack.run("docker", "variant", "push", ref)
    assert pushed.returncode == 0, pushed.stderr
    assert "warning" not in pushed.stderr
    again = stack.run("docker-variant", "labels", "--from-image", ref, check=True).stdout
    assert again == args
    assert stack.run("docker-variant", "labels", "--local", ref, check=True).stdout == args
    checked = stack.inspect(ref)["labels"]
    assert checked["errors"] == [] and checked["warnings"] == []  # type: ignore[index]
    assert len(checked["checked"]) == len(proposed["properties"])  # type: ignore[index, arg-type]


WRONG = [
    ("cuda", "k40", "nvidia :: sm_arch :: 35_real",
     "sm_arch :: 35_real promises capability 3.5, but /usr/local/lib/python3.11/site-packages/"
     "nvidia/curand/lib/libcurand.so.10 (.nv_fatbin) has cubin sm_50"),
    ("cuda", "cu118", "nvidia :: cuda_version_lower_bound :: 11.8",
     "bundles the CUDA 12.8 runtime, /usr/local/lib/python3.11/site-packages/nvidia/cuda_runtime"
     "/lib/libcudart.so.12 (nvidia_cuda_runtime_cu12-12.8.90.dist-info: 12.8.90)"),
    ("avx2", "cpu", "x86_64 :: level :: v1",
     "x86_64 :: level :: v1 admits CPUs below what /usr/local/bin/avx2 needs: its "
     ".note.gnu.property says x86 ISA needed: x86-64-baseline, x86-64-v2, x86-64-v3"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "label", "prop", "evidence"), WRONG)
def test_push_refuses_a_label_the_binaries_do_not_deliver(
    stack: Stack, name: str, label: str, prop: str, evidence: str
) -> None:
    base = f"{stack.registry}/contents/{name}:base"
    stack.run("docker", "pull", "-q", base, check=True)
    ref = f"{stack.registry}/contents/{name}:1.0.0-{label}"
    args = stack.run(
        "docker-variant", "labels", "--label", label, "--property", prop, check=True
    ).stdout.split()
    stack.docker_build(ref, base, args)
    refused = stack.run("docker", "variant", "push", ref)
    assert refused.returncode == 2, refused.stderr
    assert evidence in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1
    tags = stack.run("curl", "-s", f"{stack.url}/v2/contents/{name}/tags/list", check=True)
    assert f"1.0.0-{label}" not in tags.stdout  # nothing was pushed
    forced = stack.run("docker", "variant", "push", "--no-verify", ref)
    assert forced.returncode == 0, forced.stderr
    assert "--no-verify" in forced.stderr


def test_a_bound_below_the_runtime_minor_warns_and_pushes(stack: Stack) -> None:
    base = f"{stack.registry}/contents/cuda:base"
    stack.run("docker", "pull", "-q", base, check=True)
    ref = f"{stack.registry}/contents/cuda:1.0.0-cu124"
    args = stack.run(
        "docker-variant", "labels", "--label", "cu124", "--property",
        "nvidia :: cuda_version_lower_bound :: 12.4", check=True,
    ).stdout.split()  # fmt: skip
    stack.docker_build(ref, base, args)
    pushed = stack.run("docker", "variant", "push", ref)
    assert pushed.returncode == 0, pushed.stderr
    assert "warning:" in pushed.stderr and "minor-version compatibility" in pushed.stderr


def test_publish_refuses_a_version_holding_a_wrongly_labelled_image(stack: Stack) -> None:
    good = _labels("cu128", *CUDA_PROPERTIES)
    stack.image("cuda-base", "pub_2.0.0-cu128", good)
    stack.image("cuda-base", "pub_2.0.0-k40", _labels("k40", "nvidia :: sm_arch :: 35_real"))
    stack.image("avx2-base", "pub_2.0.0-v3", _labels("v3", "x86_64 :: level :: v3"))
    ref = f"{stack.registry}/contents/pub:2.0.0"
    refused = stack.run("docker", "variant", "publish", ref)
    assert refused.returncode == 2, refused.stderr
    assert f"{stack.registry}/contents/pub:2.0.0-k40 (linux/amd64)" in refused.stderr
    assert "35_real promises capability 3.5" in refused.stderr
    assert stack.run("skopeo", "inspect", "--tls-verify=false", f"docker://{ref}").returncode != 0
    forced = stack.run("docker", "variant", "publish", "--no-verify", ref)
    assert forced.returncode == 0, forced.stderr
    assert "--no-verify" in forced.stderr


def _push_raw_layer(stack: Stack, repo: str, data: bytes) -> str:
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers"}}
    ).encode()
    push_blob(stack.url, repo, config)
    push_blob(stack.url, repo, data)
    push_manifest(stack.url, repo, "1", raw_manifest(config, [data]), OCI_MANIFEST)
    return f"{stack.registry}/{repo}:1"


def test_a_layer_that_is_not_a_tar_is_a_one_line_error(stack: Stack) -> None:
    ref = _push_raw_layer(stack, "contents/notgzip", b"PK\x03\x04" + os.urandom(4096))
    done = stack.run("docker-variant", "inspect", ref)
    assert done.returncode == 2
    assert "neither gzip-compressed nor a tar archive" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_traversal_and_symlink_loops_are_skipped_with_warnings_and_nothing_escapes(
    stack: Stack, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "usr/lib").mkdir(parents=True)
    os.symlink("libcudart.so.12", tree / "usr/lib/libcudart.so.12.8.90")
    os.symlink("libcudart.so.12.8.90", tree / "usr/lib/libcudart.so.12")
    archive = layer(tree, tmp_path / "layer.tar", compress=False)
    with tarfile.open(archive, "a") as tar:
        evil = tmp_path / "evil"
        evil.write_text("root::0:0::/:/bin/sh\n")
        tar.add(evil, arcname="../../etc/passwd")
    ref = _push_raw_layer(stack, "contents/evil", gzip.compress(archive.read_bytes()))
    scratch = tmp_path / "scratch"
    (scratch / "cwd").mkdir(parents=True)
    before = Path("/etc/passwd").read_bytes()
    done = subprocess.run(
        ["docker-variant", "inspect", "--json", ref],
        env={**stack.env, "TMPDIR": str(scratch)},
        cwd=scratch / "cwd",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    warnings = json.loads(done.stdout)["warnings"]
    assert any("'../../etc/passwd': its path escapes the image root" in w for w in warnings)
    assert any("/usr/lib/libcudart.so.12" in w and "symbolic links" in w for w in warnings)
    assert Path("/etc/passwd").read_bytes() == before
    assert sorted(p.name for p in scratch.rglob("*")) == ["cwd"]  # the spool dir is gone


def test_build_push_checks_every_image_before_the_first_push(stack: Stack) -> None:
    base = f"{stack.registry}/contents/avx2:base"
    context = stack.root / "matrix-context"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {base}\n")
    matrix = context / "variants.toml"
    matrix.write_text(
        'dockerfile = "Dockerfile"\n'
        '[[variant]]\nlabel = "v3"\nproperties = ["x86_64 :: level :: v3"]\n'
        '[[variant]]\nlabel = "cpu"\nproperties = ["x86_64 :: level :: v1"]\n'
    )
    ref = f"{stack.registry}/contents/matrix:1.0.0"
    refused = stack.run(
        "docker", "variant", "build", "--matrix", str(matrix), "--push", ref, str(context)
    )
    assert refused.returncode == 2, refused.stderr
    assert f"{ref}-cpu: the labels promise what the binaries do not deliver" in refused.stderr
    assert "/usr/local/bin/avx2 needs" in refused.stderr
    tags = stack.run("curl", "-s", f"{stack.url}/v2/contents/matrix/tags/list", check=True)
    assert "1.0.0-v3" not in tags.stdout  # refused before the first push


PEAK_RSS_CLI = """
import atexit, sys
from pathlib import Path

def peak() -> None:
    status = Path("/proc/self/status").read_text().splitlines()
    sys.stderr.write(next(line for line in status if line.startswith("VmHWM:")) + "\\n")

atexit.register(peak)
from docker_variant.entry import main
main(sys.argv[1:])
"""


def _inspect_with_peak_rss(stack: Stack, ref: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """``docker-variant inspect --json REF`` in a child process, with its peak RSS (KiB)."""
    done = stack.run(sys.executable, "-c", PEAK_RSS_CLI, "inspect", "--json", ref)
    *lines, peak = done.stderr.splitlines()
    done.stderr = "".join(f"{line}\n" for line in lines)
    return done, int(peak.split()[1])


def test_a_gzip_bomb_layer_streams_through_inspect_in_bounded_memory(
    stack: Stack, tmp_path: Path
) -> None:
    """1 MB of gzip holding 1 GiB of zeros (the issue saw 3.1 GB of RSS and no end): the
    whole CLI reads it from the registry with a bounded peak RSS; the same layer cut in half
    is one line, exit 2."""
    bomb = gzip_of_zeros(tmp_path / "bomb.tar.gz").read_bytes()
    done, peak_kib = _inspect_with_peak_rss(stack, _push_raw_layer(stack, "contents/bomb", bomb))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["findings"] == []
    assert peak_kib < 128 << 10, f"peak RSS {peak_kib >> 10} MiB"  # 39 MiB here
    half = _push_raw_layer(stack, "contents/half", bomb[: len(bomb) // 2])
    cut = stack.run("docker-variant", "inspect", half)
    assert cut.returncode == 2, cut.stderr
    assert "corrupt or truncated gzip stream" in cut.stderr
    assert cut.stderr.count("\n") == 1 and "Traceback" not in cut.stderr
