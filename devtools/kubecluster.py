"""A real Kubernetes v1.37.2 control plane on loopback: etcd, kube-apiserver, kube-scheduler
and kube-controller-manager (the ResourceClaim and Job controllers), no kubelet.

``scripts/kube-up DIR`` and the tests' ``kube`` fixture both use this module, so a user and
the suite meet the same cluster. The components come from one binary built from the Go module
proxy (``devtools/kube/``, cached under ``.cache/kube/<version>/`` by ``build``). Nodes are
created Ready through the API (``add_node``): the scheduler binds pods to them and the
ResourceClaim controller and the scheduler allocate their devices; nothing runs.

    python devtools/kubecluster.py build          # the binary, once per version
    python devtools/kubecluster.py up DIR         # start; prints DIR/kubeconfig
    python devtools/kubecluster.py down DIR       # stop every component by its pid
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devstack import StartError, _spawn, free_port, listens

__all__ = [
    "FEATURE_GATES",
    "KUBERNETES_VERSION",
    "ControlPlane",
    "binary_path",
    "build",
    "down",
    "up",
]

KUBERNETES_VERSION = "v1.37.2"
REPO = Path(__file__).resolve().parent.parent
MODULE = REPO / "devtools" / "kube"

# DRA (resource.k8s.io/v1) and its prioritized list are GA in 1.37, on by default. The gang
# (Workload/PodGroup, scheduling.k8s.io/v1beta1) is beta and off by default: turn it on.
FEATURE_GATES = "GenericWorkload=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
# What runs without a kubelet: claims made from templates, Jobs making pods.
CONTROLLERS = "resourceclaim-controller,job-controller,podgroup-protection-controller"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def binary_path(version: str = KUBERNETES_VERSION) -> Path:
    """Where the build is cached: keyed on the Kubernetes version and on the wrapper module's
    own sources, so that an edit to ``devtools/kube/`` builds again."""
    digest = hashlib.sha256()
    for source in [*sorted(MODULE.glob("*.go")), MODULE / "go.mod", MODULE / "go.sum"]:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return REPO / ".cache" / "kube" / f"{version}-{digest.hexdigest()[:12]}" / "kubestack"


def build(version: str = KUBERNETES_VERSION) -> Path:
    """The control plane's binary, built once per Kubernetes version from the Go module proxy
    (``GOTOOLCHAIN=local``: the machine's Go, never a downloaded toolchain)."""
    target = binary_path(version)
    if target.is_file():
        return target
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).is_file():
        raise StartError("go is not installed: the control plane is built with Go 1.26")
    target.parent.mkdir(parents=True, exist_ok=True)
    package = "k8s.io/component-base/version"
    ldflags = " ".join(
        [
            "-s -w",
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={version.lstrip('v').split('.')[0]}",
            f"-X {package}.gitMinor={version.split('.')[1]}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate=1970-01-01T00:00:00Z",
        ]
    )
    partial = target.with_suffix(".partial")
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod", CGO_ENABLED="0")
    subprocess.run(
        [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(partial), "."],
        cwd=MODULE,
        env=env,
        check=True,
    )
    partial.rename(target)  # atomic: a half-built binary is never taken for the cache
    return target


