"""Helpers for the scheduler tests (no tests here): agent reports built from real NVIDIA
values, the scheduler on a real socket, and a private PostgreSQL cluster.

PostgreSQL: ``initdb`` refuses to run as root, so as root the cluster is made and run as the
``postgres`` user (Debian's package creates it) or else ``nobody``, in a temp dir it owns;
it listens on 127.0.0.1 and a socket in that dir, and ``pg_ctl stop`` ends it. Each test
gets its own database in the one cluster of the test process.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from devstack import free_port
from docker_variant.providers.nvidia import nvidia_features
from docker_variant.scheduler import Store, create_app
from docker_variant.scheduler.app import IndexFetcher
from docker_variant.scheduler.documents import AgentReport
from docker_variant.scheduler.tokens import TokenTable

# --------------------------------------------------------------------------- hardware

X86_V4 = {"x86_64": {"level": ["v4", "v3", "v2", "v1"]}}
X86_V3 = {"x86_64": {"level": ["v3", "v2", "v1"]}}

# (CUDA the driver supports, compute capability): an H200 (9.0) on driver branches R570 and R580
H200_R570 = ((12, 8), (9, 0))
H200_R580 = ((13, 0), (9, 0))
A100_R535 = ((12, 2), (8, 0))
B200_R580 = ((13, 0), (10, 0))
L4_R535 = ((12, 2), (8, 9))


def gpu_lists(gpu: tuple[tuple[int, int], tuple[int, int]]) -> dict[str, dict[str, list[str]]]:
    """One GPU's lists, as the nvidia provider reports them under ``devices``."""
    cuda, cc = gpu
    return {"nvidia": nvidia_features(cuda, cc)}


def agent_body(
    gpu: tuple[tuple[int, int], tuple[int, int]] | None,
    count: int = 4,
    *,
    group: str = "default",
    host: Mapping[str, Any] | None = None,
    prefix: str = "GPU-",
) -> dict[str, Any]:
    """A heartbeat body: ``count`` identical GPUs named ``cuda``."""
    devices = (
        {} if gpu is None else {"cuda": {f"{prefix}{i}": gpu_lists(gpu) for i in range(count)}}
    )
    return {"resource_group": group, "host": dict(host or X86_V4), "devices": devices}


def agent_report(agent_id: str, body: Mapping[str, Any]) -> AgentReport:
    return AgentReport(
        agent_id, body["resource_group"], body["host"], body["devices"], body.get("platform")
    )


#: The section 5 document used throughout: four CUDA builds, a CPU build, null and bare.
INDEX: dict[str, Any] = {
    "default-priorities": {"namespace": ["nvidia", "x86_64"]},
    "variants": {
        "cu130": {"nvidia": {"cuda_version_lower_bound": ["13.0"], "sm_arch": ["100_real"]}},
        "cu128": {
            "nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90_real", "100_real"]}
        },
        "cu126": {
            "nvidia": {"cuda_version_lower_bound": ["12.6"], "sm_arch": ["80_real", "90_real"]}
        },
        "cu122": {"nvidia": {"cuda_version_lower_bound": ["12.2"], "sm_arch": ["80_real"]}},
        "v3": {"x86_64": {"level": ["v3"]}},
        "null": {},
    },
    "images": {
        label: {
            "tag": f"2.0-{label}",
            "digest": "sha256:" + hashlib.sha256(label.encode()).hexdigest(),
        }
        for label in ("cu130", "cu128", "cu126", "cu122", "v3", "null")
    },
    "bare": {"tag": "2.0", "digest": "sha256:" + "b" * 64},
    "invalid": [],
}


def gpu_only_index() -> dict[str, Any]:
    """INDEX without the variants that fit anything (CPU build, null, bare)."""
    index = {**INDEX, "variants": dict(INDEX["variants"]), "images": dict(INDEX["images"])}
    for label in ("v3", "null"):
        del index["variants"][label]
        del index["images"][label]
    index["bare"] = None
    return index


# --------------------------------------------------------------------------- servers


class _Server(uvicorn.Server):
    """uvicorn's server, with an event set once it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


class SchedulerServer:
    """The scheduler app under uvicorn on 127.0.0.1, in a thread of the test process."""

    def __init__(
        self,
        store: Store,
        fetch: IndexFetcher | None = None,
        *,
        tokens: TokenTable | None = None,
        registries: list[str] | None = None,
        tls: dict[str, Any] | None = None,
    ) -> None:
        extra: dict[str, Any] = {} if fetch is None else {"fetch": fetch}
        app = create_app(store, tokens=tokens, registries=registries, **extra)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(
            app, log_config=None, log_level="warning", lifespan="off", **(tls or {})
        )
        self.server = _Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        finally:
            self.server.ready.set()  # a server that failed to start wakes the waiter too

    def __enter__(self) -> SchedulerServer:
        self._thread.start()
        if not self.server.ready.wait(timeout=15) or not self.server.started:
            raise RuntimeError("the scheduler did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl", path=str(Path(found).parent)):
        return Path(found).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(candidates[-1]).parent if candidates else None


def _run_as() -> tuple[list[str], str | None]:
    """The command prefix to run PostgreSQL as a non-root user, and that user."""
    if os.geteuid() != 0:
        return [], None
    for user in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return ["runuser", "-u", user, "--"], user
    raise RuntimeError("running as root, with neither a postgres nor a nobody user")


class PostgresCluster:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.prefix, user = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="dv-pg-", dir="/tmp"))
        if user is not None:
            shutil.chown(self.root, user)
        self.data = self.root / "data"
        self.port = 0
        self._admin_lock = threading.Lock()

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self.prefix, *args], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args[:2])} failed: {(done.stderr or done.stdout)[-800:]}"
            )

    def start(self) -> PostgresCluster:
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        for _attempt in range(3):  # the free port may be taken between probe and bind
            self.port = free_port()
            options = f"-k {self.root} -h 127.0.0.1 -p {self.port} -F -c max_connections=300"
            try:
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options,
                    "-l", str(self.root / "postgres.log"), "-w", "-t", "30", "start",
                )  # fmt: skip
                return self
            except RuntimeError:
                if "already in use" not in self.log_tail():
                    raise
        raise RuntimeError("PostgreSQL: no free port after 3 attempts")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "postgres.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with (
            self._admin_lock,
            psycopg.connect(
                host="127.0.0.1", port=self.port, user="postgres", autocommit=True
            ) as conn,
        ):
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@functools.cache
def _cluster() -> PostgresCluster | str:
    bindir = _pg_bindir()
    if bindir is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed (Debian: postgresql)"
    cluster = PostgresCluster(bindir).start()
    atexit.register(cluster.stop)
    return cluster


def postgres_cluster() -> PostgresCluster:
    """The test process's cluster (started on first use); skips where PostgreSQL is absent."""
    cluster = _cluster()
    if isinstance(cluster, str):
        pytest.skip(cluster)
    return cluster


@contextlib.contextmanager
def open_store(kind: str, tmp_path: Path, **kwargs: Any) -> Iterator[Store]:
    """A fresh store on SQLite (a file under ``tmp_path``) or on a new PostgreSQL database."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'scheduler.db'}"
    else:
        url = postgres_cluster().new_database()
    store = Store.open(url, **kwargs)
    try:
        yield store
    finally:
        store.close()
