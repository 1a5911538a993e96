"""The CLI on index documents and providers files: output, exit codes, one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clirun import cli_env, run_cli

INDEX = {
    "$schema": "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json",
    "default-priorities": {"namespace": ["nvidia", "x86_64"]},
    "variants": {
        "cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real"]}},
        "cu126": {"nvidia": {"cuda_version_lower_bound": ["12.6"]}},
        "sm100": {"nvidia": {"sm_arch": ["100_real"]}},
        "v3": {"x86_64": {"level": ["v3"]}},
        "npu": {"furiosa": {"arch": ["rngd"]}},
        "null": {},
    },
    "images": {
        label: {
            "tag": f"1.0.0-{label}",
            "digest": "sha256:" + hashlib.sha256(label.encode()).hexdigest(),
        }
        for label in ("cu128", "cu126", "sm100", "v3", "npu", "null")
    },
    "bare": {"tag": "1.0.0", "digest": "sha256:" + hashlib.sha256(b"bare").hexdigest()},
    "invalid": [
        {
            "tag": "1.0.0-bad",
            "error": "dev.pep817.variant.nvidia.sm_arch: value '9.0 ' does not match [a-z0-9_.]+",
        }
    ],
}
H200 = {
    "nvidia": {
        "cuda_version_lower_bound": ["12.8", "12.7", "12.6", "12"],
        "sm_arch": ["90_real", "90_virtual"],
    },
    "x86_64": {"level": ["v3", "v2", "v1"]},
}


def write(tmp: Path, name: str, data: Any) -> str:
    path = tmp / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    """The one error style: ``docker-variant: error: MESSAGE``, then a ``hint:`` at most."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert needle in result.stderr
    error, *rest = [line for line in result.stderr.splitlines() if line.strip()]
    assert error.startswith("docker-variant: error: "), result.stderr
    assert [line.split(" ", 1)[0] for line in rest] in ([], ["hint:"]), result.stderr


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "index": write(tmp_path, "index.json", INDEX),
        "h200": write(tmp_path, "h200.json", H200),
        "cpu": write(tmp_path, "cpu.json", {"x86_64": {"level": ["v2", "v1"]}}),
        "arm": write(tmp_path, "arm.json", {"aarch64": {"version": ["8.2a"]}}),
    }


def test_global_options_after_the_command_win_over_before_and_the_environment(
    files: dict[str, str],
) -> None:
    resolve = ("resolve", "--index", files["index"])
    # after the command beats before it; an explicit option beats the environment
    result = run_cli("--providers-file", files["cpu"], *resolve, "--providers-file", files["h200"])
    assert (result.returncode, result.stdout) == (0, "1.0.0-cu128\n")
    env = {"DOCKER_VARIANT_PROVIDERS_FILE": files["cpu"]}
    for args in (
        ("--providers-file", files["h200"], *resolve),
        (*resolve, "--providers-file", files["h200"]),
    ):
        assert run_cli(*args, env=env).stdout == "1.0.0-cu128\n"
    assert run_cli(*resolve, env=env).stdout == "1.0.0-null\n"
    # the --opt=value form, and after a k8s sub-command and a publisher's command
    result = run_cli(*resolve, f"--providers-file={files['h200']}", "--json")
    assert json.loads(result.stdout)["label"] == "cu128"
    result = run_cli("k8s", "node-labels", "--providers-file", files["h200"], "--json")
    assert result.returncode == 0 and json.loads(result.stdout), result.stderr
    result = run_cli("labels", "--label", "v3", "--property", "x86_64 :: level :: v3", "--json")
    assert result.returncode == 0 and json.loads(result.stdout), result.stderr
    # an option's value that looks like a command or a global option stays its value
    result = run_cli("--providers-file", "ls", *resolve)
    assert_one_line_error(result, 2, "providers file 'ls'")
    result = run_cli(*resolve, "--platform", "--json", "--providers-file", files["h200"])
    assert_one_line_error(result, 2, "--platform: '--json' is not a platform")


