"""``variant-scheduler agent``: NVML health, providers files, timing, bad input, end to end.

NVML is tests/fakenvml/pynvml.py answering from machine fixtures shaped as
tests/fixtures/nvidia/*.json, with the real nvidia-ml-py error classes. End to end, the agent
and the scheduler are real processes on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import copy
import http.server
import importlib.util
import json
import logging
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import httpx
import pytest

import devstack
from clirun import run_in_process
from docker_variant.agent.client import check_scheduler_url
from docker_variant.agent.health import nvml_health
from docker_variant.agent.inputs import read_agent_providers_file
from docker_variant.agent.node import (
    MAX_BACKOFF_S,
    Agent,
    AgentSettings,
    HeartbeatError,
    backoff_delay,
    jittered,
)
from docker_variant.errors import InvalidInputError
from docker_variant.providers import HostReport, nvidia
from docker_variant.scheduler import Store
from docker_variant.scheduler.__main__ import main
from docker_variant.scheduler.tokens import load_tokens
from test_scheduler_support import H200_R580, INDEX, X86_V3, SchedulerServer, gpu_lists

TESTS = Path(__file__).parent
FAKE_NVML_DIR = TESTS / "fakenvml"
MACHINES = TESTS / "fixtures" / "nvidia"
SRC = TESTS.parent / "src"


# --------------------------------------------------------------------------- NVML fixtures


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    import pynvml  # noqa: F401  (the fake takes its error classes from the real module)

    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delenv("FAKE_NVML_MACHINE", raising=False)
    return module


def healthy_machine(name: str = "h100-r570") -> dict[str, Any]:
    """A fixture machine with the health calls answered as on a healthy data-centre GPU."""
    machine: dict[str, Any] = json.loads((MACHINES / f"{name}.json").read_text())
    for device in machine["devices"]:
        device["nvmlDeviceGetTotalEccErrors"] = 0
        device["nvmlDeviceGetRetiredPagesPendingStatus"] = 0  # NVML_FEATURE_DISABLED
    return machine


def write_machine(path: Path, machine: dict[str, Any]) -> Path:
    """Written whole, then renamed into place: a running agent's fake NVML reads the file at
    each beat and must never see it half written."""
    written = path.with_name(path.name + ".new")
    written.write_text(json.dumps(machine, indent=2))
    written.replace(path)
    return path


def uuids(machine: dict[str, Any]) -> list[str]:
    return [d["nvmlDeviceGetUUID"] for d in machine["devices"]]


def use(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, machine: dict[str, Any]) -> None:
    monkeypatch.setenv("FAKE_NVML_MACHINE", str(write_machine(tmp_path / "m.json", machine)))


def test_the_fake_raises_the_real_nvml_error_classes(fake_nvml: ModuleType) -> None:
    import pynvml

    error = fake_nvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert type(error).__name__ == "NVMLError_GpuIsLost" and str(error) == "GPU is lost"
    assert isinstance(error, pynvml.NVMLError)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake_nvml.nvmlInit()  # no machine: as without a driver


def test_a_healthy_machine_has_no_verdicts(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine = healthy_machine()
    use(monkeypatch, tmp_path, machine)
    assert len(uuids(machine)) >= 2
    assert nvml_health(uuids(machine), fake_nvml, known=uuids(machine)) == {}


def test_uncorrectable_ecc_errors_and_pending_retired_pages_are_unhealthy(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine = healthy_machine()
    first, second = uuids(machine)[:2]
    machine["devices"][0]["nvmlDeviceGetTotalEccErrors"] = 3
    machine["devices"][1]["nvmlDeviceGetRetiredPagesPendingStatus"] = 1  # FEATURE_ENABLED
    use(monkeypatch, tmp_path, machine)
    assert nvml_health(uuids(machine), fake_nvml) == {
        first: "3 uncorrectable ECC errors since the driver loaded",
        second: "retired pages pending (the GPU needs a reset)",
    }


def test_a_lost_gpu_stopped_answering(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine = healthy_machine()
    lost, other = uuids(machine)[:2]
    machine["devices"][0]["nvmlError"] = "NVML_ERROR_GPU_IS_LOST"
    machine["devices"][1]["nvmlDeviceGetRetiredPagesPendingStatus"] = {
        "nvmlError": "NVML_ERROR_UNKNOWN"
    }
    use(monkeypatch, tmp_path, machine)
    assert nvml_health([lost, other], fake_nvml) == {
        lost: "stopped answering (NVML: GPU is lost)",
        other: "stopped answering (NVML: Unknown Error)",
    }


def test_not_supported_says_nothing_about_health(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A GeForce card has no ECC and no page retirement: both calls answer "Not Supported".
    machine = healthy_machine("rtx5090-r570")
    for device in machine["devices"]:
        device["nvmlDeviceGetTotalEccErrors"] = {"nvmlError": "NVML_ERROR_NOT_SUPPORTED"}
        device["nvmlDeviceGetRetiredPagesPendingStatus"] = {"nvmlError": "NVML_ERROR_NOT_SUPPORTED"}
    use(monkeypatch, tmp_path, machine)
    assert nvml_health(uuids(machine), fake_nvml) == {}


def test_a_vanished_gpu_is_unhealthy_only_if_nvml_knew_it(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use(monkeypatch, tmp_path, healthy_machine())
    gone = "GPU-00000000-1111-2222-3333-444444444444"
    assert nvml_health([gone], fake_nvml) == {}  # e.g. an id from a providers file
    assert nvml_health([gone], fake_nvml, known=[gone]) == {
        gone: "stopped answering (NVML: Not Found)"
    }


def test_without_a_driver_nothing_is_judged(fake_nvml: ModuleType) -> None:
    assert nvml_health(["GPU-1"], fake_nvml, known=["GPU-1"]) == {}


def test_the_agent_keeps_a_gpu_that_vanished_and_marks_it(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Detection through NVML (no providers file): the first report lists both GPUs; when
    one falls off the bus it stays in the report, with its lists, marked unhealthy."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)  # what the nvidia provider imports
    machine = healthy_machine()
    use(monkeypatch, tmp_path, machine)
    agent = Agent(AgentSettings("http://127.0.0.1:9", "node"), nvml=fake_nvml)
    first = agent.report()
    assert sorted(first["devices"]["nvidia"]) == sorted(uuids(machine))
    assert "unhealthy" not in first and first["platform"].startswith("linux/")
    lost = copy.deepcopy(machine)
    del lost["devices"][1]
    lost["nvmlDeviceGetCount"] = len(lost["devices"])
    use(monkeypatch, tmp_path, lost)
    second = agent.report()
    assert second["devices"] == first["devices"]
    assert second["unhealthy"] == {"nvidia": [uuids(machine)[1]]}


def test_a_gpu_lost_mid_run_keeps_its_neighbours_reported(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """NVML still counts a GPU that fell off the bus, but its handle lookup fails with
    GPU_IS_LOST: the nvidia provider skips that GPU only; the agent keeps every GPU it saw,
    marks the lost one and leaves the one that answers healthy."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    machine = healthy_machine()
    use(monkeypatch, tmp_path, machine)
    agent = Agent(AgentSettings("http://127.0.0.1:9", "node"), nvml=fake_nvml)
    first = agent.report()
    lost = copy.deepcopy(machine)
    lost["devices"][0]["nvmlError"] = "NVML_ERROR_GPU_IS_LOST"
    use(monkeypatch, tmp_path, lost)
    # the provider's view: the GPU that answers, without the lost one
    assert list(nvidia.detect({}, fake_nvml, lambda _args: None).devices) == uuids(machine)[1:]
    second = agent.report()
    assert second["devices"]["nvidia"] == first["devices"]["nvidia"]
    assert second["unhealthy"] == {"nvidia": [uuids(machine)[0]]}


