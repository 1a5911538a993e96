"""Finding the engine as the Docker CLI does, and its errors, without a running engine."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from docker_variant.docker import Engine, EngineError, check_push_labels, engine_host
from docker_variant.docker.events import LayerLines
from docker_variant.docker.ops import pull_candidate
from docker_variant.errors import InvalidInputError
from docker_variant.oci.reference import parse_reference
from docker_variant.variant import Candidate


@pytest.fixture
def docker_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _context(root: Path, name: str, host: str) -> None:
    meta = root / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(
        json.dumps({"Name": name, "Endpoints": {"docker": {"Host": host}}})
    )


def test_engine_host_follows_docker_host_then_context_then_default(
    docker_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine_host() == "unix:///var/run/docker.sock"
    _context(docker_dir, "remote", "unix:///run/remote.sock")
    (docker_dir / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    assert engine_host() == "unix:///run/remote.sock"
    _context(docker_dir, "other", "tcp://127.0.0.1:2375")
    monkeypatch.setenv("DOCKER_CONTEXT", "other")
    assert engine_host() == "tcp://127.0.0.1:2375"
    monkeypatch.setenv("DOCKER_HOST", "unix:///explicit.sock")
    assert engine_host() == "unix:///explicit.sock"


def test_unknown_context_and_bad_host_are_bad_input(
    docker_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CONTEXT", "missing")
    with pytest.raises(InvalidInputError, match="'missing'"):
        engine_host()
    with pytest.raises(InvalidInputError, match="ssh://"):
        Engine("ssh://somewhere")


def test_engine_down_is_exit_3(tmp_path: Path) -> None:
    with Engine(f"unix://{tmp_path}/none.sock") as engine, pytest.raises(EngineError) as caught:
        engine.ping()
    assert caught.value.exit_code == 3 and "not reachable" in str(caught.value)


@pytest.mark.parametrize(
    ("tag", "labels", "needle"),
    [
        (
            "1.0.0-cu126",
            {"dev.pep817.variant-label": "cu128", "dev.pep817.variant.nvidia.sm_arch": "90_real"},
            "must be <version>-cu128",
        ),
        (
            "cu128",
            {"dev.pep817.variant-label": "cu128", "dev.pep817.variant.nvidia.sm_arch": "90_real"},
            "must be <version>-cu128",
        ),
        (
            "1.0.0-null",
            {"dev.pep817.variant-label": "null", "dev.pep817.variant.nvidia.sm_arch": "90_real"},
            "reserved",
        ),
        ("1.0.0-x", {"dev.pep817.variant-label": "x"}, "no properties"),
    ],
)
def test_push_label_checks(tag: str, labels: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidInputError, match=needle):
        check_push_labels(parse_reference(f"127.0.0.1:5000/app:{tag}"), labels)


def test_push_label_checks_accept_good_images() -> None:
    ref = parse_reference("127.0.0.1:5000/app:2.12.0-ubuntu24.04-cu128")
    labels = {"dev.pep817.variant-label": "cu128", "dev.pep817.variant.nvidia.sm_arch": "90_real"}
    variant = check_push_labels(ref, labels)
    assert variant is not None and variant.label == "cu128"
    assert (
        check_push_labels(parse_reference("127.0.0.1:5000/app:1.0.0"), {"maintainer": "me"}) is None
    )
    null = check_push_labels(
        parse_reference("127.0.0.1:5000/app:1.0.0-null"), {"dev.pep817.variant-label": "null"}
    )
    assert null is not None and null.is_null


def test_a_log_or_pipe_gets_one_plain_line_per_finished_layer() -> None:
    """The engine's own event shapes, as a pull in a pipe writes them: no bars, a line once a
    layer is done (once, however often the engine says so), registry text shown safely."""
    out = io.StringIO()
    events: list[dict[str, object]] = [
        {"status": "Pulling from e2e/app", "id": "1.0.0-cu128"},
        {"status": "Pulling fs layer", "id": "5d0aeceef7ee", "progressDetail": {}},
        {"status": "Downloading", "id": "5d0aeceef7ee", "progressDetail": {"current": 5}},
        {"status": "Already exists", "id": "621222cd8430"},
        {"status": "Pull complete", "id": "5d0aeceef7ee", "progressDetail": {}},
        {"status": "Pull complete", "id": "5d0aeceef7ee"},
        {"status": "Pull complete", "id": "[bold]\x1b]0;t\x07"},
        {"status": "Digest: sha256:" + "a" * 64},
        {"status": "Status: Downloaded newer image for e2e/app:1.0.0-cu128"},
    ]
    with LayerLines("pull", out, "e2e/app:1.0.0-cu128") as lines:
        for event in events:
            lines(event)
    assert out.getvalue() == (
        "pull e2e/app:1.0.0-cu128 layer 621222cd8430: Already exists\n"
        "pull e2e/app:1.0.0-cu128 layer 5d0aeceef7ee: Pull complete\n"
        "pull e2e/app:1.0.0-cu128 layer [bold]\\x1b]0;t\\x07: Pull complete\n"
    )


class _TagRecorder(Engine):
    """An engine whose pulled image carries ``repo_tags``; records the tag requests."""

    def __init__(self, repo_tags: list[str]) -> None:  # no connection: nothing is sent
        self.repo_tags = repo_tags
        self.calls: list[str] = []

    def pull(self, *args: Any, **kwargs: Any) -> None:
        pass

    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        return {"Id": "sha256:" + "1" * 64, "RepoTags": self.repo_tags}

    def tag(self, source: str, repository: str, tag: str) -> None:
        self.calls.append(f"tag {repository}:{tag}")
        if tag == "fail":
            raise EngineError("tag refused")

    def untag(self, ref: str) -> None:
        self.calls.append(f"untag {ref}")


@pytest.mark.parametrize(
    ("ref", "repo_tags", "calls"),
    [
        # Docker lists a Docker Hub image's tags in their short form
        ("ubuntu:1.0", ["ubuntu:1.0-v3", "ubuntu:1.0"], []),
        ("ubuntu:1.0", ["ubuntu:1.0-v3"], ["tag docker.io/library/ubuntu:1.0"]),
        ("127.0.0.1:5000/app:1.0", ["127.0.0.1:5000/app:1.0-v3"], ["tag 127.0.0.1:5000/app:1.0"]),
        ("127.0.0.1:5000/app:1.0", [], ["tag 127.0.0.1:5000/app:1.0-v3", "tag 127.0.0.1:5000/app:1.0"]),
        # the second tag refused: the first one made here is undone, one already there is kept
        ("r.example/app:fail", [], ["tag r.example/app:fail-v3", "tag r.example/app:fail", "untag r.example/app:fail-v3"]),
        ("r.example/app:fail", ["r.example/app:fail-v3"], ["tag r.example/app:fail"]),
    ],
)  # fmt: skip
def test_pull_tags_only_what_the_image_lacks(
    ref: str, repo_tags: list[str], calls: list[str]
) -> None:
    reference = parse_reference(ref)
    assert reference.tag is not None
    chosen = Candidate(
        label="v3", tag=f"{reference.tag}-v3", digest="sha256:" + "2" * 64, kind="variant"
    )
    engine = _TagRecorder(repo_tags)
    if reference.tag == "fail":
        with pytest.raises(EngineError):
            pull_candidate(engine, reference, chosen, lambda _: None)
    else:
        pull_candidate(engine, reference, chosen, lambda _: None)
    assert engine.calls == calls
