"""Start a loopback registry, a variant-proxy and a private Docker engine.

Used by the demo, the tests and the benchmarks, so there is one way to bring these up. Each
service listens on 127.0.0.1 (or a socket in its own temp dir) and is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = [
    "LocalStack",
    "Service",
    "StartError",
    "free_port",
    "listens",
    "local_stack",
    "registry_requests",
    "start_containerd",
    "start_dockerd",
    "start_nginx",
    "start_nginx_front",
    "start_proxy",
    "start_redis",
    "start_registry",
    "start_scheduler",
]


class StartError(RuntimeError):
    pass


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    address: str  # "127.0.0.1:PORT", or "unix:///.../docker.sock" for the engine
    root: Path
    log: Path
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, size: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-size:]
        return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(
    name: str, argv: list[str], root: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log = root / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return process, log


def _wait(service: Service, ready: Callable[[], bool] | None, timeout: float) -> Service:
    """``service`` once ``ready()``; on a TCP port only once its own process listens there,
    so that another process holding the port is not taken for it (``ready`` None: that is
    all; TLS and tokens make HTTP probes awkward)."""
    host, _, port = service.address.rpartition(":")
    tcp_port = int(port) if host and port.isdigit() else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            break
        with contextlib.suppress(httpx.TransportError, OSError):
            listening = tcp_port is None or listens(service.process.pid, tcp_port)
            if listening and (ready is None or ready()):
                return service
        time.sleep(0.05)
    service.stop()
    raise StartError(f"{service.name} did not start: {service.log_tail()}")


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (IPv4 or IPv6)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                # sl, local address:port (hex), remote, state (0A: LISTEN), ..., inode
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    listening.add(f"socket:[{fields[9]}]")
    with contextlib.suppress(OSError):  # gone, or not ours to look at
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in listening:
                    return True
    return False


def _on_free_port(start: Callable[[int], Service], name: str, attempts: int = 3) -> Service:
    """``start(port)`` on a free loopback port, again on another where the one probed was
    taken before the service bound it (another process can take it in between)."""
    for _attempt in range(attempts):
        try:
            return start(free_port())
        except StartError as error:
            if "address already in use" not in str(error).lower():
                raise
    raise StartError(f"{name}: no free port after {attempts} attempts")


def _http_ready(url: str) -> Callable[[], bool]:
    return lambda: httpx.get(url, timeout=1).status_code in (200, 401)


def start_registry(
    root: Path,
    htpasswd: Path | None = None,
    realm: str = "docker-variant",
    timeout: float = 15,
    *,
    access_log: bool = False,
    notify: tuple[str, str] | None = None,
    remote: str | None = None,
    tls: tuple[Path, Path] | None = None,
    client_ca: Path | None = None,
) -> Service:
    """Debian's ``docker-registry`` (distribution 2.8) on a free loopback port; with
    ``tls`` = (certificate, key) over HTTPS, requiring client certificates signed by
    ``client_ca`` when given (its ``http.tls``); with
    ``remote`` (a registry URL) a pull-through cache of that registry (distribution's proxy
    mode: read-only, each blob fetched from the remote once); with
    ``access_log`` it writes one combined-format line per request to its log (request
    counts in tests and benchmarks: ``registry_requests``); with ``notify`` = (URL, secret)
    it POSTs its push/delete events there with ``Authorization: Bearer <secret>``."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise StartError("docker-registry is not installed (Debian package docker-registry)")
    root.mkdir(parents=True, exist_ok=True)

    def start(port: int) -> Service:
        lines = [
            "version: 0.1",
            "log:",
            "  level: error",
            "  accesslog:",
            f"    disabled: {'false' if access_log else 'true'}",
            "http:",
            f"  addr: 127.0.0.1:{port}",
            *_registry_tls(tls, client_ca),
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {root / 'storage'}",
            "  delete:",
            "    enabled: true",
        ]
        if remote is not None:
            lines += ["proxy:", f"  remoteurl: {remote}"]
        if htpasswd is not None:
            lines += ["auth:", "  htpasswd:", f"    realm: {realm}", f"    path: {htpasswd}"]
        if notify is not None:
            lines += [
                "notifications:",
                "  endpoints:",
                "    - name: variant-proxy",
                f"      url: {notify[0]}",
                "      headers:",
                f"        Authorization: [Bearer {notify[1]}]",
                "      timeout: 1s",
                "      threshold: 5",
                "      backoff: 1s",
            ]
        config = root / "registry.yml"
        config.write_text("\n".join(lines) + "\n")
        process, log = _spawn("registry", [binary, "serve", str(config)], root)
        scheme = "https" if tls is not None else "http"
        service = Service("docker-registry", process, f"127.0.0.1:{port}", root, log, scheme)
        # over TLS, listening is enough: the probe would need the CA (and a client certificate)
        ready = _http_ready(f"{service.url}/v2/") if tls is None else None
        return _wait(service, ready, timeout)

    return _on_free_port(start, "docker-registry")