# --------------------------------------------------------------------------- other vendors

HOST_ROOTS = TESTS / "fixtures" / "hostroot"  # sysfs as on real hosts (tests/test_amd_provider.py)
DESCRIPTORS = TESTS.parent / "examples" / "providers.d"  # the Warboy and Gaudi2 examples


@pytest.fixture
def no_user_descriptors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the descriptors a test names apply (not this machine's user's)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in (
        "DOCKER_VARIANT_HOST_ROOT",
        "DOCKER_VARIANT_DESCRIPTORS",
        "DOCKER_VARIANT_PROVIDERS_FILE",
    ):
        monkeypatch.delenv(name, raising=False)


def test_an_mi300x_host_reports_its_gpus_and_nvml_judges_only_nvidia_ones(
    fake_nvml: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    no_user_descriptors: None,
) -> None:
    """An MI300X host with two H100s beside it (NVML answers for those): the AMD GPUs are
    reported by PCI address with their gfx target; an H100 with an ECC error is unhealthy,
    no AMD GPU is, though NVML knows none of them."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    machine = healthy_machine()
    machine["devices"][0]["nvmlDeviceGetTotalEccErrors"] = 2
    use(monkeypatch, tmp_path, machine)
    settings = AgentSettings("http://127.0.0.1:9", "mi300x", host_root=HOST_ROOTS / "mi300x")
    body = Agent(settings, nvml=fake_nvml).report()
    amd = body["devices"]["amd"]
    assert len(amd) == 8 and all(re.fullmatch(r"0000:[0-9a-f]{2}:00\.0", pci) for pci in amd)
    assert {lists["amd"]["gfx_arch"][0] for lists in amd.values()} == {"gfx942"}
    assert body["host"]["amd"]["gfx_arch"] == ["gfx942"]
    assert body["host"]["amd"]["rocm_version"][0] == "6.4"  # the host's own ROCm first
    assert sorted(body["devices"]["nvidia"]) == sorted(uuids(machine))
    assert body["unhealthy"] == {"nvidia": [uuids(machine)[0]]}


def test_a_warboy_host_reports_its_npus_from_the_descriptor(no_user_descriptors: None) -> None:
    settings = AgentSettings(
        "http://127.0.0.1:9", "npu", host_root=HOST_ROOTS / "warboy", descriptors=DESCRIPTORS
    )
    body = Agent(settings).report()
    furiosa = body["devices"]["furiosa"]
    assert sorted(furiosa) == ["0000:17:00.0", "0000:65:00.0"]  # 0000:31:00.0 is no Warboy
    assert all(
        lists == {"furiosa": {"arch": ["warboy"], "driver_version": ["1.9.2"]}}
        for lists in furiosa.values()
    )
    assert "amd" not in body["devices"] and "unhealthy" not in body


def test_a_device_detection_stops_listing_is_kept_and_unhealthy(
    tmp_path: Path, no_user_descriptors: None
) -> None:
    """An AMD GPU that falls off the bus leaves the KFD topology: the agent keeps it, with
    its last lists, marked unhealthy; NVML has no say in it."""
    root = tmp_path / "host"
    shutil.copytree(HOST_ROOTS / "mi210-navi31", root)
    agent = Agent(AgentSettings("http://127.0.0.1:9", "node", host_root=root))
    first = agent.report()
    assert sorted(first["devices"]["amd"]) == ["0000:03:00.0", "0000:0c:00.0"]
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    gone = next(
        node
        for node in nodes.iterdir()
        if "gfx_target_version 110000" in (node / "properties").read_text()
    )
    shutil.rmtree(gone)  # the Navi 31
    second = agent.report()
    assert second["devices"] == first["devices"]
    assert second["unhealthy"] == {"amd": ["0000:0c:00.0"]}
    shutil.copytree(HOST_ROOTS / "mi210-navi31" / gone.relative_to(root), gone)
    assert "unhealthy" not in agent.report()  # back on the bus: healthy again


def test_the_agent_command_takes_a_host_root_and_descriptors(
    tmp_path: Path, started: list[Any], no_user_descriptors: None
) -> None:
    """``--host-root`` and ``--descriptors`` on the command line, or
    ``$DOCKER_VARIANT_HOST_ROOT``: each agent's heartbeats carry its host's devices."""
    scheduler = devstack.start_scheduler(tmp_path / "scheduler")
    started.append(scheduler)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    npu = AgentProcess(
        tmp_path / "npu",
        ["--scheduler", scheduler.url, "--agent-id", "npu", "--host-root",
         str(HOST_ROOTS / "warboy"), "--descriptors", str(DESCRIPTORS)],
        env,
    )  # fmt: skip
    started.append(npu)
    gpu = AgentProcess(
        tmp_path / "gpu",
        ["--scheduler", scheduler.url, "--agent-id", "gpu"],
        {**env, "DOCKER_VARIANT_HOST_ROOT": str(HOST_ROOTS / "mi300x")},
    )
    started.append(gpu)
    sources = npu.expect("detecting with")["message"]
    assert f"furiosa: descriptor {DESCRIPTORS / 'furiosa-warboy.toml'}" in sources, sources
    npu.expect("registered with")
    assert "amd: built-in (KFD sysfs under" in gpu.expect("detecting with")["message"]
    gpu.expect("registered with")
    listed = agents(scheduler.url)
    assert listed["npu"]["devices"]["furiosa"]["free"] == ["0000:17:00.0", "0000:65:00.0"]
    assert len(listed["gpu"]["devices"]["amd"]["free"]) == 8
    assert npu.stop() == 0 and gpu.stop() == 0


# --------------------------------------------------------------------------- inputs


def test_providers_file_shapes(tmp_path: Path) -> None:
    lists = tmp_path / "lists.json"
    # a namespace may be called "host": plain supported lists still, since it holds value lists
    lists.write_text(json.dumps({"host": {"kind": ["a"]}, **X86_V3}))
    assert read_agent_providers_file(lists).report.devices == {}
    report = tmp_path / "report.json"
    body = {
        "host": X86_V3,
        "devices": {"cuda": {"GPU-0": gpu_lists(H200_R580), "GPU-1": gpu_lists(H200_R580)}},
        "capacity": {"cuda": {"GPU-1": 0.5}},
    }
    report.write_text(json.dumps(body))
    read = read_agent_providers_file(report)
    assert read.report.host == X86_V3 and sorted(read.report.devices["cuda"]) == ["GPU-0", "GPU-1"]
    assert read.capacity == {"cuda": {"GPU-1": 0.5}}
    body["capacity"] = {"cuda": {"GPU-7": 1}}
    report.write_text(json.dumps(body))
    with pytest.raises(InvalidInputError, match="capacity names cuda/GPU-7, no device"):
        read_agent_providers_file(report)
    # what `providers --devices --json` prints (its "sources" too), with capacity added
    printed = HostReport(X86_V3, {"cuda": {"GPU-0": gpu_lists(H200_R580)}}, {"x86_64": "a"})
    report.write_text(json.dumps({**printed.to_json(), "capacity": {"cuda": {"GPU-0": 0.25}}}))
    read = read_agent_providers_file(report)
    assert read.report.devices == printed.devices and read.capacity == {"cuda": {"GPU-0": 0.25}}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:5090", "expected http://HOST:PORT"),
        ("ftp://h:1", "expected http://HOST:PORT"),
        ("http://", "expected http://HOST:PORT"),
        ("http://h:5090/?x=1", "no query or fragment"),
    ],
)
def test_bad_scheduler_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        check_scheduler_url(url)
    assert check_scheduler_url("https://sched.example:8443/") == "https://sched.example:8443"


def test_backoff_doubles_to_its_cap_and_beats_are_jittered() -> None:
    rng = random.Random(7)
    bases = [1, 2, 4, 8, 16, 30, 30, 30]
    for failures, base in enumerate(bases, 1):
        delay = backoff_delay(failures, 10, rng)
        assert base * 0.8 <= delay <= base * 1.2, (failures, delay)
    assert backoff_delay(1000, 120, rng) >= 120 * 0.8 > MAX_BACKOFF_S  # a long interval caps
    beats = {round(jittered(10, rng), 6) for _ in range(50)}
    assert len(beats) > 40 and all(9 <= b <= 11 for b in beats)


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    return run_in_process(main, argv, capsys)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--scheduler", "localhost:5090"], "--scheduler 'localhost:5090': expected http://"),
        (["--token-file", "/no/such/token"], "--token-file '/no/such/token': cannot read it"),
        (["--token-file", "EMPTY"], "the file is empty"),
        (["--providers-file", "/no/such.json"], "providers file '/no/such.json': cannot read"),
        (["--providers-file", "BAD"], "not valid JSON"),
        (["--agent-id", "a/b"], "agent_id 'a/b' is not valid"),
        (["--resource-group", "a b"], "--resource-group 'a b' is not valid"),
        (["--interval", "0"], "interval must be > 0 seconds, got '0'"),
        (["--host-root", "/no/such/root"], "--host-root '/no/such/root': not a directory"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "EMPTY").write_text("\n")
    (tmp_path / "BAD").write_text("{nope")
    (tmp_path / "ok.json").write_text(json.dumps(X86_V3))
    argv = ["agent", "--scheduler", "http://127.0.0.1:9", "--providers-file", "ok.json"]
    argv += [str(tmp_path / a) if a in ("EMPTY", "BAD") else a for a in extra]
    os.chdir(tmp_path)
    code, err = run_main(argv, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- end to end


class Output:
    """A process's output, line by line as it comes (a reader thread), also kept in a file:
    a test awaits the line that says something happened instead of polling."""

    def __init__(self, stream: IO[bytes], path: Path) -> None:
        self.path = path
        self.ended = False  # the end of the output was taken
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        with stream, self.path.open("ab") as kept:
            for raw in iter(stream.readline, b""):
                kept.write(raw)
                kept.flush()
                self._lines.put(raw.decode(errors="replace"))
        self._lines.put(None)  # the process closed its output

    def text(self) -> str:
        return self.path.read_text(errors="replace")

    def expect(self, wanted: str, timeout: float = 30) -> str:
        """The next line (after those already taken) that contains ``wanted``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError(f"no {wanted!r} within {timeout} s: {self.text()}") from None
            if line is None:
                self.ended = True
                raise AssertionError(f"the output ended before {wanted!r}: {self.text()}")
            if wanted in line:
                return line

    def expect_end(self, timeout: float = 30) -> None:
        """Wait until the process has closed its output (all of it is in the file)."""
        deadline = time.monotonic() + timeout
        while not self.ended:
            try:
                self.ended = self._lines.get(timeout=max(deadline - time.monotonic(), 0)) is None
            except queue.Empty:
                raise AssertionError(f"the output is still open after {timeout} s") from None


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[Any, Output]:
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    assert process.stdout is not None
    return process, Output(process.stdout, log)


