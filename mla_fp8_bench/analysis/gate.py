"""PR gate: compare HEAD with BASE on accuracy (against calibrated tolerances) and latency (with statistics).

``mla-fp8-bench gate BASE HEAD``: each side a run JSON, an asv result file or a commit hash prefix read
from ``<results-dir>/<machine>/`` (through :mod:`mla_fp8_bench.harness.results`); how each metric gates
comes from :mod:`mla_fp8_bench.measure.metric_table`. The rules, the exit statuses and what is only
informational: docs/regressions.md, section 3.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mla_fp8_bench.analysis.stats import mann_whitney_greater, min_attainable_p  # noqa: F401 - re-exported
from mla_fp8_bench.analysis.tolerances import Tolerances, load_tolerances, tolerance_key
from mla_fp8_bench.harness.results import (
    AsvResult,
    ResultsError,
    RunDoc,
    asv_result_from_data,
    find_result,
    is_cpu_machine,
    is_machine_dir,
    list_result_files,
    load_any,
    run_doc_from_data,
)
from mla_fp8_bench.jsonio import json_number
from mla_fp8_bench.measure import metric_table
from mla_fp8_bench.measure.clocks import OFF_PLATEAU_REL
from mla_fp8_bench.measure.metric_table import DEFAULT_ACC_FACTOR, DEFAULT_FACTOR, Metric, find, record_is_emulation
from mla_fp8_bench.terminal import fmt_seconds

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
DEFAULT_ALPHA = 0.01
#: k of the noise-aware latency threshold ``max(factor, 1 + k x spread)`` (spread: (max - min) / median
#: of the param's rounds, or of its stored history).
DEFAULT_NOISE_K = 1.0
#: Default factor of ``mla-fp8-bench ab`` (both sides measured in alternating processes on one machine,
#: so machine-start drift cancels and a smaller factor holds).
DEFAULT_AB_FACTOR = 1.02
#: k of ``ab``'s threshold ``max(factor, 1 + k x standard error of the ratio)`` (:func:`interleaved_ratio`).
DEFAULT_AB_NOISE_K = 3.0
#: asv benchmark versions whose latency samples are within-process samples, not rounds.
LEGACY_SAMPLE_VERSIONS = ("mla-prefill-v1",)
#: A latency threshold above this (a spread over 50 % with k = 1) judges nothing: the param is AMBIGUOUS.
MAX_NOISE_THRESHOLD = 1.5
#: Growth below this absolute change is never an accuracy regression (deterministic values that move
#: within rounding noise of 0).
ACC_ABS_FLOOR = 1e-6
#: Verdicts that fail the gate (LOST only without ``--allow-missing``).
GATING = ("REGRESSION", "FAILED", "INVALID", "AMBIGUOUS", "NOTHING COMPARED", "LOST")


class GateUsageError(ValueError):
    """Bad gate input; the CLI prints the message and exits 2."""


# ------------------------------------------------------------------------------------------ data model
@dataclass
class Measure:
    """One metric of one (backend, case) on one side.

    ``status``: ``ok``, ``skipped``, ``failed``, ``invalid`` (a stored value that is not a number),
    ``ambiguous`` (several different records of this (backend, case) on the side) or ``missing`` (an ok
    record without this value). ``scope``: ``kernel`` (gates), ``emulation`` or ``cpu`` (informational).
    """

    status: str
    value: float | None = None
    samples: list[float] | None = None
    ci: tuple[float, float] | None = None
    version: str | None = None
    reason: str = ""
    scope: str = "kernel"
    rounds: list[float] | None = None

    def center(self) -> float | None:
        """Median of the rounds (two or more), else of the samples, else the stored value."""
        xs = self.rounds if self.rounds and len(self.rounds) >= 2 else self.samples
        return float(np.median(xs)) if xs else self.value

    def round_spread(self) -> float | None:
        """(max - min) / median of the rounds; None with fewer than two rounds."""
        if not self.rounds or len(self.rounds) < 2:
            return None
        med = self.center()
        return (max(self.rounds) - min(self.rounds)) / med if med > 0 else None


@dataclass
class Side:
    """All measures of one side (BASE or HEAD): ``{(backend, case, metric): Measure}``.

    ``machine``: ``{"machine": asv name, "gpu": device}`` (None when unknown); ``params``: (backend, case)
    -> (status of the parameter: ``ok``/``skipped``/``failed``, its reason).
    """

    label: str
    kinds: dict[str, str] = field(default_factory=dict)  # metric -> kind (table kinds, "info" if unknown)
    data: dict[tuple[str, str, str], Measure] = field(default_factory=dict)
    machine: dict[str, str | None] = field(default_factory=dict)
    params: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    when: tuple[str, float] | None = None  # ("measured" | "commit date", seconds since the epoch)


def _metric_kind(m: Metric | None, name: str) -> str:
    if m is not None:
        return m.kind
    return "accuracy" if any(w in name for w in ("error", "mismatch", "nondeterminism", "nonfinite")) else "info"


def _number(x: Any) -> float | None | str:
    """A stored value as float; None when absent; the string ``"invalid"`` when not a number (or an
    integer beyond the float range)."""
    if x is None:
        return None
    v = json_number(x)
    return "invalid" if v is None else v


def _ok_measure(m: Metric | None, v: float, samples: Any, ci=None, version=None, scope="kernel",
                rounds: Any = None) -> Measure:
    """An ok Measure with the metric's floor applied (asv stores floored values); an impossible value
    (e.g. a negative error) is kept as it is, so the comparison can report it."""
    possible = m is None or m.possible(v)
    fv = m.floored(v) if m is not None and possible else v
    for name, vals, absent in (("samples", samples, ()), ("rounds", rounds, (None,))):
        bad = [x for x in vals if x not in absent and _number(x) in ("invalid", None)] if isinstance(vals, list) else []
        if bad or (name == "rounds" and vals is not None and not isinstance(vals, list)):
            what = repr(bad[0])[:40] if bad else f"{type(vals).__name__} {repr(vals)[:40]}"
            return Measure("invalid", reason=f"{name} hold {what}, not a number: a list of latencies in seconds")
    # an impossible or infinite stored value is what gets compared, never hidden behind its samples
    smp = ([float(x) for x in samples] if possible and math.isfinite(v) and isinstance(samples, list) and samples
           else None)
    rnd = [float(x) for x in rounds if x is not None] if isinstance(rounds, list) else None
    if rnd and (odd := [x for x in rnd if not _is_latency(x)]):
        return Measure("invalid", reason=f"rounds hold {odd[0]!r}, not a finite latency > 0 s")
    return Measure("ok", fv, smp, ci, version, scope=scope, rounds=rnd if rnd and len(rnd) >= 2 else None)


def _is_latency(x: Any) -> bool:
    """A finite number of seconds > 0 (a bool is not a number here)."""
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
    except OverflowError:  # an int beyond the float range
        return False


def _parsed(doc: Any, label: str, convert) -> Any:
    """``doc`` itself, or ``convert(doc, label)`` of a parsed JSON document (ResultsError -> GateUsageError)."""
    if not isinstance(doc, dict):
        return doc
    try:
        return convert(doc, label)
    except ResultsError as exc:
        raise GateUsageError(f"{label}: {exc}") from None


#: Record keys holding a number of seconds (and ``flops``, which ``seconds_per_pflop`` divides by): each a
#: JSON number or null in a run JSON the gate reads.
_NUMBER_KEYS = {**{m.record_key: "a finite number of seconds > 0, or null" for m in metric_table.METRICS
                   if m.unit == "seconds"}, "flops": "a finite number of FLOPs >= 1, or null"}
#: Record keys of raw samples: a list (of numbers; a non-number in it is judged ``INVALID``) or null.
_SAMPLES_KEYS = tuple(m.samples_key for m in metric_table.METRICS if m.samples_key)
_JSON_TYPES = {"list": "an array", "dict": "an object", "str": "a string", "bool": "a bool"}


def check_run_numbers(doc: RunDoc, label: str) -> None:
    """Refuse a run JSON whose latency (or ``flops``) is not a JSON number or null (a list, object, string,
    bool), whose ``flops`` is not a finite number >= 1, or whose samples are not a list, before any
    comparison; a latency out of range is left to the comparison (``INVALID``).

    Raises:
        GateUsageError: naming ``label`` (the side and its file), the record's (backend, case), the field
        and what is allowed.
    """
    for i, r in enumerate(doc.records):
        for key, allowed in _NUMBER_KEYS.items():
            v = r.get(key)
            if v is not None and json_number(v) is None:
                what = _JSON_TYPES.get(type(v).__name__, "an integer beyond the float range")
                raise GateUsageError(f"{label}: record {i} ({r['backend']}, {r['case']}): {key} = {repr(v)[:40]} "
                                     f"is {what}, not a number: allowed {allowed}")
            if key == "flops" and v is not None and not (math.isfinite(float(v)) and float(v) >= 1):
                raise GateUsageError(f"{label}: record {i} ({r['backend']}, {r['case']}): flops = {repr(v)[:40]} "
                                     f"is out of range: allowed {allowed}")
        for key in _SAMPLES_KEYS:
            v = r.get(key)
            if v is not None and not isinstance(v, list):
                what = _JSON_TYPES.get(type(v).__name__, "a number")
                raise GateUsageError(f"{label}: record {i} ({r['backend']}, {r['case']}): {key} = {repr(v)[:40]} "
                                     "is " + what + ": allowed a list of numbers of seconds, or null")


def side_from_run_json(doc: RunDoc | dict[str, Any], label: str) -> Side:
    """A side from ``mla-fp8-bench run --json`` output (a :class:`RunDoc` or the parsed document).

    Raises:
        GateUsageError: a malformed document, or a latency that is not a number (:func:`check_run_numbers`).
    """
    doc = _parsed(doc, label, run_doc_from_data)
    check_run_numbers(doc, label)
    env = doc.env
    vendor = str(env.get("vendor") or "").lower()
    side = Side(label, machine={"machine": None,
                                "gpu": ("none" if vendor == "cpu" else env.get("device_name")) if vendor else None},
                when=_iso_time(env.get("time_utc")))
    cpu = str(env.get("vendor", "")).lower() == "cpu" or str(env.get("device", "")).startswith("cpu")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in doc.records:
        groups.setdefault((r["backend"], r["case"]), []).append(r)
    for (b, c), recs in groups.items():
        if any(x != recs[0] for x in recs[1:]):  # several different records: no value is trusted
            why = (f"{len(recs)} different records of this (backend, case) on {side.label.split()[0]} (statuses "
                   f"{', '.join(str(x.get('status')) for x in recs)}): which one holds is unknown")
            side.params[(b, c)] = ("ambiguous", why)
            for m in metric_table.METRICS:
                if any(m.record_key in x for x in recs) or any(x.get("status") != "ok" for x in recs):
                    side.kinds[m.record_key] = m.kind
                    side.data[(b, c, m.record_key)] = Measure("ambiguous", reason=why)
            continue
        r = recs[0]
        status = r.get("status") if r.get("status") in ("ok", "skipped") else "failed"
        reason = str(r.get("reason") or "")
        side.params[(b, c)] = (status, reason)
        scope = "emulation" if record_is_emulation(r) else "cpu" if cpu else "kernel"
        for m in metric_table.METRICS:
            key = (b, c, m.record_key)
            side.kinds[m.record_key] = m.kind
            if status != "ok":
                side.data[key] = Measure(status, reason=reason)
                continue
            v = _number(m.value(r))
            if v is None:
                if m.kind == "accuracy" and m.record_key in r:
                    side.data[key] = Measure("missing", reason=f"{m.record_key} is null")
                continue  # not measured for this backend (e.g. no timing, no LSE)
            if v == "invalid":
                shown = repr(r.get(m.record_key))[:40]
                side.data[key] = Measure("invalid", reason=f"{m.record_key} = {shown} is not a number")
                continue
            side.data[key] = _ok_measure(m, v, r.get(m.samples_key) if m.samples_key else None, scope=scope,
                                         rounds=r.get(m.rounds_key) if m.rounds_key else None)
    return side


def _iso_time(text: Any) -> tuple[str, float] | None:
    try:
        return ("measured", _dt.datetime.fromisoformat(str(text)).timestamp()) if text else None
    except ValueError:
        return None


def side_from_asv_result(res: AsvResult | dict[str, Any], label: str) -> Side:
    """A side from an asv result file (an :class:`AsvResult` or the parsed document)."""
    res = _parsed(res, label, asv_result_from_data)
    gpu = res.params.get("gpu")
    cpu = is_cpu_machine(res.params)
    side = Side(label, machine={"machine": res.machine, "gpu": gpu if isinstance(gpu, str) else None},
                when=("commit date", res.date / 1000.0) if isinstance(res.date, (int, float)) and res.date else None)
    from mla_fp8_bench.backends import backend_flag

    emulation = functools.cache(functools.partial(backend_flag, flag="emulation"))
    for name in res.benchmarks():
        method = name.rsplit(".", 1)[-1]
        m = find(method)
        metric = m.record_key if m is not None else method
        kind = _metric_kind(m, method)
        side.kinds[metric] = kind
        try:
            meas = res.measurements(name)
        except ResultsError as exc:
            raise GateUsageError(f"{label}: {exc}") from None
        for combo, x in meas.items():
            backend = combo[0] if combo else ""
            case = ", ".join(combo[1:]) if len(combo) >= 2 else ("" if combo else name)
            key = (backend, case, metric if combo else name)
            if x.status != "ok":
                side.data[key] = Measure(x.status, version=x.version)
                continue
            scope = "emulation" if emulation(backend) else "cpu" if cpu else "kernel"
            ci = (x.ci_99_a, x.ci_99_b) if x.ci_99_a is not None and x.ci_99_b is not None else None
            as_rounds = m is not None and m.rounds_key is not None and x.version not in LEGACY_SAMPLE_VERSIONS
            side.data[key] = _ok_measure(m, x.value, None if as_rounds else x.samples, ci, x.version, scope,
                                         rounds=x.samples if as_rounds else None)
    for (b, c, _metric), x in side.data.items():
        prev = side.params.get((b, c))
        if prev is None or (prev[0] != "ok" and x.status == "ok"):
            side.params[(b, c)] = (x.status, x.reason)
    return side


# ------------------------------------------------------------------------------------------ loading
def machine_names(results_dir: str) -> list[str]:
    """The asv machine directories directly below ``results_dir`` (each holds ``machine.json``), sorted."""
    return sorted(q.name for q in Path(results_dir).iterdir() if q.is_dir() and is_machine_dir(q))


def resolve_machine(results_dir: str, machine: str | None) -> str:
    """The machine directory to read: ``--machine`` or the only one present."""
    if not os.path.isdir(results_dir):
        raise GateUsageError(f"results directory {results_dir} does not exist")
    machines = machine_names(results_dir)
    if machine:
        if machine not in machines:
            raise GateUsageError(f"machine {machine!r} has no results in {results_dir}: found "
                                 f"{', '.join(machines) or 'none'}")
        return machine
    if len(machines) == 1:
        return machines[0]
    raise GateUsageError(f"{results_dir} holds results of {len(machines)} machines ({', '.join(machines) or 'none'}): "
                         "pass --machine")


def machine_holding(results_dir: str, specs: tuple[str, ...], env: str | None) -> str | None:
    """The one machine of ``results_dir`` with results for every commit prefix in ``specs`` (files are
    skipped), or None when there is no such machine or several (``--machine`` then decides)."""
    prefixes = [s for s in specs if not os.path.isfile(s)]
    if not prefixes or not os.path.isdir(results_dir):
        return None
    found = []
    for name in machine_names(results_dir):
        with contextlib.suppress(ResultsError):
            for s in prefixes:
                find_result(results_dir, name, s, env)
            found.append(name)
    return found[0] if len(found) == 1 else None


def load_side(spec: str, label: str, results_dir: str, machine: str | None, env: str | None) -> tuple[Side, str]:
    """(Side, where it came from) for a file path or a commit prefix.

    Raises:
        GateUsageError: a missing/corrupt file, an unknown/ambiguous commit, or a file of neither kind.
    """
    try:
        if os.path.isfile(spec):
            path = spec
        elif len(spec) < 4 or not all(c in "0123456789abcdefABCDEF" for c in spec):
            raise GateUsageError(f"{spec!r} is neither an existing file nor a commit hash prefix (>= 4 hex digits)")
        else:
            path = str(find_result(results_dir, resolve_machine(results_dir, machine), spec, env))
        doc = load_any(path)
    except ResultsError as exc:
        raise GateUsageError(f"{label}: {exc}") from None
    if isinstance(doc, AsvResult):
        return side_from_asv_result(doc, f"{label} {spec}"), path
    return side_from_run_json(doc, f"{label} {spec}"), path


def check_same_machine(base: Side, head: Side) -> None:
    """Refuse to compare results of two machines: asv machine names that differ, or devices of which
    neither name contains the other (a run JSON's ``"AMD Instinct MI355X"`` matches asv's ``"MI355X"``).

    Raises:
        GateUsageError: naming both machines.
    """
    for facet in ("machine", "gpu"):
        b, h = base.machine.get(facet), head.machine.get(facet)
        if b is None or h is None:
            continue
        bl, hl = str(b).strip().lower(), str(h).strip().lower()
        same = bl == hl if facet == "machine" or "none" in (bl, hl) else (bl in hl or hl in bl)
        if not same:
            raise GateUsageError(f"BASE and HEAD come from different machines ({facet} {b!r} vs {h!r}): their "
                                 "latencies are not comparable; pass --allow-cross-machine to compare anyway")


# ------------------------------------------------------------------------------------------ latency rule
@dataclass
class LatencyVerdict:
    ratio: float
    significant: bool
    regressed: bool
    method: str  # "mann-whitney p=..." / "ci-99" / "no stats" / "too few samples"
    p: float | None = None


def latency_verdict(base: Measure, head: Measure, factor: float = DEFAULT_FACTOR,
                    alpha: float = DEFAULT_ALPHA) -> LatencyVerdict:
    """The gate's latency rule: ratio of medians (or values) > factor AND significant. Samples too few to
    ever reach ``alpha`` (3 vs 3: the smallest exact p is 0.05) are never significant."""
    bv, hv = base.center(), head.center()
    ratio = hv / bv if bv and bv > 0 else math.inf
    if _sampled(base, head):
        n1, n2 = len(head.samples), len(base.samples)
        _u, p = mann_whitney_greater(head.samples, base.samples)
        if min_attainable_p(n1, n2) >= alpha:
            return LatencyVerdict(ratio, False, False, f"too few samples ({n2} vs {n1}) for p < {alpha}", p)
        sig = p < alpha
        return LatencyVerdict(ratio, sig, sig and ratio > factor, f"mann-whitney p={p:.2g}", p)
    if base.ci and head.ci:
        sig = head.ci[0] > base.ci[1]
        return LatencyVerdict(ratio, sig, sig and ratio > factor, "ci-99 " + ("disjoint" if sig else "overlap"))
    return LatencyVerdict(ratio, True, ratio > factor, "no stats")


def _sampled(bm: Measure, hm: Measure) -> bool:
    return bool(bm.samples and hm.samples and len(bm.samples) >= 2 and len(hm.samples) >= 2)


def _sig_faster(bm: Measure, hm: Measure, alpha: float) -> bool:
    if _sampled(bm, hm):
        return mann_whitney_greater(bm.samples, hm.samples)[1] < alpha
    return bm.ci[0] > hm.ci[1] if bm.ci and hm.ci else True


# ------------------------------------------------------------------------------------------ comparing
@dataclass
class Row:
    backend: str
    case: str
    metric: str
    kind: str
    base: str
    head: str
    ratio: float | None
    verdict: str  # GATING verdicts, or ok | improved | skipped | not comparable | new | removed | info | ...
    detail: str = ""
    compared: bool = False  # a HEAD value was judged against BASE's value or a calibrated tolerance
    #: the ratio column's text when a ratio would mislead (BASE at the metric's floor: "0 -> 64 (new)")
    ratio_note: str = ""

    @property
    def gating(self) -> bool:
        return self.verdict in GATING


@dataclass
class GateOptions:
    """How :func:`compare` judges (see the module docstring and the CLI flags)."""

    factor: float = DEFAULT_FACTOR
    acc_factor: float = DEFAULT_ACC_FACTOR
    alpha: float = DEFAULT_ALPHA
    tolerances: Tolerances | None = None
    gate_host_latency: bool = False
    noise_k: float = DEFAULT_NOISE_K
    #: (backend, case, metric) -> relative spread of the param in the machine's stored history
    history: dict[tuple[str, str, str], float] = field(default_factory=dict)
    #: BASE and HEAD rounds alternate on one machine (``ab``): time is gated, on the ratio of the
    #: means of the rounds' :func:`fastest_mode`
    interleaved: bool = False


_LATENCY_KINDS = ("kernel_latency", "host_latency", "latency")
_SCOPE_TEXT = {"emulation": "an emulation's latency, not a kernel's: informational",
               "cpu": "CPU host time, not a kernel's: informational"}


def _fmt(m: Measure | None, kind: str, metric: Metric | None = None) -> str:
    """A value as the table shows it; a value at the metric's floor (a stored exact 0) reads ``0``."""
    if m is None:
        return "-"
    if m.status != "ok":
        return m.status
    v = m.center()
    if v is None:
        return "-"
    if metric is not None and metric.floor is not None and v <= metric.floor:
        return "0"
    if kind in _LATENCY_KINDS:
        return fmt_seconds(v) + (f" (n={len(m.samples)})" if m.samples else "")
    return f"{v:.4g}"


