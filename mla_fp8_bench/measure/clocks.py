"""GPU clock, temperature and power readings (optional ``pynvml`` or ``amdsmi``: without them every reading
is ``None``) and a device's clock policy, read only."""

from __future__ import annotations

import functools
import operator
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

#: NVML clock event reasons (nvml.h): bit 1 << i is the i-th name.
NVML_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake", "display_clock_setting")
#: Throttled, unlike the SW power cap, which is the normal state of a busy GPU.
THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80
#: Off-plateau: a sample's SM clock this far from its set's median (more than one 15 MHz Hopper step).
OFF_PLATEAU_REL = 0.015


def reason_names(mask: int | None) -> list[str]:
    """Names of the reason bits set in ``mask`` (unknown bits as hex)."""
    rest = (mask or 0) >> len(NVML_REASONS) << len(NVML_REASONS)
    return [n for i, n in enumerate(NVML_REASONS) if (mask or 0) >> i & 1] + ([hex(rest)] if rest else [])


@dataclass
class ClockReading:
    sm_mhz: float | None = None  # SM (NVIDIA) / GFX (AMD) clock, MHz
    mem_mhz: float | None = None  # memory clock, MHz
    temp_c: float | None = None  # die temperature, deg C
    power_w: float | None = None  # board power, W
    reasons: int | None = None  # NVML clock event reason mask (NVIDIA only)

    @property
    def throttled(self) -> bool:
        return bool(self.reasons and self.reasons & THROTTLE_MASK)


def _num(v: Any) -> float | None:
    try:
        return None if v is None or v == "N/A" else float(v)
    except (TypeError, ValueError):
        return None


