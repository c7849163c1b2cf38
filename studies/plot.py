"""Draws the README's pictures (``docs/img/*-sweep.png``, each a ``<device>-summary.png``) and the other
figures per device: ``python studies/plot.py INPUT... --out DIR [--format png,svg]`` (needs matplotlib).

  python studies/plot.py studies/results/h200_sweep.json studies/results/h200_emulated.json --out /tmp/img
  python studies/plot.py results --machine cpu-2core --format png --out /tmp/img

INPUT: a run JSON (``run --json``, optionally with ``ceilings``) or an asv results / machine directory
(newest commit unless ``--commit``). Per device: ``<slug>-latency`` (median, IQR bars; kernel and
emulation on separate panels), ``<slug>-error`` (max |out - ref| vs the fp8 and the bf16 reference),
``<slug>-tflops`` (with GEMM ceilings / datasheet peaks when present), ``<slug>-summary`` (all panels).
Only single-sequence cases (``s<N>``) of one variant are drawn against seq_len; the rest is "not plotted".
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import math
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.harness import results as R
from mla_fp8_bench.jsonio import finite_number, json_number, load_json, write_file_atomic
from mla_fp8_bench.measure import metric_table as MT
from mla_fp8_bench.problem.cases import CaseError, parse_case_id
from mla_fp8_bench.problem.shapes import QK_HEAD_DIM, V_HEAD_DIM

#: Formats ``--format`` accepts.
FORMATS = ("png", "svg")
#: Floor for error values on log axes (asv floors its tracks at 1e-12 too).
ERROR_FLOOR = MT.ASV_ACCURACY_FLOOR
#: Latency panels: kernel and emulation latency never share an axis (an emulation's time is PyTorch code).
LATENCY_SCOPES = ("kernel", "emulation")


class PlotError(ValueError):
    """Bad plot input (missing, corrupt, unknown machine/commit, nothing plottable); names the problem."""


@dataclass
class Point:
    """One (backend, case) measurement placed on the seq_len axis: latencies in seconds (median, IQR),
    max-abs errors in output units against the fp8 / bf16 reference, throughput in TFLOP/s."""

    backend: str
    case: str
    seq_len: int
    latency_s: float | None = None
    latency_q25: float | None = None
    latency_q75: float | None = None
    err_fp8: float | None = None
    err_bf16: float | None = None
    tflops: float | None = None
    emulation: bool = False
    fp8: bool = True
    variant: str = ""  # the case id's suffixes after s<N>


@dataclass
class Dataset:
    """One device's measurements: everything one figure set shows."""

    device: str  # shown in titles, e.g. "NVIDIA H200 (sm_90)" or "machine cpu-2core (CPU)"
    slug: str
    source: str
    latency_desc: str
    points: list[Point] = field(default_factory=list)
    ceilings: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    variant: str = ""
    is_cpu: bool = False


# ------------------------------------------------------------------------------------- readers
_LATENCY_DESC = {"host": "host wall-clock", "graph": "device time, CUDA/HIP graph replay",
                 "events": "device time, events"}
_LAT = MT.metric("latency")
_ERR8 = MT.metric("max_abs_error")
_ERR16 = MT.metric("max_abs_error_bf16_ref")
_TFLOPS = MT.metric("tflops")
_SPP = MT.metric("seconds_per_pflop")
_EMU_LAT = MT.metric("emulation_latency")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "device"


def _point(ds: Dataset, b: str, cid: str, **values: Any) -> Point | None:
    """Append the :class:`Point` of a single-sequence case ``s<N><variant>`` (grammar :func:`parse_case_id`)
    to ``ds.points``; for any other case None and a note in ``ds`` saying why it is not drawn."""
    try:
        case = parse_case_id(cid)
    except CaseError as exc:
        ds.notes.append(f"{b} {cid}: case id not recognised by this suite version ({str(exc).split(':')[0]})")
        return None
    base = f"s{case.seq_lens[0]}"
    if case.batch_size != 1 or not cid.startswith(base):
        ds.notes.append(f"{b} {cid}: not a single-sequence case (not on the seq_len axis)")
        return None
    ds.points.append(Point(b, cid, case.seq_lens[0], variant=cid[len(base):], **values))
    return ds.points[-1]