def ratio_str(x: float, against: float | None = None) -> str:
    """A ratio with 3 decimals, or as many more (up to 6) as it takes to differ from ``against`` (the
    threshold it is compared with): ``1.0502`` next to ``1.05``, never ``1.050``."""
    if x is None or math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf"
    for d in (3, 4, 5, 6):
        text = f"{x:.{d}f}"
        if against is None or float(text) != against:
            return text
    return repr(x)


def growth_text(bv: float, hv: float, floor: float | None, against: float | None = None) -> str:
    """How HEAD relates to BASE: ``1.0502x``, or ``0 -> 64 (new)`` when BASE is at the metric's floor
    (an exact 0, stored floored) and HEAD is not (a ratio against a floored 0 means nothing)."""
    if floor is not None and bv <= floor < hv:
        return f"0 → {hv:.4g} (new)"
    if not bv:
        return "0 → 0" if not hv else f"0 → {hv:.4g} (new)"
    return ratio_str(hv / bv, against) + "x"


def _head_not_ok(row: Row, bm: Measure | None, hm: Measure) -> None:
    """Verdict of a HEAD measure that is not ok (failed, skipped, invalid, missing: an ok record whose
    accuracy value is null)."""
    b_ok = bm is not None and bm.status == "ok"
    if hm.status == "failed":
        row.verdict = "FAILED" if b_ok else "failed"
        row.detail = (f"failed on HEAD, OK on BASE {hm.reason}".strip() if b_ok
                      else "still failing" if bm is not None else "new, failed")
    else:
        row.verdict = {"skipped": "skipped", "invalid": "INVALID"}.get(hm.status, "LOST")
        row.detail = hm.reason + (" (measured on BASE)" if b_ok and row.verdict == "LOST" else "")


