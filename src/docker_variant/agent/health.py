"""NVML's verdicts on the NVIDIA GPUs of this node: which stopped answering, count
uncorrectable ECC errors since the driver loaded, or have retired pages pending."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["NVML_KIND", "nvml_health"]

NVML_KIND = "nvidia"  # the providers' device kind (a namespace) that NVML can judge


def _load_nvml(nvml: Any) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except (ImportError, OSError):
        return None
    return pynvml


def nvml_health(
    uuids: Iterable[str], nvml: Any = None, *, known: Iterable[str] = ()
) -> dict[str, str]:
    """Why each unhealthy GPU of ``uuids`` is so (healthy ones are absent); ``{}`` where NVML
    cannot be used at all (no driver), since nothing can be judged then.

    ``known``: GPUs NVML found earlier in this run; one of them that NVML no longer finds
    stopped answering. Any other id NVML does not know (e.g. from a providers file) is left
    alone."""
    nvml = _load_nvml(nvml)
    if nvml is None:
        return {}
    error: Any = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except (error, OSError):  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded
        return {}
    try:
        known_ids = set(known)
        verdicts = {}
        for uuid in uuids:
            why = _judge_gpu(nvml, error, uuid, uuid in known_ids)
            if why is not None:
                verdicts[uuid] = why
        return verdicts
    finally:
        with contextlib.suppress(error, OSError):
            nvml.nvmlShutdown()


def _codes(nvml: Any, *names: str) -> set[int]:
    return {getattr(nvml, name) for name in names if hasattr(nvml, name)}


def _judge_gpu(nvml: Any, error: Any, uuid: str, known: bool) -> str | None:
    # "Not supported" (consumer GPUs have no ECC), "no permission" and a driver without the
    # call say nothing about the GPU's health.
    unjudged = _codes(
        nvml,
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_NO_PERMISSION",
        "NVML_ERROR_FUNCTION_NOT_FOUND",
    )
    not_found = _codes(nvml, "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    except error as exc:
        if getattr(exc, "value", None) in not_found and not known:
            return None  # not a GPU this NVML has (an id from a providers file)
        return f"stopped answering (NVML: {exc})"
    checks: list[tuple[str, Callable[[], Any]]] = [
        (
            "ecc",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        ),
        ("pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
    ]
    for name, check in checks:
        try:
            answer = int(check())
        except error as exc:
            if getattr(exc, "value", None) in unjudged:
                continue
            return f"stopped answering (NVML: {exc})"
        if name == "ecc" and answer > 0:
            return f"{answer} uncorrectable ECC error{'s' if answer != 1 else ''} since the driver loaded"
        if name == "pending" and answer == nvml.NVML_FEATURE_ENABLED:
            return "retired pages pending (the GPU needs a reset)"
    return None
