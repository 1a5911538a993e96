"""Shell completion, driven through real bash: the script ``docker-variant --show-completion
bash`` prints, and Docker's own bash completion (Debian's ``docker.io`` with
``bash-completion``) completing ``docker variant <TAB>`` through the plugin's ``__complete``.
Tags come from a real registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clirun import cli_env, run_cli
from conftest import RunningRegistry
from docker_variant.cli.complete import complete_reference
from docker_variant.oci.client import SyncRegistryClient
from imaging import push_raw_image

BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")
DOCKER_COMPLETION = Path("/usr/share/bash-completion/completions/docker")


def _output(argv: list[str], env: dict[str, str]) -> str:
    """The stdout of ``argv``, which must succeed."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _bash(script: str, env: dict[str, str]) -> list[str]:
    """Run ``script`` in a non-interactive bash; its stdout, a line per candidate."""
    out = _output(["bash", "--norc", "--noprofile", "-c", script], env)
    return [line for line in out.splitlines() if line]


def _complete_line(words: list[str]) -> str:
    """Bash lines that set the completion variables as readline would for ``words`` (the
    last one being completed) and print COMPREPLY after ``$COMPLETE`` runs."""
    line = " ".join(words)
    quoted = " ".join(f"'{w}'" for w in words)
    return (
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
        f"COMP_LINE='{line}'; COMP_POINT={len(line)}; COMP_TYPE=9; "
        # as bash calls a completion function: the command, the word, the word before
        f"$COMPLETE '{words[0]}' '{words[-1]}' '{words[-2]}'; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``docker-variant`` on PATH (the venv's console script) and the installed plugin."""
    where = tmp_path_factory.mktemp("completion")
    done = run_cli("install-plugin", "--dir", str(where / "cli-plugins"))
    assert done.returncode == 0, done.stderr
    return where


def _env(bin_dir: Path) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return cli_env({"PATH": path, "HOME": str(bin_dir)})


def test_typer_bash_completion_completes_commands_and_options(bin_dir: Path) -> None:
    env = _env(bin_dir)
    shown = _output(["docker-variant", "--show-completion", "bash"], env)
    script = bin_dir / "docker-variant.bash"
    script.write_text(shown)
    function = next(
        line.split()[0].removesuffix("()")
        for line in shown.splitlines()
        if line.rstrip().endswith("() {")
    )
    prelude = f"source {script}; COMPLETE={function}; "
    commands = _bash(prelude + _complete_line(["docker-variant", "p"]), env)
    assert set(commands) == {"providers", "pull", "push", "publish"}
    options = _bash(prelude + _complete_line(["docker-variant", "pull", "--d"]), env)
    assert set(options) == {"--dry-run", "--descriptors"}


@pytest.mark.skipif(
    not (BASH_COMPLETION.exists() and DOCKER_COMPLETION.exists()),
    reason="bash-completion and docker.io's completion are installed by scripts/setup",
)
def test_docker_bash_completion_asks_the_plugin(bin_dir: Path, registry: RunningRegistry) -> None:
    """``docker variant <TAB>``: Docker's script runs the plugin's ``__completeNoDesc``."""
    for tag in ("2.12.0", "2.12.0-cu128", "2.13.0"):
        push_raw_image(registry.url, "complete/app", tag, json.dumps({"tag": tag}).encode())
    env = _env(bin_dir)
    plugin = bin_dir / "cli-plugins" / "docker-variant"
    prelude = (
        f"source {BASH_COMPLETION}; source {DOCKER_COMPLETION}; "
        f"DOCKER_PLUGINS_PATH={plugin}:; COMPLETE=_docker; "
    )
    commands = _bash(prelude + _complete_line(["docker", "variant", "p"]), env)
    assert set(commands) == {"providers", "pull", "push", "publish"}
    options = _bash(prelude + _complete_line(["docker", "variant", "pull", "--dr"]), env)
    assert options == ["--dry-run"]
    ref = f"{registry.host}/complete/app:2.12"
    tags = _bash(prelude + _complete_line(["docker", "variant", "pull", ref]), env)
    assert set(tags) == {f"{registry.host}/complete/app:2.12.0", f"{ref}.0-cu128"}


def test_cobra_protocol_answers_with_a_directive(bin_dir: Path) -> None:
    """What Docker's cobra completion (zsh, fish, bash v2) reads: candidates with
    descriptions, then ``:4`` (no file completion)."""
    done = run_cli("__complete", "variant", "k8s", "")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == ":4"
    assert [line.split("\t")[0] for line in lines[:-1]] == [
        "claim",
        "node-labels",
        "containerd-hosts",
        "gang",
    ]


def test_tags_outside_the_grammar_are_never_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry's tag list is outside input: Docker's bash script expands each candidate,
    so a tag holding ``$(...)``, a newline or a space would reach the user's shell."""
    hostile = ["2.12.0", "2.12.0$(touch pwned)", "2.12.0\nx", "2.12 0", "2.12.0-cu128"]
    monkeypatch.setattr(SyncRegistryClient, "list_tags", lambda *_a, **_k: hostile)
    assert complete_reference("127.0.0.1:9/app:2.12") == [
        "127.0.0.1:9/app:2.12.0",
        "127.0.0.1:9/app:2.12.0-cu128",
    ]
    assert complete_reference("127.0.0.1:9/app") == []  # a repository is never listed


def test_completion_scripts_asked_through_docker_are_docker_variants(tmp_path: Path) -> None:
    """``docker variant --install-completion`` once wrote ``complete ... docker variant`` with
    ``_DOCKER VARIANT_COMPLETE``, which breaks Docker's own completion in every new shell: a
    script is only ever for the ``docker-variant`` command."""
    shown = run_cli("variant", "--show-completion", "bash")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.rstrip().endswith("_docker_variant_completion docker-variant")
    assert "docker variant" not in shown.stdout and "_DOCKER VARIANT" not in shown.stdout
    assert "completes through Docker's own completion" in shown.stderr
    installed = run_cli("variant", "--install-completion", "bash", env={"HOME": str(tmp_path)})
    assert installed.returncode == 0, installed.stderr
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "docker-variant" in written
    assert "docker variant" not in written and "_DOCKER VARIANT" not in written
