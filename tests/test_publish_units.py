"""Pure parts of publishing (docs/reference/image-index.md): platforms as Docker matches them, the variant
image index written and read back, which entry variant-unaware clients get, the matrix."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from docker_variant.docker.context import context_archive
from docker_variant.errors import InvalidInputError
from docker_variant.oci.client import OCI_MANIFEST, retry_after
from docker_variant.oci.imageindex import (
    IndexEntry,
    order_entries,
    read_image_index,
    write_image_index,
)
from docker_variant.publish.matrix import load_matrix, parse_matrix
from docker_variant.variant import build_index, select
from docker_variant.variant.labels import labels_for
from docker_variant.variant.model import parse_property
from docker_variant.variant.platform import Platform, platform_of_lists

AMD, ARM = Platform("linux", "amd64"), Platform("linux", "arm64")


@pytest.mark.parametrize(
    ("host", "image", "fits"),
    [
        ("linux/amd64", "linux/amd64", True),
        ("linux/arm64", "linux/arm64/v8", True),  # arm64 means arm64/v8
        ("linux/aarch64", "linux/arm64", True),  # the machine's spelling
        ("linux/amd64", "linux/amd64/v1", True),
        ("linux/amd64", "linux/arm64", False),
        ("linux/arm/v7", "linux/arm/v6", False),
        ("linux/amd64", "windows/amd64", False),
    ],
)
def test_platforms_match_as_docker_matches_them(host: str, image: str, fits: bool) -> None:
    assert Platform.parse(host).matches(Platform.parse(image)) is fits


@pytest.mark.parametrize("text", ["linux", "linux/", "Linux/AMD64/v8/x", "linux/am d64", ""])
def test_bad_platforms_are_refused_naming_them(text: str) -> None:
    with pytest.raises(InvalidInputError, match="is not a platform"):
        Platform.parse(text, "--platform")


def test_the_cpu_namespace_implies_the_platform() -> None:
    assert platform_of_lists({"x86_64": {"level": ["v1"]}}) == AMD
    assert platform_of_lists({"aarch64": {"version": ["8a"]}, "nvidia": {}}) == ARM
    assert platform_of_lists({"nvidia": {"sm_arch": ["90_real"]}}) is None
    assert platform_of_lists({"x86_64": {"level": ["v1"]}, "aarch64": {"v": ["8a"]}}) is None


def _entry(tag: str, platform: Platform, props: list[str] | None, n: int) -> IndexEntry:
    label = tag.split("-", 1)[1] if "-" in tag else None
    labels = {} if label is None else labels_for(label, [parse_property(p) for p in props or []])
    return IndexEntry(tag, platform, OCI_MANIFEST, f"sha256:{n:064x}", 500 + n, labels)


def _written(entries: list[IndexEntry]) -> tuple[list[str], dict[str, Any]]:
    index = build_index("1.0", [e.record() for e in entries])
    body = write_image_index(order_entries(entries, index), index.namespace_order)
    document = json.loads(body)
    return [
        m["annotations"]["org.opencontainers.image.ref.name"] for m in document["manifests"]
    ], document


CU128 = ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"]
CU126 = ["nvidia :: cuda_version_lower_bound :: 12.6"]


@pytest.mark.parametrize(
    ("tags", "first"),
    [
        ({"1.0-cu128": CU128, "1.0-cpu": ["x86_64 :: level :: v1"], "1.0": None}, "1.0"),
        ({"1.0-cu128": CU128, "1.0-null": [], "1.0-cpu": ["x86_64 :: level :: v1"]}, "1.0-null"),
        # no bare, no null: what the baseline CPU without an accelerator ranks first
        ({"1.0-cu128": CU128, "1.0-v3": ["x86_64 :: level :: v3"],
          "1.0-v1": ["x86_64 :: level :: v1"]}, "1.0-v1"),
        # nothing runs on the baseline: the least demanding build
        ({"1.0-cu128": CU128, "1.0-cu126": CU126}, "1.0-cu126"),
    ],
    ids=["bare", "null", "baseline-cpu", "least-demanding"],
)  # fmt: skip
def test_variant_unaware_clients_get_the_baseline_first(
    tags: dict[str, list[str] | None], first: str
) -> None:
    entries = [_entry(tag, AMD, props, n) for n, (tag, props) in enumerate(tags.items())]
    names, _ = _written(entries)
    assert names[0] == first
    assert sorted(names) == sorted(tags)


def test_each_platform_has_its_own_first_entry_and_reading_it_back_is_the_same_index() -> None:
    entries = [
        _entry("1.0-cu128", AMD, CU128, 1),
        _entry("1.0-cu128", ARM, CU128, 2),
        _entry("1.0-cpu", AMD, ["x86_64 :: level :: v1"], 3),
        _entry("1.0-armv8", ARM, ["aarch64 :: version :: 8a"], 4),
        _entry("1.0", AMD, None, 5),
    ]
    _, document = _written(entries)
    first = {}
    for m in document["manifests"]:
        first.setdefault(m["platform"]["architecture"], m["annotations"])
    assert first["amd64"] == {"org.opencontainers.image.ref.name": "1.0"}
    assert first["arm64"]["dev.pep817.variant-label"] == "armv8"
    back = read_image_index(document, "1.0")
    assert back is not None
    original = build_index("1.0", [e.record() for e in entries])
    assert build_index("1.0", [e.record() for e in back]).to_json() == original.to_json()
    assert original.images["cu128"].platforms == {
        "linux/amd64": f"sha256:{1:064x}",
        "linux/arm64": f"sha256:{2:064x}",
    }
    # the same inputs, in any order, give the same bytes
    index = build_index("1.0", [e.record() for e in entries])
    again = write_image_index(order_entries(entries[::-1], index), index.namespace_order)
    assert json.loads(again) == document


def test_an_ordinary_index_is_not_a_variant_index() -> None:
    plain = {
        "schemaVersion": 2,
        "manifests": [
            {"digest": "sha256:" + "a" * 64, "platform": {"os": "linux", "architecture": "amd64"}}
        ],
    }
    assert read_image_index(plain, "1.0") is None


def test_selection_skips_images_for_other_platforms_with_the_reason() -> None:
    entries = [
        _entry("1.0-cu128", ARM, CU128, 1),
        _entry("1.0-cpu", AMD, ["x86_64 :: level :: v1"], 2),
    ]
    index = build_index("1.0", [e.record() for e in entries])
    host = {
        "x86_64": {"level": ["v3", "v2", "v1"]},
        "nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]},
    }
    on_amd = select(index, host, AMD)
    assert [c.label for c in on_amd.ranked] == ["cpu"]
    assert {c.label: c.reason for c in on_amd.rejected} == {
        "cu128": "no linux/amd64 image (it has linux/arm64)"
    }
    on_arm = select(index, host, ARM)
    assert [(c.label, c.digest, c.platform) for c in on_arm.ranked] == [
        ("cu128", f"sha256:{1:064x}", "linux/arm64")
    ]
    # a document without platforms: every image is for the host's platform
    assert [c.label for c in select(index, host).ranked] == ["cu128", "cpu"]


GOOD = """
dockerfile = "build/Dockerfile"
namespace-order = ["nvidia"]
[build-args]
BASE = "debian"
[[variant]]
label = "cu128"
properties = ["nvidia :: sm_arch :: 90_real"]
build-args = { BASE = "cuda", CUDA = "12.8" }
platform = "linux/arm64"
[[variant]]
bare = true
"""


def test_a_matrix_entry_gets_its_labels_args_and_platform() -> None:
    matrix = parse_matrix(GOOD)
    assert matrix.dockerfile == "build/Dockerfile"
    cu128, bare = matrix.entries
    assert cu128.labels == {
        "dev.pep817.variant-label": "cu128",
        "dev.pep817.variant.nvidia.sm_arch": "90_real",
        "dev.pep817.default-priorities.namespace": "nvidia",
    }
    assert cu128.build_args == {"BASE": "cuda", "CUDA": "12.8"}
    assert cu128.platform == ARM and cu128.tag("1.0") == "1.0-cu128"
    assert bare.labels == {} and bare.tag("1.0") == "1.0" and bare.build_args == {"BASE": "debian"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("90_real", "9.0"), "variant[1] (cu128): variant 'cu128': nvidia :: sm_arch"),
        (GOOD.replace('label = "cu128"', 'label = "CU128"'), "variant label 'CU128'"),
        (GOOD.replace("linux/arm64", "arm64"), "'arm64' is not a platform"),
        (
            GOOD + '[[variant]]\nlabel = "cu128"\nproperties = ["nvidia :: sm_arch :: 80_real"]\n',
            "variant[3] (cu128) repeats variant[1] (cu128)",
        ),
        (GOOD + "[[variant]]\nbare = true\n", "variant[3] repeats variant[2]"),
        (GOOD.replace("bare = true", 'bare = true\nlabel = "x"'), "a bare entry has no label"),
        (GOOD.replace("platform =", "plat ="), "unknown key 'plat'"),
        (
            GOOD.replace('dockerfile = "build/Dockerfile"', 'dockerfile = "/etc/passwd"'),
            "inside the build context",
        ),
        ("[[variant]]\nproperties = []\n", "needs a label"),
        ('dockerfile = "Dockerfile"\n', "no [[variant]] entries"),
        ("this is = not toml", "not valid TOML"),
        (GOOD.replace('"build/Dockerfile"', '"../outside/Dockerfile"'), "no '..', not absolute"),
        (GOOD.replace('"build/Dockerfile"', '"build/../../Dockerfile"'), "no '..'"),
        ("a = " + "{b = " * 40 + "1" + "}" * 40, "nested more than 32 levels"),
        ("a = " + "[" * 50_000 + "]" * 50_000, "nested more than 32 levels"),
        ("n = 1" + "0" * 5_000, "a number of more than 4300 digits"),
        (GOOD.replace("CUDA =", '"BAD-NAME" ='), "'BAD-NAME' is not a build argument name"),
    ],
)
def test_a_bad_matrix_is_refused_naming_the_entry_and_rule(text: str, expected: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_matrix(text, "matrix m.toml")
    message = str(caught.value)
    assert expected in message and "\n" not in message
    assert message.startswith("matrix m.toml: ")


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, 1.0), ("5", 5.0), ("junk", 1.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_retry_after(header: str | None, seconds: float) -> None:
    assert retry_after(header) == seconds


def test_a_matrix_file_is_read_with_a_bound(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not a regular file"):
        load_matrix(Path("/dev/zero"))  # refused before any read
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(InvalidInputError, match=r"big\.toml.*larger than"):
        load_matrix(big)


def test_a_dockerfile_symlink_out_of_the_context_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "Dockerfile").write_text("FROM scratch\n")
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").symlink_to(outside / "Dockerfile")
    with pytest.raises(InvalidInputError, match="leads outside it"):
        context_archive(context, "Dockerfile")
    (context / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidInputError, match="leads outside it"):
        context_archive(context, "sub/Dockerfile")


def _sent(tmp_path: Path, ignore: str, files: list[str]) -> list[str]:
    """What ``context_archive`` sends of ``files`` under ``ignore`` (the Dockerfile and
    ``.dockerignore`` left out of the answer: they are always sent)."""
    context = tmp_path / "ctx"
    for name in [*files, "Dockerfile"]:
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_text(name)
    (context / ".dockerignore").write_text(ignore)
    with tarfile.open(fileobj=io.BytesIO(context_archive(context, "Dockerfile"))) as archive:
        names = archive.getnames()
    assert "Dockerfile" in names and ".dockerignore" in names
    return sorted(n for n in names if (context / n).is_file() and n in files)


FILES = ["a.log", "logs/b.log", "foo/x", "sub/foo", "tempa", "sub/temporary.txt", "README.md",
         "docs/guide.md", "src/main.go", "src/pkg/util.go", "keep/me", "keep/not"]  # fmt: skip


@pytest.mark.parametrize(
    ("ignore", "left_out"),
    [
        ("*.log", ["a.log"]),  # * does not cross a directory
        ("**/*.log", ["a.log", "logs/b.log"]),
        ("foo", ["foo/x"]),  # a directory takes what is under it; sub/foo is another path
        ("/foo/", ["foo/x"]),
        ("*/temp*", ["sub/temporary.txt"]),
        ("temp?", ["tempa"]),
        ("**/*.go", ["src/main.go", "src/pkg/util.go"]),
        ("*.md\n!README.md", []),  # *.md is the root's only, README.md taken back
        ("**/*.md\n!README.md", ["docs/guide.md"]),
        ("keep\n!keep/me", ["keep/not"]),
        ("# a comment\n\nsrc/*/\n", ["src/main.go", "src/pkg/util.go"]),  # src/*/ is src/*
        ("Dockerfile\n.dockerignore", []),  # sent all the same
    ],
)
def test_dockerignore_is_read_as_docker_reads_it(
    tmp_path: Path, ignore: str, left_out: list[str]
) -> None:
    assert _sent(tmp_path, ignore, FILES) == sorted(set(FILES) - set(left_out))


class _Inspected:
    """The one engine call the check after a build makes: an image's inspection, as the
    engine answers it (the classic builder makes a FROM scratch image for the engine's own
    platform on some engines and for the asked one on others, so an e2e test cannot pin it)."""

    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer

    def inspect_image(self, ref: str) -> dict[str, object]:
        return self.answer


def test_an_image_built_for_another_platform_than_asked_is_refused() -> None:
    from docker_variant.oci.reference import parse_reference
    from docker_variant.publish.build import _check_built

    (entry,) = parse_matrix(
        '[[variant]]\nlabel = "armv8"\nproperties = ["aarch64 :: version :: 8a"]\n'
        'platform = "linux/arm64"\n'
    ).entries
    target = parse_reference("127.0.0.1:5000/app:1.0.0-armv8")
    config = {"Labels": dict(entry.labels)}
    made = _Inspected({"Os": "linux", "Architecture": "amd64", "Config": config})
    with pytest.raises(InvalidInputError, match=r"asked for linux/arm64, .* for linux/amd64"):
        _check_built(made, entry, target, "sha256:x")  # type: ignore[arg-type]
    arm = _Inspected({"Os": "linux", "Architecture": "arm64", "Variant": "v8", "Config": config})
    _check_built(arm, entry, target, "sha256:x")  # type: ignore[arg-type]