def _select_variant(ds: Dataset, wanted: str | None) -> None:
    """Keep one case variant in ``ds`` (default: the plain ids, else the most frequent); PlotError if
    ``wanted`` has no points."""
    by: dict[str, list[Point]] = collections.defaultdict(list)
    for p in ds.points:
        by[p.variant].append(p)
    if wanted is None:
        w = "" if "" in by or not by else max(by, key=lambda k: (len(by[k]), k))
    elif (w := wanted if (wanted == "" or wanted.startswith("-")) else "-" + wanted) not in by:
        have = ", ".join(repr(k or "(plain)") for k in sorted(by)) or "none"
        raise PlotError(f"case variant {wanted!r} has no single-sequence results here: variants present {have}")
    ds.variant, ds.points = w, by.get(w, [])


def load_run_json(path: Path, variant: str | None = None) -> Dataset:
    """A :class:`Dataset` from a ``run --json`` file; PlotError: unreadable, not a run JSON (an asv result
    file is pointed at its directory), a malformed record, an unknown ``variant``."""
    from mla_fp8_bench.backends import record_is_fp8

    try:
        data = load_json(path, "run JSON", PlotError,
                         "it may be truncated - re-run `mla-fp8-bench run --json` (it writes atomically)")
        if isinstance(data, dict) and "records" not in data and "result_columns" in data:
            raise PlotError(f"{path} is one asv result file: pass its results directory "
                            f"({path.parent.parent}) or machine directory ({path.parent}) instead")
        doc = R.run_doc_from_data(data, path)
    except R.ResultsError as exc:
        raise PlotError(str(exc)) from None
    env = doc.env
    name, arch, host = env.get("device_name") or "unknown device", env.get("arch") or "?", env.get("hostname")
    is_cpu = env.get("vendor") == "cpu" or arch == "cpu"
    device = (f"CPU ({name}" + (f", host {host}" if host else "") + ")") if is_cpu else f"{name} ({arch})"
    methods = sorted({str(r["latency_method"]) for r in doc.records if r.get("latency_method")})
    ds = Dataset(device=device, slug=_slug("cpu-" + name if is_cpu else name), source=str(path),
                 latency_desc=", ".join(_LATENCY_DESC.get(m, m) for m in methods) or "latency",
                 ceilings=doc.ceilings, is_cpu=is_cpu)
    for r in doc.records:
        b, cid, st = r["backend"], r["case"], r.get("status")
        if st != "ok":
            ds.notes.append(f"{b} {cid}: {st} - {r.get('reason', '')}".rstrip(" -"))
            continue
        emu = MT.record_is_emulation(r)
        p = _point(ds, b, cid, latency_s=finite_number(r.get(_LAT.record_key)),
                   err_fp8=finite_number(r.get(_ERR8.record_key)), err_bf16=finite_number(r.get(_ERR16.record_key)),
                   tflops=None if emu else finite_number(r.get(_TFLOPS.record_key)), emulation=emu,
                   fp8=record_is_fp8(r) is not False)
        if p is None:
            continue
        for key in (_ERR8.record_key, _ERR16.record_key, _LAT.record_key):  # stored but not drawable: named
            v, x = r.get(key), json_number(r.get(key))
            if v is not None and x is None:
                ds.notes.append(f"{b} {cid}: {key} is {v!r:.40}, not a number; not drawn")
            elif x is not None and not math.isfinite(x):
                ds.notes.append(f"{b} {cid}: {key} is {v} (non-finite output), not drawn")
        stored = r.get(_LAT.samples_key)
        samples = [x for x in (stored if isinstance(stored, list) else []) if finite_number(x) is not None]
        if len(samples) >= 2:
            p.latency_q25, _, p.latency_q75 = statistics.quantiles(samples, n=4, method="inclusive")
    _select_variant(ds, variant)
    return ds