def serve(root: Path, port: int) -> devstack.Service:
    """The scheduler on a given port (a restart must come back where the agent looks). Nothing
    waits for it to listen: the agent retries until it does, and its log says when the
    scheduler took a heartbeat."""
    argv = [
        sys.executable, "-m", "docker_variant.scheduler", "serve", "--log-level", "warning",
        "--db", f"sqlite:///{root / 'scheduler.db'}", "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    process, _ = spawn(argv, root / "scheduler.log")
    return devstack.Service(
        "variant-scheduler", process, f"127.0.0.1:{port}", root, root / "scheduler.log"
    )


class AgentProcess:
    """``variant-scheduler agent`` as a process; its log lines can be awaited."""

    def __init__(self, root: Path, argv: list[str], env: dict[str, str] | None = None) -> None:
        command = [sys.executable, "-m", "docker_variant.scheduler", "agent", *argv]
        root.mkdir(parents=True, exist_ok=True)
        self.process, self.output = spawn(command, root / "agent.log", env)

    def text(self) -> str:
        return self.output.text()

    def expect(self, wanted: str, timeout: float = 30) -> dict[str, Any]:
        """The agent's next log line whose message contains ``wanted``, as its JSON object
        (at debug level, httpcore's lines come too)."""
        while True:
            entry: dict[str, Any] = json.loads(self.output.expect(wanted, timeout))
            if entry["logger"] == "docker_variant.agent" and wanted in entry["message"]:
                return entry

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=20)
        self.output.expect_end()
        return int(self.process.returncode)


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """Processes to stop (by their pid) whatever the test's outcome."""
    running: list[Any] = []
    yield running
    for item in reversed(running):
        item.stop()


