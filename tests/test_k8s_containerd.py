"""`docker-variant k8s containerd-hosts`: a containerd hosts.toml carrying this node's lists.

(tests/test_containerd_e2e.py runs a real containerd with the generated file.)
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from docker_variant.cli import main
from docker_variant.k8s.containerd import hosts_toml
from docker_variant.variant import VariantIndex, labels_for, select
from fakeupstream import FakeUpstream, Reply
from proxyrunner import ProxyServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
H200 = EXAMPLES / "hosts" / "h200-r570.json"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0), out, err


def hosts(capsys: pytest.CaptureFixture[str], registry: str, *args: str) -> dict[str, Any]:
    code, out, err = run_cli(
        capsys, "k8s", "containerd-hosts", registry, "--providers-file", str(H200), *args
    )
    assert code == 0, err
    return tomllib.loads(out)


def header(document: dict[str, Any]) -> Any:
    server = document["server"]
    return json.loads(document["host"][server]["header"]["X-Variant-Properties"])


def test_loopback_registry_gets_an_http_server_and_the_exact_lists(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = hosts(capsys, "127.0.0.1:5080")
    assert document["server"] == "http://127.0.0.1:5080"
    assert set(document["host"]) == {"http://127.0.0.1:5080"}
    entry = document["host"]["http://127.0.0.1:5080"]
    assert entry["capabilities"] == ["pull", "resolve"]
    assert set(entry["header"]) == {"X-Variant-Properties"}
    expected = json.loads(H200.read_text())
    decoded = header(document)
    assert decoded == expected
    # the order is a preference: features (and values) as the host lists them
    for namespace, features in expected.items():
        assert list(decoded[namespace]) == list(features)


def test_the_header_is_a_literal_compact_json_string(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "k8s", "containerd-hosts", "localhost:5000", "--providers-file", str(H200)
    )
    assert code == 0
    (line,) = [line for line in out.splitlines() if "X-Variant-Properties" in line]
    compact = json.dumps(json.loads(H200.read_text()), separators=(",", ":"))
    assert line.strip() == f"X-Variant-Properties = '{compact}'"
    assert 'server = "http://localhost:5000"' in out


@pytest.mark.parametrize(
    ("registry", "server"),
    [
        ("registry.example.com", "https://registry.example.com"),
        ("registry.example.com:5000", "https://registry.example.com:5000"),
        ("10.0.0.7:5000", "https://10.0.0.7:5000"),
        ("[::1]:5080", "http://[::1]:5080"),
        ("127.0.0.2", "http://127.0.0.2"),
    ],
)
def test_default_server(capsys: pytest.CaptureFixture[str], registry: str, server: str) -> None:
    document = hosts(capsys, registry)
    assert document["server"] == server
    assert header(document) == json.loads(H200.read_text())


def test_server_option_points_at_a_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    document = hosts(
        capsys, "registry.example.com", "--server", "https://variant-proxy.internal:5080/"
    )
    assert document["server"] == "https://variant-proxy.internal:5080"
    assert "https://variant-proxy.internal:5080" in document["host"]


@pytest.mark.parametrize(
    "registry",
    [
        "bad host",
        "host:0",
        "host:65536",
        "host:",
        "-host",
        "host-",
        "[zz]:5000",
        "host/path",
        "",
        "https://host",
        "a..b",
    ],
)
def test_invalid_registry_exits_2(capsys: pytest.CaptureFixture[str], registry: str) -> None:
    code, out, err = run_cli(
        capsys, "k8s", "containerd-hosts", "--providers-file", str(H200), "--", registry
    )
    assert code == 2
    assert out == ""
    assert f"registry {registry!r}" in err


@pytest.mark.parametrize(
    "server", ["ftp://proxy", "proxy:5080", "http://", "http://proxy/'x", "http://proxy/?q=1"]
)
def test_invalid_server_exits_2(capsys: pytest.CaptureFixture[str], server: str) -> None:
    code, out, err = run_cli(
        capsys,
        "k8s",
        "containerd-hosts",
        "reg.example",
        "--server",
        server,
        "--providers-file",
        str(H200),
    )
    assert code == 2
    assert out == ""
    assert "server" in err


def test_output_writes_registry_hosts_toml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, printed, _ = run_cli(
        capsys, "k8s", "containerd-hosts", "127.0.0.1:5080", "--providers-file", str(H200)
    )
    assert code == 0
    target = tmp_path / "certs.d"
    for _ in range(2):  # a second run replaces the file
        code, out, err = run_cli(
            capsys,
            "k8s",
            "containerd-hosts",
            "127.0.0.1:5080",
            "--providers-file",
            str(H200),
            "--output",
            str(target),
        )
        assert code == 0, err
        path = target / "127.0.0.1:5080" / "hosts.toml"
        assert out == f"{path}\n"
        assert path.read_text() == printed
        assert sorted(p.name for p in path.parent.iterdir()) == ["hosts.toml"]  # no temp left
        assert oct(path.stat().st_mode & 0o777) == "0o644"

    code, out, _ = run_cli(
        capsys,
        "--json",
        "k8s",
        "containerd-hosts",
        "127.0.0.1:5080",
        "--providers-file",
        str(H200),
        "--output",
        str(target),
    )
    result = json.loads(out)
    assert result["path"] == str(target / "127.0.0.1:5080" / "hosts.toml")
    assert result["server"] == "http://127.0.0.1:5080"
    assert result["hosts_toml"] == printed


def test_unwritable_output_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(
        capsys,
        "k8s",
        "containerd-hosts",
        "reg.example",
        "--providers-file",
        str(H200),
        "--output",
        str(blocker),
    )
    assert code == 2
    assert "cannot write" in err


def test_a_quote_in_the_lists_falls_back_to_a_basic_string() -> None:
    """Our value grammar has no ``'``; if a plugin's ever did, the TOML still parses."""
    host = {"npu": {"note": ["it's", 'a "b" \\ c']}}
    text = hosts_toml("reg.example", "https://reg.example", host)
    document = tomllib.loads(text)
    assert (
        json.loads(document["host"]["https://reg.example"]["header"]["X-Variant-Properties"])
        == host
    )


def test_empty_lists_still_make_a_valid_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"nvidia": {}, "x86_64": {}}))
    code, out, _ = run_cli(
        capsys, "k8s", "containerd-hosts", "reg.example", "--providers-file", str(path)
    )
    assert code == 0
    assert header(tomllib.loads(out)) == {"nvidia": {}, "x86_64": {}}


# --- a node whose GPUs differ: an H200 and an L4 -------------------------------------------

MIXED = EXAMPLES / "hosts" / "h200-l4.json"
PYTORCH = EXAMPLES / "pytorch-2.12.0.json"


def mixed_headers(capsys: pytest.CaptureFixture[str], registry: str) -> dict[str, str]:
    code, out, err = run_cli(
        capsys, "k8s", "containerd-hosts", registry, "--providers-file", str(MIXED)
    )
    assert code == 0, err
    document = tomllib.loads(out)
    found: dict[str, str] = document["host"][document["server"]]["header"]
    return found


def test_a_mixed_node_header_lists_only_what_every_gpu_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The union of the two GPUs' lists would let the proxy choose cu128 (sm_90/sm_100 code
    only), which the L4 cannot run: the header lists what both run, and each GPU's own
    lists go in X-Variant-Devices."""
    headers = mixed_headers(capsys, "reg.example")
    assert set(headers) == {"X-Variant-Properties", "X-Variant-Devices"}
    common = json.loads(headers["X-Variant-Properties"])
    devices = json.loads(headers["X-Variant-Devices"])
    report = json.loads(MIXED.read_text())
    h200, l4 = report["devices"]["nvidia"].values()
    assert devices == [h200, l4]
    assert common["x86_64"] == report["host"]["x86_64"]
    # the H200 and the L4 list no sm_arch in common; both drivers are R570 (CUDA 12.8)
    assert common["nvidia"] == {f: v for f, v in h200["nvidia"].items() if f != "sm_arch"}
    # the header alone (a proxy that reads nothing else): never cu128
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    alone = select(index, common)
    assert "cu128" not in [c.label for c in alone.ranked]