def load_asv_machine(mdir: Path, commit: str | None = None, variant: str | None = None) -> Dataset:
    """A :class:`Dataset` from one asv machine directory (newest commit unless ``commit``); PlotError:
    corrupt/missing files (named), unknown commit, no ``MLAPrefill.track_latency`` results."""
    from mla_fp8_bench.backends import backend_flag

    try:
        mj = R.load_machine(mdir)
        res = R.newest_result(mdir, commit)
        tables = []  # per metric: (backend, case) -> measurement of MLAPrefill.<track>
        for m in (_LAT, _ERR8, _ERR16, _SPP, _EMU_LAT):
            names = [n for n in res.results if n.endswith(f".MLAPrefill.{m.track}")]
            tables.append({x.params: x for x in res.measurements(names[0]).values() if len(x.params) == 2}
                          if names else {})
    except R.ResultsError as exc:
        raise PlotError(str(exc)) from None
    lat, e8, e16, spp, emu_lat = tables
    e8, e16, spp = ({k: finite_number(x.value) for k, x in t.items()} for t in (e8, e16, spp))
    if not lat:
        raise PlotError(f"asv result file {res.path} has no MLAPrefill.track_latency results: not this suite's "
                        "results (benchmarks/bench_mla_prefill.py)")
    gpu = mj.get("gpu")
    has_gpu = bool(gpu) and not R.is_cpu_machine(mj)
    hw = gpu if has_gpu else f"CPU: {mj.get('cpu') or mj.get('arch') or '?'}"
    ds = Dataset(device=f"machine {mj['machine']} ({hw}), commit {res.commit_hash[:8]}",
                 slug=_slug(f"asv-{mj['machine']}"), source=str(res.path),
                 latency_desc="asv track_latency" + (" (device time)" if has_gpu else " (host time)"),
                 is_cpu=not has_gpu)
    for b, c in dict.fromkeys([*lat, *emu_lat]):
        emu = bool(backend_flag(b, "emulation"))
        # an emulation's time has its own track (results stored before it had one: track_latency)
        tracks = (emu_lat.get((b, c)), lat.get((b, c))) if emu else (lat.get((b, c)),)
        m = next((x for x in tracks if x is not None and x.status != "skipped"), None)
        if m is None:  # a skip: not available on this machine / beyond its cap
            continue
        if m.status == "failed":
            ds.notes.append(f"{b} {c}: failed in asv (null)")
        else:
            s = spp.get((b, c))
            _point(ds, b, c, latency_s=finite_number(m.value), latency_q25=m.q25, latency_q75=m.q75,
                   err_fp8=e8.get((b, c)), err_bf16=e16.get((b, c)),
                   tflops=(1e3 / s) if (s and not emu) else None, emulation=emu,
                   fp8=backend_flag(b, "fp8") is not False)
    _select_variant(ds, variant)
    ds.notes.append("ceilings: not stored in asv results (plot a run JSON with `ceilings` for the lines)")
    return ds


