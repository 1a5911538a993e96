"""`docker variant build --matrix --publish` on a real Docker engine, then the published set
as users meet it (docs/reference/image-index.md): a plain `docker pull` and `ctr images pull` get the
baseline, `docker variant pull` gets each host's variant, `--platform linux/arm64` the arm64
image (built with umoci), and `skopeo inspect --raw` shows the annotated index."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import devstack
from docker_variant.providers.nvidia import nvidia_features
from imaging import ImageBuilder, variant_labels

pytestmark = pytest.mark.e2e

H200 = {"nvidia": nvidia_features((12, 8), (9, 0)), "x86_64": {"level": ["v4", "v3", "v2", "v1"]}}
MATRIX = """
dockerfile = "Dockerfile"
namespace-order = ["nvidia", "x86_64"]
[build-args]
APP = "e2e"

[[variant]]
label = "cu128"
properties = ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"]
build-args = { VARIANT = "cu128" }

[[variant]]
label = "cu126"
properties = ["nvidia :: cuda_version_lower_bound :: 12.6"]
build-args = { VARIANT = "cu126" }

[[variant]]
label = "v3"
properties = ["x86_64 :: level :: v3"]
build-args = { VARIANT = "v3" }

[[variant]]
label = "cpu"
properties = ["x86_64 :: level :: v1"]
build-args = { VARIANT = "cpu" }
"""


@dataclass
class Published:
    env: dict[str, str]
    root: Path
    registry: str
    ref: str
    built: dict[str, str]  # label -> image ID
    arm64: str  # manifest digest of the umoci-built arm64 image

    def inspect(self, ref: str, template: str) -> str:
        """``docker image inspect --format TEMPLATE REF``."""
        done = self.run("docker", "image", "inspect", "--format", template, ref, check=True)
        return done.stdout.strip()

    def run(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=300)
        if check:
            assert done.returncode == 0, f"{args}: {done.stderr}"
        return done


def _context(root: Path) -> Path:
    context = root / "context"
    context.mkdir()
    # a file per variant, so that every image has a layer of its own
    (context / "Dockerfile").write_text(
        "FROM scratch\nARG VARIANT\nARG APP\nCOPY ${VARIANT}.txt /app.txt\nLABEL test.app=${APP}\n"
    )
    for label in ("cu128", "cu126", "v3", "cpu"):
        (context / f"{label}.txt").write_text(f"built for {label}\n")
    return context


@pytest.fixture(scope="module")
def published(image_builder: ImageBuilder) -> Iterator[Published]:
    for tool in ("docker", "dockerd", "docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    with devstack.local_stack("dv-pub-", proxy=False) as stack:
        env = stack.client_env()
        registry = stack.registry.address
        ref = f"{registry}/pub/app:1.0.0"
        matrix = stack.root / "matrix.toml"
        matrix.write_text(MATRIX)
        # a GH200 build of the same version, for arm64 hosts
        arm64 = image_builder.build_and_push(
            f"{registry}/pub/app:1.0.0-gh200",
            variant_labels(
                "gh200", nvidia__cuda_version_lower_bound="12.8", nvidia__sm_arch="90_real"
            ),
            architecture="arm64",
        )
        state = Published(env, stack.root, registry, ref, {}, arm64)
        state.run("docker-variant", "install-plugin", check=True)
        done = state.run(
            "docker", "variant", "build", "--matrix", str(matrix), "--publish", ref,
            str(_context(stack.root)), "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["index_digest"].startswith("sha256:")
        state.built = {row["label"]: row["image_id"] for row in answer["images"]}
        assert all(row["pushed"] for row in answer["images"])
        yield state


def test_matrix_builds_four_images_whose_labels_the_tool_accepts(published: Published) -> None:
    assert sorted(published.built) == ["cpu", "cu126", "cu128", "v3"]
    for label, image_id in published.built.items():
        ref = f"{published.registry}/pub/app:1.0.0-{label}"
        inspected = json.loads(published.run("docker", "image", "inspect", ref, check=True).stdout)
        assert inspected[0]["Id"] == image_id
        labels = inspected[0]["Config"]["Labels"]
        assert labels["test.app"] == "e2e"  # shared build args reach the Dockerfile
        # the labels are exactly what `docker-variant labels` gives for the entry
        props = {
            "cu128": ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"],
            "cu126": ["nvidia :: cuda_version_lower_bound :: 12.6"],
            "v3": ["x86_64 :: level :: v3"],
            "cpu": ["x86_64 :: level :: v1"],
        }[label]
        args = [a for p in props for a in ("--property", p)]
        expected = json.loads(
            published.run(
                "docker-variant", "--json", "labels", "--label", label, *args,
                "--namespace-order", "nvidia,x86_64", check=True,
            ).stdout
        )  # fmt: skip
        assert {k: v for k, v in labels.items() if k.startswith("dev.pep817.")} == expected
        # and push accepts them again (the check runs before pushing)
        published.run("docker", "variant", "push", ref, check=True)


def test_skopeo_shows_the_annotated_index(published: Published) -> None:
    raw = published.run(
        "skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{published.ref}", check=True
    ).stdout
    index = json.loads(raw)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert index["annotations"]["dev.pep817.default-priorities.namespace"] == "nvidia,x86_64"
    names = [e["annotations"]["org.opencontainers.image.ref.name"] for e in index["manifests"]]
    # variant-unaware clients: cpu on amd64 (the baseline CPU), gh200 alone on arm64
    assert names[:2] == ["1.0.0-cpu", "1.0.0-gh200"]
    assert sorted(names) == sorted(f"1.0.0-{x}" for x in ("cpu", "cu126", "cu128", "gh200", "v3"))
    cu128 = next(e for e in index["manifests"] if e["annotations"].get(
        "dev.pep817.variant-label") == "cu128")  # fmt: skip
    assert cu128["annotations"]["dev.pep817.variant.nvidia.sm_arch"] == "90_real"
    assert cu128["platform"] == {"architecture": "amd64", "os": "linux"}


def _forget(published: Published) -> None:
    listing = published.run(
        "docker", "images", "--format", "{{.Repository}}:{{.Tag}}", f"{published.registry}/pub/app"
    ).stdout.split()
    refs = [r for r in listing if not r.endswith(":<none>")]
    if refs:
        published.run("docker", "rmi", "-f", *refs, check=True)


def test_plain_docker_pull_gets_the_baseline(published: Published) -> None:
    _forget(published)
    published.run("docker", "pull", "-q", published.ref, check=True)
    got = published.inspect(published.ref, "{{.Id}}")
    assert got == published.built["cpu"]


def test_docker_variant_pull_as_h200_gets_cu128(published: Published) -> None:
    _forget(published)
    host = published.root / "h200.json"
    host.write_text(json.dumps(H200))
    done = published.run(
        "docker", "variant", "pull", "--providers-file", str(host), published.ref, check=True
    )
    assert (
        done.stdout.splitlines()[0]
        == f'Selected variant "cu128" of {published.registry}/pub/app version 1.0.0'
    )
    got = published.inspect(published.ref, "{{.Id}}")
    assert got == published.built["cu128"]


def test_pull_platform_arm64_gets_the_arm64_image(published: Published) -> None:
    _forget(published)
    host = published.root / "gh200.json"
    host.write_text(json.dumps({"nvidia": H200["nvidia"]}))
    done = published.run(
        "docker", "variant", "pull", "--platform", "linux/arm64", "--providers-file", str(host),
        "--json", published.ref,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["label"], answer["digest"]) == ("gh200", published.arm64)
    arch = published.inspect(published.ref, "{{.Architecture}}")
    assert arch == "arm64"
    # on amd64 the same host gets an amd64 build
    amd = published.run(
        "docker-variant", "--json", "resolve", "--providers-file", str(host), published.ref,
        check=True,
    )  # fmt: skip
    assert json.loads(amd.stdout)["label"] == "cu128"


def test_ctr_pull_unpacks_the_baseline(published: Published, containerd: devstack.Service) -> None:
    sock = containerd.address.removeprefix("unix://")
    hosts = published.root / "ctr-hosts" / published.registry
    hosts.mkdir(parents=True)
    (hosts / "hosts.toml").write_text(
        f'server = "http://{published.registry}"\n'
        f'[host."http://{published.registry}"]\n  capabilities = ["pull", "resolve"]\n'
    )
    subprocess.run(
        ["ctr", "-a", sock, "images", "pull", "--hosts-dir", str(hosts.parent),
         "--snapshotter", "native", published.ref],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    # The one image unpacked is the first amd64 entry's: its only layer's snapshot exists.
    snapshots = subprocess.run(
        ["ctr", "-a", sock, "snapshots", "--snapshotter", "native", "ls"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    subprocess.run(["ctr", "-a", sock, "images", "rm", published.ref], capture_output=True)
    layers = {}
    for label in published.built:
        ref = f"{published.registry}/pub/app:1.0.0-{label}"
        published.run("docker", "pull", "-q", ref, check=True)
        out = published.inspect(ref, "{{json .RootFS.Layers}}")
        layers[label] = json.loads(out)[-1]  # a one-layer image: its chain ID is its diff ID
    assert layers["cpu"] in snapshots
    assert not any(layers[x] in snapshots for x in ("cu126", "cu128", "v3"))


def test_a_bad_matrix_entry_fails_before_any_build(published: Published) -> None:
    bad = published.root / "bad.toml"
    bad.write_text(MATRIX.replace('"x86_64 :: level :: v3"', '"x86_64 :: level :: V3"'))
    ref = f"{published.registry}/pub/bad:1.0.0"
    done = published.run(
        "docker", "variant", "build", "--matrix", str(bad), ref, str(published.root / "context")
    )
    assert done.returncode == 2
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "variant[3] (v3)" in line and "x86_64 :: level :: V3" in line
    assert "does not match" in line
    listing = published.run(
        "docker", "images", "-q", f"{published.registry}/pub/bad", check=True
    ).stdout
    assert listing.strip() == ""  # nothing was built


def test_labels_inherited_from_a_variant_base_image_are_refused_before_a_push(
    published: Published,
) -> None:
    """A build adds labels but cannot take one away: built FROM the cu128 image, a cu126
    entry would carry cu128's sm_arch. Refused (exit 2, naming the label), nothing pushed."""
    context = published.root / "inherit"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {published.ref}-cu128\nCOPY x /x\n")
    (context / "x").write_text("x\n")
    matrix = published.root / "inherit.toml"
    matrix.write_text(
        '[[variant]]\nlabel = "cu126"\n'
        'properties = ["nvidia :: cuda_version_lower_bound :: 12.6"]\n'
    )
    ref = f"{published.registry}/pub/inherit:1.0.0"
    done = published.run(
        "docker", "variant", "build", "--matrix", str(matrix), "--push", ref, str(context)
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]  # after the build's progress lines
    assert line.startswith("docker-variant: error: variant[1] (cu126): ")
    assert "dev.pep817.variant.nvidia.sm_arch='90_real'" in line
    tags = httpx.get(f"http://{published.registry}/v2/pub/inherit/tags/list")
    assert tags.status_code == 404  # nothing was pushed