def agents(url: str) -> dict[str, dict[str, Any]]:
    listed = httpx.get(f"{url}/v1/agents", timeout=5).json()["agents"]
    return {a["agent_id"]: a for a in listed}


def providers_report(path: Path, count: int = 2) -> Path:
    devices = {f"GPU-{i}": gpu_lists(H200_R580) for i in range(count)}
    path.write_text(json.dumps({"host": X86_V3, "devices": {"cuda": devices}}))
    return path


def test_agent_registers_re_registers_and_stops_on_sigterm(
    tmp_path: Path, started: list[Any]
) -> None:
    port = devstack.free_port()
    scheduler = serve(tmp_path, port)
    started.append(scheduler)
    providers = providers_report(tmp_path / "node.json")
    agent = AgentProcess(
        tmp_path,
        ["--scheduler", scheduler.url, "--providers-file", str(providers), "--interval", "1",
         "--agent-id", "node-a", "--resource-group", "gpu", "--log-level", "debug"],
    )  # fmt: skip
    started.append(agent)
    # the agent beats at once on start
    agent.expect("registered with")
    view = agents(scheduler.url)["node-a"]
    assert view["resource_group"] == "gpu" and view["platform"] == "linux/amd64"
    assert view["devices"]["cuda"]["free"] == ["GPU-0", "GPU-1"]
    # it keeps beating: last_seen moves on. It is shown to the second and a beat comes
    # every 0.9 to 1.1 s, so two beats may share a second; the third is >= 1.8 s later.
    agent.expect("heartbeat 3 taken")
    before = agents(scheduler.url)["node-a"]["last_seen"]
    assert before != view["last_seen"]

    # the scheduler dies and comes back on the same database: the agent re-registers
    scheduler.process.kill()
    scheduler.process.wait()
    assert agent.expect("failed")["level"] == "warning"  # an outage, not an error
    scheduler = serve(tmp_path, port)
    started.append(scheduler)
    agent.expect("re-registered after")
    assert agents(scheduler.url)["node-a"]["last_seen"] > before

    # the operator drops the agent (an empty database would look the same): it comes back
    # with its devices, and a report the scheduler takes in full (its lists) each time
    httpx.delete(f"{scheduler.url}/v1/agents/node-a").raise_for_status()
    back = None
    for _ in range(3):  # a beat already on its way when the agent was dropped may come first
        agent.expect("taken")
        if back := agents(scheduler.url).get("node-a"):
            break
    assert back is not None and back["devices"]["cuda"]["free"] == ["GPU-0", "GPU-1"]
    detail = httpx.get(f"{scheduler.url}/v1/agents/node-a").json()
    assert detail["host"] == X86_V3

    assert agent.stop() == 0
    log = agent.text()
    assert "Traceback" not in log and "agent node-a stopped" in log
    assert all(
        json.loads(line)["level"] in ("info", "warning", "debug") for line in log.splitlines()
    )


