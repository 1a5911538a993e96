"""`docker variant push/pull/ls/resolve` end to end: the real Docker CLI plugin path, a real
engine (dockerd, started here), the Debian registry and variant-proxy (docs/reference/cli.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import devstack
from conftest import RunningRegistry
from docker_variant.providers.nvidia import nvidia_features

pytestmark = pytest.mark.e2e

HOSTS = {
    "h200": {
        "nvidia": nvidia_features((12, 8), (9, 0)),
        "x86_64": {"level": ["v4", "v3", "v2", "v1"]},
    },
    "old-driver": {"nvidia": nvidia_features((12, 4), (8, 0)), "x86_64": {"level": ["v2", "v1"]}},
    "v3-cpu": {"x86_64": {"level": ["v3", "v2", "v1"]}},
    "graviton": {"aarch64": {"version": ["8.2a", "8.1a", "8.0a"]}},
}
VARIANTS = {  # label -> properties, as `docker-variant labels` takes them
    "cpu": ["x86_64 :: level :: v1"],
    "v3": ["x86_64 :: level :: v3"],
    "cu126": ["nvidia :: cuda_version_lower_bound :: 12.6"],
    "cu128": ["nvidia :: cuda_version_lower_bound :: 12.8", "nvidia :: sm_arch :: 90_real"],
    "null": [],
}


@dataclass
class Stack:
    env: dict[str, str]
    registry: devstack.Service
    proxy: devstack.Service
    root: Path

    def run(
        self, *args: str, check: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            list(args), capture_output=True, text=True, env={**self.env, **(env or {})}, timeout=300
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{args} failed ({result.returncode}): {result.stderr}")
        return result

    def docker(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run("docker", *args, **kw)  # type: ignore[arg-type]

    def image_id(self, ref: str) -> str | None:
        result = self.docker("image", "inspect", "--format", "{{.Id}}", ref)
        return result.stdout.strip() if result.returncode == 0 else None

    def build(
        self, ref: str, label: str | None, content: str, extra: list[str] | None = None
    ) -> None:
        context = self.root / "context"
        context.mkdir(exist_ok=True)
        (context / "Dockerfile").write_text("FROM scratch\nCOPY app.txt /app.txt\n")
        (context / "app.txt").write_text(content)
        build_args: list[str] = list(extra or [])
        if label is not None:
            props = [a for p in VARIANTS[label] for a in ("--property", p)]
            build_args += self.run(
                "docker-variant", "labels", "--label", label, *props, check=True
            ).stdout.split()
        self.docker(
            "build", "-q", "--network=host", "-t", ref, *build_args, str(context), check=True
        )

    def host_file(self, name: str) -> str:
        path = self.root / f"{name}.json"
        path.write_text(json.dumps(HOSTS[name]))
        return str(path)

    def publish(
        self,
        repo: str,
        labels: list[str],
        bare: bool = True,
        via_proxy: bool = False,
        via: str | None = None,
    ) -> str:
        """Build and `docker variant push` one image per label (and a bare one) to the
        registry, the proxy (``via_proxy``) or the address ``via``; returns REF."""
        registry = via or (self.proxy.address if via_proxy else self.registry.address)
        for label in labels:
            ref = f"{registry}/{repo}:1.0.0-{label}"
            self.build(ref, label, f"{repo} {label}\n")
            self.docker("variant", "push", ref, check=True)
        if bare:
            ref = f"{registry}/{repo}:1.0.0"
            self.build(ref, None, f"{repo} bare\n")
            self.docker("variant", "push", ref, check=True)
        self.forget(registry, repo)
        return f"{registry}/{repo}:1.0.0"

    def proxy_requests(self) -> dict[str, float]:
        """Requests the proxy answered, by route class (from its Prometheus /metrics)."""
        counts: dict[str, float] = {}
        text = self.run("curl", "-s", f"{self.proxy.url}/metrics", check=True).stdout
        for line in text.splitlines():
            if line.startswith("variant_proxy_requests_total{"):
                route = line.split('route="', 1)[1].split('"', 1)[0]
                counts[route] = counts.get(route, 0) + float(line.rsplit(" ", 1)[1])
        return counts

    def forget(self, registry: str, repo: str) -> None:
        """Remove every local tag of the repository so that pulls really download."""
        listing = self.docker(
            "images", "--format", "{{.Repository}}:{{.Tag}}", f"{registry}/{repo}", check=True
        )
        refs = [line for line in listing.stdout.split() if not line.endswith(":<none>")]
        if refs:
            self.docker("rmi", "-f", *refs, check=True)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    for tool in ("docker", "dockerd", "docker-registry"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    with devstack.local_stack("dv-e2e-", cache_ttl=300) as local:
        assert local.proxy is not None
        stack = Stack(local.client_env(), local.registry, local.proxy, local.root)
        stack.run("docker-variant", "install-plugin", check=True)
        yield stack


@pytest.fixture(scope="module")
def app_ref(stack: Stack) -> str:
    return stack.publish("e2e/app", list(VARIANTS))


def test_plugin_is_listed_and_answers_metadata(stack: Stack) -> None:
    assert "variant*" in stack.docker("--help", check=True).stdout
    metadata = json.loads(
        stack.run("docker-variant", "docker-cli-plugin-metadata", check=True).stdout
    )
    assert metadata["SchemaVersion"] == "0.1.0"


@pytest.mark.parametrize(
    ("host", "label"),
    [("h200", "cu128"), ("old-driver", "cpu"), ("v3-cpu", "v3"), ("graviton", "null")],
)
def test_pull_chooses_per_host_and_tags_both_ways(
    stack: Stack, app_ref: str, host: str, label: str
) -> None:
    stack.forget(stack.registry.address, "e2e/app")
    result = stack.docker("variant", "pull", "--providers-file", stack.host_file(host), app_ref)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.splitlines()[0]
        == f'Selected variant "{label}" of {app_ref.rsplit(":", 1)[0]} version 1.0.0'
    )
    variant_ref = f"{app_ref}-{label}"
    assert stack.image_id(app_ref) is not None
    assert stack.image_id(app_ref) == stack.image_id(variant_ref)
    # and the same choice from resolve, for scripts
    resolved = stack.docker(
        "variant", "resolve", "--providers-file", stack.host_file(host), app_ref, check=True
    )
    assert resolved.stdout.strip() == variant_ref


def test_a_second_pull_moves_ref_to_its_own_choice(stack: Stack, app_ref: str) -> None:
    """REF, already a tag of another variant's image, follows the new choice; a pull of an
    image whose tags are in place leaves them as they are."""
    stack.forget(stack.registry.address, "e2e/app")
    for host, label in (("v3-cpu", "v3"), ("h200", "cu128"), ("h200", "cu128")):
        stack.docker(
            "variant", "pull", "--providers-file", stack.host_file(host), app_ref, check=True
        )
        chosen = stack.image_id(f"{app_ref}-{label}")
        assert chosen is not None and stack.image_id(app_ref) == chosen
    assert stack.image_id(f"{app_ref}-v3") not in (None, stack.image_id(app_ref))


def test_a_repeated_pull_says_up_to_date_and_leaves_no_untagged_image(
    stack: Stack, app_ref: str
) -> None:
    """As ``docker pull``: ``Status: Downloaded newer image for REF`` when layers came,
    ``Status: Image is up to date for REF`` when nothing did (last on stderr: stdout keeps
    the one line scripts read), and no ``<none>`` left."""
    stack.forget(stack.registry.address, "e2e/app")
    pull = ("variant", "pull", "--providers-file", stack.host_file("h200"), app_ref)
    variant_ref = f"{app_ref}-cu128"
    statuses = []
    for _ in range(3):
        done = stack.docker(*pull, check=True)
        assert done.stdout.splitlines() == [done.stdout.splitlines()[0]]  # the line alone
        statuses.append(done.stderr.splitlines()[-1])
    assert statuses == [
        f"Status: Downloaded newer image for {variant_ref}",
        f"Status: Image is up to date for {variant_ref}",
        f"Status: Image is up to date for {variant_ref}",
    ]
    listing = stack.docker(
        "images", "--format", "{{.Repository}}:{{.Tag}}", app_ref.rsplit(":", 1)[0], check=True
    )
    assert sorted(listing.stdout.split()) == sorted([app_ref, variant_ref]), listing.stdout
    assert stack.docker("images", "-q", "--filter", "dangling=true").stdout == ""


def test_pull_as_this_host_agrees_with_resolve(stack: Stack, app_ref: str) -> None:
    expected = stack.docker("variant", "resolve", app_ref, check=True).stdout.strip()
    result = stack.docker("variant", "pull", app_ref, check=True)
    label = expected.rsplit("-", 1)[1]
    assert f'Selected variant "{label}"' in result.stdout
    assert stack.image_id(app_ref) == stack.image_id(expected)


def test_pull_through_the_proxy_uses_variants_api(stack: Stack) -> None:
    ref = stack.publish("e2e/proxied", ["cu128", "v3", "null"], via_proxy=True)
    result = stack.docker("variant", "pull", "--providers-file", stack.host_file("h200"), ref)
    assert result.returncode == 0, result.stderr
    assert '"cu128"' in result.stdout
    assert stack.image_id(ref) == stack.image_id(f"{ref}-cu128")
    listing = json.loads(
        stack.docker(
            "variant",
            "ls",
            "--json",
            "--providers-file",
            stack.host_file("v3-cpu"),
            ref,
            check=True,
        ).stdout
    )
    assert [v["label"] for v in listing["variants"] if v["compatible"]] == ["v3", "null", None]
    # resolving through the proxy is one `_variants` request: no tag listing, no manifests
    before = stack.proxy_requests()
    stack.docker("variant", "resolve", "--providers-file", stack.host_file("h200"), ref, check=True)
    after = stack.proxy_requests()
    assert after.get("variants", 0) - before.get("variants", 0) == 1
    assert after.get("tags", 0) == before.get("tags", 0)
    # a variant asked for by its own tag is that variant, where it fits
    own = f"{ref}-cu128"
    chosen = stack.docker("variant", "resolve", "--providers-file", stack.host_file("h200"), own)
    assert (chosen.returncode, chosen.stdout.strip()) == (0, own), chosen.stderr
    assert after.get("manifest", 0) == before.get("manifest", 0)


def test_push_and_pull_through_the_nginx_front(stack: Stack, tmp_path: Path) -> None:
    """The shipped nginx front (deploy/nginx/variant-proxy.conf) before the registry and the
    proxy: `docker variant push` and `pull` through it, the choice made by the proxy's
    `_variants` behind it, and a plain `docker pull` of the version gets the bare image."""
    front = devstack.start_nginx_front(
        stack.registry.address, stack.proxy.address, tmp_path / "nginx"
    )
    try:
        before = stack.proxy_requests()
        ref = stack.publish("e2e/fronted", ["cu128", "v3", "null"], via=front.address)
        result = stack.docker("variant", "pull", "--providers-file", stack.host_file("h200"), ref)
        assert result.returncode == 0, result.stderr
        assert 'Selected variant "cu128"' in result.stdout
        assert stack.image_id(ref) == stack.image_id(f"{ref}-cu128")
        after = stack.proxy_requests()
        assert after.get("variants", 0) > before.get("variants", 0)  # answered behind nginx
        stack.forget(front.address, "e2e/fronted")
        stack.docker("pull", "-q", ref, check=True)  # variant-unaware: the bare image
        stack.docker("pull", "-q", f"{ref}-v3", check=True)
        assert stack.image_id(ref) != stack.image_id(f"{ref}-v3")
    finally:
        front.stop()


def test_bare_image_only_when_no_variant_fits(stack: Stack) -> None:
    ref = stack.publish("e2e/barefallback", ["cu128", "v3"])
    result = stack.docker("variant", "pull", "--providers-file", stack.host_file("graviton"), ref)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("Selected the bare image of")
    stack.forget(stack.registry.address, "e2e/barefallback")
    result = stack.docker(
        "variant", "pull", "--providers-file", stack.host_file("v3-cpu"), ref, check=True
    )
    assert '"v3"' in result.stdout


def test_no_compatible_variant_exits_1_and_tags_nothing(stack: Stack) -> None:
    ref = stack.publish("e2e/gpuonly", ["cu128"], bare=False)
    result = stack.docker("variant", "pull", "--providers-file", stack.host_file("graviton"), ref)
    assert result.returncode == 1
    assert "cu128: no provider for namespace nvidia on this host" in result.stderr
    assert "Traceback" not in result.stderr
    assert stack.image_id(ref) is None and stack.image_id(f"{ref}-cu128") is None
    dry = stack.docker(
        "variant", "pull", "--dry-run", "--providers-file", stack.host_file("h200"), ref
    )
    assert dry.returncode == 0 and '"cu128"' in dry.stdout
    assert stack.image_id(ref) is None, "--dry-run pulls nothing"


def test_push_refuses_bad_labels(stack: Stack) -> None:
    ref = f"{stack.registry.address}/e2e/refused:1.0.0-cu126"
    stack.build(ref, "cu128", "mislabelled\n")  # built as cu128, tagged cu126
    result = stack.docker("variant", "push", ref)
    assert (
        result.returncode == 2 and "'cu128'" in result.stderr and "Traceback" not in result.stderr
    )
    bad = f"{stack.registry.address}/e2e/refused:1.0.0-x"
    stack.build(
        bad,
        None,
        "bad value\n",
        [
            "--label",
            "dev.pep817.variant-label=x",
            "--label",
            "dev.pep817.variant.nvidia.sm_arch=9.0",
        ],
    )
    result = stack.docker("variant", "push", bad)
    assert result.returncode == 2 and "'9.0'" in result.stderr
    tags = stack.run("curl", "-s", f"{stack.registry.url}/v2/e2e/refused/tags/list").stdout
    assert "1.0.0" not in tags, "nothing was pushed"
    missing = stack.docker("variant", "push", f"{stack.registry.address}/e2e/refused:9.9.9")
    # a missing image, local or in a registry, is exit 3 and says "not found"
    assert missing.returncode == 3 and "no such local image" in missing.stderr
    assert missing.stderr.startswith("docker-variant: error: not found: ")
    absent = stack.docker("variant", "inspect", "--local", "e2e/nosuchimage:1")
    assert absent.returncode == 3 and "no such local image" in absent.stderr, absent.stderr


def test_a_refused_push_says_unauthorized_and_hints_at_docker_login(
    stack: Stack, htpasswd_registry: Callable[[Mapping[str, str]], RunningRegistry]
) -> None:
    """The engine's "no basic auth credentials" is a refusal, not "unreachable"."""
    private = htpasswd_registry({"alice": "wonderland"})
    ref = f"{private.host}/e2e/private:1.0.0"
    stack.build(ref, None, "private\n")
    refused = stack.docker("variant", "push", ref)
    assert refused.returncode == 3, refused.stderr
    error, hint = refused.stderr.splitlines()
    assert error.startswith("docker-variant: error: unauthorized: push "), error
    assert "no basic auth credentials" in error
    assert hint.startswith(f"hint: run `docker login {private.host}`")


