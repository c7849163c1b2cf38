"""The metric table: every figure the suite records, defined once (:data:`METRICS`). The asv ``track_*``
methods, the run-record keys, the gate's and calibrate's metric lists and the asv configs' regression keys are
derived from it; the kinds and gate rules are described in docs/regressions.md."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("accuracy", "kernel_latency", "host_latency", "resource", "informational")
GATES = ("tolerance", "grow", "latency", "exact", "zero", "none")
ASV_CLASSES = ("MLAPrefill", "AiterPlan")
ASV_MODULE = "bench_mla_prefill"  # benchmark names are ``<module>.<class>.<track>``
#: Floor of accuracy values asv tracks: asv's summary is a geometric mean over params, which one exact 0 would
#: make 0; a plotted 1e-12 means exactly 0.
ASV_ACCURACY_FLOOR = 1e-12
#: The gate's default growth factors over BASE: kernel latency (with significance) and resources 5 %;
#: accuracy 2x, the calibration margin.
DEFAULT_FACTOR, DEFAULT_ACC_FACTOR = 1.05, 2.0
#: Kinds the gate judges by default (host latency only with ``--gate-call-latency``; informational never).
GATED_KINDS = ("accuracy", "kernel_latency", "resource")


@dataclass(frozen=True)
class Metric:
    """One recorded figure; a value outside ``bounds`` is impossible (the gate's INVALID)."""

    name: str  # short id (``latency``, ``max_abs_error``); unique
    record_key: str  # key in run records; unique
    track: str | None  # asv method name (``track_latency``), None when asv does not track it
    asv_class: str | None  # asv class of the track (one of :data:`ASV_CLASSES`) or None
    unit: str  # shown by asv (``seconds``, ``bytes``)
    pretty_name: str  # human label (asv's ``pretty_name``)
    kind: str  # one of :data:`KINDS`
    floor: float | None = None  # asv tracks ``max(value, floor)``; the gate applies it to both sides
    better: str = "lower"  # or "higher"
    calibrated: bool = False  # calibrate measures it and the tolerance file holds a limit for it
    gate: str = "none"  # one of :data:`GATES`
    samples_key: str | None = None  # record key of the raw samples (asv gets ``{"samples": ...}``)
    rounds_key: str | None = None  # record key of the per-round values (asv's samples when >= 2)
    tolerance_floor: float | None = None  # smallest calibrated tolerance (calibrated metrics only)
    derive: Callable[[dict[str, Any]], float | None] | None = None  # the value when ``record_key`` is absent
    doc: str = ""  # one-line description (the asv method's docstring)
    bounds: tuple[float, float] = (0.0, math.inf)  # the range of possible values, closed but for low_open
    low_open: bool = False  # the lower bound itself is impossible (a time of exactly 0: a timer that read nothing)

    def __post_init__(self) -> None:
        for what, allowed in (("kind", KINDS), ("gate", GATES), ("better", ("lower", "higher")),
                              ("asv_class", (None, *ASV_CLASSES))):
            if getattr(self, what) not in allowed:
                raise ValueError(f"metric {self.name}: {what} {getattr(self, what)!r} is unknown: allowed {allowed}")
        if (self.track is None) != (self.asv_class is None) or not self.bounds[0] <= self.bounds[1] \
                or (self.calibrated and self.tolerance_floor is None):
            raise ValueError(f"metric {self.name}: track and asv_class go together, bounds must not be empty "
                             "and a calibrated metric needs a tolerance_floor")

    @property
    def asv_name(self) -> str | None:  # bench_mla_prefill.MLAPrefill.track_latency
        return f"{ASV_MODULE}.{self.asv_class}.{self.track}" if self.track else None

    def asv_version(self, class_version: str) -> str:
        """``class_version + "+rounds"`` for a track with per-round samples (only it starts a new series)."""
        return class_version + "+rounds" if self.rounds_key else class_version

    def value(self, record: dict[str, Any]) -> float | None:  # record[record_key], else derive(record)
        v = record.get(self.record_key)
        return self.derive(record) if v is None and self.derive is not None else v

    @property
    def regression_factor(self) -> float | None:
        """The default growth over BASE that regresses (asv's ``regressions_thresholds`` + 1); None where
        growth is not judged by default."""
        if self.gate == "none" or self.kind not in GATED_KINDS:
            return None
        return 1.0 if self.gate in ("exact", "zero") else DEFAULT_ACC_FACTOR if self.kind == "accuracy" \
            else DEFAULT_FACTOR

    def possible(self, v: float) -> bool:  # within bounds (NaN: False)
        lo, hi = self.bounds
        return not math.isnan(v) and (lo < v if self.low_open else lo <= v) and v <= hi

    @property
    def bounds_text(self) -> str:  # (0, inf] or [0, 1]
        return f"{'(' if self.low_open else '['}{self.bounds[0]:g}, {self.bounds[1]:g}]"

    def floored(self, v: float) -> float:  # max(v, floor), NaN stays NaN: what asv stores
        return v if self.floor is None or math.isnan(v) else max(v, self.floor)


def record_is_emulation(rec: dict[str, Any]) -> bool:
    return bool(rec.get("emulation")) or rec.get("timing_scope") == "emulation"


def _seconds_per_pflop(rec: dict[str, Any]) -> float | None:  # None for an emulation's latency
    lat, flops = rec.get("latency_s"), rec.get("flops")
    if record_is_emulation(rec) or lat is None or not flops or float(flops) < 1:
        return None
    return float(lat) / (float(flops) / 1e15)


def _accuracy(name: str, key: str, track: str | None, unit: str, pretty: str, *, calibrated: bool = False,
              tolerance_floor: float | None = None, doc: str = "", bounds: tuple[float, float] = (0.0, math.inf),
              ) -> Metric:
    return Metric(name, key, track, "MLAPrefill" if track else None, unit, pretty, "accuracy",
                  floor=ASV_ACCURACY_FLOOR if track else None, calibrated=calibrated,
                  gate="tolerance" if calibrated else "grow", tolerance_floor=tolerance_floor, doc=doc, bounds=bounds)


#: Every metric of the suite. Order: asv tracks first (in their classes), then record-only figures.
METRICS: tuple[Metric, ...] = (
    Metric("latency", "latency_s", "track_latency", "MLAPrefill", "seconds", "MLA prefill latency",
           "kernel_latency", gate="latency", samples_key="latency_samples_s", rounds_key="latency_rounds_s",
           low_open=True, doc="Kernel-only device time (CUDA/HIP graph replay) on GPUs; host time on CPU; seconds."),
    Metric("call_latency", "call_latency_s", "track_call_latency", "MLAPrefill", "seconds",
           "MLA prefill call latency (host-inclusive)", "host_latency", gate="latency",
           samples_key="call_latency_samples_s",
           low_open=True, doc="Host-inclusive latency of one call (run + synchronize), seconds (GPU only)."),
    Metric("emulation_latency", "emulation_latency_s", "track_emulation_latency", "MLAPrefill", "seconds",
           "emulated MLA prefill latency (host time of the emulation, not a kernel's)", "informational",
           samples_key="emulation_latency_samples_s", low_open=True,
           doc="Host time of an emulation of the kernel (PyTorch code), seconds: informational, never a kernel's. "
               "Its own track, so asv never draws it on the axis of kernel latencies (track_latency is n/a "
               "for emulation records)."),
    _accuracy("max_abs_error", "max_abs_error_fp8_ref", "track_max_abs_error", "max-abs error",
              "max-abs error vs fp8-dequant reference", calibrated=True, tolerance_floor=1e-3,
              doc="max |out - ref| against float64/float32 attention on the dequantised fp8 inputs."),
    _accuracy("max_abs_error_bf16_ref", "max_abs_error_bf16_ref", "track_max_abs_error_bf16_ref", "max-abs error",
              "max-abs error vs bf16 reference", calibrated=True, tolerance_floor=1e-3,
              doc="max |out - ref| against attention on the original bf16 inputs (end-to-end FP8 error)."),
    _accuracy("rel_l2_error", "rel_l2_error_fp8_ref", "track_rel_l2_error", "rel-L2 error",
              "rel-L2 error vs fp8-dequant reference", calibrated=True, tolerance_floor=1e-4,
              doc="||out - ref||_2 / ||ref||_2 against the dequantised-fp8 reference."),
    _accuracy("mismatch_fraction", "mismatch_fraction", "track_mismatch_fraction", "fraction of elements",
              "mismatch fraction (AITER checkAllclose 5e-2)", calibrated=True, tolerance_floor=1e-4,
              doc="AITER checkAllclose fraction failing atol=rtol=5e-2 against the bf16 reference.",
              bounds=(0.0, 1.0)),
    _accuracy("nondeterminism", "nondeterminism_max_abs", "track_nondeterminism", "max-abs difference",
              "run-to-run max difference",
              doc="Largest |difference| between two runs on the same inputs (0 for deterministic kernels)."),
    Metric("seconds_per_pflop", "seconds_per_pflop", "track_seconds_per_pflop", "MLAPrefill", "s/PFLOP",
           "seconds per PFLOP (informational)", "informational", derive=_seconds_per_pflop,
           doc="Informational throughput as seconds per PFLOP (asv treats larger as worse; TFLOP/s would invert)."),
    Metric("planner_time", "planner_s", "track_planner_time", "AiterPlan", "seconds", "AITER PS planner time",
           "host_latency", gate="latency", samples_key="planner_samples_s", low_open=True,
           doc="get_ps_metadata_v1 host planning time (the real planner on gfx950, the port elsewhere), seconds."),
    Metric("workspace_bytes", "workspace_bytes", "track_workspace_bytes", "AiterPlan", "bytes",
           "partial + LSE workspace", "resource", gate="grow",
           doc="Scratch bytes for partial outputs + partial LSE + final LSE (catches sizing regressions)."),
    Metric("num_partials", "num_partials", "track_num_partials", "AiterPlan", "partial slots", "live partial slots",
           "resource", floor=ASV_ACCURACY_FLOOR, gate="grow",
           doc="Live partial slots (reduce_indptr[-1]) the plan uses."),
    Metric("reserved_workspace_bytes", "reserved_workspace_bytes", "track_reserved_workspace_bytes", "AiterPlan",
           "bytes", "workspace reserved from the info bounds", "resource", gate="grow",
           doc="Scratch bytes a caller reserving from get_ps_metadata_info_v1's bounds holds for this shape "
               "(vLLM reserves so); grows with AITER #3606's looser bounds (the class of vLLM #57923)."),
    # record-only figures (no asv track)
    _accuracy("mean_abs_error", "mean_abs_error_fp8_ref", None, "mean-abs error",
              "mean-abs error vs fp8-dequant reference", calibrated=True, tolerance_floor=1e-5),
    _accuracy("rel_l2_error_bf16_ref", "rel_l2_error_bf16_ref", None, "rel-L2 error", "rel-L2 error vs bf16 reference",
              calibrated=True, tolerance_floor=1e-4),
    _accuracy("mean_abs_error_bf16_ref", "mean_abs_error_bf16_ref", None, "mean-abs error",
              "mean-abs error vs bf16 reference", calibrated=True, tolerance_floor=1e-5),
    _accuracy("lse_rel_error", "lse_rel_error_fp8_ref", None, "relative error",
              "LSE relative error vs fp8-dequant reference", calibrated=True, tolerance_floor=1e-5,
              doc="max |lse - ref| / max(|ref|, 1) of the natural-log LSE: rows the backend wrote for prefill "
                  "cases, every row for ctx/prefix cases (vLLM merges context chunks by LSE on every row)."),
    Metric("lse_nonfinite_count", "lse_nonfinite_count", None, None, "elements", "non-finite LSE elements",
           "accuracy", gate="zero",
           doc="LSE elements compared that are NaN/+-inf where the reference is finite (unwritten final_lse)."),
    Metric("nonfinite_count", "nonfinite_count_fp8_ref", None, None, "elements", "non-finite output elements",
           "accuracy", gate="zero"),
    Metric("tflops", "tflops", None, None, "TFLOP/s", "throughput (causal FLOPs / latency)", "informational",
           better="higher"),
    Metric("gb_s", "gb_s", None, None, "GB/s", "minimum bytes / latency", "informational", better="higher"),
    # clock state of the latency samples (measure/clocks.py; NVML / amdsmi, absent = not recorded)
    Metric("sm_clock", "sm_clock_mhz", "track_sm_clock", "MLAPrefill", "MHz", "SM clock during latency samples",
           "informational", better="higher",
           doc="Median SM (GFX) clock read while the latency samples ran, MHz (informational; never gates)."),
    Metric("sm_cycles", "latency_sm_cycles", "track_sm_cycles", "MLAPrefill", "cycles",
           "SM cycles per launch (latency x SM clock)", "informational", samples_key="latency_sm_cycles_samples",
           rounds_key="latency_sm_cycles_rounds",
           doc="Median over samples of latency x the SM clock read during the sample (clock-normalised latency); "
               "the gate gates it instead of time where the SM clock is off its plateau."),
    Metric("gpu_temp", "gpu_temp_c", None, None, "degC", "GPU temperature during latency samples", "informational"),
    Metric("gpu_power", "gpu_power_w", None, None, "W", "board power during latency samples", "informational"),
)


@functools.cache
def _indexes(metrics: tuple[Metric, ...]) -> tuple[dict[str, Metric], ...]:  # by name, record key, track
    out = []
    for attr in ("name", "record_key", "track"):
        keys = [getattr(m, attr) for m in metrics if getattr(m, attr) is not None]
        if len(set(keys)) != len(keys):
            raise ValueError(f"metric table: {attr} {next(k for k in keys if keys.count(k) > 1)!r} appears twice")
        out.append({getattr(m, attr): m for m in metrics if getattr(m, attr) is not None})
    return tuple(out)


class UnknownMetricError(KeyError):
    """A metric name, record key or asv track is not in the table."""


def metric(key: str) -> Metric:
    """The metric with this name, record key, asv track or full asv benchmark name."""
    by_name, by_record_key, by_track = _indexes(METRICS)
    for index in (by_name, by_record_key, by_track):
        if key in index:
            return index[key]
    tail = key.rsplit(".", 1)[-1]
    if tail in by_track and by_track[tail].asv_name == key:
        return by_track[tail]
    raise UnknownMetricError(f"metric {key!r} is unknown: allowed {', '.join(by_name)}")


def find(key: str) -> Metric | None:
    try:
        return metric(key)
    except UnknownMetricError:
        return None


def label(key: str) -> str:  # pretty_name; the key itself for unknown keys
    return m.pretty_name if (m := find(key)) else key


def asv_metrics(asv_class: str | None = None) -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.track and (asv_class is None or m.asv_class == asv_class))


def calibrated_metrics() -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.calibrated)


def zero_metrics() -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.gate == "zero")


def record_keys() -> tuple[str, ...]:
    """Metric keys every run record holds (None when not measured): ``MLAPrefill``'s and the informational
    figures, with their samples keys."""
    return tuple(k for m in METRICS if m.derive is None and (m.asv_class == "MLAPrefill" or m.kind == "informational")
                 for k in (m.record_key, m.samples_key) if k)