def test_a_refused_report_exits_2(tmp_path: Path, started: list[Any]) -> None:
    scheduler = devstack.start_scheduler(tmp_path)
    started.append(scheduler)
    providers = tmp_path / "node.json"
    # valid lists for the agent, but a device id the scheduler's rule refuses ("/")
    providers.write_text(json.dumps({"host": X86_V3, "devices": {"cuda": {"a/b": {}}}}))
    agent = AgentProcess(
        tmp_path, ["--scheduler", scheduler.url, "--providers-file", str(providers)]
    )
    started.append(agent)
    assert agent.process.wait(timeout=30) == 2
    assert "the scheduler refused the report of agent" in agent.text()
    assert "Traceback" not in agent.text()


def placement(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/placements", json=body, timeout=10)
    assert response.status_code == 201, response.text
    document: dict[str, Any] = response.json()
    return document


def test_an_unhealthy_gpu_degrades_the_placement_holding_it(
    tmp_path: Path, started: list[Any]
) -> None:
    """The agent detects through NVML (the fake, in the agent's own process): two H100s;
    one then counts an uncorrectable ECC error, and the gang on it is degraded."""
    scheduler = devstack.start_scheduler(tmp_path)
    started.append(scheduler)
    machine = healthy_machine("h100-r570")
    path = write_machine(tmp_path / "machine.json", machine)
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKE_NVML_DIR), str(SRC)]),
        "FAKE_NVML_MACHINE": str(path),
        "DOCKER_VARIANT_PROVIDERS_FILE": "",
    }
    argv = ["--scheduler", scheduler.url, "--interval", "1", "--agent-id", "gpu-node"]
    agent = AgentProcess(tmp_path, [*argv, "--log-level", "debug"], env)
    started.append(agent)
    agent.expect("registered with")
    view = agents(scheduler.url)["gpu-node"]
    assert sorted(view["devices"]["nvidia"]["free"]) == sorted(uuids(machine))
    placed = placement(scheduler.url, {"index": INDEX, "nodes": 1, "devices_per_node": 1})
    held = placed["allocations"][0]["devices"][0]
    assert placed.get("state", "active") == "active"

    sick = copy.deepcopy(machine)
    sick["devices"][uuids(machine).index(held)]["nvmlDeviceGetTotalEccErrors"] = 1
    write_machine(path, sick)

    # the next report says so, and once the scheduler has taken it the gang is degraded
    assert (
        "uncorrectable ECC error" in agent.expect(f"device nvidia/{held} is unhealthy")["message"]
    )
    agent.expect("taken")
    document = httpx.get(f"{scheduler.url}/v1/placements/{placed['id']}").json()
    assert document["state"] == "degraded", document
    assert held in document["degraded"]["reason"] and document["degraded"]["since"]
    listed = httpx.get(f"{scheduler.url}/v1/placements", params={"state": "degraded"}).json()
    assert [p["id"] for p in listed["placements"]] == [placed["id"]]