def _registry_tls(tls: tuple[Path, Path] | None, client_ca: Path | None) -> list[str]:
    """The ``http.tls`` lines of a registry's config."""
    if tls is None:
        return []
    lines = ["  tls:", f"    certificate: {tls[0]}", f"    key: {tls[1]}"]
    return lines + (["    clientcas:", f"      - {client_ca}"] if client_ca is not None else [])


def registry_requests(service: Service, method: str = "GET") -> list[str]:
    """The request paths in a registry's access log (``start_registry(access_log=True)``)."""
    paths: list[str] = []
    for line in service.log.read_text(errors="replace").splitlines():
        _, quote, rest = line.partition('"')
        parts = rest.split(" ", 2)
        if quote and len(parts) == 3 and parts[0] == method and parts[1].startswith("/v2/"):
            paths.append(parts[1])
    return paths


def start_proxy(
    upstream: str,
    root: Path,
    cache_ttl: float = 30,
    timeout: float = 15,
    *,
    port: int | None = None,
    extra: Sequence[str] = (),
    scheme: str = "http",
) -> Service:
    """``variant-proxy`` in front of ``upstream``, on a free loopback port (or ``port``);
    ``extra`` arguments go to it (``--tls-cert``, ``--upstream-timeout``...)."""
    root.mkdir(parents=True, exist_ok=True)

    def start(port: int) -> Service:
        argv = [
            sys.executable,
            "-m",
            "docker_variant.proxy",
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{port}",
            "--cache-ttl",
            str(cache_ttl),
            *extra,
        ]
        process, log = _spawn("proxy", argv, root)
        service = Service("variant-proxy", process, f"127.0.0.1:{port}", root, log, scheme)
        ready = _http_ready(f"{service.url}/healthz") if scheme == "http" else None
        return _wait(service, ready, timeout)

    return start(port) if port else _on_free_port(start, "variant-proxy")


NGINX_FRONT = Path(__file__).resolve().parent.parent / "deploy/nginx/variant-proxy.conf"
# what start_nginx_front sets in the shipped file: its placeholders for the site's addresses
_FRONT_PLACEHOLDERS = ("server registry:5000;", "server variant-proxy:5080;", "listen 5000;")


def nginx_binary() -> str | None:
    """Debian's nginx (nginx-light), or None where it is not installed."""
    found = shutil.which("nginx")
    if found is None and Path("/usr/sbin/nginx").exists():
        found = "/usr/sbin/nginx"
    return found