@dataclass
class ClockReader:
    """One GPU's clocks (:func:`open_reader`); a failed query reads ``None`` and is kept in ``_errors``."""

    backend: str = "none"
    available: bool = False
    reason: str = ""
    _lib: Any = None
    _handle: Any = None
    _errors: dict = field(default_factory=dict)

    def _try(self, key: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - a query the driver refuses is recorded, not raised
            self._errors.setdefault(key, f"{type(exc).__name__}: {exc}"[:160])
            return None

    def read(self, full: bool = True) -> ClockReading:
        """SM clock and event reasons; with ``full`` also memory clock, temperature, power."""
        if not self.available:
            return ClockReading()
        lib, h, q = self._lib, self._handle, self._try
        if self.backend == "nvml":
            reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                getattr(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            r = ClockReading(q("sm", lib.nvmlDeviceGetClockInfo, h, lib.NVML_CLOCK_SM),
                             reasons=q("reasons", reasons, h) if reasons else None)
            if full:
                power = q("power", lib.nvmlDeviceGetPowerUsage, h)
                r.mem_mhz = q("mem", lib.nvmlDeviceGetClockInfo, h, lib.NVML_CLOCK_MEM)
                r.temp_c = q("temp", lib.nvmlDeviceGetTemperature, h, lib.NVML_TEMPERATURE_GPU)
                r.power_w = None if power is None else power / 1000.0
            return r
        gfx = q("sm", lib.amdsmi_get_clock_info, h, lib.AmdSmiClkType.GFX) or {}
        if not full:
            return ClockReading(_num(gfx.get("clk")))
        mem = q("mem", lib.amdsmi_get_clock_info, h, lib.AmdSmiClkType.MEM) or {}
        temp = q("temp", lib.amdsmi_get_temp_metric, h, lib.AmdSmiTemperatureType.HOTSPOT,
                 lib.AmdSmiTemperatureMetric.CURRENT)
        pw = q("power", lib.amdsmi_get_power_info, h) or {}
        return ClockReading(_num(gfx.get("clk")), _num(mem.get("clk")), _num(temp),
                            _num(pw.get("current_socket_power", pw.get("average_socket_power"))))

    def policy(self) -> dict[str, Any]:
        """``{"backend", "available", "locked", "evidence", "recommendation"}``. Locked: NVIDIA applications
        clock off its default or its reason bit set; AMD performance level DETERMINISM, MANUAL or STABLE_*."""
        out: dict[str, Any] = {"backend": self.backend, "available": self.available, "locked": None,
                               "evidence": {} if self.available else {"reason": self.reason}, "recommendation": ""}
        if not self.available:
            return out
        lib, h, q, ev = self._lib, self._handle, self._try, out["evidence"]
        if self.backend == "nvml":
            ev["app_sm_mhz"] = q("app", lib.nvmlDeviceGetApplicationsClock, h, lib.NVML_CLOCK_SM)
            ev["default_app_sm_mhz"] = q("dapp", lib.nvmlDeviceGetDefaultApplicationsClock, h, lib.NVML_CLOCK_SM)
            ev["max_sm_mhz"] = q("max", lib.nvmlDeviceGetMaxClockInfo, h, lib.NVML_CLOCK_SM)
            plim = _num(q("plim", lib.nvmlDeviceGetEnforcedPowerLimit, h))
            ev["power_limit_w"] = None if plim is None else plim / 1000.0
            reasons = self.read().reasons
            ev["reasons_now"] = reason_names(reasons)
            out["locked"] = bool(None not in (ev["app_sm_mhz"], ev["default_app_sm_mhz"]) and
                                 ev["app_sm_mhz"] != ev["default_app_sm_mhz"] or (reasons or 0) & 0x2)
            out["recommendation"] = ("clocks are locked: samples are clock-deterministic" if out["locked"] else
                                     "clocks float (boost and power cap); the suite measures at the sustained-load "
                                     "plateau and records the SM clock of every sample")
            return out
        level = q("perf_level", lib.amdsmi_get_gpu_perf_level, h)
        ev["perf_level"] = None if level is None else str(level)
        cap = q("power_cap", getattr(lib, "amdsmi_get_power_cap_info", lambda _h: None), h)
        for key in ("power_cap", "default_power_cap", "min_power_cap", "max_power_cap"):
            if isinstance(cap, dict) and _num(cap.get(key)) is not None:
                ev[key + "_w"] = _num(cap[key]) / 1e6
        asic = q("asic", getattr(lib, "amdsmi_get_gpu_asic_info", lambda _h: None), h)
        if isinstance(asic, dict):
            ev.update(target_graphics_version=asic.get("target_graphics_version"), market_name=asic.get("market_name"))
        out["locked"] = None if level is None else any(k in str(level).upper()
                                                       for k in ("DETERMINISM", "MANUAL", "STABLE"))
        out["recommendation"] = "" if out["locked"] else (
            "clocks float under the power cap (performance determinism is not supported on MI350/MI355): the suite "
            "records the level and the power cap, times in rounds of separate processes and gates SM cycles where "
            "the clock is off its plateau; it never changes clocks or power limits")
        return out


def open_reader(index: int = 0, vendor: str | None = None) -> ClockReader:
    """A reader of GPU ``index`` (``vendor`` cuda/rocm, None tries both), mapped through an integer
    ``CUDA_VISIBLE_DEVICES`` entry for NVML."""
    reasons = []
    if vendor in (None, "cuda"):
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        entry = vis[index].strip() if index < len(vis) else ""
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(int(entry) if entry.isascii() and entry.isdigit() else index)
            return ClockReader("nvml", True, "", pynvml, h)
        except Exception as exc:  # noqa: BLE001 - absent or failing library = unavailable
            reasons.append(f"nvml: {type(exc).__name__}: {str(exc)[:120]}")
    if vendor in (None, "rocm"):
        try:
            import amdsmi

            amdsmi.amdsmi_init()
            return ClockReader("amdsmi", True, "", amdsmi, amdsmi.amdsmi_get_processor_handles()[index])
        except Exception as exc:  # noqa: BLE001
            reasons.append(f"amdsmi: {type(exc).__name__}: {str(exc)[:120]}")
    return ClockReader("none", False, "; ".join(reasons) or f"no management library for vendor {vendor}")


def mark_samples(readings: list[ClockReading | None], rel: float = OFF_PLATEAU_REL) -> dict[str, Any]:
    """One reading (or None) per sample: ``{"sm_mhz", "temp_c", "power_w": [per sample], "<key>_median",
    "throttled", "off_plateau": [indices], "reasons"}``."""
    rs = [r or ClockReading() for r in readings]
    cols = {k: [getattr(r, k) for r in rs] for k in ("sm_mhz", "temp_c", "power_w")}
    medians = {f"{k}_median": statistics.median(v) if (v := [x for x in col if x is not None]) else None
               for k, col in cols.items()}
    med = medians["sm_mhz_median"] or 0
    return {**cols, **medians, "throttled": [i for i, r in enumerate(rs) if r.throttled],
            "off_plateau": [i for i, x in enumerate(cols["sm_mhz"]) if x is not None and abs(x - med) > rel * med > 0],
            "reasons": reason_names(functools.reduce(operator.or_, (r.reasons or 0 for r in rs), 0))}


def plateau_reached(history: list[float | None], window: int = 3, tol_mhz: float = 15.0) -> bool:
    """The last ``window`` SM clocks lie within ``tol_mhz``, or there are none (time rules then decide)."""
    vals = [x for x in history if x is not None]
    return not vals or (len(vals) >= window and max(vals[-window:]) - min(vals[-window:]) <= tol_mhz)
