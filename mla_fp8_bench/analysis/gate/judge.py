"""The gate's verdict per (backend, case, metric): one latency rule, one accuracy rule, resources and lost
results (the rules: :mod:`mla_fp8_bench.analysis.gate`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from mla_fp8_bench.analysis.gate.load import JUDGED_KINDS, Side, Value
from mla_fp8_bench.analysis.stats import DEFAULT_NOISE_K, latency_ratio, mode_mean
from mla_fp8_bench.analysis.tolerances import Tolerances, tolerance_key
from mla_fp8_bench.measure.clocks import OFF_PLATEAU_REL
from mla_fp8_bench.measure.metric_table import ASV_ACCURACY_FLOOR, DEFAULT_ACC_FACTOR, DEFAULT_FACTOR, Metric, metric
from mla_fp8_bench.terminal import fmt_seconds

#: Accuracy growth below this absolute change is never a regression (values within rounding of 0).
ACC_ABS_FLOOR = 1e-6
#: Verdicts that fail (LOST not with ``--allow-missing``).
GATING = ("REGRESSION", "FAILED", "INVALID", "LOST", "NOTHING COMPARED")
_LATENCY = ("kernel_latency", "host_latency")


@dataclass
class Options:
    factor: float = DEFAULT_FACTOR  # latency and resource growth that fails
    acc_factor: float = DEFAULT_ACC_FACTOR  # accuracy growth that fails where no tolerance covers the value
    noise_k: float = DEFAULT_NOISE_K
    tolerances: Tolerances | None = None
    gate_host_latency: bool = False  # call latency and planner time gate too
    interleaved: bool = False  # ``ab``: both sides share the machine's state, so time is gated, never cycles


@dataclass
class Row:
    backend: str
    case: str
    metric: str
    base: str
    head: str
    verdict: str  # GATING, or ok | improved | new | info | not comparable
    ratio: str = "-"
    detail: str = ""
    judged = property(lambda self: self.verdict in ("ok", "improved", "REGRESSION"), doc="HEAD's value was judged")


def _shown(x: Value | None, m: Metric) -> str:
    if x is None or x.status != "ok":
        return x.status if x is not None else "-"
    if m.kind in _LATENCY and all(math.isfinite(v) and v > 0 for v in x.values):
        return fmt_seconds(mode_mean(x.values)) + (f" ({len(x.values)})" if len(x.values) > 1 else "")
    return "0" if m.floor is not None and x.center <= m.floor else f"{x.center:.4g}"


def _ratio(bv: float, hv: float, against: float) -> str:
    """HEAD / BASE with as many decimals (3 to 6) as it takes to differ from ``against``; ``0 -> x`` from 0."""
    if not (math.isfinite(bv) and math.isfinite(hv)) or (bv <= ASV_ACCURACY_FLOOR and hv <= bv):
        return "-"
    if bv <= ASV_ACCURACY_FLOOR:  # an exact 0, stored floored: a ratio against it means nothing
        return f"0 -> {hv:.4g}"
    return next((t for d in (3, 4, 5, 6) if float(t := f"{hv / bv:.{d}f}") != against), repr(hv / bv)) + "x"


def _impossible(m: Metric, *values: Value | None) -> str:
    """Why a value cannot be judged: null, not finite, out of bounds (a HEAD error that is not finite is judged:
    over every limit); "" when none."""
    for side, x in zip(("BASE", "HEAD"), values):
        if x is not None and x.status == "missing":
            return f"{m.record_key} is null on {side}"
        for v in (x.center, *x.values) if x is not None and x.status == "ok" else ():
            if not (side == "HEAD" and m.kind == "accuracy" and not math.isfinite(v)) and not (
                    m.possible(v) and math.isfinite(v)):
                return f"impossible value {v:.4g} on {side} (possible: {m.bounds_text})"
    return ""


def _grown(row: Row, bv: float, hv: float, limit: float, floor: float = 0.0) -> None:
    row.ratio = _ratio(bv, hv, limit)
    grew = not math.isfinite(hv) or (hv > bv * limit and hv - bv > floor)
    row.verdict = "REGRESSION" if grew else "improved" if hv < bv / limit else "ok"
    row.detail = f"grew beyond {limit}x over BASE" if grew else ""


def _accuracy(row: Row, m: Metric, bm: Value | None, hm: Value, opts: Options) -> None:
    """Over its tolerance (calibrated; 0 for a count that must be 0), else grown beyond ``acc_factor``."""
    tol, b_ok = None, bm is not None and bm.status == "ok"
    if m.gate == "zero":
        tol = (0.0, "must be 0")
    elif opts.tolerances is not None and m.calibrated:
        lim, how = opts.tolerances.lookup(row.backend, tolerance_key({"backend": row.backend, "case": row.case}))
        tol = (float(lim[m.record_key]), how.split(" (")[0]) if lim and m.record_key in lim else None
    if tol is not None:
        over = not hm.center <= tol[0]
        row.verdict = "REGRESSION" if over else "ok"
        row.ratio = _ratio(bm.center, hm.center, opts.acc_factor) if b_ok else "-"
        row.detail = f"{hm.center:.4g} {'>' if over else '<='} tolerance {tol[0]:.4g} ({tol[1]})"
    elif b_ok:
        _grown(row, bm.center, hm.center, opts.acc_factor, ACC_ABS_FLOOR)
    else:
        row.verdict = "new"
    if b_ok and bm.version != hm.version:
        row.detail = "; ".join(x for x in (row.detail, "benchmark version changed") if x)


def _figure(base: Side, head: Side, key: tuple[str, str, str], opts: Options) -> tuple[str, Value, Value]:
    """``SM cycles`` where a ``latency_s`` param's SM clock is off its side's plateau (power-capped), not in ab."""
    clocks = [(s.data.get((*key[:2], "sm_clock_mhz")), s.plateau) for s in (base, head)]
    cb, ch = (s.data.get((*key[:2], "latency_sm_cycles")) for s in (base, head))
    if key[2] == "latency_s" and not opts.interleaved and cb and ch and cb.status == ch.status == "ok" and any(
            x is not None and x.status == "ok" and p and x.center < p * (1 - OFF_PLATEAU_REL) for x, p in clocks):
        return "SM cycles", cb, ch
    return "time", base.data[key], head.data[key]


def _latency(row: Row, m: Metric, scope: str, fig: tuple[str, Value, Value], opts: Options) -> None:
    name, gb, gh = fig
    if why := _impossible(m, gb, gh):
        row.verdict, row.detail = "INVALID", why
        return
    ratio, thr, se = latency_ratio(gb.values, gh.values, opts.factor, opts.noise_k)
    row.ratio = _ratio(mode_mean(gb.values), mode_mean(gh.values), thr)
    if scope:
        row.verdict, row.detail = "info", scope
        return
    if name != "time":
        row.base, row.head = (f"{mode_mean(x.values):.4g} cycles" for x in (gb, gh))
    row.verdict = "REGRESSION" if ratio > thr else "improved" if ratio < 1 / thr else "ok"
    row.detail = (f"threshold {thr:.3f} (se {se:.2%} over {len(gb.values)}/{len(gh.values)} values)"
                  + (f"; gated on {name} (SM clock off its plateau)" if name != "time" else ""))


def _scope(key: tuple[str, str, str], m: Metric, base: Side, head: Side, opts: Options) -> str:
    """Why a latency is informational ("" when it gates)."""
    why = "" if m.kind not in _LATENCY else "an emulation's host time, not a kernel's" if key[:2] in (
        base.emulated | head.emulated) else "CPU host time, not a kernel's" if base.cpu or head.cpu else \
        "host-side latency (--gate-call-latency gates it)" if m.kind == "host_latency" and not opts.gate_host_latency \
        else ""
    return why and f"{why}: informational"


def judge_one(key: tuple[str, str, str], base: Side, head: Side, opts: Options) -> Row | None:
    """The row of one (backend, case, metric); None where HEAD holds no value that BASE held and gates."""
    m = metric(key[2])
    bm, hm = base.data.get(key), head.data.get(key)
    row = Row(*key, _shown(bm, m), _shown(hm, m), "")
    b_ok, scope = bm is not None and bm.status == "ok", _scope(key, m, base, head, opts)
    if hm is None or hm.status != "ok":
        if not b_ok or scope:
            return None
        row.verdict = "FAILED" if hm is not None and hm.status == "failed" else "LOST"
        row.detail = f"{'absent' if hm is None else hm.status} on HEAD, measured on BASE"
    elif m.kind not in _LATENCY and _impossible(m, bm, hm):
        row.verdict, row.detail = "INVALID", _impossible(m, bm, hm)
    elif m.kind == "accuracy":
        _accuracy(row, m, bm, hm, opts)
    elif not b_ok:
        row.verdict = "new"
    elif bm.version != hm.version:
        row.verdict, row.detail = "not comparable", f"benchmark version {bm.version} -> {hm.version}"
    elif m.kind == "resource":
        _grown(row, bm.center, hm.center, opts.factor)
    else:
        _latency(row, m, scope, _figure(base, head, key, opts), opts)
    return row


def compare(base: Side, head: Side, opts: Options) -> list[Row]:
    """A row per (backend, case) lost on HEAD, then per judged (backend, case, metric); NOTHING COMPARED if none."""
    rows, lost = [], set()
    for key in sorted(base.params.keys() | head.params.keys()):
        (bs, _), (hs, why) = (s.params.get(key, ("absent", "")) for s in (base, head))
        if bs == "ok" and hs != "ok":
            lost.add(key)
            rows.append(Row(*key, "-", "ok", hs, "FAILED" if hs == "failed" else "LOST",
                            detail=f"ok on BASE, {hs} on HEAD" + (f": {why}" if why else "")))
    for key in sorted(base.data.keys() | head.data.keys()):
        if key[:2] not in lost and metric(key[2]).kind in JUDGED_KINDS:
            rows += [r for r in [judge_one(key, base, head, opts)] if r is not None]
    if not any(r.judged for r in rows):
        why = ("BASE holds no results" if not base.params else "HEAD holds no results" if not head.params
               else "no value of HEAD could be judged against BASE or a tolerance")
        rows.append(Row("*", "*", "-", f"{len(base.data)} value(s)", f"{len(head.data)} value(s)",
                        "NOTHING COMPARED", detail=why + f" ({counts(rows) or 'no rows'})"))
    return rows


def counts(rows: list[Row]) -> str:  # "verdict n" per verdict, sorted
    return ", ".join(f"{v} {n}" for v, n in sorted(Counter(r.verdict for r in rows).items()))


def failing(rows: list[Row], allow_missing: bool = False) -> list[Row]:
    return [r for r in rows if r.verdict in GATING and not (allow_missing and r.verdict == "LOST")]