def load_inputs(inputs: list[str], *, machines: list[str] | None = None, commit: str | None = None,
                variant: str | None = None) -> list[Dataset]:
    """Every INPUT (run JSON or asv results directory) as datasets; of several machines, one without
    results is skipped (named in the first dataset's notes). PlotError: missing/corrupt input, unknown
    machine or commit, no asv machines in a directory."""
    out: list[Dataset] = []
    skipped_empty: list[str] = []
    seen_machines: set[str] = set()  # non-empty once a results directory was read
    for path in map(Path, inputs):
        if path.is_dir():
            try:
                mdirs = R.machine_dirs(path)
            except R.ResultsError as exc:
                raise PlotError(str(exc)) from None
            if not mdirs:
                raise PlotError(f"{path} is a directory but not an asv results directory: no "
                                "<machine>/machine.json inside (and no machine.json in it)")
            seen_machines.update(m.name for m in mdirs)
            mdirs = [m for m in mdirs if not machines or m.name in machines]
            for m in mdirs:
                if not R.list_result_files(m) and len(mdirs) > 1 and not machines:
                    skipped_empty.append(f"{m} (machine.json only, no results yet)")
                    continue  # one runner without results must not stop the others' plots
                out.append(load_asv_machine(m, commit, variant))
        elif path.is_file():
            out.append(load_run_json(path, variant))
        else:
            raise PlotError(f"input {path} does not exist: give a run JSON (`mla-fp8-bench run --json`) or an asv "
                            "results directory")
    if machines and not seen_machines:
        raise PlotError("--machine selects machines of an asv results directory, but no directory was given")
    if unknown := [m for m in machines or [] if m not in seen_machines]:
        raise PlotError(f"machine {', '.join(map(repr, unknown))} is not in the given results: machines present "
                        f"{', '.join(sorted(seen_machines)) or 'none'}")
    if skipped_empty:
        if not out:
            raise PlotError("no results to plot: " + "; ".join(skipped_empty))
        out[0].notes.extend(f"machine skipped: {e}" for e in skipped_empty)
    counts = collections.Counter(ds.slug for ds in out)
    used: set[str] = set()
    for ds in out:  # two inputs from one device: tell their files apart by the input's name
        base = ds.slug if counts[ds.slug] == 1 else f"{ds.slug}-{_slug(Path(ds.source).stem)}"
        ds.slug = next(s for s in (base, *(f"{base}-{n}" for n in range(2, len(out) + 2))) if s not in used)
        used.add(ds.slug)
    return out


# ------------------------------------------------------------------------------------- drawing
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_OFF_GRID_NOTE = "unconnected markers: lengths off the power-of-two sweep (q-tile edges 255/257, s8175, ...)"


def backend_styles(names: list[str]) -> dict[str, dict[str, Any]]:
    """``{backend: {"color": ..., "marker": ...}}`` in registry order, so figures of several devices agree."""
    import matplotlib

    from mla_fp8_bench.backends import backend_names

    order = backend_names()
    order += sorted(n for n in names if n not in order)
    cmap = matplotlib.colormaps["tab10"]
    return {n: {"color": cmap(i % 10), "marker": _MARKERS[i % len(_MARKERS)]} for i, n in enumerate(order)}


def _series(points: list[Point]) -> dict[str, list[Point]]:
    ordered = sorted(points, key=lambda p: (p.backend, p.seq_len))
    return {b: list(g) for b, g in itertools.groupby(ordered, key=lambda p: p.backend)}


def _on_grid(x: int) -> bool:  # power-of-two lengths: the sweep's, joined by lines
    return x > 0 and x & (x - 1) == 0


def _draw_series(ax, b: str, style: dict[str, Any], pts: list[Point], ys: list[float], emu: bool = False,
                 yerr=None) -> bool:
    """``ys`` over the seq_len of ``pts`` (an emulation dashed, hollow): a line through the sweep points,
    unconnected markers for the others (no zig-zag); True if off-sweep points were drawn."""
    xs = [p.seq_len for p in pts]
    on = [i for i, x in enumerate(xs) if _on_grid(x)]
    off = [i for i, x in enumerate(xs) if not _on_grid(x)]
    if len(on) < 2:  # no sweep to join: join everything
        on, off = list(range(len(xs))), []
    color = style["color"]
    for idx, ls, lab, ms in ((on, "--" if emu else "-", _label(b, emu), 6), (off, "none", None, 5)):
        if not idx:
            continue
        kw = dict(color=color, linestyle=ls, marker=style["marker"], markerfacecolor="white" if emu else color,
                  markersize=ms, linewidth=1.6, label=lab)
        px, py = [xs[i] for i in idx], [ys[i] for i in idx]
        if yerr is not None:
            ax.errorbar(px, py, yerr=[[yerr[0][i] for i in idx], [yerr[1][i] for i in idx]], capsize=2, **kw)
        else:
            ax.plot(px, py, **kw)
    return bool(off)


