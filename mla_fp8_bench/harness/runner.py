"""Evaluate a grid of (backend, case) in one process: latency, errors against both references, FLOPs.
One failing pair never loses the others: unavailable, unsupported and out-of-memory are ``skipped`` records
with the reason, exceptions ``error`` records. A grid expected to outlast :data:`MAX_WAIT_S` is refused."""

from __future__ import annotations

import functools
import gc
import math
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from mla_fp8_bench.backends import (
    Backend,
    BackendUnavailable,
    CaseUnsupported,
    UnknownBackendError,
    Verdict,
    get_backend,
)
from mla_fp8_bench.config import MAX_SAMPLES, RunConfig
from mla_fp8_bench.measure import metric_table
from mla_fp8_bench.measure.devices import PlatformInfo, environment, platform_info, synchronize
from mla_fp8_bench.measure.metrics import error_metrics, lse_metrics
from mla_fp8_bench.measure.reference import reference_bf16, reference_fp8_dequant
from mla_fp8_bench.measure.timing import clock_fields, measure_latency, time_call
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.flops import case_flops, case_min_bytes, tflops
from mla_fp8_bench.problem.inputs import CaseInputs, make_inputs

#: Record keys that every JSON record carries (the contract with users).
RECORD_KEYS = ("backend", "case", "status", "reason", "latency_method", "timing_scope") + metric_table.record_keys()
#: Longest expected run (seconds) :func:`evaluate` starts unless ``RunOptions.max_wait_s`` says otherwise.
MAX_WAIT_S = 3600.0
#: Per device type: fast FLOP rate (FLOP/s), shortest call and time per sequence of a call (s; an emulation's
#: 100x on a CPU): the expected duration is a lower bound, so only a run surely past the limit is refused.
_RATE = {"cpu": 1e11, "cuda": 1e14}
_CALL_S = {"cpu": 1e-4, "cuda": 1e-3}
_SEQ_S = {"cpu": 2e-5, "cuda": 2e-5}


@dataclass
class RunOptions:
    """How to measure."""

    timing: bool = True  # measure latency (False: accuracy only)
    samples: int = 30  # latency samples per (backend, case)
    time_budget_s: float = 20.0  # wall-clock budget of one (backend, case)'s latency samples
    flush_l2: bool = False  # flush L2 before each sample (GPU)
    determinism: bool = True  # run twice, record the largest difference (``nondeterminism_max_abs``)
    max_wait_s: float | None = MAX_WAIT_S  # refuse a grid expected to take longer (None: no limit)

    def __post_init__(self) -> None:
        if type(self.samples) is not int or not 1 <= self.samples <= MAX_SAMPLES:
            raise ValueError(f"samples={self.samples!r} is invalid: an integer >= 1 and <= {MAX_SAMPLES} (latency "
                             "samples per case)")
        tb = self.time_budget_s
        if isinstance(tb, bool) or not isinstance(tb, (int, float)) or not math.isfinite(tb) or tb <= 0:
            raise ValueError(f"time_budget_s={tb!r} is invalid: a finite number of seconds > 0")


@dataclass
class Record:
    """The result of one (backend, case); serialised with :meth:`as_dict`."""

    backend: str
    case: str
    status: str  # "ok" | "skipped" | "error"
    reason: str = ""
    values: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**dict.fromkeys(RECORD_KEYS), "backend": self.backend, "case": self.case, "status": self.status,
                "reason": self.reason, **self.values}


class RunInterrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` during :func:`evaluate`; ``data``: the records completed, marked interrupted."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(f"interrupted after {len(data['records'])} records")
        self.data = data


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


class CaseData:
    """Inputs and lazily computed references of one case, shared by all backends."""

    def __init__(self, case: Case, pinfo: PlatformInfo, ref_dtype: torch.dtype | None):
        self.case = case
        self.inputs: CaseInputs = make_inputs(case, pinfo.device, pinfo.fp8_dtype)
        self._ref_dtype = ref_dtype

    @functools.cached_property
    def fp8_ref(self) -> tuple[torch.Tensor, torch.Tensor]:
        return reference_fp8_dequant(self.inputs, self._ref_dtype)

    @functools.cached_property
    def bf16_ref(self) -> tuple[torch.Tensor, torch.Tensor]:
        return reference_bf16(self.inputs, self._ref_dtype)


def _measure_timing(v: dict[str, Any], prepared, pinfo: PlatformInfo, opts: RunOptions) -> None:
    """Latency (on GPUs also host call latency) of ``prepared.run`` into the record values ``v``."""
    gpu = pinfo.device.type == "cuda"
    tr = measure_latency(prepared.run, pinfo.device, graph_capturable=prepared.graph_capturable,
                         samples=opts.samples, time_budget_s=opts.time_budget_s,
                         **({"flush_l2": opts.flush_l2} if gpu else {"warmup": False}))
    v.update(latency_s=tr.median_s, latency_samples_s=tr.samples_s, latency_iqr_s=tr.iqr_s, latency_cv=tr.cv,
             latency_method=tr.method, launches_per_sample=tr.launches_per_sample, **clock_fields(tr),
             tflops=tflops(v["flops"], tr.median_s), gb_s=v["bytes"] / tr.median_s / 1e9)
    if tr.note:
        v["latency_note"] = tr.note
    if gpu:  # also the host-inclusive call latency
        cl = time_call(prepared.run, pinfo.device, time_budget_s=min(5.0, opts.time_budget_s))
        v.update(call_latency_s=cl.median_s, call_latency_samples_s=cl.samples_s)


#: Error values of a record that must be finite numbers for the record to count as measured.
_ERROR_KEYS = ("max_abs_error_fp8_ref", "max_abs_error_bf16_ref", "rel_l2_error_fp8_ref", "mismatch_fraction")


def _check_finite(rec: Record) -> None:
    """A record with a non-finite output or a NaN error becomes an ``error`` (values kept), not an asv n/a."""
    v = rec.values
    bad_out = max(int(v.get("nonfinite_count_fp8_ref") or 0), int(v.get("nonfinite_count_bf16_ref") or 0))
    undefined = [k for k in _ERROR_KEYS if isinstance(v.get(k), float) and math.isnan(v[k])]
    if bad_out:
        rec.status, rec.reason = "error", (f"non-finite result: {bad_out} of {v.get('numel_fp8_ref', '?')} outputs "
                                           "are NaN/Inf (values kept in this record)")
    elif undefined:
        rec.status, rec.reason = "error", (f"non-finite result: {', '.join(undefined)} undefined (NaN): the "
                                           "reference is NaN/Inf, the inputs are not finite")


def evaluate_one(backend: Backend, case_data: CaseData, pinfo: PlatformInfo, opts: RunOptions) -> Record:
    """Measure one backend on one case; a backend failure is a record, never raised."""
    case = case_data.case
    rec = Record(backend.name, case.id, "ok")
    prepared = None
    try:
        sup = backend.supports(case, pinfo)
        if not sup:
            rec.status, rec.reason = "skipped", sup.reason
            return rec
        prepared = backend.prepare_case(case_data.inputs)
        t0 = time.perf_counter()
        out = prepared.run()
        synchronize(pinfo.device)
        call_s = time.perf_counter() - t0  # the first call: an upper side of one sample, for the sampling check
        out = out.detach().clone()
        v = rec.values
        v.update(timing_scope=prepared.timing_scope, emulation=backend.emulation, fp8=backend.fp8)
        bfm = error_metrics(out, case_data.bf16_ref[0])
        v.update(**error_metrics(out, case_data.fp8_ref[0]).as_dict("_fp8_ref"), **bfm.as_dict("_bf16_ref"))
        v["mismatch_fraction"] = bfm.mismatch_fraction  # AITER's criterion is against the unquantised ref
        if prepared.lse is not None:
            lse, rows = prepared.lse()
            v.update(lse_metrics(lse, rows, case_data.fp8_ref[1], case.kind))
        if opts.determinism:
            out2 = prepared.run()
            synchronize(pinfo.device)
            v["nondeterminism_max_abs"] = float((out2.detach().double() - out.double()).abs().nan_to_num(
                nan=float("inf")).max().item())
        del out
        v.update(flops=case_flops(case), bytes=case_min_bytes(case))
        _check_finite(rec)
        if opts.timing and rec.status == "ok":
            est = min(opts.time_budget_s, opts.samples * call_s)
            if opts.max_wait_s is not None and est > opts.max_wait_s:
                raise ValueError(f"latency sampling would take about {est / 3600:.1f} h ({opts.samples} samples of a "
                                 f"{call_s:.3g} s call within {opts.time_budget_s:g} s): fewer samples or a shorter "
                                 "time budget, or --allow-long to go on")
            _measure_timing(v, prepared, pinfo, opts)
        v.update({k: val for k, val in prepared.extras.items() if k not in v})
    except (BackendUnavailable, CaseUnsupported) as exc:
        rec.status, rec.reason = "skipped", str(exc)
    except Exception as exc:  # noqa: BLE001 - a failing backend must not lose other results
        if _is_oom(exc):
            rec.status, rec.reason = "skipped", f"out of memory at {case.id}: {_short(exc)}"
        else:
            rec.status, rec.reason = "error", _short(exc)
            rec.values["traceback"] = traceback.format_exc(limit=8)
    finally:
        if prepared is not None and prepared.cleanup is not None:
            try:
                prepared.cleanup()
            except Exception as exc:  # noqa: BLE001
                rec.values["cleanup_error"] = _short(exc)
        if pinfo.device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def _load_backends(names: list[str], pinfo: PlatformInfo, config: RunConfig | None
                   ) -> dict[str, tuple[Backend | None, Verdict]]:
    """Backends by name and their availability; one that cannot load is None."""
    out: dict[str, tuple[Backend | None, Verdict]] = {}
    for n in names:
        b = None
        try:
            b = get_backend(n, config)
            out[n] = (b, b.availability(pinfo))
        except UnknownBackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend that cannot load or tell is a skip, not a crash
            out[n] = (b, Verdict.no(f"backend {n} failed to load: {_short(exc)}" if b is None else
                                    f"availability check failed: {_short(exc)}"))
    return out


def _supported(b: Backend, case: Case, pinfo: PlatformInfo) -> bool:
    try:
        return bool(b.supports(case, pinfo))
    except Exception:  # noqa: BLE001 - it will be measured, and fail in its own record
        return True


def _call_s(case: Case, device_type: str, emulation: bool = False) -> float:
    dt, k = device_type if device_type in _RATE else "cuda", 100 if emulation and device_type == "cpu" else 1
    return max(case_flops(case) / _RATE[dt], k * _CALL_S[dt], k * case.batch_size * _SEQ_S[dt])


def expected_seconds(pairs: Iterable[tuple[Backend, Case]], device_type: str, opts: RunOptions) -> float:
    """A lower bound of the seconds :func:`evaluate` spends on ``pairs`` (backend, case): two references per
    case, then per pair a call for accuracy, one for determinism and up to ``samples`` within ``time_budget_s``."""
    pairs = list(pairs)
    total = sum(2 * _call_s(c, device_type) for c in {c.id: c for _b, c in pairs}.values())
    for b, c in pairs:
        call = _call_s(c, device_type, b.emulation)
        total += (1 + opts.determinism) * call + (min(opts.time_budget_s, opts.samples * call) if opts.timing else 0)
    return total


def check_duration(pairs: list[tuple[Backend, Case]], pinfo: PlatformInfo, opts: RunOptions) -> None:
    """ValueError when ``pairs`` are expected (:func:`expected_seconds`) to outlast ``opts.max_wait_s``."""
    if opts.max_wait_s is None or not pairs:
        return
    secs = expected_seconds(pairs, pinfo.device_type, opts)
    if secs > opts.max_wait_s:
        b, c = max(pairs, key=lambda p: expected_seconds([p], pinfo.device_type, opts))
        raise ValueError(f"this run would take at least {secs / 3600:.1f} h on {pinfo.device} ({len(pairs)} (backend, "
                         f"case) pairs, {opts.samples} samples within {opts.time_budget_s:g} s each; the longest: "
                         f"{b.name} {c.id}), more than {opts.max_wait_s / 3600:g} h: measure fewer or smaller cases, "
                         "fewer samples or a shorter time budget, or pass --allow-long to go on")


def evaluate(backends: Iterable[str], cases: Iterable[Case], *, device: str | torch.device = "auto",
             options: RunOptions | None = None, config: RunConfig | None = None,
             progress: Callable[[Record], None] | None = None) -> dict[str, Any]:
    """Every (backend, case) pair, each once; returns ``{"env", "records"}`` (JSON-ready). Before any work:
    UnknownBackendError, DeviceError, or ValueError for a grid expected past ``max_wait_s``; RunInterrupted
    (with the records completed) on ``KeyboardInterrupt``."""
    opts = options or RunOptions()
    pinfo = platform_info(device)
    bks = _load_backends(list(dict.fromkeys(backends)), pinfo, config)
    by_id: dict[str, Case] = {}
    for c in cases:
        by_id.setdefault(c.id, c)
    check_duration([(b, c) for c in by_id.values() for b, v in bks.values() if v and _supported(b, c, pinfo)],
                   pinfo, opts)
    records: list[dict[str, Any]] = []
    current = ("", "")
    try:
        for case in by_id.values():
            case_data: CaseData | None = None
            inputs_error: str | None = None
            for name, (b, verdict) in bks.items():
                current = (name, case.id)
                if verdict and case_data is None and inputs_error is None:
                    try:
                        case_data = CaseData(case, pinfo, None)
                    except Exception as exc:  # noqa: BLE001
                        inputs_error = (f"out of memory building inputs for {case.id}" if _is_oom(exc) else
                                        f"inputs for {case.id} failed: {_short(exc)}")
                if not verdict:
                    rec = Record(name, case.id, "skipped", verdict.reason)
                elif inputs_error is not None:
                    rec = Record(name, case.id, "skipped" if "out of memory" in inputs_error else "error", inputs_error)
                else:
                    rec = evaluate_one(b, case_data, pinfo, opts)
                records.append(rec.as_dict())
                if progress is not None:
                    progress(rec)
            del case_data
            gc.collect()
    except KeyboardInterrupt as exc:
        raise RunInterrupted({"env": environment(pinfo), "records": records, "interrupted": True,
                              "interrupted_before": {"backend": current[0], "case": current[1]},
                              "planned": len(bks) * len(by_id)}) from exc
    return {"env": environment(pinfo), "records": records}
