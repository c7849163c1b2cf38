"""Device facts: vendor (cuda / rocm / cpu; ROCm GPUs are ``cuda`` devices), arch, fp8 dtype. Devices are
always indexed (``cuda:0``, never ``cuda``)."""

from __future__ import annotations

import datetime as _dt
import platform as _pyplatform
from dataclasses import dataclass
from typing import Any

import torch

from mla_fp8_bench import __version__
from mla_fp8_bench.aiter_ps.facts import dist_version

ALLOWED_DEVICES = "auto, cpu, cuda or cuda:N"


class DeviceError(ValueError):
    """A device string is invalid or names a device that is not present."""


@dataclass(frozen=True)
class PlatformInfo:
    vendor: str  # "cuda" (NVIDIA), "rocm" (AMD) or "cpu"
    device: torch.device
    arch: str  # "sm_90", "gfx950", ... or "cpu"
    name: str  # the device's marketing name (``NVIDIA H200``) or the CPU's
    fp8_dtype: torch.dtype  # ``torch.float8_e4m3fn``; ``float8_e4m3fnuz`` on gfx942
    torch_version: str
    cuda_version: str | None
    hip_version: str | None
    multi_processor_count: int  # SMs / CUs (0 on CPU)

    @property
    def device_type(self) -> str:  # "cpu" or "cuda" (ROCm included)
        return self.device.type

    def no_gpu(self) -> str:
        return f"no GPU visible to torch {self.torch_version}"

    def describe(self) -> str:
        """The device in words: ``cpu``, ``an AMD GPU (name, gfx950)``, ``NVIDIA H200 (sm_90)``."""
        return {"cpu": "cpu", "rocm": f"an AMD GPU ({self.name}, {self.arch})"}.get(self.vendor,
                                                                                   f"{self.name} ({self.arch})")


def vendor_of_build() -> str:
    return "rocm" if getattr(torch.version, "hip", None) else "cuda" if getattr(torch.version, "cuda", None) else "cpu"


def normalize_device(device: str | torch.device | None = "auto") -> torch.device:
    """``auto``/``cpu``/``cuda``/``cuda:N`` as an indexed torch device; DeviceError otherwise or when absent."""
    if device is None or device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device, str) and device.startswith("hip"):
        raise DeviceError(f"device {device!r} is not a torch tensor device: on ROCm builds AMD GPUs are 'cuda' devices")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"device {device!r} is invalid: allowed {ALLOWED_DEVICES} ({exc})") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise DeviceError(f"device {device!r} is not supported: allowed {ALLOWED_DEVICES}")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {device!r} was asked for but no CUDA/ROCm GPU is available "
                          f"(torch {torch.__version__})")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise DeviceError(f"device {device!r}: index {index} out of range, {torch.cuda.device_count()} GPU(s) visible")
    return torch.device("cuda", index)


def gpu_arch(device: torch.device) -> str:
    """``gfx950`` on ROCm (``gcnArchName`` without feature flags), ``sm_XY`` on NVIDIA."""
    props = torch.cuda.get_device_properties(device)
    gcn = getattr(props, "gcnArchName", None)
    return gcn.split(":")[0] if vendor_of_build() == "rocm" and gcn else f"sm_{props.major}{props.minor}"


def fp8_dtype_for(vendor: str, arch: str) -> torch.dtype:
    """``float8_e4m3fnuz`` on gfx94x (max 240), else ``float8_e4m3fn`` (max 448)."""
    return torch.float8_e4m3fnuz if vendor == "rocm" and arch.startswith("gfx94") else torch.float8_e4m3fn


def platform_info(device: str | torch.device | None = "auto") -> PlatformInfo:
    dev = normalize_device(device)
    if dev.type == "cpu":
        return PlatformInfo("cpu", dev, "cpu", _pyplatform.processor() or _pyplatform.machine(), torch.float8_e4m3fn,
                            str(torch.__version__), None, None, 0)
    vendor, arch, props = vendor_of_build(), gpu_arch(dev), torch.cuda.get_device_properties(dev)
    return PlatformInfo(vendor, dev, arch, props.name, fp8_dtype_for(vendor, arch), str(torch.__version__),
                        getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None),
                        props.multi_processor_count)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def environment(pinfo: PlatformInfo) -> dict[str, Any]:
    """Versions and device facts stored with every run (distribution versions: importing aiter runs rocminfo)."""
    dists = {"asv": "asv", "asv_runner": "asv_runner", "numpy": "numpy", "aiter": "amd-aiter", "vllm": "vllm",
             "fa3_fwd_interface": "fa3-fwd"}
    return {"mla_fp8_bench": __version__, "torch": str(torch.__version__), "python": _pyplatform.python_version(),
            "vendor": pinfo.vendor, "device": str(pinfo.device), "arch": pinfo.arch, "device_name": pinfo.name,
            "fp8_dtype": str(pinfo.fp8_dtype).replace("torch.", ""), "cuda": pinfo.cuda_version,
            "hip": pinfo.hip_version, "multi_processor_count": pinfo.multi_processor_count,
            "hostname": _pyplatform.node(),
            "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **{mod: dist_version(dist) for mod, dist in dists.items()}}
