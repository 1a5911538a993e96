"""The ``nvidia`` namespace (docs/reference/host-properties.md): NVML first, ``nvidia-smi`` as the fallback.

The lists are exactly those of the wheelnext NVIDIA variant provider (``vendors.nvidia``
computes them) so that a variant image is chosen the way pip/uv choose a variant wheel on
the same host. Besides the host aggregate
(what pip/uv see) each GPU gets its own lists, keyed by UUID, for schedulers.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from docker_variant.errors import InvalidInputError
from docker_variant.numtext import DIGITS, is_number
from docker_variant.providers.hostroot import HostRoot
from docker_variant.vendors import nvidia as rules

__all__ = [
    "CUDA_ENV",
    "SM_ARCH_ENV",
    "Gpu",
    "NvidiaReport",
    "NvidiaSystem",
    "cuda_lower_bounds",
    "cuda_upper_bounds",
    "detect",
    "detect_host",
    "nvidia_features",
    "read_nvidia_smi",
    "read_nvml",
    "sm_arch_values",
]

CUDA_ENV = "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION"
SM_ARCH_ENV = "NV_VARIANT_PROVIDER_FORCE_SM_ARCH"

# A *detected* driver outside the provider's catalogue disables the namespace (wheelnext does
# the same); an override is taken as given.
_DETECTED_RANGE = ((rules.MIN_MAJOR, 0), (rules.MAX_MAJOR, rules.MAX_MINOR))

# The lists themselves are the vendor's rules; the provider only detects.
cuda_lower_bounds = rules.cuda_lower_bounds
cuda_upper_bounds = rules.cuda_upper_bounds
sm_arch_values = rules.sm_arch_values
nvidia_features = rules.supported_features

SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,compute_cap,driver_version",
    "--format=csv,noheader",
]
SMI_DETAILS = ["nvidia-smi", "-q"]
_SMI_TIMEOUT_S = 10.0

_VERSION_RE = re.compile(rf"({DIGITS})\.({DIGITS})")
_SMI_CUDA_RE = re.compile(
    rf"^[ \t]*CUDA Version[ \t]*:[ \t]*({DIGITS})\.({DIGITS})[ \t\r]*$", re.MULTILINE
)
_UUID_RE = re.compile(r"GPU-[0-9a-fA-F-]+")

Version = tuple[int, int]


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    compute_capability: tuple[int, int]


@dataclass(frozen=True)
class NvidiaSystem:
    cuda: tuple[int, int] | None  # highest CUDA version the driver supports
    driver_version: str
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class NvidiaReport:
    host: dict[str, list[str]]  # features of the nvidia namespace, as pip/uv see them
    devices: dict[str, dict[str, dict[str, list[str]]]]  # GPU UUID -> {"nvidia": features}


# --------------------------------------------------------------------------- NVML


def _text(value: object) -> str:
    # Older nvidia-ml-py releases return bytes for names, UUIDs and versions.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _cuda_from_int(value: int) -> Version:
    return (value // 1000, (value % 1000) // 10)


def read_nvml(nvml: Any = None) -> NvidiaSystem | None:
    """The driver and GPUs through NVML; ``None`` without a driver, a library or a GPU."""
    if nvml is None:
        try:
            import pynvml as nvml_module
        except (ImportError, OSError):
            return None
        nvml = nvml_module
    error: Any = getattr(nvml, "NVMLError", OSError)
    try:
        nvml.nvmlInit()
    except (error, OSError):  # NVMLError_LibraryNotFound when no driver is installed
        return None
    try:
        return _query_nvml(nvml, error)
    except (error, OSError, ValueError, TypeError):
        return None
    finally:
        with contextlib.suppress(error, OSError):
            nvml.nvmlShutdown()


def _query_nvml(nvml: Any, error: Any) -> NvidiaSystem | None:
    cuda: Version | None = None
    # v2 is what wheelnext asks first; v1 exists in every binding.
    for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        query = getattr(nvml, name, None)
        if query is None:
            continue
        try:
            cuda = _cuda_from_int(int(query()))
            break
        except error:
            continue
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    gpus: list[Gpu] = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            # GPU_IS_LOST is raised here, for a GPU that fell off the bus
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
        except error:
            continue  # like wheelnext, one unreadable device does not hide the others
        gpus.append(Gpu(index, uuid, name, (int(major), int(minor))))
    if not gpus:
        return None
    return NvidiaSystem(cuda, driver, tuple(gpus))


# --------------------------------------------------------------------------- nvidia-smi


def _run_nvidia_smi(args: list[str]) -> str | None:
    """Stdout of ``args``, or ``None`` when the binary is missing, fails or hangs."""
    try:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _parse_version(text: str) -> Version | None:
    match = _VERSION_RE.fullmatch(text.strip())
    return (int(match[1]), int(match[2])) if match else None


def _parse_smi_gpu(line: str) -> tuple[Gpu, str] | None:
    fields = [field.strip() for field in line.split(",")]
    if len(fields) < 5:
        return None
    # A product name could contain a comma; the other four fields cannot.
    index, uuid, *name_parts, cap, driver = fields
    name = ", ".join(name_parts)
    cc = _parse_version(cap)
    if not is_number(index) or not _UUID_RE.fullmatch(uuid) or not name or cc is None:
        return None
    if not driver or not driver[0].isdigit():
        return None
    return Gpu(int(index), uuid, name, cc), driver


def read_nvidia_smi(run: Callable[[list[str]], str | None] | None = None) -> NvidiaSystem | None:
    """The driver and GPUs through ``nvidia-smi``; ``None`` if it is missing or says nonsense."""
    run = run or _run_nvidia_smi
    out = run(list(SMI_QUERY))
    if not out:
        return None
    gpus: list[Gpu] = []
    drivers: list[str] = []
    for line in out.splitlines():
        if not line.strip():
            continue
        parsed = _parse_smi_gpu(line)
        if parsed is None:
            return None  # e.g. "No devices were found" or an unsupported field
        gpus.append(parsed[0])
        drivers.append(parsed[1])
    if not gpus:
        return None
    details = run(list(SMI_DETAILS)) or ""
    match = _SMI_CUDA_RE.search(details)
    cuda = (int(match[1]), int(match[2])) if match else None
    return NvidiaSystem(cuda, drivers[0], tuple(gpus))


# --------------------------------------------------------------------------- detection


_OVERRIDE_MAX = 60  # characters of an override value (a version is a few)


def _override(env: Mapping[str, str], name: str) -> Version | None:
    """An override's (major, minor), read as the wheelnext provider reads it: any PEP 440
    version (``12`` is 12.0, ``12.8.1`` and ``12.8rc1`` are 12.8, ``v12.08`` is 12.8)."""
    from packaging.version import InvalidVersion
    from packaging.version import Version as Pep440

    raw = env.get(name, "")
    if not raw.strip():
        return None  # an empty override counts as unset, as in wheelnext
    release: tuple[int, ...] = ()
    if len(raw) <= _OVERRIDE_MAX:
        with contextlib.suppress(InvalidVersion):
            release = Pep440(raw.strip()).release
    if not release:
        shown = raw if len(raw) <= _OVERRIDE_MAX else raw[: _OVERRIDE_MAX - 3] + "..."
        raise InvalidInputError(
            f"{name}={shown!r} is not a version (MAJOR.MINOR, as the wheelnext provider reads "
            "it: any PEP 440 version)"
        )
    return release[0], release[1] if len(release) > 1 else 0


def detect(
    env: Mapping[str, str],
    nvml: Any = None,
    smi_run: Callable[[list[str]], str | None] | None = None,
) -> NvidiaReport:
    """Host aggregate and per-GPU lists; ``NvidiaReport({}, {})`` when there is no usable GPU."""
    forced_cuda = _override(env, CUDA_ENV)
    forced_cc = _override(env, SM_ARCH_ENV)
    system = read_nvml(nvml) or read_nvidia_smi(smi_run)
    gpus = system.gpus if system is not None else ()

    cuda = forced_cuda
    if cuda is None and system is not None and system.cuda is not None:
        low, high = _DETECTED_RANGE
        cuda = system.cuda if low <= system.cuda <= high else None
    if cuda is None:
        # wheelnext reports nothing at all, not even sm_arch, without a CUDA driver version.
        return NvidiaReport({}, {})

    def cc_of(gpu: Gpu) -> Version:
        return gpu.compute_capability if forced_cc is None else forced_cc

    top_cc = max((cc_of(gpu) for gpu in gpus), default=forced_cc)
    host = nvidia_features(cuda, top_cc)
    devices = {gpu.uuid: {"nvidia": nvidia_features(cuda, cc_of(gpu))} for gpu in gpus}
    return NvidiaReport(host, devices)


def detect_host(root: HostRoot, env: Mapping[str, str]) -> NvidiaReport:
    """The vendor's detector (``vendors.nvidia.VENDOR``): NVML reads no file under the host
    root."""
    return detect(env)