def _impossible(kind: str, m: Metric | None, bm: Measure | None, hm: Measure) -> tuple[str, str] | None:
    """(verdict, detail) of a non-finite or impossible HEAD value, or an impossible BASE value; None if neither."""
    hv = hm.center()
    if kind == "accuracy" and (hv is None or not math.isfinite(hv)):
        return "REGRESSION", "non-finite on HEAD"
    if m is not None and hv is not None and not m.possible(hv):
        return "INVALID", f"impossible value {hv:.4g} on HEAD (possible: {m.bounds_text})"
    bv = bm.center() if bm is not None and bm.status == "ok" else None
    if bv is not None and (not math.isfinite(bv) or (m is not None and not m.possible(bv))):
        what = "non-finite" if not math.isfinite(bv) else "impossible"
        return "INVALID", (f"{what} value {bv:.4g} on BASE" + (f" (possible: {m.bounds_text})" if m is not None
                           else "") + f": HEAD's {hv:.4g} cannot be judged against it")
    if bm is not None and bm.status in ("invalid", "missing"):
        return "INVALID", f"BASE: {bm.reason}: HEAD's {hv:.4g} cannot be judged against it"
    return None


def _tolerance(row: Row, m: Metric | None, bm: Measure | None, hm: Measure, opts: GateOptions) -> str:
    """Check a calibrated accuracy value against its tolerance; sets REGRESSION; returns a detail note."""
    if row.kind != "accuracy" or opts.tolerances is None:
        return ""
    key = tolerance_key({"backend": row.backend, "case": row.case})
    lim, how = opts.tolerances.lookup(row.backend, key)
    if lim is None or (row.metric not in lim and not (m is not None and m.calibrated)):
        return ""
    if row.metric not in lim:
        raise GateUsageError(f"tolerance file {opts.tolerances.path} lacks calibrated metric {row.metric} for "
                             f"{row.backend} / {key} ({how}): recalibrate (mla-fp8-bench calibrate)")
    v, t = hm.center(), lim[row.metric]
    row.compared = True
    if v > t:
        b_ok = bm is not None and bm.status == "ok"
        row.verdict = "REGRESSION"
        row.ratio = (v / bm.center()) if b_ok and bm.center() else None
        if b_ok and m is not None and m.floor is not None and bm.center() <= m.floor < v:
            row.ratio_note = growth_text(bm.center(), v, m.floor)
        row.detail = f"exceeds tolerance: {v:.4g} > {t:.4g} ({how})" + (
            "; already over at BASE" if b_ok and (bm.center() or 0) > t else "")
    return f"tol {t:.4g} ({how.split(' (')[0]})"


