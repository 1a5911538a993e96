"""The CLI's fixed cost (issue 8), checked by what a command loads and builds, not by the clock:
each command imports only what it uses, no TLS trust store is read for plain-HTTP registries
or the engine's socket, and Docker's metadata probe is answered as before, without the CLI."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import devstack
from conftest import RunningRegistry
from docker_variant import __version__
from imaging import ImageBuilder, variant_labels
from test_cli_offline import H200, INDEX

# Runs the console script's entry (as `docker-variant ARGS`) and, at exit, writes the modules
# it loaded, the garbage collector's state and the collections before the CLI was loaded
# and, with SPY_TLS set, each time a TLS context read certificates.
_WRAPPER = """
import atexit, json, os, sys
record = {"trust_loads": []}
if os.environ.get("SPY_TLS"):
    import ssl
    for name in ("load_default_certs", "load_verify_locations", "set_default_verify_paths"):
        def spy(self, *args, _name=name, _original=getattr(ssl.SSLContext, name), **kwargs):
            record["trust_loads"].append(_name)
            return _original(self, *args, **kwargs)
        setattr(ssl.SSLContext, name, spy)

import gc
record["startup_collections"] = 0
def count(phase, info, _frozen=gc.get_freeze_count):
    if phase == "start" and record.get("in_main") and _frozen() == 0:
        record["startup_collections"] += 1
gc.callbacks.append(count)

@atexit.register
def dump():
    record["modules"] = sorted(n for n, m in sys.modules.items() if m is not None)
    record["frozen"] = gc.get_freeze_count()
    record["gc_enabled"] = gc.isenabled()
    with open(os.environ["COST_RECORD"], "w") as handle:
        json.dump(record, handle)