def test_the_agent_sends_its_token_and_takes_a_rotated_one(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\nrole = "agent"\nagent_id = "node"\ntoken = "agent-token-0123456789"\n'
    )
    token_file = tmp_path / "agent.token"
    token_file.write_text("stale-token-0123456789\n")
    providers = providers_report(tmp_path / "node.json")
    store = Store.open(f"sqlite:///{tmp_path / 'scheduler.db'}")
    try:
        with SchedulerServer(store, tokens=load_tokens(tokens)) as server:
            settings = AgentSettings(
                server.url, "node", token_file=token_file, providers_file=providers
            )
            agent = Agent(settings)
            with pytest.raises(HeartbeatError, match="401 the bearer token is not valid"):
                agent.beat()
            token_file.write_text("agent-token-0123456789\n")  # rotated on disk
            with pytest.raises(HeartbeatError):
                agent.beat()  # this one still carried the old token; it re-read the file
            assert agent.beat()["devices"]["cuda"]["free"] == ["GPU-0", "GPU-1"]
            agent.close()
            other = Agent(replace(settings, agent_id="someone-else"))
            with pytest.raises(HeartbeatError, match="403"):
                other.beat()  # an agent's token reports its own agent only
            other.close()
    finally:
        store.close()


# --------------------------------------------------------------------------- bad answers


def peak_rss_kib(pid: int) -> int:
    """A live process's peak resident set (``VmHWM``), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


HUGE = 300 << 20  # what the scheduler sent: 300 MB


class BadScheduler(http.server.ThreadingHTTPServer):
    """A scheduler that answers every heartbeat with one bad shape, on 127.0.0.1; it counts
    the heartbeats and notes the agent's peak RSS as each one arrives."""

    daemon_threads = True

    def __init__(self, shape: str) -> None:
        super().__init__(("127.0.0.1", 0), _BadAnswer)
        self.shape = shape
        self.agent_pid: int | None = None
        self.peaks: list[int] = []
        self.arrived = threading.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait_for_beats(self, count: int, timeout: float = 60) -> None:
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.peaks) >= count, timeout):
                raise AssertionError(f"{len(self.peaks)} heartbeats, not {count}, in {timeout} s")