def _plateau_mhz(side: Side) -> float | None:
    """The highest median SM clock over the kernel params of a side (the clock of a lightly loaded case)."""
    vals = [x.center() for (_b, _c, metric), x in side.data.items()
            if metric == "sm_clock_mhz" and x.status == "ok" and x.scope == "kernel" and x.center()]
    return max(vals) if vals else None


def off_plateau(side: Side, backend: str, case: str, plateau: float | None) -> bool:
    """Whether the param's median SM clock lies more than ``OFF_PLATEAU_REL`` (the clock reader's) below
    ``plateau`` (:func:`_plateau_mhz` of its side)."""
    x = side.data.get((backend, case, "sm_clock_mhz"))
    v = x.center() if x is not None and x.status == "ok" else None
    return bool(v and plateau and v < plateau * (1 - OFF_PLATEAU_REL))


@dataclass
class GatedFigure:
    """What the latency rule compares for one param: ``time`` or ``cycles`` (SM cycles per launch) and why."""

    name: str
    base: Measure
    head: Measure
    why: str


def gated_figure(base: Side, head: Side, key: tuple[str, str, str], bm: Measure, hm: Measure,
                 interleaved: bool = False) -> GatedFigure:
    """Where the SM clock of a ``latency_s`` param is off its plateau on either side (a power-capped case,
    whose clock depends on the preceding load and the machine start), SM cycles per launch (latency x
    clock) when both sides hold them; elsewhere, for other metrics and when ``interleaved`` (both sides
    share the machine's thermal and power state; a clock a change itself lowers is a slowdown), time."""
    b, c, metric = key
    if metric != "latency_s":
        return GatedFigure("time", bm, hm, "")
    if interleaved:
        return GatedFigure("time", bm, hm, "BASE and HEAD interleaved on one machine")
    pb, ph = _plateau_mhz(base), _plateau_mhz(head)
    if off_plateau(base, b, c, pb) or off_plateau(head, b, c, ph):
        cb, ch = base.data.get((b, c, "latency_sm_cycles")), head.data.get((b, c, "latency_sm_cycles"))
        if cb is not None and ch is not None and cb.status == ch.status == "ok" and cb.center() and ch.center():
            return GatedFigure("cycles", cb, ch, "SM clock off its plateau")
        return GatedFigure("time", bm, hm, "SM clock off its plateau, no SM cycles on both sides")
    return GatedFigure("time", bm, hm, "")


