"""Text from outside (index entries' tags, annotations, image labels, tar member paths) is
shown as it is: rich markup in it is not interpreted (no hyperlink, no MarkupError), and
control characters (ESC, BEL, CR) reach the terminal as escapes such as ``\\x1b``."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from clirun import run_cli
from conftest import RunningRegistry
from docker_variant.safetext import safe_text
from imaging import OCI_INDEX, OCI_MANIFEST, push_blob, push_manifest, raw_manifest
from test_cli_offline import H200

LINK = "[link=http://x]a[/link]"
OPEN = "[bold"
ESC = "\x1b[31m"
BEL = "\x07"
CONTROLS = ("\x1b", "\x07", "\r")


def test_safe_text_escapes_controls_and_markup() -> None:
    assert safe_text(f"a{ESC}b{BEL}c\r\n\t\x7f\x9b\u202e", markup=False) == (
        "a\\x1b[31mb\\x07c\\r\\n\\t\\x7f\\x9b\\u202e"
    )
    assert safe_text(LINK, markup=True) == "\\[link=http://x]a\\[/link]"
    assert safe_text(OPEN, markup=False) == OPEN
    assert safe_text("plain text: 1.0.0-cu128", markup=True) == "plain text: 1.0.0-cu128"


def _layer(member: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"x"
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue())


def _push_hostile_version(registry: RunningRegistry, repo: str) -> str:
    """A raw image with hostile labels and a hostile tar member, and a variant image index
    at 1.0.0 whose entries carry hostile tags and annotations."""
    layer = _layer(f"../{ESC}{LINK}{BEL}{OPEN}/evil")
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": {"dev.pep817.variant-label": f"{LINK}{ESC}{BEL}"}},
            "rootfs": {"type": "layers"},
        }
    ).encode()
    push_blob(registry.url, repo, config)
    push_blob(registry.url, repo, layer)
    manifest = raw_manifest(config, [layer])
    digest = push_manifest(registry.url, repo, "raw", manifest, OCI_MANIFEST)

    def entry(label: str, ref_name: str, **more: str) -> dict[str, object]:
        return {
            "mediaType": OCI_MANIFEST,
            "digest": digest,
            "size": len(manifest),
            "platform": {"os": "linux", "architecture": "amd64"},
            "annotations": {
                "dev.pep817.variant-label": label,
                "org.opencontainers.image.ref.name": ref_name,
                **more,
            },
        }

    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [  # none is valid: pull shows the table of refusals
            entry("cu128", f"1.0.0-{LINK}"),
            entry("v3", f"1.0.0-{OPEN}{ESC}{BEL}"),  # shown in a cell as it is
            entry(
                "cu126",
                "1.0.0-cu126",
                **{"dev.pep817.variant.nvidia.cuda_version_lower_bound": f"12.6{ESC}{BEL}\r"},
            ),
        ],
        "annotations": {"dev.pep817.default-priorities.namespace": "nvidia,x86_64"},
    }
    push_manifest(registry.url, repo, "1.0.0", json.dumps(index).encode(), OCI_INDEX)
    return f"{registry.host}/{repo}"


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    hosts = tmp_path / "h200.json"
    hosts.write_text(json.dumps(H200))
    env = {
        "DOCKER_CONFIG": str(tmp_path / "docker"),
        "DOCKER_VARIANT_PROVIDERS_FILE": str(hosts),
        "COLUMNS": "400",  # no folding: the texts stay whole on one line
    }
    return run_cli(*args, env=env, tmp=tmp_path, timeout=120)


def _assert_harmless(done: subprocess.CompletedProcess[str]) -> None:
    output = done.stdout + done.stderr
    assert "Traceback" not in output and "MarkupError" not in output, output
    assert "internal error" not in output, output
    for control in CONTROLS:
        assert control not in output, (control, output)
    assert "\x1b]8;" not in output  # no hyperlink sequence


@pytest.fixture(scope="module")
def hostile(registry: RunningRegistry) -> str:
    return _push_hostile_version(registry, "untrusted/app")


@pytest.mark.e2e
def test_ls_shows_hostile_tags_literally(hostile: str, tmp_path: Path) -> None:
    done = _cli(tmp_path, "ls", f"{hostile}:1.0.0")
    assert done.returncode == 1, done.stderr  # listed, and none fits this host
    _assert_harmless(done)
    assert LINK in done.stdout and OPEN in done.stdout and "\\x1b[31m\\x07\\r" in done.stdout


@pytest.mark.e2e
def test_pull_dry_run_names_the_choice_without_escapes(hostile: str, tmp_path: Path) -> None:
    done = _cli(tmp_path, "pull", "--dry-run", f"{hostile}:1.0.0")
    assert done.returncode == 1, done.stderr  # nothing fits: the refusals go to stderr
    _assert_harmless(done)
    assert LINK in done.stderr and OPEN in done.stderr and "\\x1b[31m" in done.stderr


@pytest.mark.e2e
def test_inspect_shows_hostile_labels_and_paths_escaped(hostile: str, tmp_path: Path) -> None:
    done = _cli(tmp_path, "inspect", f"{hostile}:raw")
    assert done.returncode == 0, done.stderr
    _assert_harmless(done)
    assert "\\x1b[31m" in done.stdout and "\\x07" in done.stdout
    assert LINK in done.stdout
