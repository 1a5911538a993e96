"""`ls`/`resolve` on a registry that needs credentials: they come from Docker's config.json,
and a refusal, an unknown repository or tag and a dead registry are exit 3, each saying which
(docs/reference/cli.md)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from clirun import run_cli
from conftest import RunningRegistry
from imaging import ImageBuilder

pytestmark = pytest.mark.e2e

H200 = {
    "nvidia": {"cuda_version_lower_bound": ["12.8", "12.6"], "sm_arch": ["90_real", "90_virtual"]}
}


def test_credentials_from_docker_config(
    htpasswd_registry: Callable[[Mapping[str, str]], RunningRegistry],
    image_builder: ImageBuilder,
    tmp_path: Path,
) -> None:
    private = htpasswd_registry({"alice": "wonderland"})
    creds = ("alice", "wonderland")
    labels = {
        "dev.pep817.variant-label": "cu128",
        "dev.pep817.variant.nvidia.cuda_version_lower_bound": "12.8",
    }
    image_builder.build_and_push(f"{private.host}/cli/app:1.0.0-cu128", labels, creds=creds)
    image_builder.build_and_push(
        f"{private.host}/cli/app:1.0.0-null", {"dev.pep817.variant-label": "null"}, creds=creds
    )
    providers = tmp_path / "h200.json"
    providers.write_text(json.dumps(H200))
    ref = f"{private.host}/cli/app:1.0.0"

    good = tmp_path / "good"
    good.mkdir()
    auth = base64.b64encode(b"alice:wonderland").decode()
    (good / "config.json").write_text(json.dumps({"auths": {private.host: {"auth": auth}}}))
    given = ("--providers-file", str(providers), ref)
    result = run_cli("resolve", *given, env={"DOCKER_CONFIG": str(good)}, tmp=tmp_path)
    assert (result.returncode, result.stdout) == (0, f"{ref}-cu128\n"), result.stderr

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    bad = base64.b64encode(b"alice:rabbit").decode()
    (wrong / "config.json").write_text(json.dumps({"auths": {private.host: {"auth": bad}}}))
    none = tmp_path / "none"
    none.mkdir()
    for config in (wrong, none):
        refused = run_cli("ls", *given, env={"DOCKER_CONFIG": str(config)}, tmp=tmp_path)
        assert refused.returncode == 3, refused.stderr
        assert "401" in refused.stderr and "Traceback" not in refused.stderr
        # the one error style, and what to do about it
        error, hint = refused.stderr.splitlines()
        assert error.startswith("docker-variant: error: unauthorized: "), error
        assert (
            hint
            == f"hint: run `docker login {private.host}` (credentials come from Docker's config.json)"
        )
    # an unknown repository and an unknown tag: "not found", never "unreachable"
    in_good = {"DOCKER_CONFIG": str(good)}
    for missing in (f"{private.host}/cli/nosuchapp:1.0.0", f"{private.host}/cli/app:9.9.9"):
        result = run_cli("resolve", "--providers-file", str(providers), missing, env=in_good)
        assert result.returncode == 3, result.stderr
        assert result.stderr.startswith("docker-variant: error: not found: "), result.stderr
        assert "unreachable" not in result.stderr and len(result.stderr.splitlines()) == 1

    private.service.stop()
    down = run_cli(
        "resolve",
        "--providers-file",
        str(providers),
        ref,
        env={"DOCKER_CONFIG": str(good)},
        tmp=tmp_path,
    )
    assert down.returncode == 3 and "unreachable" in down.stderr and "Traceback" not in down.stderr
    assert down.stderr.startswith("docker-variant: error: ") and "not found" not in down.stderr