from docker_variant.entry import main
record["in_main"] = True
main(sys.argv[1:])
"""

# Never needed by `resolve --index FILE --providers-file FILE`.
_NOT_FOR_RESOLVE = (
    "typer.rich_utils",  # typer's help renderer
    "rich.markdown",
    "markdown_it",
    "pygments",
    "rich.console",
    "rich.table",
    "docker_variant.k8s",
    "docker_variant.k8s.cel",
    "celpy",
    "docker_variant.publish",
    "docker_variant.proxy",
    "docker_variant.docker",
    "docker_variant.oci.client",  # the registry client, and with it httpx
    "docker_variant.oci.source",
    "httpx",
    "ssl",
    "importlib.metadata",  # for the detection cache's key: no detection with --providers-file
    "variantlib.models.variant",  # selection needs only variantlib's grammar
)


def run_entry(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, spy_tls: bool = False
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    record = tmp_path / "record.json"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "NV_"))}
    full_env |= {"COST_RECORD": str(record), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    full_env |= env or {}
    if spy_tls:
        full_env["SPY_TLS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )
    return done, json.loads(record.read_text())


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "index.json").write_text(json.dumps(INDEX))
    (tmp_path / "h200.json").write_text(json.dumps(H200))
    return {"index": str(tmp_path / "index.json"), "h200": str(tmp_path / "h200.json")}


def loaded(record: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    modules = set(record["modules"])
    return [name for name in names if name in modules]


def test_resolve_with_an_index_loads_no_help_renderer_k8s_oci_or_tls(
    tmp_path: Path, files: dict[str, str]
) -> None:
    done, record = run_entry(
        tmp_path, "resolve", "--index", files["index"], "--providers-file", files["h200"]
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "1.0.0-cu128\n", "")
    assert loaded(record, _NOT_FOR_RESOLVE) == []
    # no collection while the CLI loaded; what it made was frozen, and collection is back on
    # (the exit handlers ran: this record is written by one)
    assert record["startup_collections"] == 0
    assert record["frozen"] > 10_000 and record["gc_enabled"] is True
    # the same command, as Docker runs the plugin
    done, record = run_entry(
        tmp_path, "variant", "resolve", "--index", files["index"], "--providers-file", files["h200"]
    )
    assert (done.returncode, done.stdout) == (0, "1.0.0-cu128\n")
    assert loaded(record, _NOT_FOR_RESOLVE) == []


def test_help_and_tables_still_load_what_they_need(tmp_path: Path, files: dict[str, str]) -> None:
    """The harness sees these modules when a command does use them."""
    done, record = run_entry(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: docker-variant" in done.stdout and "resolve" in done.stdout
    assert "k8s" in done.stdout and "Kubernetes" in done.stdout
    assert loaded(record, ("typer.rich_utils", "rich.console")) == [
        "typer.rich_utils",
        "rich.console",
    ]
    done, record = run_entry(tmp_path, "k8s", "claim", "--help")
    assert done.returncode == 0 and "gpu.nvidia.com]" in done.stdout  # "[default: " may wrap
    assert "1<=x<=32" in done.stdout
    assert loaded(record, ("docker_variant.k8s",)) == []  # help needs only the two literals
    done, record = run_entry(
        tmp_path, "ls", "--index", files["index"], "--providers-file", files["h200"]
    )
    assert done.returncode == 0 and "cu128" in done.stdout
    assert loaded(record, ("rich.table", "docker_variant.k8s", "httpx")) == ["rich.table"]
    done, record = run_entry(tmp_path, "k8s", "claim", "--index", files["index"], "--count", "2")
    assert done.returncode == 0, done.stderr
    assert loaded(
        record, ("docker_variant.k8s", "docker_variant.proxy", "docker_variant.publish")
    ) == ["docker_variant.k8s"]


def test_k8s_option_defaults_agree_with_the_k8s_package() -> None:
    from docker_variant.cli.k8s import K8S_DEFAULT_DEVICE_CLASS, K8S_MAX_COUNT
    from docker_variant.k8s.claim import DEFAULT_DEVICE_CLASS, MAX_COUNT

    assert (K8S_DEFAULT_DEVICE_CLASS, K8S_MAX_COUNT) == (DEFAULT_DEVICE_CLASS, MAX_COUNT)


def test_docker_metadata_probe_is_answered_as_before_without_the_cli(tmp_path: Path) -> None:
    done, record = run_entry(tmp_path, "docker-cli-plugin-metadata")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == (
        '{"SchemaVersion": "0.1.0", "Vendor": "docker-variant", "Version": "'
        + __version__
        + '", "ShortDescription": "Pull the best PEP 817 variant of an image for this host"}\n'
    )
    assert loaded(record, ("docker_variant.cli", "typer", "click", "rich", "httpx")) == []


def test_a_plain_http_registry_reads_no_trust_store_and_is_probed_once(
    tmp_path: Path, registry: RunningRegistry, image_builder: ImageBuilder
) -> None:
    # a registry of its own, to count its requests
    service = devstack.start_registry(tmp_path / "counted", access_log=True)
    try:
        ref = f"{service.address}/cost/app:1.0.0"
        image_builder.build_and_push(
            f"{service.address}/cost/app:1.0.0-cu128",
            variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8"),
        )
        probes = []
        for _ in range(2):
            before = len(devstack.registry_requests(service))
            done, record = run_entry(
                tmp_path, "resolve", ref, "--providers-file", _h200(tmp_path), spy_tls=True
            )
            assert (done.returncode, done.stderr) == (0, ""), done.stderr
            assert done.stdout == f"{service.address}/cost/app:1.0.0-cu128\n"
            assert record["trust_loads"] == []
            assert "httpx" in record["modules"]  # it did talk to the registry
            assert loaded(record, ("docker_variant.k8s", "docker_variant.proxy")) == []
            # a tag scan (nothing is published) runs on the sync client's threads
            assert loaded(record, ("asyncio", "anyio._backends._asyncio")) == []
            paths = devstack.registry_requests(service)[before:]
            probes.append([p for p in paths if "/_variants/" in p])
        # the first run found no proxy there; the second remembers it (PLAIN_REGISTRY_TTL)
        assert probes == [["/v2/cost/app/_variants/1.0.0"], []]
    finally:
        service.stop()


def _h200(tmp_path: Path) -> str:
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(H200))
    return str(path)


@pytest.fixture
def trust_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each time any TLS context in this process reads certificates."""
    calls: list[str] = []
    for name in ("load_default_certs", "load_verify_locations", "set_default_verify_paths"):
        original = getattr(ssl.SSLContext, name)

        def spy(
            self: ssl.SSLContext, *args: Any, _n: str = name, _o: Any = original, **kw: Any
        ) -> Any:
            calls.append(_n)
            return _o(self, *args, **kw)

        monkeypatch.setattr(ssl.SSLContext, name, spy)
    return calls