@dataclass(frozen=True)
class ControlPlane:
    """A started control plane: its directory, the admin kubeconfig and where it listens."""

    root: Path
    server: str  # https://127.0.0.1:PORT
    token: str  # the admin's bearer token (group system:masters)
    ca: Path

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def client(self) -> httpx.Client:
        """An HTTP client for the apiserver as the admin."""
        return httpx.Client(
            base_url=self.server,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _certificates(root: Path) -> Path:
    """A CA, the apiserver's serving certificate for 127.0.0.1 and localhost, and the service
    account signing key; returns the CA's path."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "docker-variant test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = root / "pki"
    pki.mkdir(mode=0o700)
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (pki / "apiserver.crt").write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    (pki / "apiserver.key").write_bytes(_key_pem(key))
    signing = ec.generate_private_key(ec.SECP256R1())
    (pki / "sa.key").write_bytes(_key_pem(signing))
    (pki / "sa.pub").write_bytes(
        signing.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki / "ca.crt"


def _kubeconfig(server: str, ca: Path, token: str) -> str:
    # JSON is YAML: kubectl, client-go and the Python clients all read it.
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "docker-variant",
                    "cluster": {"server": server, "certificate-authority": str(ca)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "docker-variant",
                    "context": {"cluster": "docker-variant", "user": "admin"},
                }
            ],
            "current-context": "docker-variant",
        },
        indent=2,
    )


def _start(root: Path, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """``devstack``'s way of starting a process (its log under ``root``, its own session),
    plus a pid file: ``down`` stops the components from another process (kube-down)."""
    process, _log = _spawn(name, list(argv), root)
    (root / f"{name}.pid").write_text(f"{process.pid}\n")
    return process


def _log_tail(root: Path, name: str, size: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return (root / f"{name}.log").read_text(errors="replace")[-size:]
    return ""


def _await(
    root: Path,
    name: str,
    process: subprocess.Popen[bytes],
    ready: Callable[[], bool],
    timeout: float,
) -> None:
    """Return once ``ready()`` holds; fail with the component's log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartError(f"{name} exited with {process.returncode}: {_log_tail(root, name)}")
        with contextlib.suppress(httpx.TransportError, OSError):
            if ready():
                return
        time.sleep(0.1)
    raise StartError(f"{name} was not ready in {timeout:.0f} s: {_log_tail(root, name)}")


def _healthy(url: str) -> bool:
    # The components' own self-signed serving certificates: a loopback liveness probe only.
    return httpx.get(url, verify=False, timeout=2).status_code == 200


def up(root: Path, timeout: float = 120) -> ControlPlane:
    """Start the control plane under ``root`` (an empty or absent directory) and return once
    the apiserver is ready and the scheduler and controller manager are healthy."""
    binary = build()
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise StartError(f"{root}: not empty; kube-up starts a cluster in a fresh directory")
    ca = _certificates(root)
    pki = ca.parent
    token = os.urandom(24).hex()
    (pki / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    ports = {name: free_port() for name in ("etcd", "peer", "api", "kcm", "sched")}
    server = f"https://127.0.0.1:{ports['api']}"
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(_kubeconfig(server, ca, token))
    kubeconfig.chmod(0o600)
    try:
        etcd = _start(
            root,
            "etcd",
            [
                str(binary),
                "etcd",
                f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{ports['peer']}",
            ],
        )
        _await(root, "etcd", etcd, lambda: listens(etcd.pid, ports["etcd"]), timeout)
        api = _start(
            root,
            "kube-apiserver",
            [
                str(binary),
                "kube-apiserver",
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # No Service routes to a loopback apiserver: keep no kubernetes Endpoints.
                "--endpoint-reconciler-type=none",
                f"--secure-port={ports['api']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.0.0.0/24",
                # No kubelet mounts tokens: pods need no service account.
                "--disable-admission-plugins=ServiceAccount",
                f"--feature-gates={FEATURE_GATES}",
                f"--runtime-config={RUNTIME_CONFIG}",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ],
        )
        with httpx.Client(
            base_url=server,
            verify=ssl.create_default_context(cafile=str(ca)),
            headers={"Authorization": f"Bearer {token}"},
        ) as client:
            _await(
                root,
                "kube-apiserver",
                api,
                lambda: client.get("/readyz", timeout=2).status_code == 200,
                timeout,
            )
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--feature-gates={FEATURE_GATES}",
            f"--cert-dir={root / 'pki'}",
            "--v=1",
        ]
        kcm = _start(
            root,
            "kube-controller-manager",
            [
                str(binary),
                "kube-controller-manager",
                *common,
                f"--secure-port={ports['kcm']}",
                f"--controllers={CONTROLLERS}",
                "--use-service-account-credentials=false",
            ],
        )
        scheduler = _start(
            root,
            "kube-scheduler",
            [str(binary), "kube-scheduler", *common, f"--secure-port={ports['sched']}"],
        )
        for name, process, port in (
            ("kube-controller-manager", kcm, ports["kcm"]),
            ("kube-scheduler", scheduler, ports["sched"]),
        ):
            url = f"https://127.0.0.1:{port}/healthz"
            _await(root, name, process, functools.partial(_healthy, url), timeout)
    except BaseException:
        down(root)
        raise
    return ControlPlane(root, server, token, ca)


def down(root: Path, timeout: float = 15) -> None:
    """Stop every component started under ``root`` by its pid (scheduler first, etcd last)."""
    for name in reversed(COMPONENTS):
        pidfile = root / f"{name}.pid"
        try:
            pid = int(pidfile.read_text())
        except (OSError, ValueError):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubecluster", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build the control plane's binary (cached per version)")
    start = commands.add_parser("up", help="start a control plane in DIR; prints DIR/kubeconfig")
    start.add_argument("dir", type=Path)
    stop = commands.add_parser("down", help="stop the control plane started in DIR")
    stop.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build())
        elif args.command == "up":
            print(up(args.dir).kubeconfig)
        else:
            down(args.dir.resolve())
    except (StartError, subprocess.CalledProcessError) as error:
        print(f"kubecluster: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