def start_nginx(
    site: Callable[[int], str], root: Path, timeout: float = 15, *, port: int | None = None
) -> Service:
    """nginx running ``site(port)`` (http-level directives: upstreams, maps, servers that
    listen on ``127.0.0.1:port``, a free loopback port or ``port``) as one worker, everything
    it writes under ``root``."""
    binary = nginx_binary()
    if binary is None:
        raise StartError("nginx is not installed (Debian package nginx-light)")
    root.mkdir(parents=True, exist_ok=True)
    if port is not None:  # named before it starts, e.g. in a registry's notifications URL
        return _start_nginx(binary, site(port), root, port, timeout)
    return _on_free_port(
        lambda port: _start_nginx(binary, site(port), root, port, timeout), "nginx"
    )


def _start_nginx(binary: str, server_conf: str, root: Path, port: int, timeout: float) -> Service:
    temp = " ".join(
        f"{kind}_temp_path {root}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (root / "site.conf").write_text(server_conf)
    (root / "nginx.conf").write_text(
        # as root, nginx's worker would run as nobody, who may not write the temp paths here
        ("user root;\n" if os.geteuid() == 0 else "")
        + f"worker_processes 1; daemon off; pid {root}/nginx.pid; error_log {root}/error.log;\n"
        "events { worker_connections 512; }\n"
        f"http {{ access_log off; {temp} include {root}/site.conf; }}\n"
    )
    argv = [binary, "-p", str(root), "-c", str(root / "nginx.conf")]
    process, log = _spawn("nginx", argv, root)
    service = Service("nginx", process, f"127.0.0.1:{port}", root, log)
    try:
        return _wait(service, None, timeout)
    except StartError as error:
        errors = ""
        with contextlib.suppress(OSError):
            errors = (root / "error.log").read_text(errors="replace")[-2000:]
        raise StartError(f"{error} {errors}") from None


def start_nginx_front(registry: str, proxy: str, root: Path, *, port: int | None = None) -> Service:
    """The shipped ``deploy/nginx/variant-proxy.conf`` in front of the registry and the
    proxy at ``registry`` and ``proxy`` (``127.0.0.1:PORT``), on a free loopback port (or
    ``port``)."""
    shipped = NGINX_FRONT.read_text()
    for placeholder in _FRONT_PLACEHOLDERS:
        if shipped.count(placeholder) != 1:
            raise StartError(f"{NGINX_FRONT}: expected one {placeholder!r} to set")

    def site(port: int) -> str:
        return (
            shipped.replace(_FRONT_PLACEHOLDERS[0], f"server {registry};")
            .replace(_FRONT_PLACEHOLDERS[1], f"server {proxy};")
            .replace(_FRONT_PLACEHOLDERS[2], f"listen 127.0.0.1:{port};")
        )

    return start_nginx(site, root, port=port)


def start_redis(root: Path, timeout: float = 15) -> Service:
    """Debian's ``redis-server`` on a free loopback port, nothing saved to disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StartError("redis-server is not installed (Debian package redis-server)")
    root.mkdir(parents=True, exist_ok=True)

    def start(port: int) -> Service:
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(root)]  # fmt: skip
        process, log = _spawn("redis", argv, root)
        service = Service("redis-server", process, f"127.0.0.1:{port}", root, log, "redis")
        return _wait(service, None, timeout)

    return _on_free_port(start, "redis-server")


def start_scheduler(
    root: Path,
    db_url: str | None = None,
    timeout: float = 20,
    *,
    extra: Sequence[str] = (),
    scheme: str = "http",
    host: str = "127.0.0.1",
) -> Service:
    """``variant-scheduler serve`` on a free port of ``host`` (SQLite under ``root`` by
    default); ``extra`` arguments go to ``serve`` (``--tokens``, ``--tls-cert``...)."""
    root.mkdir(parents=True, exist_ok=True)

    def start(port: int) -> Service:
        argv = [
            sys.executable, "-m", "docker_variant.scheduler", "serve", "--log-level", "warning",
            "--db", db_url or f"sqlite:///{root / 'scheduler.db'}", "--listen", f"{host}:{port}",
            *extra,
        ]  # fmt: skip
        process, log = _spawn("scheduler", argv, root)
        service = Service("variant-scheduler", process, f"127.0.0.1:{port}", root, log, scheme)
        return _wait(service, None, timeout)

    return _on_free_port(start, "variant-scheduler")


def start_dockerd(root: Path, timeout: float = 60) -> Service:
    """A private Docker engine (vfs storage, no networking set-up) on a socket under ``root``."""
    binary = shutil.which("dockerd")
    if binary is None:
        raise StartError("dockerd is not installed (Debian package docker.io)")
    root.mkdir(parents=True, exist_ok=True)
    sock = root / "docker.sock"
    argv = [
        binary,
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",
        "--storage-driver=vfs",
        f"--host=unix://{sock}",
        f"--data-root={root / 'data'}",
        f"--exec-root={root / 'exec'}",
        f"--pidfile={root / 'docker.pid'}",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    process, log = _spawn("dockerd", argv, root, env)
    service = Service("dockerd", process, f"unix://{sock}", root, log)

    def ready() -> bool:
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://docker", timeout=2) as client:
            return client.get("/_ping").status_code == 200

    return _wait(service, ready, timeout)


def start_containerd(root: Path, timeout: float = 30) -> Service:
    """A private containerd (its own root, state and socket under ``root``), as a kubelet's."""
    binary = shutil.which("containerd")
    if binary is None:
        raise StartError("containerd is not installed (Debian package containerd)")
    root.mkdir(parents=True, exist_ok=True)
    sock = root / "containerd.sock"
    config = root / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{root / "root"}"\nstate = "{root / "state"}"\n'
        f'[grpc]\n  address = "{sock}"\n'
    )
    process, log = _spawn("containerd", [binary, "--config", str(config)], root)
    service = Service("containerd", process, f"unix://{sock}", root, log)
    return _wait(service, sock.exists, timeout)