def test_gpus_alike_send_one_header_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "k8s", "containerd-hosts", "reg.example", "--providers-file", str(H200)
    )
    assert code == 0
    assert "X-Variant-Devices" not in out


def _serve_pytorch(fake: FakeUpstream, repository: str) -> dict[str, str]:
    """The pytorch example's images (labels only) on a scripted registry: label -> digest."""
    index = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
    digests = {}
    for label, variant in index.variants.items():
        labels = labels_for(label, variant.iter_properties(), index.namespace_order)
        config = {"architecture": "amd64", "os": "linux", "config": {"Labels": labels}}
        digests[label] = fake.serve_image(
            repository, f"2.12.0-{label}", json.dumps(config).encode()
        )
    tags = {"name": repository, "tags": [f"2.12.0-{label}" for label in index.variants]}
    fake.routes[f"/v2/{repository}/tags/list"] = Reply(200, json.dumps(tags).encode())
    return digests


def test_a_mixed_node_pulls_cu126_through_the_proxy(
    capsys: pytest.CaptureFixture[str], fake_upstream: FakeUpstream
) -> None:
    """What containerd sends with the generated hosts.toml (both headers, on its HEAD of the
    tag) resolves to cu126, which runs on both GPUs; the header alone, to no CUDA build;
    a broken X-Variant-Devices is a 400 naming it."""
    digests = _serve_pytorch(fake_upstream, "ml/pytorch")
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    with ProxyServer(fake_upstream.url) as proxy:
        headers = mixed_headers(capsys, proxy.host)
        url = f"{proxy.url}/v2/ml/pytorch/manifests/2.12.0"
        head = httpx.head(url, headers={**accept, **headers})
        assert head.status_code == 200, head.text
        assert head.headers["x-variant-label"] == "cu126"
        assert head.headers["docker-content-digest"] == digests["cu126"]
        assert "X-Variant-Devices" in head.headers["vary"]
        # the proxy's own headers never reach the registry
        assert not any("x-variant" in h.lower() for r in fake_upstream.requests for h in r.headers)
        alone = httpx.head(
            url, headers={**accept, "X-Variant-Properties": headers["X-Variant-Properties"]}
        )
        assert alone.headers["x-variant-label"] == "v3"
        # the union, as before: the L4 could not run what it picks
        union = json.loads(MIXED.read_text())["host"]
        old = httpx.head(url, headers={**accept, "X-Variant-Properties": json.dumps(union)})
        assert old.headers["x-variant-label"] == "cu128"
        for bad in ("{}", "[]", "[1]", '[{"nvidia": {"sm_arch": []}}]', "[" + "{}," * 64 + "{}]"):
            refused = httpx.get(url, headers={**accept, **headers, "X-Variant-Devices": bad})
            assert refused.status_code == 400, bad
            error = refused.json()["errors"][0]
            assert error["message"].startswith("invalid X-Variant-Devices header: ")
            assert "\n" not in error["message"]