def noise_threshold(bm: Measure, hm: Measure, factor: float, k: float, history: float | None = None
                    ) -> tuple[float, str]:
    """The per-param latency threshold ``max(factor, 1 + k x spread)`` and where the spread came from:
    the larger round spread ((max - min) / median) of the two sides, else ``history`` (the param's spread
    in the machine's stored results), else none (``factor``)."""
    sp = [x for x in (bm.round_spread(), hm.round_spread()) if x is not None]
    if sp:
        noise, src = max(sp), "round spread"
    elif history is not None:
        noise, src = history, "history spread"
    else:
        return factor, "factor"
    t = max(factor, 1 + k * noise)
    return t, f"{src} {noise * 100:.2f}%"


#: Rounds within this fraction of a side's fastest round belong to its fastest per-process mode.
MODE_WIDTH_REL = 0.02


def robust_sd(values: list[float]) -> float:
    """``1.4826 x MAD``: the standard deviation of normal data, insensitive to a few outlying values."""
    med = float(np.median(values))
    return 1.4826 * float(np.median(np.abs(np.asarray(values) - med)))


def fastest_mode(values: list[float]) -> list[float]:
    """The rounds within :data:`MODE_WIDTH_REL` of the fastest round: the side's fastest per-process mode.

    A fresh H200 process reads a case at one of a few levels (FA3-FP8 s512: 15.16 or 16.21 us; s8192:
    386.3 or 389.8 us); a slower round is a slower process, not a slower library, and a library change
    moves every level, so the fastest modes of two sides compare like with like.
    """
    lo = min(values)
    return [v for v in values if v <= lo * (1 + MODE_WIDTH_REL)]


def fastest_mode_mean(values: list[float]) -> float:
    """Mean of :func:`fastest_mode`, summed relative to its smallest value (no overflow near the float limit)."""
    mode = fastest_mode(values)
    lo = min(mode)
    return lo * float(np.mean([x / lo for x in mode]))


def interleaved_ratio(base: list[float], head: list[float], factor: float, k: float
                      ) -> tuple[float, float, str]:
    """The interleaved (``ab``) latency rule: ratio of the means of HEAD's and BASE's :func:`fastest_mode`,
    threshold ``max(factor, 1 + k x se)``, ``se`` the ratio's relative standard error
    ``sqrt(sd_b^2 / n_b + sd_h^2 / n_h)`` from the relative :func:`robust_sd` of each side's fastest mode.

    Returns:
        ``(ratio, threshold, where the threshold came from)``.

    Raises:
        ValueError: a side without rounds, or a round that is not a finite latency > 0.
    """
    for name, v in (("BASE", base), ("HEAD", head)):
        bad = [x for x in v if not _is_latency(x)]
        if not v or bad:
            raise ValueError(f"{name} rounds {list(v)[:6]!r} cannot be judged: every round must be a finite "
                             f"latency > 0 (bad: {bad[:3]!r})")
    modes = [fastest_mode([float(x) for x in v]) for v in (base, head)]
    mb, mh = (fastest_mode_mean(m) for m in modes)

    ratio = mh / mb
    if not math.isfinite(ratio) or ratio == 0:
        raise ValueError(f"HEAD / BASE = {mh!r} / {mb!r} is not a finite ratio > 0: the rounds cannot be judged")
    rel = [(robust_sd(m) / float(np.median(m))) ** 2 / len(m) for m in modes]
    se = math.sqrt(sum(rel))
    return ratio, max(factor, 1 + k * se), f"standard error {se * 100:.2f}%"


def history_spreads(machine_dir: str, exclude: tuple[str, ...] = (), least: int = 3
                    ) -> dict[tuple[str, str, str], float]:
    """``{(backend, case, metric): (max - min) / median}`` of each kernel-latency param over the stored asv
    results of one machine directory (``exclude`` left out, unreadable files skipped), over the values of
    the newest file's benchmark version; a param needs at least ``least`` stored values."""
    skip = {os.path.realpath(x) for x in exclude}
    vals: dict[tuple[str, str, str], dict[str | None, list[float]]] = {}
    newest: dict[tuple[str, str, str], str | None] = {}
    for f in list_result_files(machine_dir):
        if os.path.realpath(f.path) in skip:
            continue
        try:
            side = side_from_asv_result(load_any(str(f.path)), str(f.path))  # type: ignore[arg-type]
        except (ResultsError, GateUsageError, TypeError, AttributeError, ValueError):
            continue
        for key, x in side.data.items():
            if side.kinds.get(key[2]) == "kernel_latency" and x.status == "ok" and x.center():
                vals.setdefault(key, {}).setdefault(x.version, []).append(float(x.center()))
                newest[key] = x.version
    out = {}
    for key, by_version in vals.items():
        v = by_version.get(newest[key], [])
        if len(v) >= least:
            med = float(np.median(v))
            out[key] = (max(v) - min(v)) / med if med > 0 else 0.0
    return out


