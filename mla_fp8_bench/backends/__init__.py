"""Backend registry. Modules are imported lazily so optional packages (aiter, vllm, fa3) are only
touched when a backend is asked about."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from mla_fp8_bench.backends.base import Backend, BackendUnavailable, CaseUnsupported, Prepared, Verdict
from mla_fp8_bench.config import RunConfig

#: name -> a Backend subclass, ``"package.module:Class"`` (absolute) or ``"module:Class"`` (in this package).
_REGISTRY: dict[str, str | type[Backend]] = {
    "aiter-emulated": "aiter_emulated:AiterEmulated",
    "aiter": "aiter_real:AiterReal",
    "vllm-aiter": "vllm_aiter:VllmAiter",
    "fa3-fp8": "mla_fp8_bench.peers.fa3:Fa3Fp8",
    "fa3-bf16": "mla_fp8_bench.peers.fa3:Fa3Bf16",
    "torch-sdpa-bf16": "torch_ref:TorchSdpaBf16",
    "torch-fp8-ref": "torch_ref:TorchFp8Ref",
    "cudnn-fp8": "mla_fp8_bench.peers.cudnn:CudnnFp8",
    "cudnn-bf16": "mla_fp8_bench.peers.cudnn:CudnnBf16",
}

#: What ``run`` uses when no backend is named: the AITER path, emulated where no gfx950 exists.
DEFAULT_BACKENDS = ("aiter", "vllm-aiter", "aiter-emulated", "fa3-fp8", "fa3-bf16", "torch-sdpa-bf16", "torch-fp8-ref")


#: Traits the asv grid reads without importing every backend (tests/test_extending.py holds them to the classes):
#: the backends with ``plan_stats`` (the AiterPlan tracks) and the emulations (latency apart, never gated).
PLAN_BACKENDS = ("aiter", "vllm-aiter", "aiter-emulated")
EMULATION_BACKENDS = ("aiter-emulated",)


class UnknownBackendError(ValueError):
    """A backend name is not registered; the message lists the known ones."""


def backend_names() -> list[str]:
    return list(_REGISTRY)


def get_backend(name: str, config: RunConfig | None = None) -> Backend:
    """Instantiate a backend by name, with the run's ``config`` (default: :class:`RunConfig` defaults);
    :class:`UnknownBackendError` names the bad value and the known names."""
    if name not in _REGISTRY:
        raise UnknownBackendError(f"backend {name!r} is unknown: allowed {', '.join(_REGISTRY)}")
    target = _REGISTRY[name]
    if not isinstance(target, type):
        mod_name, cls_name = target.split(":")
        module = importlib.import_module(mod_name if "." in mod_name else f"{__name__}.{mod_name}")
        target = getattr(module, cls_name)
    backend = target()
    if config is not None:
        backend.config = config
    return backend


def backend_flag(name: str, flag: str) -> bool | None:
    """The registered backend's ``emulation`` or ``fp8`` attribute; None for a name that is not registered
    or a backend that cannot be built."""
    try:
        return bool(getattr(get_backend(name), flag))
    except Exception:  # noqa: BLE001 - a backend that cannot even be constructed has no such trait
        return None


def record_is_fp8(rec: Mapping[str, Any]) -> bool | None:
    """A run record's ``fp8`` field; for records stored before the field existed, its backend's
    (:func:`backend_flag`, None for a backend not registered)."""
    if rec.get("fp8") is not None:
        return bool(rec["fp8"])
    return backend_flag(str(rec.get("backend", "")), "fp8")


__all__ = [
    "Backend", "BackendUnavailable", "CaseUnsupported", "Prepared", "Verdict", "UnknownBackendError",
    "DEFAULT_BACKENDS", "EMULATION_BACKENDS", "PLAN_BACKENDS", "backend_flag", "backend_names", "get_backend",
    "record_is_fp8",
]