class _BadAnswer(http.server.BaseHTTPRequestHandler):
    server: BadScheduler

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server = self.server
        with server.arrived:
            server.arrived.wait_for(lambda: server.agent_pid is not None, 30)
            assert server.agent_pid is not None
            server.peaks.append(peak_rss_kib(server.agent_pid))
            server.arrived.notify_all()
        view = json.dumps({"agent_id": "node", "devices": {}}).encode()
        with contextlib.suppress(OSError):  # the agent hangs up on what it will not read
            if server.shape == "nested":  # valid JSON, 100,000 levels deep
                self._answer(200, b"[" * 100_000 + b"]" * 100_000)
            elif server.shape == "redirect":  # a JSON body that looks like a heartbeat's
                self._answer(302, view, Location="http://127.0.0.1:9/v1/agents/node")
            elif server.shape == "huge-declared":
                self._answer(200, b"", **{"Content-Length": str(HUGE)})
                self.wfile.write(b" " * (1 << 20))
            elif server.shape == "huge":  # no length: the body ends when the server hangs up
                self._answer(200, b"")
                chunk = b"[" + b" " * ((1 << 20) - 1)
                for _ in range(HUGE >> 20):
                    self.wfile.write(chunk)

    def _answer(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        if body or "Content-Length" in headers:
            self.send_header("Content-Length", headers.get("Content-Length", str(len(body))))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def bad_scheduler(request: pytest.FixtureRequest) -> Iterator[BadScheduler]:
    server = BadScheduler(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize(
    ("bad_scheduler", "reason"),
    [
        ("nested", "nested more than 32 levels deep"),
        ("redirect", "302 Found: a redirect to 'http://127.0.0.1:9/v1/agents/node'"),
        ("huge-declared", f"the answer is {HUGE} bytes, more than the 1048576 an agent reads"),
        ("huge", "the answer is larger than the 1048576 bytes an agent reads"),
    ],
    indirect=["bad_scheduler"],
)
def test_a_bad_answer_is_one_logged_error_and_a_retry(
    bad_scheduler: BadScheduler, reason: str, tmp_path: Path, started: list[Any]
) -> None:
    """Each bad answer fails the heartbeat (a redirect counts for nothing), is logged once
    while it repeats, and is retried with backoff; the agent keeps running, and it never
    buffers more than its bound of a 300 MB answer."""
    providers = providers_report(tmp_path / "node.json")
    agent = AgentProcess(
        tmp_path,
        ["--scheduler", bad_scheduler.url, "--providers-file", str(providers),
         "--interval", "0.2", "--agent-id", "node"],
    )  # fmt: skip
    started.append(agent)
    with bad_scheduler.arrived:
        bad_scheduler.agent_pid = agent.process.pid
        bad_scheduler.arrived.notify_all()
    bad_scheduler.wait_for_beats(3)  # the first beat and two retries after backoff
    assert agent.process.poll() is None, agent.text()
    growth_kib = peak_rss_kib(agent.process.pid) - bad_scheduler.peaks[0]
    assert growth_kib < 16 << 10, f"peak RSS grew by {growth_kib} KiB"  # 1 MiB read at most
    assert agent.stop() == 0
    lines = [json.loads(line) for line in agent.text().splitlines()]
    failed = [line for line in lines if "failed" in line["message"]]
    assert len(failed) == 1 and failed[0]["level"] == "error", lines
    assert "heartbeat 1 to" in failed[0]["message"] and reason in failed[0]["message"], failed
    assert not any("registered" in line["message"] for line in lines), lines
    assert "Traceback" not in agent.text()


#: A main thread that is always inside ``stop.wait()``, where the event's lock is held for a
#: few bytecodes on every call: a handler that sets the event there waits for that lock forever.
_WAITING_CHILD = """
import signal, sys, threading
from docker_variant.agent.command import stop_on_signals
stop = threading.Event()
stop_on_signals(stop, signal.SIGTERM)
print("ready", flush=True)
while not stop.wait(0):
    pass
print("stopped", flush=True)
"""


def test_a_signal_that_lands_inside_the_wait_still_stops_the_agent() -> None:
    """The agent's SIGTERM sets its stop event from a thread, never from the handler: set
    from the handler (as it was), about half of these children hung (CI saw an agent ignore
    SIGTERM for 20 s)."""
    for _ in range(12):
        child = subprocess.Popen(
            [sys.executable, "-c", _WAITING_CHILD], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        try:
            out, _ = child.communicate(timeout=30)
        finally:
            child.kill()
        assert child.returncode == 0 and out == "stopped\n", (child.returncode, out)


def test_an_agent_with_no_devices_warns_once(
    tmp_path: Path, no_user_descriptors: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A node reporting no device at all is worth a warning (a GPU node without its driver
    or mounts looks just like it): once, not at every beat; a node with devices gets none."""
    empty = tmp_path / "host"
    (empty / "sys").mkdir(parents=True)
    agent = Agent(AgentSettings("http://127.0.0.1:9", "cpu-1", host_root=empty))
    with caplog.at_level(logging.WARNING, logger="docker_variant"):
        agent.report()
        agent.report()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "agent cpu-1 reports no devices" in warnings[0]
    assert f"{empty}/sys/class/kfd" in warnings[0]
    caplog.clear()
    gpus = Agent(AgentSettings("http://127.0.0.1:9", "amd", host_root=HOST_ROOTS / "mi300x"))
    with caplog.at_level(logging.WARNING, logger="docker_variant"):
        gpus.report()
    assert not [r for r in caplog.records if "no devices" in r.getMessage()]


# --------------------------------------------------------------------------- node labels

EXAMPLE_HOSTS = TESTS.parent / "examples" / "hosts"
PREFIX = "variant.pep817.dev/"


class FakeApiserver:
    """Nodes behind an ``httpx.MockTransport``: GET and merge-PATCH (RFC 7386) of
    ``/api/v1/nodes/NAME``, every request kept; ``refuse`` answers that status instead."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes
        self.requests: list[httpx.Request] = []
        self.refuse: int | None = None
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        match = re.fullmatch(r"/api/v1/nodes/([^/]+)", request.url.path)
        if self.refuse is not None or match is None or match[1] not in self.nodes:
            code = self.refuse or 404
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "message": f"refused ({code})", "reason": "Forbidden", "code": code}  # fmt: skip
            return httpx.Response(code, json=status)
        node = self.nodes[match[1]]
        if request.method == "PATCH":
            assert request.headers["content-type"] == "application/merge-patch+json"
            _merge(node, json.loads(request.content))
        return httpx.Response(200, json=node)

    def patches(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.method == "PATCH"]


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels), "resourceVersion": "1"},
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}}  # fmt: skip


def _kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "agent", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "agent"}}],
    }))  # fmt: skip
    return path


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _labelling_agent(
    tmp_path: Path, apiserver: FakeApiserver, host: str, clock: Clock
) -> tuple[Agent, Path]:
    from docker_variant.k8s.apiserver import NodeLabeller, connect

    providers = tmp_path / "node.json"
    shutil.copy(EXAMPLE_HOSTS / f"{host}.json", providers)
    settings = AgentSettings(None, "gpu-1", providers_file=providers, node_name="gpu-1")
    client = connect(_kubeconfig(tmp_path), transport=apiserver.transport)
    labeller = NodeLabeller(client, "gpu-1")
    return Agent(settings, labeller=labeller, clock=clock), providers