def _latency(row: Row, bm: Measure, hm: Measure, opts: GateOptions, fig: GatedFigure, history: float | None) -> None:
    scope = next((s for s in (hm.scope, bm.scope) if s != "kernel"), "kernel")
    gb, gh = fig.base, fig.head
    thr, src = noise_threshold(gb, gh, opts.factor, opts.noise_k, history)
    both_rounds = bool(gb.rounds and gh.rounds)
    if both_rounds and opts.interleaved:
        try:
            ratio, thr, src = interleaved_ratio(gb.rounds, gh.rounds, opts.factor, opts.noise_k)
        except ValueError as exc:
            row.verdict, row.detail = "INVALID", str(exc)
            return
        row.base, row.head = (fmt_seconds(fastest_mode_mean(x.rounds)) for x in (gb, gh))
        lv = LatencyVerdict(ratio, True, ratio > thr, f"rounds {len(gb.rounds)}/{len(gh.rounds)}, "
                            "ratio of fastest-mode means")
    elif both_rounds:
        ratio = gh.center() / gb.center() if gb.center() else math.inf
        lv = LatencyVerdict(ratio, True, ratio > thr, f"rounds {len(gb.rounds)}/{len(gh.rounds)}")
    else:
        lv = latency_verdict(gb, gh, thr, opts.alpha)
    row.ratio = lv.ratio
    if scope != "kernel":
        row.verdict, row.detail = "info", _SCOPE_TEXT[scope]
        return
    if row.kind == "host_latency" and not opts.gate_host_latency:
        row.verdict, row.detail = "info", "host-side latency: informational (--gate-call-latency gates it)"
        return
    if thr > MAX_NOISE_THRESHOLD:
        row.verdict = "AMBIGUOUS"
        row.detail = (f"threshold {thr:.3g} from the {src.rsplit(' ', 1)[0]} is over {MAX_NOISE_THRESHOLD}: the values "
                      "disagree too much to judge a regression (a stalled or broken round?); measure again")
        return
    time_ratio = (hm.center() / bm.center()) if bm.center() else math.inf
    gated = f"gated on {fig.name}" + (f" ({fig.why})" if fig.why else "")
    beside = f"; time {time_ratio:.3f}x" if fig.name != "time" else ""
    row.detail = f"{gated}; threshold {thr:.3f} ({src}){beside}; {lv.method}"
    if lv.regressed:
        row.verdict = "REGRESSION"
        row.detail = f"{ratio_str(lv.ratio, thr)}x > {thr:.3f}; {row.detail}"
    elif lv.ratio < 1 / thr and (both_rounds or _sig_faster(gb, gh, opts.alpha)):
        row.verdict, row.detail = "improved", f"{ratio_str(lv.ratio, 1 / thr)}x, faster; {row.detail}"


def _by_rule(row: Row, m: Metric | None, bv: float, hv: float, opts: GateOptions, tol_detail: str) -> None:
    """Verdict of two ok, comparable values by the metric's gate rule (latency excluded)."""
    acc = row.kind == "accuracy"
    rule = m.gate if m is not None else ("grow" if acc else "none")
    row.ratio = (hv / bv) if bv else (math.inf if hv else 1.0)
    floor = m.floor if m is not None else None
    if (floor is not None and bv <= floor < hv) or (not bv and hv):
        row.ratio_note = growth_text(bv, hv, floor)
    if rule == "zero":
        if hv != 0:
            row.verdict, row.detail = "REGRESSION", f"{hv:.4g} on HEAD, must be 0"
    elif rule == "exact":
        if hv != bv:
            row.verdict, row.detail = "REGRESSION", f"changed {bv:.6g} -> {hv:.6g} (must not change)"
    elif rule == "grow" or (rule == "tolerance" and acc):
        limit = opts.acc_factor if acc else opts.factor
        if hv > bv * limit and (not acc or hv - bv > ACC_ABS_FLOOR):
            row.verdict = "REGRESSION"
            text = growth_text(bv, hv, floor, limit)
            row.detail = (f"grew {text} > {limit}x" if text.endswith("x")
                          else f"{text}: any growth from 0 exceeds {limit}x") + (" over BASE" if acc else "")

            row.detail += f"; {tol_detail}" if tol_detail else ""
        else:
            row.detail = tol_detail
            if hv < bv / limit:
                row.verdict = "improved"
    else:
        row.verdict = "info"


def compare_one(key: tuple[str, str, str], base: Side, head: Side, opts: GateOptions) -> Row:
    """The verdict of one (backend, case, metric) (see the module docstring)."""
    b, c, metric = key
    m = find(metric)
    kind = head.kinds.get(metric) or base.kinds.get(metric) or _metric_kind(m, metric)
    bm, hm = base.data.get(key), head.data.get(key)
    row = Row(b, c, metric, kind, _fmt(bm, kind, m), _fmt(hm, kind, m), None, "ok")
    amb = next((x for x in (hm, bm) if x is not None and x.status == "ambiguous"), None)
    if amb is not None:
        row.verdict, row.detail = "AMBIGUOUS", amb.reason
        return row
    if hm is None:
        head_ok = head.params.get((b, c), ("",))[0] == "ok"
        lost = kind == "accuracy" and bm is not None and bm.status == "ok" and head_ok and metric in head.kinds
        row.verdict, row.detail = ("LOST", "absent on HEAD, measured on BASE") if lost else ("removed", "")
        return row
    if hm.status != "ok":
        _head_not_ok(row, bm, hm)
        return row
    bad = _impossible(kind, m, bm, hm)
    if bad is not None:
        row.verdict, row.detail = bad
        return row
    tol_detail = _tolerance(row, m, bm, hm, opts)
    if row.verdict == "REGRESSION":
        return row
    if bm is None or bm.status != "ok":
        row.verdict = "new" if bm is None else "fixed" if bm.status == "failed" else "was " + bm.status
        row.detail = tol_detail
        return row
    if bm.version is not None and hm.version is not None and bm.version != hm.version:
        row.verdict, row.detail = "not comparable", "benchmark version changed"
        return row
    row.compared = True
    if kind in _LATENCY_KINDS:
        _latency(row, bm, hm, opts, gated_figure(base, head, key, bm, hm, opts.interleaved), opts.history.get(key))
    else:
        _by_rule(row, m, bm.center(), hm.center(), opts, tol_detail)
    return row


def lost_params(base: Side, head: Side) -> list[Row]:
    """One LOST row per (backend, case) that was ok on BASE and is absent or skipped on HEAD, and one
    when HEAD holds no results at all."""
    rows: list[Row] = []
    if not head.params:
        rows.append(Row("*", "*", "-", "-", f"{len(base.params)} param(s)", "none", None, "LOST",
                        "HEAD holds no results"))
    for (b, c), (st, _reason) in sorted(base.params.items()):
        h = head.params.get((b, c))
        if st != "ok" or (h is not None and h[0] != "skipped"):
            continue
        where = "absent on HEAD" if h is None else "skipped on HEAD" + (f": {h[1]}" if h[1] else "")
        rows.append(Row(b, c, "-", "-", "ok", "absent" if h is None else "skipped", None, "LOST",
                        f"ok on BASE, {where}"))
    return rows


def compare(base: Side, head: Side, **options: Any) -> list[Row]:
    """Every (backend, case, metric) of either side with its verdict, then the LOST parameters;
    ``options``: the fields of :class:`GateOptions`."""
    opts = GateOptions(**options)
    rows = [compare_one(key, base, head, opts) for key in sorted(set(base.data) | set(head.data))]
    rows += lost_params(base, head)
    if not any(r.compared for r in rows):
        why = ("BASE holds no results" if not base.params else "HEAD holds no results" if not head.params else
               "no (backend, case, metric) value is on both sides and comparable "
               f"({_verdict_counts(rows) or 'no rows'})")
        rows.append(Row("*", "*", "-", "-", f"{len(base.data)} value(s)", f"{len(head.data)} value(s)", None,
                        "NOTHING COMPARED", why))
    return rows