def test_resolve_and_ls_with_index(files: dict[str, str], tmp_path: Path) -> None:
    result = run_cli("resolve", "--index", files["index"], "--providers-file", files["h200"])
    assert (result.returncode, result.stdout) == (0, "1.0.0-cu128\n")
    # global options may come before the command too
    result = run_cli(
        "--json", "--providers-file", files["cpu"], "resolve", "--index", files["index"]
    )
    assert json.loads(result.stdout)["label"] == "null"
    listing = json.loads(
        run_cli("ls", "--index", files["index"], "--providers-file", files["h200"], "--json").stdout
    )
    ranked = [(v["label"], v["rank"]) for v in listing["variants"] if v["compatible"]]
    assert ranked == [("cu128", 1), ("cu126", 2), ("v3", 3), ("null", 4), (None, 5)]
    reasons = {
        v["label"] or v["tag"]: v["reason"] for v in listing["variants"] if not v["compatible"]
    }
    assert (
        reasons["sm100"]
        == "nvidia :: sm_arch needs one of 100_real; this host supports 90_real, 90_virtual"
    )
    assert reasons["npu"] == "no provider for namespace furiosa on this host"
    assert "'9.0 '" in reasons["1.0.0-bad"]
    human = run_cli("ls", "--index", files["index"], "--providers-file", files["h200"])
    assert human.returncode == 0 and "cu128" in human.stdout and "furiosa" in human.stdout
    # a variant's properties are one a line in the table, never a shown "\\n" escape
    assert "\\n" not in human.stdout
    row = next(line for line in human.stdout.splitlines() if "cuda_version_lower_bound" in line)
    after = human.stdout.splitlines()[human.stdout.splitlines().index(row) + 1]
    assert "nvidia :: sm_arch ::" in after
    # in a pipe a row is one line, however long: a reason is found whole, beside its tag
    row = next(line for line in human.stdout.splitlines() if "sm100" in line)
    assert "1.0.0-sm100" in row and reasons["sm100"] in row
    assert any(reasons["1.0.0-bad"] in line for line in human.stdout.splitlines())
    narrow = run_cli(
        "ls", "--index", files["index"], "--providers-file", files["h200"], env={"COLUMNS": "60"}
    )
    assert not any(reasons["sm100"] in line for line in narrow.stdout.splitlines())