def test_faults_exit_3_with_a_clear_message(stack: Stack, app_ref: str) -> None:
    gone = stack.docker(
        "variant", "pull", app_ref, env={"DOCKER_HOST": f"unix://{stack.root}/nothing.sock"}
    )
    assert (
        gone.returncode == 3 and "not reachable" in gone.stderr and "Traceback" not in gone.stderr
    )
    port = devstack.free_port()
    down = stack.docker("variant", "pull", f"127.0.0.1:{port}/e2e/app:1.0.0")
    assert (
        down.returncode == 3
        and f"127.0.0.1:{port}" in down.stderr
        and "Traceback" not in down.stderr
    )
    missing = stack.docker("variant", "pull", f"{stack.registry.address}/e2e/nosuchimage:1.0.0")
    assert missing.returncode == 3 and "nosuchimage" in missing.stderr
    # the repository exists, the version does not: as `docker pull` of a missing tag
    no_version = stack.docker("variant", "resolve", app_ref.replace(":1.0.0", ":9.9.9"))
    assert no_version.returncode == 3 and "no image tagged 9.9.9" in no_version.stderr


def test_interrupted_pull_leaves_no_tags(stack: Stack) -> None:
    ref = stack.publish("e2e/broken", ["v3"], bare=False)
    # Lose the layer's data in the registry: the engine's pull fails half-way, after the manifest.
    layers = stack.registry.root / "storage" / "docker" / "registry" / "v2" / "blobs"
    manifest = json.loads(
        stack.run(
            "curl",
            "-s",
            "-H",
            "Accept: application/vnd.docker.distribution.manifest.v2+json",
            f"{stack.registry.url}/v2/e2e/broken/manifests/1.0.0-v3",
        ).stdout
    )
    digest = manifest["layers"][0]["digest"].split(":", 1)[1]
    (layers / "sha256" / digest[:2] / digest / "data").unlink()
    result = stack.docker("variant", "pull", "--providers-file", stack.host_file("v3-cpu"), ref)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "pull" in result.stderr
    assert stack.image_id(ref) is None and stack.image_id(f"{ref}-v3") is None