def test_the_engine_client_reads_no_trust_store(
    tmp_path: Path, trust_loads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from docker_variant.docker.engine import Engine, EngineError
    from docker_variant.oci.http import system_tls

    system_tls.cache_clear()
    monkeypatch.setattr("docker_variant.oci.http.system_tls", system_tls)
    for host in (f"unix://{tmp_path}/docker.sock", f"tcp://127.0.0.1:{devstack.free_port()}"):
        with Engine(host) as engine, pytest.raises(EngineError, match="not reachable"):
            engine.ping()
    assert trust_loads == []


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on loopback whose certificate a test CA signed: ``(url, CA file)``."""
    from tlsca import CertificateAuthority

    ca = CertificateAuthority(tmp_path / "ca")
    pair = ca.server()

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}/", ca.ca
    server.shutdown()
    server.server_close()


def test_the_deferred_trust_store_is_read_at_the_first_handshake_and_verifies(
    tls_server: tuple[str, Path], trust_loads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from docker_variant.oci.http import _DeferredTrustContext

    url, ca = tls_server
    untrusting = _DeferredTrustContext(ssl.PROTOCOL_TLS_CLIENT)
    assert trust_loads == []
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(url, verify=untrusting)
    assert trust_loads == ["load_default_certs", "set_default_verify_paths"]
    # Made before the CA is trusted, and still it trusts it: the store is read at the
    # first handshake (OpenSSL reads SSL_CERT_FILE there), not when the context was made.
    deferred = _DeferredTrustContext(ssl.PROTOCOL_TLS_CLIENT)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    for _ in range(2):
        assert httpx.get(url, verify=deferred).text == "ok"
    assert trust_loads.count("load_default_certs") == 2  # once per context, not per handshake


# `pull`: one HTTP stack (httpx's sync client, for the engine and the registry alike), no
# rich unless stderr is a terminal, no engine client for --dry-run.
_NOT_FOR_A_PIPED_PULL = (
    "rich",
    "rich.console",
    "rich.progress",
    "docker_variant.docker.progress",
    "asyncio",
    "anyio._backends._asyncio",  # httpcore's async backend: the second HTTP stack
    "typer.rich_utils",
    "variantlib.models.variant",
)
_NOT_FOR_A_DRY_RUN = (*_NOT_FOR_A_PIPED_PULL, "docker_variant.docker.engine")


def test_pull_dry_run_with_an_index_loads_no_http_engine_or_rich(
    tmp_path: Path, files: dict[str, str]
) -> None:
    done, record = run_entry(
        tmp_path,
        "variant",
        "pull",
        "--dry-run",
        "--index",
        files["index"],
        "--providers-file",
        files["h200"],
        "127.0.0.1:1/cost/app:1.0.0",
        env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"},  # never asked
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout == 'Selected variant "cu128" of 127.0.0.1:1/cost/app version 1.0.0\n'
    assert loaded(record, (*_NOT_FOR_A_DRY_RUN, "httpx", "docker_variant.oci.client")) == []


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    """A private Docker engine: its ``DOCKER_HOST``."""
    root = Path(tempfile.mkdtemp(prefix="dv-cost-", dir="/tmp"))  # socket paths are short
    service = devstack.start_dockerd(root / "engine")
    try:
        yield service.address
    finally:
        service.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_pull_to_a_pipe_loads_one_http_stack_and_no_rich(
    tmp_path: Path, registry: RunningRegistry, image_builder: ImageBuilder, engine: str
) -> None:
    ref = f"{registry.host}/cost/pulled:1.0.0"
    image_builder.build_and_push(
        f"{ref}-cu128", variant_labels("cu128", nvidia__cuda_version_lower_bound="12.8")
    )
    image_builder.build_and_push(f"{ref}-v3", variant_labels("v3", x86_64__level="v3"))
    published, _ = run_entry(tmp_path, "publish", ref)  # one variant image index at 1.0.0
    assert published.returncode == 0, published.stderr
    env = {"DOCKER_HOST": engine, "DOCKER_CONFIG": str(tmp_path / "docker-config")}
    pull = ("variant", "pull", "--providers-file", _h200(tmp_path), ref)

    dry, record = run_entry(tmp_path, *pull[:2], "--dry-run", *pull[2:], env=env)
    assert (dry.returncode, dry.stderr) == (0, ""), dry.stderr
    assert loaded(record, _NOT_FOR_A_DRY_RUN) == []
    assert "httpx" in record["modules"]  # it read the registry

    stderr = []
    for status in ("Downloaded newer image", "Image is up to date"):
        done, record = run_entry(tmp_path, *pull, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout == (
            f'Selected variant "cu128" of {ref.rsplit(":", 1)[0]} version 1.0.0\n'
        )  # the line scripts read, alone; docker pull's status ends stderr
        assert done.stderr.endswith(f"Status: {status} for {ref}-cu128\n")
        assert loaded(record, _NOT_FOR_A_PIPED_PULL) == []
        assert "docker_variant.docker.engine" in record["modules"]
        stderr.append(done.stderr.splitlines()[:-1])
    # a pipe gets one plain line per layer pulled (no bars), and none for a present image
    lines = stderr[0]
    layer = rf"pull {re.escape(ref)}-cu128 layer [0-9a-f]{{12}}: Pull complete"
    assert lines and all(re.fullmatch(layer, x) for x in lines)
    assert stderr[1] == []