def test_build_push_in_a_log_writes_plain_lines_that_name_their_image(
    published: Published,
) -> None:
    """stderr to a file or a pipe: no bar glyphs; the build's outcome and each pushed layer on
    a line of its own that names the image (the layers exist already: all alike otherwise)."""
    done = published.run(
        "docker", "variant", "build", "--matrix", str(published.root / "matrix.toml"), "--push",
        published.ref, str(published.root / "context"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert not any(glyph in done.stderr for glyph in "━╸╺"), done.stderr
    for label in ("cpu", "cu126", "cu128", "v3"):
        assert f"build 1.0.0-{label}: built" in lines
    layers = [line for line in lines if line.startswith("push ")]
    assert layers and all(": Layer already exists" in line for line in layers), layers
    images = {line.split(" ")[1] for line in layers}
    assert images == {f"{published.ref}-{label}" for label in ("cpu", "cu126", "cu128", "v3")}
    assert all(line.split(" ")[2] == "layer" for line in layers)


def test_a_variant_pushed_after_publish_is_told_to_publish_again(published: Published) -> None:
    """ls, resolve and pull read the published index: a variant pushed later is not among
    the version's until it is published again, and push says so."""
    context = published.root / "late"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nCOPY late.txt /late.txt\n")
    (context / "late.txt").write_text("pushed after the index\n")
    late = f"{published.ref}-v4"
    labels = ["dev.pep817.variant-label=v4", "dev.pep817.variant.x86_64.level=v4"]
    published.run(
        "docker", "build", "-q", "--network=host", "-t", late,
        *(arg for label in labels for arg in ("--label", label)), str(context), check=True,
    )  # fmt: skip
    done = published.run("docker", "variant", "push", late)
    assert done.returncode == 0, done.stderr
    assert f"{published.ref} is a published variant image index without 1.0.0-v4" in done.stderr
    assert f"docker variant publish {published.ref}" in done.stderr