def test_the_readme_demo_runs_and_cleans_up() -> None:
    if shutil.which("dockerd") is None:
        pytest.skip("dockerd is not installed (scripts/setup installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "NV_VARIANT"))}
    result = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "devtools" / "demo.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    choices = result.stdout.split("== choices", 1)[1]
    assert (
        "an H200 on an R570 driver (CUDA 12.8)" in choices and 'Selected variant "cu128"' in choices
    )
    assert 'Selected variant "cpu"' in choices  # the old driver rules out both CUDA variants
    removed = result.stdout.rsplit("removed ", 1)[1].strip()
    assert removed.startswith("/tmp/dv-demo-") and not Path(removed).exists()


def test_a_pull_runs_the_registrys_credential_helper_once(stack: Stack, tmp_path: Path) -> None:
    """The registry's index and the engine's pull take the same credentials: the helper
    (a keychain prompt, a cloud CLI) runs once for the command, not once for each."""
    app_ref = stack.publish("e2e/helper-once", ["cu128"])
    registry = app_ref.split("/", 1)[0]
    bin_dir, config = tmp_path / "bin", tmp_path / "docker"
    bin_dir.mkdir()
    config.mkdir()
    log = tmp_path / "helper.log"
    helper = bin_dir / "docker-credential-countme"
    helper.write_text(
        f'#!/bin/sh\nread server; echo "$1 $server" >> {log}\n'
        'echo "credentials not found in native keychain"; exit 1\n'
    )
    helper.chmod(0o755)
    (config / "config.json").write_text(json.dumps({"credHelpers": {registry: "countme"}}))
    env = {"DOCKER_CONFIG": str(config), "PATH": f"{bin_dir}{os.pathsep}{stack.env['PATH']}"}
    host = stack.host_file("h200")
    stack.run("docker-variant", "pull", "--providers-file", host, app_ref, env=env, check=True)
    assert log.read_text().splitlines() == [f"get {registry}"]