def compared_count(rows: list[Row]) -> int:
    """How many (backend, case, metric) values of HEAD were judged (against BASE or a tolerance)."""
    return sum(r.compared for r in rows)


def _verdict_counts(rows: list[Row]) -> str:
    return ", ".join(f"{v} {n}" for v, n in sorted(Counter(r.verdict for r in rows).items()))


def side_notes(base: Side, head: Side) -> list[str]:
    """Facts about the two sides a reader must know: BASE measured after HEAD (swapped arguments?)."""
    if not (base.when and head.when and base.when[1] > head.when[1]):
        return []
    (b_what, b_t), (h_what, h_t) = base.when, head.when
    b_iso, h_iso = (_dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds") for t in (b_t, h_t))
    return [f"BASE is newer than HEAD ({b_what} {b_iso} vs {h_what} {h_iso}): are BASE and HEAD swapped?"]


# ------------------------------------------------------------------------------------------ reports
_STYLE = {"REGRESSION": "bold red", "FAILED": "bold red", "INVALID": "bold red", "LOST": "bold red",
          "improved": "green", "skipped": "dim", "not comparable": "yellow", "failed": "yellow", "new": "cyan"}
_QUIET = ("ok", "info", "skipped", "removed")


def _gating(rows: list[Row], allow_missing: bool) -> list[Row]:
    return [r for r in rows if r.gating and not (allow_missing and r.verdict == "LOST")]


_COLUMNS = ("verdict", "backend", "case", "metric", "BASE", "HEAD", "ratio", "detail")


def _cells(r: Row) -> tuple[str, ...]:
    """A row's cells in :data:`_COLUMNS` order, each on one line (a failure's reason may hold newlines)."""
    ratio = r.ratio_note or ("-" if r.ratio is None or not math.isfinite(r.ratio) else ratio_str(r.ratio))
    return tuple(" ".join(str(x).split()) for x in (r.verdict, r.backend, r.case, r.metric, r.base, r.head, ratio,
                                                    r.detail))


def _skipped_summary(rows: list[Row]) -> dict[str, dict[str, str]]:
    """backend -> case -> reason, for params all of whose metrics were skipped on HEAD (a CPU run skips
    call latency alone, which is not a skipped case)."""
    by_param: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r.metric != "-":
            by_param.setdefault((r.backend, r.case), []).append(r)
    skipped: dict[str, dict[str, str]] = {}
    for (b, c), rs in by_param.items():
        if all(r.verdict == "skipped" for r in rs):
            skipped.setdefault(b, {})[c] = next((r.detail for r in rs if r.detail), "")
    return skipped


def render_text(rows: list[Row], title: str, console, *, show_all: bool = False) -> None:
    """The rich table of notable rows, one grep-able line per notable row, skips and counts."""
    from rich.table import Table

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False, soft_wrap=True)

    shown = rows if show_all else [r for r in rows if r.verdict not in _QUIET]
    t = Table()
    for col in _COLUMNS:
        t.add_column(col, overflow="fold")
    for r in shown:
        st = _STYLE.get(r.verdict, "")
        t.add_row(f"[{st}]{r.verdict}[/{st}]" if st else r.verdict, *_cells(r)[1:])
    say(title)
    if shown:
        console.print(t)
    # one unfolded line per notable row, so CI logs and greps see every name whatever the terminal width
    for r in shown:
        if r.verdict not in ("ok", "info", "new"):
            what = f"{r.backend} {r.case}" + (f" {r.metric}" if r.metric != "-" else "")
            detail = _cells(r)[-1]
            say(f"{r.verdict}: {what}: BASE {r.base} -> HEAD {r.head}" + (f" ({detail})" if detail else ""))
    for b, cases in sorted(_skipped_summary(rows).items()):
        reasons = sorted({x for x in cases.values() if x})
        say(f"skipped on HEAD: {b}: {len(cases)} case(s) ({', '.join(sorted(cases))})"
            + (f": {reasons[0][:160]}" if reasons else ""))
    removed = [r for r in rows if r.verdict == "removed" and r.base not in ("skipped", "failed")]
    if removed and not show_all:
        say(f"absent on HEAD (measured on BASE): {len(removed)} row(s), metrics "
            f"{', '.join(sorted({r.metric for r in removed}))} (--all lists them)")
    info = [r for r in rows if r.verdict == "info"]
    if info and not show_all:
        kinds = sorted({r.detail.split(":")[0] for r in info if r.detail})
        say(f"informational, never gating: {len(info)} row(s)" + (f" ({'; '.join(kinds)})" if kinds else ""))
    say(f"(backend, case, metric) rows by verdict: {_verdict_counts(rows)}; judged: {compared_count(rows)}")


#: Rows per markdown table: a GitHub comment holds at most 65,536 characters.
MD_MAX_ROWS = 50


def _md_table(rows: list[Row]) -> list[str]:
    out = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for r in rows[:MD_MAX_ROWS]:
        *cells, detail = _cells(r)
        cells.append(detail[:200])
        out.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    if len(rows) > MD_MAX_ROWS:
        out.append(f"\n... and {len(rows) - MD_MAX_ROWS} more (the text report lists every row)")
    return out


