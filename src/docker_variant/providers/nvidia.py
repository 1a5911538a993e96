"""The ``nvidia`` namespace (SPEC section 4): NVML first, ``nvidia-smi`` as the fallback.

The lists are exactly those of the wheelnext NVIDIA variant provider so that a variant image
is chosen the way pip/uv choose a variant wheel on the same host. Besides the host aggregate
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

__all__ = [
    "CUDA_ENV",
    "SM_ARCH_ENV",
    "Gpu",
    "NvidiaReport",
    "NvidiaSystem",
    "cuda_lower_bounds",
    "cuda_upper_bounds",
    "detect",
    "nvidia_features",
    "read_nvidia_smi",
    "read_nvml",
    "sm_arch_values",
]

CUDA_ENV = "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION"
SM_ARCH_ENV = "NV_VARIANT_PROVIDER_FORCE_SM_ARCH"

# The wheelnext provider's catalogue: CUDA majors 15..11 with minors 20..0.
_MAJORS = range(11, 16)
_MINORS = range(21)
_MAX_MAJOR, _MIN_MAJOR, _MAX_MINOR = max(_MAJORS), min(_MAJORS), max(_MINORS)
# A *detected* driver outside this range disables the namespace (wheelnext does the same);
# an override is taken as given.
_DETECTED_RANGE = ((_MIN_MAJOR, 0), (_MAX_MAJOR, _MAX_MINOR))
_MIN_SM = (5, 0)  # wheelnext omits sm_arch below Maxwell

SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,compute_cap,driver_version",
    "--format=csv,noheader",
]
SMI_DETAILS = ["nvidia-smi", "-q"]
_SMI_TIMEOUT_S = 10.0

_VERSION_RE = re.compile(r"([0-9]+)\.([0-9]+)")
_SMI_CUDA_RE = re.compile(
    r"^[ \t]*CUDA Version[ \t]*:[ \t]*([0-9]+)\.([0-9]+)[ \t\r]*$", re.MULTILINE
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


# --------------------------------------------------------------------------- lists


def _value(major: int, minor: int | None) -> str:
    return f"{major}" if minor is None else f"{major}.{minor}"


def cuda_lower_bounds(cuda: tuple[int, int]) -> list[str]:
    """Every ``v <= cuda``, newest first; a bare major follows its minors (``"12"`` is 12.0)."""
    major, minor = cuda
    values: list[str] = []
    # Same loop bounds as wheelnext, so forced versions outside 11..15 behave identically.
    for m in range(major, _MIN_MAJOR - 1, -1):
        top = minor if m == major else _MAX_MINOR
        values.extend(_value(m, n) for n in range(top, -1, -1))
        values.append(_value(m, None))
    return values


def cuda_upper_bounds(cuda: tuple[int, int]) -> list[str]:
    """Every ``v > cuda`` from ``"15.20"`` down; no bare ``major`` of ``cuda`` (it means major.0)."""
    major, minor = cuda
    values: list[str] = []
    for m in range(_MAX_MAJOR, major - 1, -1):
        if m > major:
            values.extend(_value(m, n) for n in range(_MAX_MINOR, -1, -1))
            values.append(_value(m, None))
        else:
            values.extend(_value(m, n) for n in range(_MAX_MINOR, minor, -1))
    return values


def sm_arch_values(cc: tuple[int, int]) -> list[str]:
    """``Mm_real`` down to ``M0_real``, then ``M0_virtual`` (the CMake arch flags that run here)."""
    major, minor = cc
    return [*(f"{major}{n}_real" for n in range(minor, -1, -1)), f"{major}0_virtual"]


def nvidia_features(
    cuda: tuple[int, int] | None, cc: tuple[int, int] | None
) -> dict[str, list[str]]:
    """The namespace's supported lists in wheelnext's feature order; unknown inputs are left out."""
    features: dict[str, list[str]] = {}
    if cuda is not None:
        # wheelnext drops a bound whose list comes out empty (forced versions beyond 11..15).
        if lower := cuda_lower_bounds(cuda):
            features["cuda_version_lower_bound"] = lower
        if upper := cuda_upper_bounds(cuda):
            features["cuda_version_upper_bound"] = upper
    if cc is not None and cc >= _MIN_SM:
        features["sm_arch"] = sm_arch_values(cc)
    return features


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
    if (
        not (index.isascii() and index.isdigit())
        or not _UUID_RE.fullmatch(uuid)
        or not name
        or cc is None
    ):
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


def _override(env: Mapping[str, str], name: str) -> Version | None:
    raw = env.get(name, "")
    if not raw.strip():
        return None  # an empty override counts as unset, as in wheelnext
    version = _parse_version(raw)
    if version is None:
        raise InvalidInputError(f"{name}={raw!r} is not a version of the form MAJOR.MINOR")
    return version


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