def test_label_patch_touches_only_the_prefix() -> None:
    from docker_variant.k8s.apiserver import label_patch

    current = {"kubernetes.io/hostname": "gpu-1", f"{PREFIX}x86_64.level": "3",
               f"{PREFIX}nvidia.sm_arch.90_real": "true", f"{PREFIX}nvidia.sm_arch.9": "0"}  # fmt: skip
    wanted = {f"{PREFIX}x86_64.level": "4", f"{PREFIX}nvidia.sm_arch.9": "0"}
    assert label_patch(current, wanted) == {
        f"{PREFIX}x86_64.level": "4",
        f"{PREFIX}nvidia.sm_arch.90_real": None,
    }
    assert label_patch(wanted, wanted) == {}


def test_the_agent_keeps_its_nodes_labels_current(tmp_path: Path) -> None:
    """Added, changed, stale ones removed (the one-per-value labels of old), others kept;
    a merge patch of metadata.labels alone, and only when something differs."""
    old = {"kubernetes.io/hostname": "gpu-1", f"{PREFIX}nvidia.sm_arch.90_real": "true",
           f"{PREFIX}x86_64.level": "3"}  # fmt: skip
    apiserver = FakeApiserver({"gpu-1": _node("gpu-1", old), "gpu-2": _node("gpu-2", old)})
    clock = Clock()
    agent, providers = _labelling_agent(tmp_path, apiserver, "h200-r570", clock)
    assert agent.beat() == {}  # labels only: no scheduler
    (patch,) = apiserver.patches()
    assert patch == {"metadata": {"labels": {
        f"{PREFIX}nvidia.cuda_version_lower_bound": "1208",
        f"{PREFIX}nvidia.cuda_version_upper_bound": "1208",
        f"{PREFIX}nvidia.sm_arch.9": "0",
        f"{PREFIX}x86_64.level": "4",
        f"{PREFIX}nvidia.sm_arch.90_real": None,
    }}}  # fmt: skip
    node = apiserver.nodes["gpu-1"]
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-1"
    assert node["spec"] == _node("gpu-1", {})["spec"]
    assert apiserver.nodes["gpu-2"]["metadata"]["labels"] == old  # not its node
    assert all(r.headers["authorization"] == "Bearer t0ken" for r in apiserver.requests)
    patching = [r for r in apiserver.requests if r.method == "PATCH"]
    assert [r.url.params.get("fieldManager") for r in patching] == ["variant-agent"]

    # unchanged detection: the Node is not asked again until the resync is due
    asked = len(apiserver.requests)
    agent.beat()
    assert len(apiserver.requests) == asked
    clock.now += 301
    agent.beat()
    assert [r.method for r in apiserver.requests[asked:]] == ["GET"]

    # a driver upgrade (CUDA 13.0) and a new GPU (B200): the labels follow at once
    shutil.copy(EXAMPLE_HOSTS / "b200-r580.json", providers)
    agent.beat()
    labels = {k: v for k, v in node["metadata"]["labels"].items() if k.startswith(PREFIX)}
    assert labels == {
        f"{PREFIX}nvidia.cuda_version_lower_bound": "1300",
        f"{PREFIX}nvidia.cuda_version_upper_bound": "1300",
        f"{PREFIX}nvidia.sm_arch.10": "0",
        f"{PREFIX}x86_64.level": "4",
    }


def test_a_refused_label_patch_is_logged_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver = FakeApiserver({"gpu-1": _node("gpu-1", {})})
    apiserver.refuse = 403
    agent, _ = _labelling_agent(tmp_path, apiserver, "h200-r570", Clock())
    with caplog.at_level(logging.WARNING, "docker_variant.agent"):
        agent.beat()  # the beat goes on
    assert "labelling node gpu-1 failed (node gpu-1: 403 refused (403))" in caplog.text
    assert apiserver.nodes["gpu-1"]["metadata"]["labels"] == {}
    apiserver.refuse = None
    agent.beat()  # no resync wait after a failure
    assert apiserver.nodes["gpu-1"]["metadata"]["labels"][f"{PREFIX}x86_64.level"] == "4"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["agent", "--providers-file", "ok.json"], {}, "give --scheduler URL, --label-node, --containerd-hosts REGISTRY, or several"),
        (["agent", "--label-node", "--providers-file", "ok.json"], {},
         "--label-node: no node name (give --node-name, or set $NODE_NAME"),
        (["agent", "--label-node", "--providers-file", "ok.json"], {"NODE_NAME": "Bad_Node"},
         "--node-name 'Bad_Node': not a node name"),
        (["agent", "--label-node", "--node-name", "gpu-1", "--kubeconfig", "/no/such/config",
          "--providers-file", "ok.json"], {}, "--kubeconfig '/no/such/config': cannot load it"),
    ],
)  # fmt: skip
def test_bad_label_node_input_exits_2_with_one_line(
    argv: list[str],
    env: dict[str, str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "ok.json").write_text(json.dumps(X86_V3))
    monkeypatch.delenv("NODE_NAME", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    code, err = run_main(argv, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err