def render_markdown(rows: list[Row], *, base_src: str, head_src: str, settings: str, allow_missing: bool,
                    plots: str | None, notes: list[str] | None = None) -> str:
    """A PR-comment / Buildkite-annotation summary: verdict, regressions, lost results, improvements, plots."""
    bad = _gating(rows, allow_missing)
    lost = [r for r in rows if r.verdict == "LOST"]
    regress = [r for r in rows if r.gating and r.verdict != "LOST"]
    improved = [r for r in rows if r.verdict == "improved"]
    info = [r for r in rows if r.verdict == "info"]
    head = (f"**GATE FAILED**: {len(bad)} regression(s), new failure(s) or lost result(s)" if bad
            else "**GATE PASSED**") + f" ({compared_count(rows)} value(s) compared)"
    out = ["## mla-fp8-bench gate", "", head, "", f"BASE `{base_src}` vs HEAD `{head_src}`; {settings}", ""]
    out += [f"Note: {n}" for n in notes or ()] + ([""] if notes else [])
    for title, sel in (("Regressions", regress), ("Lost results" + (" (allowed)" if allow_missing else ""), lost),
                       ("Improvements", improved)):
        out.append(f"### {title} ({len(sel)})")
        out.extend(_md_table(sel) if sel else ["none"])
        out.append("")
    out.append(f"Informational, never gating: {len(info)} row(s) (emulation latency, CPU host time, "
               "host-side latency unless --gate-call-latency).")
    if plots:
        out.append(f"Plots: {plots if '://' in plots else '`' + plots + '`'}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ CLI
def check_flags(*checks: tuple[str, float, float, str]) -> None:
    """Each ``(flag, value, least, what is allowed)``: the value must be finite and >= least.

    Raises:
        GateUsageError: naming the first bad flag, its value and what is allowed.
    """
    for flag, v, least, want in checks:
        if not (math.isfinite(v) and v >= least):
            raise GateUsageError(f"{flag} {v} is invalid: {want}")


def cmd_gate(args: argparse.Namespace, console) -> int:
    check_flags(("--factor", args.factor, 1.0, "a ratio >= 1.0 (e.g. 1.05)"),
                ("--acc-factor", args.acc_factor, 1.0, "a ratio >= 1.0"),
                ("--noise-k", args.noise_k, 0.0, "a finite number >= 0 (e.g. 1.0)"))
    if not 0 < args.alpha < 1:
        raise GateUsageError(f"--alpha {args.alpha} is invalid: in (0, 1)")
    tol = load_tolerances(args.tolerances) if args.tolerances else None
    if args.machine is None:  # several machines: the one that holds both commits, if only one does
        args.machine = machine_holding(args.results_dir, (args.base, args.head), args.env)
    base, bsrc = load_side(args.base, "BASE", args.results_dir, args.machine, args.env)
    head, hsrc = load_side(args.head, "HEAD", args.results_dir, args.machine, args.env)
    if not args.allow_cross_machine:
        check_same_machine(base, head)
    history = {}
    if args.history:
        mdir = os.path.join(args.results_dir, resolve_machine(args.results_dir, args.machine))
        history = history_spreads(mdir, exclude=(hsrc,))  # HEAD is under test; BASE is history
    rows = compare(base, head, factor=args.factor, acc_factor=args.acc_factor, alpha=args.alpha, tolerances=tol,
                   gate_host_latency=args.gate_call_latency, noise_k=args.noise_k, history=history)
    if os.path.realpath(bsrc) == os.path.realpath(hsrc):
        rows = [r for r in rows if r.verdict in GATING and r.verdict != "NOTHING COMPARED"] + [Row(
            "*", "*", "-", "-", bsrc, hsrc, None, "NOTHING COMPARED",
            f"BASE {args.base} and HEAD {args.head} are the same file: give two different runs or commits")]
        for r in rows:  # nothing was judged: no row reads "ok"
            r.compared = False
    settings = (f"latency threshold per param max({args.factor}, 1 + {args.noise_k} x spread of its rounds"
                f"{' or stored history' if args.history else ''}), Mann-Whitney alpha {args.alpha}; accuracy: "
                f"{'tolerances ' + tol.name + ' and ' if tol else ''}growth > {args.acc_factor}x")
    bad = _gating(rows, args.allow_missing)
    notes = side_notes(base, head)
    what = f"BASE {bsrc} vs HEAD {hsrc}: {compared_count(rows)} (backend, case, metric) value(s) compared"
    if args.format == "markdown":
        console.print(render_markdown(rows, base_src=bsrc, head_src=hsrc, settings=settings,
                                      allow_missing=args.allow_missing, plots=args.plots, notes=notes),
                      markup=False, highlight=False, soft_wrap=True)
        return EXIT_REGRESSION if bad else EXIT_OK
    render_text(rows, f"gate: BASE {bsrc}  vs  HEAD {hsrc}  ({settings})", console, show_all=args.all)
    if args.plots:
        console.print(f"plots: {args.plots}", highlight=False, markup=False)
    for n in notes:
        console.print(f"note: {n}", highlight=False, markup=False, soft_wrap=True)
    if bad:
        console.print(f"[bold red]GATE FAILED[/bold red]: {_verdict_counts(bad)}; {what}", highlight=False,
                      soft_wrap=True)
        return EXIT_REGRESSION
    console.print(f"[green]GATE PASSED[/green]: {what}", highlight=False, soft_wrap=True)
    return EXIT_OK


def add_parser(subparsers) -> None:
    from mla_fp8_bench.argtypes import ascii_float

    p = subparsers.add_parser("gate", help="PR gate: HEAD vs BASE (accuracy vs tolerances, latency with statistics)",
                              description="Compare HEAD with BASE per (backend, case, metric): accuracy against "
                                          "calibrated tolerances, latency with a noise-aware threshold.",
                              epilog="Exit status: 0 passed, 1 a REGRESSION, FAILED, INVALID, LOST or nothing "
                                     "compared, 2 bad usage.")
    p.add_argument("base", metavar="BASE", help="run JSON, asv result file, or commit hash (prefix) in --results-dir")
    p.add_argument("head", metavar="HEAD", help="run JSON, asv result file, or commit hash (prefix) in --results-dir")
    p.add_argument("--results-dir", default="results", help="asv results directory (default: results)")
    p.add_argument("--machine", help="asv machine name (default: the only one in --results-dir, or the only one "
                   "holding both commits)")
    p.add_argument("--env", help="substring of the asv environment name when a commit has several")
    p.add_argument("--factor", type=ascii_float, default=DEFAULT_FACTOR, help="latency/resource growth factor (1.05)")
    p.add_argument("--acc-factor", type=ascii_float, default=DEFAULT_ACC_FACTOR,
                   help="accuracy growth factor over BASE (2.0, the calibration margin)")
    p.add_argument("--alpha", type=ascii_float, default=DEFAULT_ALPHA, help="Mann-Whitney significance level (0.01)")
    p.add_argument("--noise-k", type=ascii_float, default=DEFAULT_NOISE_K,
                   help=f"latency threshold per param: max(--factor, 1 + k x spread) (default k {DEFAULT_NOISE_K})")
    p.add_argument("--history", action="store_true",
                   help="for params without rounds, take the spread from the machine's stored results in "
                        "--results-dir (same benchmark version, at least 3 values)")
    p.add_argument("--tolerances", help="calibrated tolerance JSON (e.g. tolerances/cpu-emulated-v1.json)")
    p.add_argument("--all", action="store_true", help="show every compared row, not only notable ones")
    p.add_argument("--format", choices=("text", "markdown"), default="text",
                   help="text (terminal) or markdown (a PR comment / Buildkite annotation)")
    p.add_argument("--plots", metavar="PATH_OR_URL", help="where the plots of this run are (printed in the summary)")
    p.add_argument("--gate-call-latency", "--gate-host-latency", dest="gate_call_latency", action="store_true",
                   help="also gate host-side latencies (host-inclusive call latency, planner time); "
                        "informational by default")
    p.add_argument("--allow-missing", action="store_true",
                   help="list (backend, case) results that BASE had and HEAD lost without failing the gate")
    p.add_argument("--allow-cross-machine", action="store_true",
                   help="compare BASE and HEAD from different machines (refused by default: exit 2)")
    p.set_defaults(handler=cmd_gate)