def test_no_compatible_variant_exits_1_with_every_reason(
    files: dict[str, str], tmp_path: Path
) -> None:
    kept = ("cu128", "npu")
    doc = {
        "variants": {k: v for k, v in INDEX["variants"].items() if k in kept},
        "images": {k: v for k, v in INDEX["images"].items() if k in kept},
    }
    result = run_cli(
        "resolve", "--index", write(tmp_path, "i.json", doc), "--providers-file", files["arm"]
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "cu128: no provider for namespace nvidia on this host" in result.stderr
    assert "npu: no provider for namespace furiosa" in result.stderr
    # ls lists every variant with its reason, in each of its forms, and exits 1 as well
    ls = ("ls", "--index", write(tmp_path, "i.json", doc), "--providers-file", files["arm"])
    for form in ((), ("--json",), ("-q",), ("--format", "json"), ("--format", "{{.Tag}}")):
        listed = run_cli(*ls, *form)
        assert listed.returncode == 1, listed.stderr
        assert listed.stderr == "docker-variant: error: no variant of the index fits this host\n"
    assert "no provider for namespace nvidia" in run_cli(*ls).stdout
    # --json: resolve and pull --dry-run print every variant with its reason, and exit 1
    index = write(tmp_path, "i.json", doc)
    for command in (("resolve",), ("pull", "127.0.0.1:1/app:1.0.0", "--dry-run")):
        result = run_cli(*command, "--index", index, "--providers-file", files["arm"], "--json")
        assert result.returncode == 1, result.stderr
        reasons = {v["label"]: v["reason"] for v in json.loads(result.stdout)["variants"]}
        assert reasons["cu128"] == "no provider for namespace nvidia on this host"


@pytest.mark.parametrize(
    ("providers", "needle"),
    [
        ("not json", "not valid JSON"),
        ("[]", "expected {namespace"),
        ('{"Nvidia": {}}', "'Nvidia'"),
        ('{"nvidia": {"sm_arch": "90_real"}}', "non-empty list"),
        ('{"nvidia": {"sm_arch": []}}', "non-empty list"),
        ('{"nvidia": {"sm_arch": ["9.0 "]}}', "'9.0 '"),
        ('{"nvidia": {"sm_arch": ["90_real", "90_real"]}}', "repeats"),
        ('{"nvidia": ["x"]}', "must map features"),
    ],
)
def test_bad_providers_file_exits_2(
    files: dict[str, str], tmp_path: Path, providers: str, needle: str
) -> None:
    path = write(tmp_path, "bad.json", providers)
    assert_one_line_error(
        run_cli("resolve", "--index", files["index"], "--providers-file", path), 2, needle
    )
    env = {"DOCKER_VARIANT_PROVIDERS_FILE": path}
    assert_one_line_error(run_cli("providers", env=env), 2, needle)


def test_bad_input_exits_2(files: dict[str, str], tmp_path: Path) -> None:
    assert_one_line_error(
        run_cli("resolve", "--index", str(tmp_path / "missing.json")), 2, "missing.json"
    )
    assert_one_line_error(
        run_cli("resolve", "--index", write(tmp_path, "x.json", "{")), 2, "not valid JSON"
    )
    bad = write(tmp_path, "b.json", {"variants": {"cu 128": {}}})
    assert_one_line_error(
        run_cli("ls", "--index", bad, "--providers-file", files["h200"]), 2, "'cu 128'"
    )
    assert_one_line_error(
        run_cli("resolve", "--providers-file", files["h200"]), 2, "exactly one of REF"
    )
    assert_one_line_error(
        run_cli("providers", "--providers-file", str(tmp_path / "nope.json")), 2, "nope.json"
    )
    assert_one_line_error(
        run_cli("providers", "--enable-provider", "nosuchns", tmp=tmp_path), 2, "nosuchns"
    )
    assert_one_line_error(run_cli("nosuchcommand"), 2, "nosuchcommand")


def test_h_and_the_help_command_print_help_as_docker_and_uv_do() -> None:
    """``-h`` is ``--help`` on the group and on every command, ``k8s``'s too; ``help`` and
    ``help COMMAND`` print the same help, also as Docker runs the plugin."""
    for args, usage in (
        ((), "Usage: docker-variant [OPTIONS] COMMAND"),
        (("ls",), "Usage: docker-variant ls [OPTIONS] [REF]"),
        (("k8s",), "Usage: docker-variant k8s [OPTIONS] COMMAND"),
        (("k8s", "claim"), "Usage: docker-variant k8s claim [OPTIONS] [REF]"),
    ):
        long = run_cli(*args, "--help")
        for given in ((*args, "-h"), ("help", *args)):
            short = run_cli(*given)
            assert (short.returncode, short.stdout) == (0, long.stdout), short.stderr
            assert usage in short.stdout
    plugin = run_cli("variant", "help", "pull")
    assert plugin.returncode == 0 and "Usage: docker variant pull [OPTIONS] REF" in plugin.stdout
    assert_one_line_error(run_cli("help", "nosuch"), 2, "No such command 'nosuch'")


def test_every_failure_is_one_error_style(files: dict[str, str], tmp_path: Path) -> None:
    """A usage error (click's own would print the usage, then ``Error: ...``), bad input and
    no compatible variant all start ``docker-variant: error:``; a usage error hints at help."""
    unknown = run_cli("ls", "--nope")
    assert unknown.returncode == 2
    first, hint = unknown.stderr.splitlines()  # click words its message by version
    assert first.startswith("docker-variant: error: No such option")
    assert "--nope" in first and "Did you mean" in first and "--index" in first
    assert hint == "hint: see 'docker-variant ls --help'"
    as_plugin = run_cli("variant", "nosuchcommand")
    assert as_plugin.stderr.splitlines()[1] == "hint: see 'docker variant --help'"
    doc = {"variants": {"npu": INDEX["variants"]["npu"]}, "images": {"npu": INDEX["images"]["npu"]}}
    index = write(tmp_path, "npu.json", doc)
    none = run_cli("resolve", "--index", index, "--providers-file", files["h200"])
    assert none.returncode == 1
    assert none.stderr.splitlines() == [
        "docker-variant: error: no variant of the index fits this host:",
        "  npu: no provider for namespace furiosa on this host",
    ]


def test_local_input_is_checked_before_the_engine_and_the_registry(
    files: dict[str, str], tmp_path: Path
) -> None:
    """Bad input to pull is exit 2 on a host without a Docker engine too; only good input
    goes on to find the engine missing (exit 3)."""
    gone = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    pull = ("pull", "127.0.0.1:1/app:1.0.0")
    for extra, needle in (
        (("--providers-file", str(tmp_path / "nope.json")), "nope.json"),
        (("--providers-file", files["h200"], "--platform", "linux"), "'linux'"),
        (("--providers-file", files["h200"], "--gpus", "device=x"), "device=x"),
        (("--providers-file", files["h200"], "--index", str(tmp_path / "no.json")), "no.json"),
    ):
        assert_one_line_error(run_cli(*pull, *extra, env=gone, tmp=tmp_path), 2, needle)
    result = run_cli(*pull, "--index", files["index"], "--providers-file", files["h200"], env=gone)
    assert_one_line_error(result, 3, "no-engine.sock")
    # ls and resolve too: a bad providers file is named before an unreachable registry
    for command in ("ls", "resolve"):
        result = run_cli(command, "127.0.0.1:1/app:1.0.0", "--providers-file", "nope.json")
        assert_one_line_error(result, 2, "nope.json")


def test_labels_prints_build_args_and_rejects_bad_properties() -> None:
    result = run_cli(
        "labels",
        "--label",
        "cu128",
        "--property",
        "nvidia :: cuda_version_lower_bound :: 12.8",
        "--property",
        "nvidia :: sm_arch :: 90_real",
        "--property",
        "nvidia :: sm_arch :: 100_real",
    )
    assert result.returncode == 0
    assert result.stdout.split() == [
        "--label",
        "dev.pep817.variant-label=cu128",
        "--label",
        "dev.pep817.variant.nvidia.cuda_version_lower_bound=12.8",
        "--label",
        "dev.pep817.variant.nvidia.sm_arch=90_real,100_real",
    ]
    assert json.loads(run_cli("--json", "labels", "--label", "null").stdout) == {
        "dev.pep817.variant-label": "null"
    }
    assert_one_line_error(
        run_cli("labels", "--label", "cu128", "--property", "nvidia :: sm_arch :: 9.0 x"),
        2,
        "nvidia :: sm_arch :: 9.0 x",
    )
    assert_one_line_error(
        run_cli("labels", "--label", "Cu128", "--property", "nvidia :: sm_arch :: 90_real"),
        2,
        "'Cu128'",
    )
    assert_one_line_error(
        run_cli("labels", "--label", "null", "--property", "nvidia :: sm_arch :: 90_real"),
        2,
        "reserved",
    )
    assert_one_line_error(run_cli("labels", "--label", "cu128"), 2, "no properties")


def test_providers_reports_overrides_and_uses_the_file(
    files: dict[str, str], tmp_path: Path
) -> None:
    result = run_cli("providers", "--json", "--providers-file", files["h200"])
    assert json.loads(result.stdout) == H200
    env = {
        "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": "12.7",
        "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "12.5",
    }
    host = json.loads(run_cli("providers", "--json", env=env, tmp=tmp_path).stdout)
    assert host["nvidia"]["cuda_version_lower_bound"][0] == "12.7"
    assert host["nvidia"]["sm_arch"][0] == "125_real"
    assert set(host) >= {"nvidia", "x86_64", "aarch64"}
    # the cache is keyed by the override variables: a different value is not served stale
    env["NV_VARIANT_PROVIDER_FORCE_SM_ARCH"] = "9.0"
    host = json.loads(run_cli("providers", "--json", env=env, tmp=tmp_path).stdout)
    assert host["nvidia"]["sm_arch"] == ["90_real", "90_virtual"]
    bad = run_cli("providers", env={"NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "9.x"}, tmp=tmp_path)
    assert_one_line_error(bad, 2, "NV_VARIANT_PROVIDER_FORCE_SM_ARCH='9.x'")


def test_docker_cli_plugin_protocol(files: dict[str, str]) -> None:
    metadata = json.loads(run_cli("docker-cli-plugin-metadata").stdout)
    assert metadata["SchemaVersion"] == "0.1.0"
    assert set(metadata) == {"SchemaVersion", "Vendor", "Version", "ShortDescription"}
    result = run_cli(
        "variant", "resolve", "--index", files["index"], "--providers-file", files["h200"]
    )
    assert (result.returncode, result.stdout) == (0, "1.0.0-cu128\n")
    # Docker hands its plugin its global options too: they are taken, not a usage error
    resolve = ("resolve", "--index", files["index"], "--providers-file", files["h200"])
    for docker_options in (
        ("--context", "default", "-D"),
        ("--log-level=error", "--tlsverify", "-c", "default"),
        ("--config", str(Path(files["index"]).parent)),
    ):
        result = run_cli(*docker_options, "variant", *resolve)
        assert (result.returncode, result.stdout) == (0, "1.0.0-cu128\n"), result.stderr
    # and -H / --host choose the engine, as DOCKER_HOST does
    for host_option in (("-H", "unix:///nonexistent/a.sock"), ("-Hunix:///nonexistent/a.sock",)):
        pull = ("pull", "127.0.0.1:1/app:1.0.0", "--index", files["index"])
        result = run_cli(*host_option, "variant", *pull, "--providers-file", files["h200"])
        assert_one_line_error(result, 3, "/nonexistent/a.sock")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d["images"]["cu128"].update(tag="../../evil tag"), "images.cu128.tag: tag '../../evil tag'"),
        (lambda d: d["images"]["cu128"].update(digest="notadigest"), "images.cu128.digest: digest 'notadigest'"),
        (lambda d: d["images"].pop("cu128"), "variant 'cu128' has no entry in 'images'"),
        (lambda d: d["images"]["cu128"].update(platforms={"linux": "sha256:" + "a" * 64}), "'linux' is not a platform"),
        (lambda d: d["images"]["cu128"].update(platforms={"linux/amd64": "x"}), "platforms.linux/amd64: digest 'x'"),
    ],
    ids=["tag", "digest", "no-image", "platform", "platform-digest"],
)  # fmt: skip
def test_every_string_of_the_index_document_is_checked(
    tmp_path: Path, change: Any, needle: str
) -> None:
    doc = json.loads(json.dumps(INDEX))
    change(doc)
    result = run_cli("resolve", "--index", write(tmp_path, "i.json", doc))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert needle in line and "\n" not in line and "Traceback" not in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["resolve", "127.0.0.1:99999/app:1"], "port 99999 is not 1-65535"),
        (["resolve", "--index", "http://[::1:5699/x"], "not a valid URL"),
        (["install-plugin", "--dir", "/etc/passwd"], "cannot install the plugin there"),
        (["resolve", "--index", "DEEP"], "nested more than 32 levels"),
        (["resolve", "--index", "UTF16"], "not UTF-8 text"),
        (["providers", "--providers-file", "DEEP"], "nested more than 32 levels"),
        (["providers", "--providers-file", "UTF16"], "not UTF-8 text"),
        (["providers", "--providers-file", "BINARY"], "not UTF-8 text"),
        (["providers", "--providers-file", "NAN"], "NaN is not a JSON value"),
        (["resolve", "--platform", "linux", "--index", "GOOD"], "'linux' is not a platform"),
        (["build", "--matrix", "/nonexistent.toml", "r.example/a:1"], "cannot read it"),
        (["build", "--matrix", "/dev/zero", "r.example/a:1"], "not a regular file"),
        (["build", "--matrix", "DEEP_TOML", "r.example/a:1"], "nested more than 32 levels"),
        (["build", "--matrix", "HUGE_INT_TOML", "r.example/a:1"], "a number of more than"),
        (["build", "--matrix", "OUTSIDE_TOML", "r.example/a:1"], "no '..', not absolute"),
        (["publish", "r.example/a"], "publish needs registry/name:version"),
        (["publish", "r.example/a@sha256:" + "a" * 64], "publish needs registry/name:version"),
    ],
)
def test_every_cli_input_error_is_exit_2_in_one_line(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    files = {
        "DEEP": ("[" * 100_000 + "]" * 100_000).encode(),
        "UTF16": '{"nvidia": {}}'.encode("utf-16"),
        "BINARY": bytes(range(256)),
        "NAN": b'{"nvidia": {"sm_arch": [NaN]}}',  # Python's json takes it; JSON does not
        "GOOD": json.dumps(INDEX).encode(),
        "DEEP_TOML": b"a = " + b"[" * 100_000 + b"]" * 100_000,
        "HUGE_INT_TOML": b"a = 1" + b"0" * 5_000,
        "OUTSIDE_TOML": b'dockerfile = "../outside/Dockerfile"\n[[variant]]\nbare = true\n',
    }
    resolved = []
    for arg in args:
        if arg in files:
            path = tmp_path / arg
            path.write_bytes(files[arg])
            arg = str(path)
        resolved.append(arg)
    result = run_cli(*resolved)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert needle in line and "\n" not in line and "Traceback" not in line


def test_version_is_the_package_version_and_the_plugin_metadata_agrees() -> None:
    from docker_variant import __version__

    done = run_cli("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"docker-variant {__version__}\n", "")
    as_plugin = run_cli("variant", "--version")  # as Docker runs it
    assert as_plugin.stdout == done.stdout
    probe = run_cli("docker-cli-plugin-metadata")
    assert json.loads(probe.stdout)["Version"] == __version__


def test_the_plugin_answers_the_probe_itself_until_the_console_script_is_newer(
    tmp_path: Path,
) -> None:
    """Docker's metadata probe, run before every ``docker variant`` command, starts no Python
    while the installed plugin is current; after an upgrade (a newer console script) the
    console script answers it, with its own version."""
    bindir, plugins = tmp_path / "bin", tmp_path / "plugins"
    bindir.mkdir()
    calls = tmp_path / "calls"
    stub = bindir / "docker-variant"  # stands in for the console script: logs each start
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho \'{{"Version": "9.9"}}\'\n')
    stub.chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    installed = run_cli("install-plugin", "--dir", str(plugins), env=env)
    assert installed.returncode == 0, installed.stderr
    plugin = plugins / "docker-variant"
    os.utime(plugin, (2_000_000_000, 2_000_000_000))
    os.utime(stub, (1_000_000_000, 1_000_000_000))  # older than the plugin

    def probe() -> str:
        return subprocess.run(
            [str(plugin), "docker-cli-plugin-metadata"], capture_output=True, text=True, check=True
        ).stdout

    assert json.loads(probe()) == json.loads(run_cli("docker-cli-plugin-metadata").stdout)
    assert not calls.exists()  # answered by the script
    subprocess.run([str(plugin), "variant", "ls", "x"], check=True, capture_output=True)
    assert calls.read_text() == "variant ls x\n"  # every other call runs the console script
    os.utime(stub, (2_000_000_001, 2_000_000_001))  # the console script is newer: an upgrade
    assert json.loads(probe()) == {"Version": "9.9"}
    assert calls.read_text().splitlines()[-1] == "docker-cli-plugin-metadata"


def test_a_stale_plugin_mends_itself_and_a_broken_one_says_how_to_repair_it(
    tmp_path: Path,
) -> None:
    """After a reinstall (a newer console script) the console script answers Docker's probe
    once and rewrites the plugin script: the next probes start no Python again. Where the
    console script is gone, the probe is still answered and a command says how to repair."""
    bindir, plugins, calls = tmp_path / "bin", tmp_path / "plugins", tmp_path / "calls"
    bindir.mkdir()
    console = bindir / "docker-variant"  # the real CLI, logging each start
    src = Path(__file__).resolve().parent.parent / "src"
    console.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        f'PYTHONPATH={src} exec {sys.executable} -m docker_variant "$@"\n'
    )
    console.chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    assert run_cli("install-plugin", "--dir", str(plugins), env=env).returncode == 0
    plugin = plugins / "docker-variant"
    os.utime(plugin, (1_000_000_000, 1_000_000_000))  # older: the console script was reinstalled

    def probe() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(plugin), "docker-cli-plugin-metadata"], capture_output=True, text=True, check=True
        )

    expected = json.loads(run_cli("docker-cli-plugin-metadata").stdout)
    assert json.loads(probe().stdout) == expected
    assert calls.read_text() == "docker-cli-plugin-metadata\n"  # answered by Python, once
    assert plugin.stat().st_mtime > console.stat().st_mtime  # and the script rewritten
    assert json.loads(probe().stdout) == expected
    assert calls.read_text() == "docker-cli-plugin-metadata\n"  # the script answers again
    console.unlink()  # removed, or its venv moved
    assert json.loads(probe().stdout) == expected  # Docker still lists the plugin
    broken = subprocess.run([str(plugin), "variant", "ls"], capture_output=True, text=True)
    assert broken.returncode == 4
    assert broken.stderr.splitlines() == [
        f"docker-variant: error: the plugin runs {console}, which is gone",
        "hint: run `docker-variant install-plugin` with the docker-variant to use",
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["ls", "--index", "examples/pytorch-2.12.0.json", "--providers-file",
         "examples/hosts/h200-r570.json"],
        ["ls", "--json", "--index", "examples/pytorch-2.12.0.json"],
        ["resolve", "--index", "examples/pytorch-2.12.0.json"],
        ["providers", "--json"],
        ["k8s", "claim", "--index", "examples/pytorch-2.12.0.json", "--count", "1"],
    ],
)  # fmt: skip
def test_a_reader_that_goes_away_is_exit_141_not_1(args: list[str], tmp_path: Path) -> None:
    """``docker variant ls ... | head``: the reader closes its end first. The command ends
    quietly with 141 (128 + SIGPIPE, as a shell reports ``ls`` or ``docker``), never 1,
    which says "no compatible variant"."""
    repo = Path(__file__).resolve().parent.parent
    process = subprocess.Popen(
        [sys.executable, "-m", "docker_variant", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=repo,
        env=cli_env(tmp=tmp_path),
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    errors = process.stderr.read()
    assert process.wait(timeout=60) == 141, errors
    assert errors == b""


def test_ls_quiet_and_format_as_docker_has_them(files: dict[str, str]) -> None:
    """``ls -q``: the compatible variants' references, best first; ``--format``: json lines
    or a template of ``{{.Field}}`` placeholders; anything else is exit 2 naming it."""
    ls = ("ls", "--index", files["index"], "--providers-file", files["h200"])
    quiet = run_cli(*ls, "-q")
    assert (quiet.returncode, quiet.stdout.split()) == (
        0, ["1.0.0-cu128", "1.0.0-cu126", "1.0.0-v3", "1.0.0-null", "1.0.0"])  # fmt: skip
    template = run_cli(*ls, "--format", "{{.Rank}}\\t{{.Tag}}\\t{{ .Compatible }}")
    lines = template.stdout.splitlines()
    assert lines[0] == "1\t1.0.0-cu128\ttrue"
    assert "\t1.0.0-sm100\tfalse" in lines
    reasons = run_cli(*ls, "--format", "{{.Label}}: {{.Reason}}").stdout.splitlines()
    assert "npu: no provider for namespace furiosa on this host" in reasons
    rows = [json.loads(line) for line in run_cli(*ls, "--format", "json").stdout.splitlines()]
    assert [r["label"] for r in rows if r["compatible"]] == ["cu128", "cu126", "v3", "null", None]
    for docker_json in ("{{json .}}", "{{ json . }}"):  # docker's spelling of the same
        assert (
            run_cli(*ls, "--format", docker_json).stdout == run_cli(*ls, "--format", "json").stdout
        )
    assert all(r["reference"] == r["tag"] for r in rows)  # --index: no registry to name
    for bad, needle in (
        ("{{.Name}}", "'{{.Name}}' is not a placeholder"),
        ("{{range .}}{{.Tag}}{{end}}", "'{{range .}}' is not a placeholder"),
        ("tags", "--format 'tags': no {{.Field}} placeholder"),
    ):
        result = run_cli(*ls, "--format", bad)
        assert_one_line_error(result, 2, needle)
        assert result.stdout == ""
    assert_one_line_error(run_cli(*ls, "-q", "--json"), 2, "give one of --json, --quiet")


def test_the_chosen_variant_is_one_key_in_every_json(files: dict[str, str]) -> None:
    """``ls --json``, ``resolve --json`` (when none fits) and ``pull --json`` name the chosen
    variant ``chosen``, one object: its fields and its reference."""
    given = ("--index", files["index"], "--providers-file", files["h200"], "--json")
    listed = json.loads(run_cli("ls", *given).stdout)
    ref = "reg.example:5000/app:1.0.0"
    pulled = json.loads(run_cli("pull", ref, *given, "--dry-run").stdout)
    assert "selected" not in listed
    assert listed["chosen"]["label"] == "cu128" and listed["chosen"]["rank"] == 1
    assert listed["chosen"]["reference"] == "1.0.0-cu128"  # --index alone: the tag
    assert listed["variants"][0] == listed["chosen"]
    assert pulled["chosen"] == listed["chosen"] | {"reference": f"{ref}-cu128"}


def test_format_json_as_docker_takes_it_on_every_command_with_json(
    files: dict[str, str],
) -> None:
    """``--format '{{json .}}'`` (or ``json``), before or after the command: the ``--json``
    document on one line; ``ls``: one variant a line; anything else is exit 2 naming it."""
    index, h200 = ("--index", files["index"]), ("--providers-file", files["h200"])
    for command in (
        ("providers", *h200),
        ("resolve", *index, *h200),
        ("labels", "--label", "v3", "--property", "x86_64 :: level :: v3"),
        ("k8s", "node-labels", *h200),
        ("pull", "reg.example/app:1.0.0", *index, *h200, "--dry-run"),
    ):
        expected = json.loads(run_cli(*command, "--json").stdout)
        for args in ((*command, "--format", "{{json .}}"), ("--format", "json", *command)):
            done = run_cli(*args)
            assert done.returncode == 0, done.stderr
            assert done.stdout.count("\n") == 1 and json.loads(done.stdout) == expected
    lines = run_cli("--format", "{{ json . }}", "ls", *index, *h200).stdout.splitlines()
    assert [json.loads(line)["tag"] for line in lines][:2] == ["1.0.0-cu128", "1.0.0-cu126"]
    bad = run_cli("providers", *h200, "--format", "{{.Tag}}")
    assert_one_line_error(bad, 2, "'{{.Tag}}': this command's --format takes json or '{{json .}}'")


def test_pull_quiet_prints_the_reference_alone(files: dict[str, str]) -> None:
    result = run_cli(
        "pull", "reg.example:5000/app:1.0.0", "--index", files["index"], "--dry-run", "-q",
        "--providers-file", files["h200"],
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "reg.example:5000/app:1.0.0-cu128\n")