def _finish(ax, ds: Dataset, ylabel: str, title: str, notes: list[str], **title_kw: Any) -> None:
    """The seq_len axis (log 2, sweep lengths labelled), labels, and grey notes under the x-axis label."""
    from matplotlib.ticker import FixedLocator, NullLocator, StrMethodFormatter

    ax.set_xscale("log", base=2)
    ticks = sorted({p.seq_len for p in ds.points})
    if ticks:  # label the sweep only: 255/256/257 or 8175/8192 labels would print over each other
        ax.xaxis.set_major_locator(FixedLocator([x for x in ticks if _on_grid(x)] or ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:.0f}"))  # the numbers of the case ids (s1024)
    ax.set_xlabel("seq_len (tokens per sequence, causal prefill)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="y", alpha=0.12)
    ax.set_ylabel(ylabel)
    ax.set_title(title, **title_kw)
    if notes:
        ax.annotate("\n".join(notes), xy=(0.0, 0.0), xycoords="axes fraction", xytext=(0, -34),
                    textcoords="offset points", ha="left", va="top", fontsize=7.5, color="0.3")


def _label(b: str, emu: bool) -> str:
    return f"{b}  (EMULATION: PyTorch model, not kernel time)" if emu else b


def _log_y(ax, formatter=None) -> None:
    """Log y axis, labelled at 1 and 3 per decade when the data spans <= 3 decades, else 1 per decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 0
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0) if decades <= 3 else (1.0,)))
    ax.yaxis.set_major_formatter(formatter or FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 100 else f"{x:.3g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def latency_scopes(ds: Dataset) -> list[str]:
    """The latency panels ``ds`` needs: ``kernel`` and/or ``emulation`` (``["kernel"]`` when it has none)."""
    have = {("emulation" if p.emulation else "kernel") for p in ds.points if p.latency_s}
    return [s for s in LATENCY_SCOPES if s in have] or ["kernel"]


def draw_latency(ax, ds: Dataset, st: dict[str, dict[str, Any]], scope: str = "kernel") -> list[str]:
    """Latency vs seq_len of one ``scope`` (``kernel`` or ``emulation``); ValueError for another."""
    from matplotlib.ticker import EngFormatter

    if scope not in LATENCY_SCOPES:
        raise ValueError(f"latency scope {scope!r} is unknown: allowed {', '.join(LATENCY_SCOPES)}")
    emu = scope == "emulation"
    drawn, off = [], False
    for b, pts in _series(ds.points).items():
        if not (pts := [p for p in pts if p.latency_s and p.emulation == emu]):
            continue
        ys = [p.latency_s for p in pts]
        lo = [max(0.0, y - (p.latency_q25 if p.latency_q25 is not None else y)) for p, y in zip(pts, ys)]
        hi = [max(0.0, (p.latency_q75 if p.latency_q75 is not None else y) - y) for p, y in zip(pts, ys)]
        off |= _draw_series(ax, b, st[b], pts, ys, emu, yerr=[lo, hi])
        if emu:
            ax.annotate("emulation", (pts[-1].seq_len, ys[-1]), textcoords="offset points", xytext=(-4, 6), ha="right",
                        fontsize=8, color=st[b]["color"], style="italic")
        drawn.append(b)
    if drawn:
        _log_y(ax, EngFormatter(unit="s"))
    else:
        ax.text(0.5, 0.5, "no latency to show", transform=ax.transAxes, ha="center", color="0.4")
    title = ("EMULATION latency vs seq_len (PyTorch model of the kernel;\nnot kernel time, never compared)" if emu
             else "Latency vs seq_len (log-log, lower is better)")
    _finish(ax, ds, f"{_LAT.pretty_name} per call (median; bars: IQR)", title,
            [f"timing: {ds.latency_desc}" + ("; CPU host time of PyTorch code, not GPU kernel times" if ds.is_cpu
                                             else "")] + ([_OFF_GRID_NOTE] if off else []),
            **({"fontsize": 10} if emu else {}))
    return drawn


_REFS = {
    "err_fp8": (_ERR8, "the kernel's own error: q/k/v rounding to fp8 cancels"),
    "err_bf16": (_ERR16, "end-to-end error of going FP8 (includes fp8 input rounding)"),
}


def draw_error(ax, ds: Dataset, st: dict[str, dict[str, Any]], attr: str = "err_fp8") -> list[str]:
    """max |out - ref| against one reference (``attr``: ``err_fp8``/``err_bf16``), floored at ERROR_FLOOR."""
    drawn, left_out, floored, off = [], [], False, False
    for b, pts in _series(ds.points).items():
        emu = any(p.emulation for p in pts)
        if attr == "err_fp8" and not all(p.fp8 for p in pts):
            left_out.append(b)  # a bf16 baseline never saw the fp8 inputs: its error here is meaningless
            continue
        if not (sel := [p for p in pts if getattr(p, attr) is not None]):
            continue
        floored |= any(getattr(p, attr) < ERROR_FLOOR for p in sel)
        off |= _draw_series(ax, b, st[b], sel, [max(getattr(p, attr), ERROR_FLOOR) for p in sel], emu)
        drawn.append(b)
    _log_y(ax)
    m, what = _REFS[attr]
    _finish(ax, ds, "max |out - ref| (absolute, output units)",
            f"{m.pretty_name[:1].upper()}{m.pretty_name[1:]}\n({what}; lower is better)",
            ([f"values below {ERROR_FLOOR:g} drawn at {ERROR_FLOOR:g}"] if floored else [])
            + ([f"not shown: {', '.join(left_out)} (bf16 baseline: it never sees the fp8 inputs)"] if left_out else [])
            + ([_OFF_GRID_NOTE] if off else []), fontsize=10)
    return drawn


def _ceiling_lines(ds: Dataset) -> tuple[list[tuple[str, float, str, str]], list[str]]:
    """(label, TFLOP/s, color, linestyle) lines and text notes from ``ds.ceilings``."""
    c = ds.ceilings
    if not isinstance(c, dict):
        return [], ["no measured ceilings or datasheet peaks in this input"]
    if c.get("status") not in (None, "ok"):
        return [], [f"ceilings not measured: {c.get('reason') or c.get('status')}"]
    peaks = c.get("datasheet") if isinstance(c.get("datasheet"), dict) else {}
    lines, notes = [], []
    for src, key, lab, col, ls in ((c, "fp8_gemm_tflops", "FP8 GEMM measured", "tab:red", "--"),
                                   (c, "bf16_gemm_tflops", "bf16 GEMM measured", "tab:purple", "--"),
                                   (peaks, "fp8", "FP8 datasheet peak", "tab:red", ":"),
                                   (peaks, "bf16", "bf16 datasheet peak", "tab:purple", ":")):
        if v := finite_number(src.get(key)):
            lines.append((f"{lab} {v:,.0f} TFLOP/s", v, col, ls))
    if cp := finite_number(c.get("copy_tb_s")):
        hbm = finite_number(peaks.get("hbm_tb_s"))
        notes.append(f"copy bandwidth measured {cp:.2f} TB/s" + (f" (datasheet {hbm:g} TB/s)" if hbm else ""))
    if not lines:
        notes.append("ceilings present but without TFLOP/s values")
    return lines, notes


def draw_tflops(ax, ds: Dataset, st: dict[str, dict[str, Any]]) -> list[str]:
    """TFLOP/s vs seq_len of the kernels (emulations left out) with the ceiling lines of ``ds``."""
    drawn, off = [], False
    for b, pts in _series(ds.points).items():
        if sel := [p for p in pts if p.tflops and not p.emulation]:
            off |= _draw_series(ax, b, st[b], sel, [p.tflops for p in sel])
            drawn.append(b)
    lines, notes = _ceiling_lines(ds)
    handles = [ax.axhline(v, color=col, linestyle=ls, linewidth=1.1, label=lab) for lab, v, col, ls in lines]
    ys_all = [p.tflops for p in ds.points if p.tflops and not p.emulation] + [v for _, v, _, _ in lines]
    if handles:  # labelled in a legend of their own: close values would overprint inline
        ax.legend(handles=handles, loc="lower right", fontsize=7, title="ceilings (dashed: measured here, "
                  "dotted: datasheet)", title_fontsize=7, framealpha=0.9)
    emus = sorted({p.backend for p in ds.points if p.emulation})
    notes += ([_OFF_GRID_NOTE] if off else []) + (
        [f"not shown: {', '.join(emus)} (an emulation's throughput is not a kernel's)"] if emus else [])
    if ys_all:
        ax.set_yscale("log")
        ax.set_ylim(min(ys_all) / 2.5, max(ys_all) * 2.5)
        _log_y(ax)
    else:
        ax.text(0.5, 0.5, "no kernel throughput to show", transform=ax.transAxes, ha="center", color="0.4")
    _finish(ax, ds, f"{_TFLOPS.unit} (causal FLOPs = 320·H·S², higher is faster)",
            "Throughput vs seq_len (informational)", notes)
    return drawn


def _variant_text(ds: Dataset) -> str:
    """The case shape shared by the plotted points, from the case-id grammar (:func:`parse_case_id`)."""
    if not ds.points:
        return f"variant {ds.variant or '(plain)'}"
    case = parse_case_id(ds.points[0].case)
    quant = {"per_tensor": "per-tensor fp8", "cast": "cast quant"}.get(case.quant, case.quant)
    text = f"{case.num_heads} heads, d_qk={QK_HEAD_DIM}, d_v={V_HEAD_DIM}, {quant}"
    if case.dist != "normal":
        text += f", {case.dist} inputs"
    if case.seed:
        text += f", seed {case.seed}"
    return text + (f" (ids s<N>{ds.variant})" if ds.variant else "")


def render(ds: Dataset, out_dir: Path, formats: tuple[str, ...], note: str | None = None) -> list[Path]:
    """Write the four figures of ``ds`` into ``out_dir`` (``note``: a second title line); returns the paths.
    OSError: a figure cannot be written (no half-written file is left)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    matplotlib.rcParams["svg.hashsalt"] = "mla-fp8-bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    st = backend_styles([p.backend for p in ds.points])
    title = f"FP8 MLA prefill on {ds.device} — {_variant_text(ds)}" + (f"\n{note}" if note else "")
    emus = {p.backend for p in ds.points if p.emulation}
    handles = [Line2D([], [], **st[b], linestyle="--" if b in emus else "-",
                      markerfacecolor="white" if b in emus else st[b]["color"], label=_label(b, b in emus))
               for b in _series(ds.points)]
    lat = [functools.partial(draw_latency, scope=sc) for sc in latency_scopes(ds)]
    err = [draw_error, functools.partial(draw_error, attr="err_bf16")]
    written: list[Path] = []

    def save(fig, kind: str, title_size: float, legend_size: float, bottom: float) -> None:
        fig.suptitle(title, fontsize=title_size)
        fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=legend_size, frameon=False)
        fig.tight_layout(rect=(0, bottom, 1, 0.97))
        for fmt in formats:
            path = out_dir / f"{ds.slug}-{kind}.{fmt}"
            meta = {"Date": None} if fmt == "svg" else {"Software": "mla_fp8_bench studies/plot.py"}
            write_file_atomic(path, lambda f, fmt=fmt, meta=meta: fig.savefig(
                f, format=fmt, dpi=130, bbox_inches="tight", metadata=meta), binary=True)
            written.append(path)
        plt.close(fig)

    for kind, fns in (("latency", lat), ("error", err), ("tflops", [draw_tflops])):
        fig, axes = plt.subplots(1, len(fns), figsize=(6.5 * len(fns) + 1.5, 5.2), squeeze=False,
                                 sharey=kind == "error")
        for ax, fn in zip(axes[0], fns):
            fn(ax, ds, st)
        if kind == "error":
            axes[0][1].set_ylabel("")
            axes[0][1].yaxis.set_tick_params(labelleft=True)
        save(fig, kind, 10, 8, 0.08)
    # summary: latency panel(s) and throughput on top, both error panels below
    top = len(lat) + 1
    fig = plt.figure(figsize=(7 * top, 10.5))
    gs = fig.add_gridspec(2, 2 * top)
    for i, fn in enumerate([*lat, draw_tflops]):
        fn(fig.add_subplot(gs[0, 2 * i:2 * i + 2]), ds, st)
    axes = [fig.add_subplot(gs[1, :top]), fig.add_subplot(gs[1, top:])]
    for ax, fn in zip(axes, err):
        fn(ax, ds, st)
    lims = [a.get_ylim() for a in axes]
    for a in axes:  # same scale for both references, so the panels compare at a glance
        a.set_ylim(min(lo for lo, _ in lims), max(hi for _, hi in lims))
    save(fig, "summary", 13, 10, 0.05)
    return written


def plot(inputs: list[str], out_dir: str | os.PathLike, *, formats: tuple[str, ...] = FORMATS,
         machines: list[str] | None = None, commit: str | None = None,
         variant: str | None = None, note: str | None = None) -> tuple[list[Path], list[Dataset]]:
    """Read ``inputs`` and write every dataset's figures into ``out_dir`` (created and checked writable
    first; folders it created are removed if the plot fails). PlotError: an unknown format, an ``out_dir``
    that is a file, under a file or not writable; see :func:`load_inputs`; a dataset with nothing to plot."""
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise PlotError(f"format {', '.join(map(repr, bad)) or '(none)'} is not supported: "
                        f"allowed {', '.join(FORMATS)}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PlotError(f"--out {out} is a file, not a directory: give a directory for the figures")
    created = [a for a in (out, *out.parents) if not a.exists()][::-1]
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".plot-probe", dir=out)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise PlotError(f"--out {out} is not a writable directory: {exc.strerror or exc}") from None
        datasets = load_inputs(inputs, machines=machines, commit=commit, variant=variant)
        written: list[Path] = []
        for ds in datasets:
            if not ds.points:
                raise PlotError(f"{ds.source}: no ok single-sequence (s<N>) results to plot for {ds.device}"
                                + (f" ({len(ds.notes)} records skipped/failed/ragged)" if ds.notes else ""))
            try:
                written += render(ds, out, formats, note)
            except OSError as exc:
                raise PlotError(f"cannot write figures into --out {out_dir}: {exc.strerror or exc}") from None
    except BaseException:
        for d in reversed(created):  # leave no empty output folders behind a refused plot
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    return written, datasets


# ------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """Plot the inputs; 0 when every input was plotted, 2 with one line naming a bad input."""
    import argparse

    p = argparse.ArgumentParser(prog="python studies/plot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="run JSON (mla-fp8-bench run --json) or asv results directory (results/ or results/<machine>/)")
    p.add_argument("--out", required=True, help="output directory for the figures")
    p.add_argument("--format", default="png,svg", help="comma-separated: png, svg (default: both)")
    p.add_argument("--machine", action="append", default=None,
                   help="asv inputs: only this machine (repeatable); an unknown name is an error")
    p.add_argument("--commit", default=None, help="asv inputs: commit (prefix) to plot instead of the newest")
    p.add_argument("--variant", default=None,
                   help="case-id suffix to plot, e.g. -h128 or -cast-outlier (default: the plain s<N> ids)")
    p.add_argument("--note", default=None,
                   help="a second title line, e.g. how the run was made ('torch 1 thread on a shared 2-core VM')")
    args = p.parse_args(argv)
    formats = tuple(f.strip().lower() for f in args.format.split(",") if f.strip())
    try:
        written, datasets = plot(args.inputs, args.out, formats=formats, machines=args.machine, commit=args.commit,
                                 variant=args.variant, note=args.note)
    except (PlotError, R.ResultsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for ds in datasets:
        print(f"{ds.device}: {len(ds.points)} points from {ds.source}")
        for n in ds.notes:
            print(f"  not plotted: {n}")
    for w in written:
        print(f"wrote {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