@dataclass
class LocalStack:
    """A registry, optionally a proxy in front of it and a private engine, under ``root``."""

    root: Path
    registry: Service
    proxy: Service | None
    engine: Service | None

    def client_env(self) -> dict[str, str]:
        """Environment for ``docker`` and ``docker-variant`` against this stack's engine, with
        a private Docker config (credentials, CLI plugins) and provider cache."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "NV_VARIANT"))}
        env |= {
            "DOCKER_CONFIG": str(self.root / "docker-config"),
            "DOCKER_BUILDKIT": "0",  # the classic builder works with the vfs engine here
            "DOCKER_CLI_HINTS": "false",
            "XDG_CACHE_HOME": str(self.root / "cache"),
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        }
        if self.engine is not None:
            env["DOCKER_HOST"] = self.engine.address
        return env


@contextlib.contextmanager
def local_stack(
    prefix: str = "dv-",
    *,
    proxy: bool = True,
    engine: bool = True,
    cache_ttl: float = 30,
    shared_cache: bool = False,
) -> Iterator[LocalStack]:
    """Start what is asked for in a fresh dir under /tmp (socket paths are length-bounded);
    stop everything and remove the dir on exit, whatever happened. ``shared_cache``: the
    proxy keeps its index cache in a Redis started here, as replicas would."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    started: list[Service] = []
    try:
        registry = start_registry(root / "registry")
        started.append(registry)
        extra: list[str] = []
        if proxy and shared_cache:
            redis = start_redis(root / "redis")
            started.append(redis)
            extra = ["--cache", f"redis://{redis.address}/0"]
        front = start_proxy(registry.url, root / "proxy", cache_ttl, extra=extra) if proxy else None
        if front is not None:
            started.append(front)
        dockerd = start_dockerd(root / "engine") if engine else None
        if dockerd is not None:
            started.append(dockerd)
        yield LocalStack(root, registry, front, dockerd)
    finally:
        for service in reversed(started):
            service.stop()
        shutil.rmtree(root, ignore_errors=True)
