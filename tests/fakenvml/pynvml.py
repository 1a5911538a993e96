"""A stand-in ``pynvml`` (nvidia-ml-py) answering from a machine fixture, for agent tests.

Put this directory first on ``PYTHONPATH`` (subprocesses) or load it by path, and point
``FAKE_NVML_MACHINE`` at a JSON file shaped as tests/fixtures/nvidia/*.json: what each NVML
call returns, per device. An answer ``{"nvmlError": "NVML_ERROR_GPU_IS_LOST"}`` (for one call,
or as a device's ``"nvmlError"`` for all its calls) raises that error. The file is read again
at every ``nvmlInit``, so a test turns a device unhealthy by rewriting it.

The error classes and constants are the real module's (loaded under another name), so
``NVMLError(NVML_ERROR_GPU_IS_LOST)`` is an ``NVMLError_GpuIsLost`` whose ``str`` is "GPU is
lost", exactly as nvidia-ml-py raises it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent


def _real_module() -> Any:
    loaded = sys.modules.get("pynvml")  # in-process tests: the one already imported
    if loaded is not None and Path(loaded.__file__ or "").resolve().parent != _HERE:
        return loaded
    for entry in sys.path:
        candidate = Path(entry or ".").resolve() / "pynvml.py"
        if candidate.is_file() and candidate.parent != _HERE:
            spec = importlib.util.spec_from_file_location("_real_pynvml", candidate)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules["_real_pynvml"] = module  # it looks itself up there
            spec.loader.exec_module(module)
            return module
    raise ImportError("the real pynvml (nvidia-ml-py) is needed for its errors and constants")


_real = _real_module()
for _name in dir(_real):
    if _name.startswith(("NVML_", "NVMLError")):
        globals()[_name] = getattr(_real, _name)
NVMLError = _real.NVMLError

_machine: dict[str, Any] | None = None


def _raise(answer: Any) -> Any:
    if isinstance(answer, dict) and "nvmlError" in answer:
        raise NVMLError(getattr(_real, answer["nvmlError"]))
    return answer


def _check_device(device: dict[str, Any]) -> None:
    """A device-wide fault (``"nvmlError": "NVML_ERROR_GPU_IS_LOST"``) fails every call."""
    if "nvmlError" in device:
        raise NVMLError(getattr(_real, device["nvmlError"]))


def _state() -> dict[str, Any]:
    if _machine is None:
        raise NVMLError(_real.NVML_ERROR_UNINITIALIZED)
    return _machine


def _device(handle: Any, call: str) -> Any:
    device = _state()["devices"][handle[1]]
    _check_device(device)
    return _raise(device[call])


def nvmlInit() -> None:
    global _machine
    path = os.environ.get("FAKE_NVML_MACHINE")
    if not path:
        raise NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
    _machine = json.loads(Path(path).read_text())


def nvmlShutdown() -> None:
    global _machine
    _state()
    _machine = None


def nvmlSystemGetDriverVersion() -> str:
    return str(_raise(_state()["nvmlSystemGetDriverVersion"]))


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_raise(_state()["nvmlSystemGetCudaDriverVersion"]))


def nvmlDeviceGetCount() -> int:
    return int(_raise(_state()["nvmlDeviceGetCount"]))


def nvmlDeviceGetHandleByIndex(index: int) -> tuple[str, int]:
    devices = _state()["devices"]
    if not 0 <= index < len(devices):
        raise NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
    _check_device(devices[index])
    return ("handle", index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> tuple[str, int]:
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index, device in enumerate(_state()["devices"]):
        if device.get("nvmlDeviceGetUUID") == text:
            _check_device(device)
            return ("handle", index)
    raise NVMLError(_real.NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetName(handle: Any) -> str:
    return str(_device(handle, "nvmlDeviceGetName"))


def nvmlDeviceGetUUID(handle: Any) -> str:
    return str(_device(handle, "nvmlDeviceGetUUID"))


def nvmlDeviceGetCudaComputeCapability(handle: Any) -> tuple[int, int]:
    major, minor = _device(handle, "nvmlDeviceGetCudaComputeCapability")
    return int(major), int(minor)


def nvmlDeviceGetTotalEccErrors(handle: Any, errorType: int, counterType: int) -> int:
    # the fixture holds the uncorrected volatile counter, which is what the agent asks for
    assert errorType == _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, errorType
    assert counterType == _real.NVML_VOLATILE_ECC, counterType
    return int(_device(handle, "nvmlDeviceGetTotalEccErrors"))


def nvmlDeviceGetRetiredPagesPendingStatus(handle: Any) -> int:
    return int(_device(handle, "nvmlDeviceGetRetiredPagesPendingStatus"))
