"""Plots of a run JSON or an asv results directory (``mla-fp8-bench plot``).

``mla-fp8-bench plot INPUT... --out DIR [--format png,svg]`` where each INPUT is

* a run JSON written by ``mla-fp8-bench run --json`` (``{"env": ..., "records": [...]}``, optionally a
  ``ceilings`` key from :func:`mla_fp8_bench.peers.ceilings.attach`), or
* an asv results directory (``results/`` with ``<machine>/`` inside; one figure set per machine) or one
  machine's directory (``results/<machine>/``). The newest commit's result file is used
  (``--commit`` picks another). Files are read by :mod:`mla_fp8_bench.harness.results`.

``--out`` is checked (a writable directory, created if missing) before any input is read.

Per device it writes four figures: ``<slug>-latency``, ``<slug>-error``, ``<slug>-tflops`` and
``<slug>-summary`` (all panels), each as PNG and/or SVG:

* latency vs seq_len per backend, log-log, median with the interquartile range as error bars. Kernel
  latency and emulation latency (``aiter-emulated``: a PyTorch model of the kernel, its time is not a
  kernel's) never share an axis: each gets its own panel; one device per figure set, so GPU and CPU
  series never share one either;
* max |out - ref| vs seq_len per backend against both references (the dequantised-fp8 reference, the
  kernel's own error; the bf16 reference, the end-to-end FP8 error);
* TFLOP/s vs seq_len (emulations left out: not a kernel's throughput) with horizontal lines for the
  measured FP8/bf16 GEMM ceilings and the datasheet peaks when the input has them.

Labels, record keys and asv track names come from :mod:`mla_fp8_bench.measure.metric_table`; case ids
are read with :func:`mla_fp8_bench.problem.cases.parse_case_id`. A stored value that is not a number
(e.g. a string accuracy) is listed as "not plotted" with its value; the rest of the record is drawn.

Only single-sequence cases (``s<N>``) are plotted against seq_len; among them one *variant* (the
suffixes after the length, e.g. ``-h128``; default: the plain ids). Everything else is listed as
"not plotted" on the console.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.harness.results import (
    AsvResult,
    Measurement,
    ResultsError,
    RunDoc,
    is_cpu_machine,
    list_result_files,
    load_machine,
    machine_dirs,
    newest_result,
    run_doc_from_data,
)
from mla_fp8_bench.jsonio import load_json
from mla_fp8_bench.measure import metric_table as MT
from mla_fp8_bench.problem.cases import CaseError, parse_case_id
from mla_fp8_bench.problem.shapes import QK_HEAD_DIM, V_HEAD_DIM

#: Formats ``--format`` accepts.
FORMATS = ("png", "svg")
#: Floor for error values on log axes (asv floors its tracks at 1e-12 too).
ERROR_FLOOR = MT.ASV_ACCURACY_FLOOR


class PlotError(ValueError):
    """Bad plot input (missing, corrupt, unknown machine/commit, nothing plottable); names the problem."""


@dataclass
class Point:
    """One (backend, case) measurement placed on the seq_len axis."""

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


@dataclass
class Dataset:
    """Everything one figure set shows: one device's measurements."""

    device: str  # shown in titles, e.g. "NVIDIA H200 (sm_90)" or "machine cpu-2core (CPU)"
    slug: str
    source: str
    latency_desc: str
    points: list[Point] = field(default_factory=list)
    ceilings: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    variant: str = ""
    is_cpu: bool = False


# ------------------------------------------------------------------------------------- helpers
def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return s or "device"


def _split_case(cid: str) -> tuple[int, str] | None:
    """``s4096-h128`` -> ``(4096, "-h128")``: a single-sequence case's seq_len and its variant (the id's
    suffixes); None for multi-sequence or unparsable ids (grammar: :func:`parse_case_id`)."""
    try:
        case = parse_case_id(cid)
    except CaseError:
        return None
    if case.batch_size != 1:
        return None
    base = f"s{case.seq_lens[0]}"
    return (case.seq_lens[0], cid[len(base):]) if cid.startswith(base) else None


def _off_axis_reason(cid: str) -> str:
    """Why a case is not drawn against seq_len: several sequences, or an id the grammar rejects."""
    try:
        parse_case_id(cid)
    except CaseError as exc:
        return f"case id not recognised by this suite version ({str(exc).split(':')[0]})"
    return "not a single-sequence case (not on the seq_len axis)"


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _quantile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def _select_variant(points: list[Point], wanted: str | None) -> tuple[str, list[Point]]:
    """Keep one case variant; default: the plain ids, else the most frequent variant."""
    by: dict[str, list[Point]] = {}
    for p in points:
        by.setdefault(_split_case(p.case)[1], []).append(p)  # type: ignore[index]
    if wanted is not None:
        w = wanted if (wanted == "" or wanted.startswith("-")) else "-" + wanted
        if w not in by:
            have = ", ".join(repr(k or "(plain)") for k in sorted(by)) or "none"
            raise PlotError(f"case variant {wanted!r} has no single-sequence results here: variants present {have}")
        return w, by[w]
    if not by:
        return "", []
    if "" in by:
        return "", by[""]
    best = max(by, key=lambda k: (len(by[k]), k))
    return best, by[best]


# ------------------------------------------------------------------------------------- readers
_LATENCY_DESC = {"host": "host wall-clock", "graph": "device time, CUDA/HIP graph replay",
                 "events": "device time, events"}
#: Record keys drawn as accuracy; a value that is present but not a number is named in the notes.
_LAT = MT.metric("latency")
_ERR8 = MT.metric("max_abs_error")
_ERR16 = MT.metric("max_abs_error_bf16_ref")
_TFLOPS = MT.metric("tflops")
_SPP = MT.metric("seconds_per_pflop")
_ERROR_KEYS = (_ERR8.record_key, _ERR16.record_key)


def _record_value_notes(b: str, cid: str, r: dict[str, Any]) -> list[str]:
    """Notes for values that are stored but cannot be drawn (non-finite or not a number)."""
    notes = []
    for key in (*_ERROR_KEYS, _LAT.record_key):
        v = r.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            notes.append(f"{b} {cid}: {key} is {v!r:.40}, not a number; not drawn")
        elif not math.isfinite(v):
            notes.append(f"{b} {cid}: {key} is {v} (non-finite output), not drawn")
    return notes


def load_run_json(path: Path, data: dict[str, Any] | RunDoc, variant: str | None = None) -> Dataset:
    """A :class:`Dataset` from a ``mla-fp8-bench run --json`` file (already parsed: a dict or a
    :class:`~mla_fp8_bench.harness.results.RunDoc`).

    Raises:
        PlotError: not a run JSON, a malformed record, or an unknown ``variant``.
    """
    from mla_fp8_bench.backends import record_is_fp8

    try:
        doc = data if isinstance(data, RunDoc) else run_doc_from_data(data, path)
    except ResultsError as exc:
        raise PlotError(str(exc)) from None
    env, recs = doc.env, doc.records
    name = env.get("device_name") or "unknown device"
    arch = env.get("arch") or "?"
    is_cpu = env.get("vendor") == "cpu" or arch == "cpu"
    host = env.get("hostname")
    device = (f"CPU ({name}" + (f", host {host}" if host else "") + ")") if is_cpu else f"{name} ({arch})"
    methods = sorted({str(r["latency_method"]) for r in recs if r.get("latency_method")})
    ds = Dataset(device=device, slug=_slug("cpu-" + name if is_cpu else name), source=str(path),
                 latency_desc=", ".join(_LATENCY_DESC.get(m, m) for m in methods) or "latency",
                 ceilings=doc.ceilings, is_cpu=is_cpu)
    pts: list[Point] = []
    for r in recs:
        b, cid, st = r["backend"], r["case"], r.get("status")
        if st != "ok":
            ds.notes.append(f"{b} {cid}: {st} - {r.get('reason', '')}".rstrip(" -"))
            continue
        sc = _split_case(cid)
        if sc is None:
            ds.notes.append(f"{b} {cid}: {_off_axis_reason(cid)}")
            continue
        emu = MT.record_is_emulation(r)
        ds.notes.extend(_record_value_notes(b, cid, r))
        samples = [x for x in (r.get(_LAT.samples_key) or []) if _finite(x) is not None]
        p = Point(b, cid, sc[0], latency_s=_finite(r.get(_LAT.record_key)), err_fp8=_finite(r.get(_ERR8.record_key)),
                  err_bf16=_finite(r.get(_ERR16.record_key)),
                  tflops=None if emu else _finite(r.get(_TFLOPS.record_key)), emulation=emu,
                  fp8=record_is_fp8(r) is not False)
        if len(samples) >= 2:
            p.latency_q25, p.latency_q75 = _quantile(samples, 0.25), _quantile(samples, 0.75)
        pts.append(p)
    ds.variant, ds.points = _select_variant(pts, variant)
    return ds


_BENCH = "MLAPrefill"


def _by_backend_case(res: AsvResult, method: str) -> dict[tuple[str, str], Measurement]:
    """(backend, case) -> measurement of ``<module>.MLAPrefill.<method>``; {} when absent."""
    names = [n for n in res.benchmarks() if n.endswith(f".{_BENCH}.{method}")]
    if not names:
        return {}
    return {m.params: m for m in res.measurements(names[0]).values() if len(m.params) == 2}


def load_asv_machine(mdir: Path, commit: str | None = None, variant: str | None = None) -> Dataset:
    """A :class:`Dataset` from one asv machine directory (newest commit unless ``commit``).

    Raises:
        PlotError: corrupt/missing files (named), unknown commit, no ``MLAPrefill.track_latency`` results.
    """
    from mla_fp8_bench.backends import backend_flag

    try:
        mj = load_machine(mdir)
        res = newest_result(mdir, commit)
        lat = _by_backend_case(res, _LAT.track)
        e8 = _by_backend_case(res, _ERR8.track)
        e16 = _by_backend_case(res, _ERR16.track)
        spp = _by_backend_case(res, _SPP.track)
    except ResultsError as exc:
        raise PlotError(str(exc)) from None
    gpu = mj.get("gpu")
    has_gpu = bool(gpu) and not is_cpu_machine(mj)
    hw = gpu if has_gpu else f"CPU: {mj.get('cpu') or mj.get('arch') or '?'}"
    ds = Dataset(device=f"machine {mj['machine']} ({hw}), commit {res.commit_hash[:8]}",
                 slug=_slug(f"asv-{mj['machine']}"), source=str(res.path),
                 latency_desc="asv track_latency" + (" (device time)" if has_gpu else " (host time)"),
                 is_cpu=not has_gpu)
    if not lat:
        raise PlotError(f"asv result file {res.path} has no {_BENCH}.track_latency results: not this suite's "
                        "results (benchmarks/bench_mla_prefill.py)")

    def val(table: dict[tuple[str, str], Measurement], key: tuple[str, str]) -> float | None:
        m = table.get(key)
        return _finite(m.value) if m is not None else None

    pts = []
    for (b, c), m in lat.items():
        if m.status == "failed":
            ds.notes.append(f"{b} {c}: failed in asv (null)")
            continue
        if m.status == "skipped":
            continue  # not available on this machine / beyond its cap
        sc = _split_case(c)
        if sc is None:
            ds.notes.append(f"{b} {c}: {_off_axis_reason(c)}")
            continue
        emu = bool(backend_flag(b, "emulation"))
        s = val(spp, (b, c))
        pts.append(Point(b, c, sc[0], latency_s=_finite(m.value), latency_q25=m.q25, latency_q75=m.q75,
                         err_fp8=val(e8, (b, c)), err_bf16=val(e16, (b, c)),
                         tflops=(1e3 / s) if (s and not emu) else None, emulation=emu,
                         fp8=backend_flag(b, "fp8") is not False))
    ds.variant, ds.points = _select_variant(pts, variant)
    ds.notes.append("ceilings: not stored in asv results (plot a run JSON with `ceilings` for the lines)")
    return ds


def _load_dir(path: Path, machines: list[str] | None, commit: str | None, variant: str | None,
              seen: set[str], skipped_empty: list[str]) -> list[Dataset]:
    """Datasets of one asv results (or machine) directory; machines without results are listed in
    ``skipped_empty`` when others have results."""
    try:
        mdirs = machine_dirs(path)
    except ResultsError as exc:
        raise PlotError(str(exc)) from None
    if not mdirs:
        raise PlotError(f"{path} is a directory but not an asv results directory: no <machine>/machine.json "
                        "inside (and no machine.json in it)")
    seen.update(m.name for m in mdirs)
    if machines:
        mdirs = [m for m in mdirs if m.name in machines]
    out = []
    for m in mdirs:
        if not list_result_files(m) and len(mdirs) > 1 and not machines:
            skipped_empty.append(f"{m} (machine.json only, no results yet)")
            continue  # one runner without results must not stop the others' plots
        out.append(load_asv_machine(m, commit, variant))
    return out


def _load_file(path: Path, variant: str | None) -> Dataset:
    try:
        data = load_json(path, "run JSON", PlotError,
                         "it may be truncated - re-run `mla-fp8-bench run --json` (it writes atomically)")
        if isinstance(data, dict) and "records" not in data and "result_columns" in data:
            raise PlotError(f"{path} is one asv result file: pass its results directory "
                            f"({path.parent.parent}) or machine directory ({path.parent}) instead")
        doc = run_doc_from_data(data, path)
    except ResultsError as exc:
        raise PlotError(str(exc)) from None
    return load_run_json(path, doc, variant)


def _unique_slugs(out: list[Dataset]) -> None:
    counts: dict[str, int] = {}
    for ds in out:
        counts[ds.slug] = counts.get(ds.slug, 0) + 1
    used: set[str] = set()
    for ds in out:  # two inputs from one device: tell their files apart by the input's name
        slug = ds.slug if counts[ds.slug] == 1 else f"{ds.slug}-{_slug(Path(ds.source).stem)}"
        base, n = slug, 2
        while slug in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug)
        ds.slug = slug


def load_inputs(inputs: list[str], *, machines: list[str] | None = None, commit: str | None = None,
                variant: str | None = None) -> list[Dataset]:
    """Read every INPUT (run JSON files and asv results directories) into datasets.

    Raises:
        PlotError: missing/corrupt input, unknown machine or commit, no asv machines in a directory.
    """
    out: list[Dataset] = []
    skipped_empty: list[str] = []
    seen_machines: set[str] = set()
    any_dir = False
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            any_dir = True
            out += _load_dir(path, machines, commit, variant, seen_machines, skipped_empty)
        elif path.is_file():
            out.append(_load_file(path, variant))
        else:
            raise PlotError(f"input {path} does not exist: give a run JSON (`mla-fp8-bench run --json`) or an asv "
                            "results directory")
    if machines:
        if not any_dir:
            raise PlotError("--machine selects machines of an asv results directory, but no directory was given")
        unknown = [m for m in machines if m not in seen_machines]
        if unknown:
            raise PlotError(f"machine {', '.join(map(repr, unknown))} is not in the given results: machines present "
                            f"{', '.join(sorted(seen_machines)) or 'none'}")
    if skipped_empty:
        if not out:
            raise PlotError("no results to plot: " + "; ".join(skipped_empty))
        out[0].notes.extend(f"machine skipped: {e}" for e in skipped_empty)
    _unique_slugs(out)
    return out


# ------------------------------------------------------------------------------------- drawing
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


@dataclass
class Styles:
    """Colour and marker per backend (fixed by registry order, so figures of several devices agree)."""

    colors: dict[str, Any]
    markers: dict[str, str]

    def color(self, b: str) -> Any:
        return self.colors[b]

    def marker(self, b: str) -> str:
        return self.markers[b]


def backend_styles(names: list[str]) -> Styles:
    """A colour and a distinct marker per backend, so overlapping lines stay visible."""
    colors = _backend_colors(names)
    return Styles(colors, {n: _MARKERS[i % len(_MARKERS)] for i, n in enumerate(colors)})


def _backend_colors(names: list[str]) -> dict[str, Any]:
    import matplotlib

    try:
        from mla_fp8_bench.backends import backend_names

        order = backend_names()
    except Exception:  # noqa: BLE001
        order = []
    order = order + sorted(n for n in names if n not in order)
    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(order)}


def _fmt_seconds(x: float, _pos=None) -> str:
    if x <= 0:
        return "0"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if x >= scale * 0.9999:
            v = x / scale
            return f"{v:.0f} {unit}" if v >= 1 else f"{v:.1g} {unit}"
    return f"{x:.0e} s"


def _fmt_tokens(x: float, _pos=None) -> str:
    return f"{x:.0f}"  # the numbers of the case ids (s1024, s32768)


def _series(points: list[Point]) -> dict[str, list[Point]]:
    by: dict[str, list[Point]] = {}
    for p in sorted(points, key=lambda p: (p.backend, p.seq_len)):
        by.setdefault(p.backend, []).append(p)
    return by


def _on_grid(x: int) -> bool:
    """Power-of-two lengths: the sweep's points, joined by lines; other lengths are markers only."""
    return x > 0 and x & (x - 1) == 0


def _draw_series(ax, xs: list[int], ys: list[float], *, yerr=None, color, marker, linestyle="-", hollow=False,
                 label=None, linewidth=1.6) -> bool:
    """Draw one backend's points: a line through the power-of-two (sweep) points and unconnected
    markers for the others (tile edges like 255/257, s8175), so near-equal x values do not zig-zag.
    Returns True if off-sweep points were drawn."""
    on = [i for i, x in enumerate(xs) if _on_grid(x)]
    off = [i for i, x in enumerate(xs) if not _on_grid(x)]
    if len(on) < 2:  # no sweep to join: join everything
        on, off = list(range(len(xs))), []
    face = "white" if hollow else color
    for idx, ls, lab, ms in ((on, linestyle, label, 6), (off, "none", None, 5)):
        if not idx:
            continue
        kw = dict(color=color, linestyle=ls, marker=marker, markerfacecolor=face, markersize=ms, linewidth=linewidth,
                  label=lab)
        px, py = [xs[i] for i in idx], [ys[i] for i in idx]
        if yerr is not None:
            ax.errorbar(px, py, yerr=[[yerr[0][i] for i in idx], [yerr[1][i] for i in idx]], capsize=2, **kw)
        else:
            ax.plot(px, py, **kw)
    return bool(off)


_OFF_GRID_NOTE = "unconnected markers: lengths off the power-of-two sweep (q-tile edges 255/257, s8175, ...)"


def _setup_x(ax, xs: list[int]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted(set(xs))
    on_grid = [x for x in ticks if _on_grid(x)]
    if on_grid:  # label the sweep only: 255/256/257 or 8175/8192 labels would print over each other
        lo, hi = ticks[0], ticks[-1]
        ticks = on_grid
    else:
        lo, hi = (ticks[0], ticks[-1]) if ticks else (None, None)
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(lo / 1.3, hi * 1.3)
    ax.xaxis.set_major_formatter(FuncFormatter(_fmt_tokens))
    ax.set_xlabel("seq_len (tokens per sequence, causal prefill)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="y", alpha=0.12)


def _note(ax, lines: list[str]) -> None:
    """Small grey notes under the x-axis label, where they cannot hide data."""
    ax.annotate("\n".join(lines), xy=(0.0, 0.0), xycoords="axes fraction", xytext=(0, -34),
                textcoords="offset points", ha="left", va="top", fontsize=7.5, color="0.3")


def _label(b: str, emu: bool) -> str:
    return f"{b}  (EMULATION: PyTorch model, not kernel time)" if emu else b


def _log_ticks(ax, formatter) -> None:
    """Labelled log ticks at 1 and 3 per decade when the data spans <= 3 decades, else 1 per decade."""
    from matplotlib.ticker import LogLocator, NullFormatter

    lo, hi = ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 0
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0) if decades <= 3 else (1.0,)))
    ax.yaxis.set_major_formatter(formatter)
    ax.yaxis.set_minor_formatter(NullFormatter())


def _fmt_plain(x: float, _pos=None) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


#: Latency panels: which points each draws. Kernel and emulation latency never share an axis (an
#: emulation's time is PyTorch code, not a kernel's).
LATENCY_SCOPES = ("kernel", "emulation")


def latency_scopes(ds: Dataset) -> list[str]:
    """The latency panels ``ds`` needs: ``kernel`` and/or ``emulation`` (``["kernel"]`` when it has none)."""
    have = {("emulation" if p.emulation else "kernel") for p in ds.points if p.latency_s}
    return [s for s in LATENCY_SCOPES if s in have] or ["kernel"]


def draw_latency(ax, ds: Dataset, st: Styles, scope: str = "kernel") -> list[str]:
    """Latency vs seq_len of one ``scope`` (``kernel``: non-emulation backends; ``emulation``)."""
    from matplotlib.ticker import FuncFormatter

    if scope not in LATENCY_SCOPES:
        raise ValueError(f"latency scope {scope!r} is unknown: allowed {', '.join(LATENCY_SCOPES)}")
    drawn = []
    off = False
    for b, pts in _series(ds.points).items():
        pts = [p for p in pts if p.latency_s and p.emulation == (scope == "emulation")]
        if not pts:
            continue
        emu = scope == "emulation"
        xs = [p.seq_len for p in pts]
        ys = [p.latency_s for p in pts]
        lo = [max(0.0, y - (p.latency_q25 if p.latency_q25 is not None else y)) for p, y in zip(pts, ys)]
        hi = [max(0.0, (p.latency_q75 if p.latency_q75 is not None else y) - y) for p, y in zip(pts, ys)]
        off |= _draw_series(ax, xs, ys, yerr=[lo, hi], color=st.color(b), marker=st.marker(b),
                            linestyle="--" if emu else "-", hollow=emu, label=_label(b, emu))
        if emu:
            ax.annotate("emulation", (xs[-1], ys[-1]), textcoords="offset points", xytext=(-4, 6), ha="right",
                        fontsize=8, color=st.color(b), style="italic")
        drawn.append(b)
    if drawn:
        ax.set_yscale("log")
        _log_ticks(ax, FuncFormatter(_fmt_seconds))
    else:
        ax.text(0.5, 0.5, "no latency to show", transform=ax.transAxes, ha="center", color="0.4")
    _setup_x(ax, [p.seq_len for p in ds.points])
    ax.set_ylabel(f"{_LAT.pretty_name} per call (median; bars: IQR)")
    if scope == "emulation":
        ax.set_title("EMULATION latency vs seq_len (PyTorch model of the kernel;\nnot kernel time, never compared)",
                     fontsize=10)
    else:
        ax.set_title("Latency vs seq_len (log-log, lower is better)")
    notes = [f"timing: {ds.latency_desc}" + ("; CPU host time of PyTorch code, not GPU kernel times"
                                             if ds.is_cpu else "")]
    if off:
        notes.append(_OFF_GRID_NOTE)
    _note(ax, notes)
    return drawn


_REFS = {
    "err_fp8": (_ERR8, "the kernel's own error: q/k/v rounding to fp8 cancels"),
    "err_bf16": (_ERR16, "end-to-end error of going FP8 (includes fp8 input rounding)"),
}


def draw_error(ax, ds: Dataset, st: Styles, attr: str = "err_fp8") -> list[str]:
    """max |out - ref| against one reference (``attr``: ``err_fp8`` or ``err_bf16``)."""
    drawn = []
    floored = False
    off = False
    left_out = []
    for b, pts in _series(ds.points).items():
        emu = any(p.emulation for p in pts)
        if attr == "err_fp8" and not all(p.fp8 for p in pts):
            left_out.append(b)  # a bf16 baseline never saw the fp8 inputs: its error here is meaningless
            continue
        sel = [p for p in pts if getattr(p, attr) is not None]
        if not sel:
            continue
        ys = []
        for p in sel:
            v = getattr(p, attr)
            floored |= v < ERROR_FLOOR
            ys.append(max(v, ERROR_FLOOR))
        off |= _draw_series(ax, [p.seq_len for p in sel], ys, color=st.color(b), marker=st.marker(b),
                            linestyle="--" if emu else "-", hollow=emu, label=_label(b, emu))
        drawn.append(b)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    _log_ticks(ax, FuncFormatter(_fmt_plain))
    _setup_x(ax, [p.seq_len for p in ds.points])
    ax.set_ylabel("max |out - ref| (absolute, output units)")
    m, what = _REFS[attr]
    ax.set_title(f"{m.pretty_name[:1].upper()}{m.pretty_name[1:]}\n({what}; lower is better)", fontsize=10)
    notes = []
    if floored:
        notes.append(f"values below {ERROR_FLOOR:g} drawn at {ERROR_FLOOR:g}")
    if left_out:
        notes.append(f"not shown: {', '.join(left_out)} (bf16 baseline: it never sees the fp8 inputs)")
    if off:
        notes.append(_OFF_GRID_NOTE)
    if notes:
        _note(ax, notes)
    return drawn


def draw_error_bf16(ax, ds: Dataset, st: Styles) -> list[str]:
    return draw_error(ax, ds, st, "err_bf16")


def _ceiling_lines(ds: Dataset) -> tuple[list[tuple[str, float, str, str]], list[str]]:
    """(label, TFLOP/s, color, linestyle) lines and text notes from ``ds.ceilings``."""
    c = ds.ceilings
    if not isinstance(c, dict):
        return [], ["no measured ceilings or datasheet peaks in this input"]
    if c.get("status") not in (None, "ok"):
        return [], [f"ceilings not measured: {c.get('reason') or c.get('status')}"]
    lines, notes = [], []
    for key, lab, col in (("fp8_gemm_tflops", "FP8 GEMM measured", "tab:red"),
                          ("bf16_gemm_tflops", "bf16 GEMM measured", "tab:purple")):
        v = _finite(c.get(key))
        if v:
            lines.append((f"{lab} {v:,.0f} TFLOP/s", v, col, "--"))
    ds_peaks = c.get("datasheet") if isinstance(c.get("datasheet"), dict) else {}
    for key, lab, col in (("fp8", "FP8 datasheet peak", "tab:red"), ("bf16", "bf16 datasheet peak", "tab:purple")):
        v = _finite(ds_peaks.get(key))
        if v:
            lines.append((f"{lab} {v:,.0f} TFLOP/s", v, col, ":"))
    cp = _finite(c.get("copy_tb_s"))
    if cp:
        hbm = _finite(ds_peaks.get("hbm_tb_s"))
        notes.append(f"copy bandwidth measured {cp:.2f} TB/s" + (f" (datasheet {hbm:g} TB/s)" if hbm else ""))
    if not lines:
        notes.append("ceilings present but without TFLOP/s values")
    return lines, notes


def draw_tflops(ax, ds: Dataset, st: Styles) -> list[str]:
    drawn = []
    off = False
    ymax, ymin = 0.0, math.inf
    for b, pts in _series(ds.points).items():
        sel = [p for p in pts if p.tflops and not p.emulation]
        if not sel:
            continue
        ys = [p.tflops for p in sel]
        ymax, ymin = max(ymax, *ys), min(ymin, *ys)
        off |= _draw_series(ax, [p.seq_len for p in sel], ys, color=st.color(b), marker=st.marker(b), label=b)
        drawn.append(b)
    lines, notes = _ceiling_lines(ds)
    handles = []
    for lab, v, col, ls in lines:  # labelled in a legend of their own: close values would overprint inline
        handles.append(ax.axhline(v, color=col, linestyle=ls, linewidth=1.1, label=lab))
        ymax, ymin = max(ymax, v), min(ymin, v)
    if handles:
        ax.legend(handles=handles, loc="lower right", fontsize=7, title="ceilings (dashed: measured here, "
                  "dotted: datasheet)", title_fontsize=7, framealpha=0.9)
    if off:
        notes.append(_OFF_GRID_NOTE)
    emus = sorted({p.backend for p in ds.points if p.emulation})
    if emus:
        notes.append(f"not shown: {', '.join(emus)} (an emulation's throughput is not a kernel's)")
    if drawn or lines:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        ax.set_ylim(ymin / 2.5, ymax * 2.5)
        _log_ticks(ax, FuncFormatter(_fmt_plain))
    else:
        ax.text(0.5, 0.5, "no kernel throughput to show", transform=ax.transAxes, ha="center", color="0.4")
    _setup_x(ax, [p.seq_len for p in ds.points])
    ax.set_ylabel(f"{_TFLOPS.unit} (causal FLOPs = 320·H·S², higher is faster)")
    ax.set_title("Throughput vs seq_len (informational)")
    if notes:
        _note(ax, notes)
    return drawn


_QUANT_TEXT = {"per_tensor": "per-tensor fp8", "cast": "cast quant"}


def _variant_text(ds: Dataset) -> str:
    """The case shape shared by the plotted points, from the case-id grammar (:func:`parse_case_id`)."""
    case = parse_case_id(ds.points[0].case) if ds.points else None
    if case is None:
        return f"variant {ds.variant or '(plain)'}"
    text = f"{case.num_heads} heads, d_qk={QK_HEAD_DIM}, d_v={V_HEAD_DIM}, {_QUANT_TEXT.get(case.quant, case.quant)}"
    if case.dist != "normal":
        text += f", {case.dist} inputs"
    if case.seed:
        text += f", seed {case.seed}"
    return text + (f" (ids s<N>{ds.variant})" if ds.variant else "")


def render(ds: Dataset, out_dir: Path, formats: tuple[str, ...], note: str | None = None) -> list[Path]:
    """Write the four figures of ``ds`` into ``out_dir`` (``note``: a second title line); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "mla-fp8-bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    st = backend_styles([p.backend for p in ds.points])
    sub = f"{ds.device} — {_variant_text(ds)}" + (f"\n{note}" if note else "")
    written: list[Path] = []

    def save(fig, kind: str) -> None:
        for fmt in formats:
            path = out_dir / f"{ds.slug}-{kind}.{fmt}"
            tmp = path.with_name(path.name + ".tmp")
            meta = {"Date": None} if fmt == "svg" else {"Software": "mla-fp8-bench plot"}
            try:
                fig.savefig(tmp, format=fmt, dpi=130, bbox_inches="tight", metadata=meta)
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)  # no half-written figure left behind
                raise
            written.append(path)
        plt.close(fig)

    def legend_handles() -> list:
        from matplotlib.lines import Line2D

        return [Line2D([], [], color=st.color(b), marker=st.marker(b), linestyle="--" if _is_emu(ds, b) else "-",
                       markerfacecolor="white" if _is_emu(ds, b) else st.color(b), label=_label(b, _is_emu(ds, b)))
                for b in _series(ds.points)]

    scopes = latency_scopes(ds)
    lat_fns = [lambda ax, d, s, sc=sc: draw_latency(ax, d, s, sc) for sc in scopes]
    for kind, fns in (("latency", lat_fns), ("error", (draw_error, draw_error_bf16)), ("tflops", (draw_tflops,))):
        fig, axes = plt.subplots(1, len(fns), figsize=(6.5 * len(fns) + 1.5, 5.2), squeeze=False,
                                 sharey=kind == "error")
        for ax, fn in zip(axes[0], fns):
            fn(ax, ds, st)
        if kind == "error":
            axes[0][1].set_ylabel("")
            axes[0][1].yaxis.set_tick_params(labelleft=True)
        fig.suptitle(f"FP8 MLA prefill on {sub}", fontsize=10)
        fig.legend(handles=legend_handles(), loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.08, 1, 0.97))
        save(fig, kind)
    _render_summary(plt, ds, st, scopes, sub, legend_handles, save)
    return written


def _render_summary(plt, ds: Dataset, st: Styles, scopes: list[str], sub: str, legend_handles, save) -> None:
    """Latency panel(s) and throughput on top, both error panels below (one figure)."""
    top = len(scopes) + 1
    fig = plt.figure(figsize=(7 * top, 10.5))
    gs = fig.add_gridspec(2, 2 * top)
    for i, sc in enumerate(scopes):
        draw_latency(fig.add_subplot(gs[0, 2 * i:2 * i + 2]), ds, st, sc)
    draw_tflops(fig.add_subplot(gs[0, 2 * top - 2:]), ds, st)
    err = [fig.add_subplot(gs[1, :top]), fig.add_subplot(gs[1, top:])]
    draw_error(err[0], ds, st)
    draw_error_bf16(err[1], ds, st)
    lo = min(a.get_ylim()[0] for a in err)
    hi = max(a.get_ylim()[1] for a in err)
    for a in err:
        a.set_ylim(lo, hi)  # same scale for both references, so the panels compare at a glance
    fig.legend(handles=legend_handles(), loc="lower center", ncol=3, fontsize=10, frameon=False)
    fig.suptitle(f"FP8 MLA prefill on {sub}", fontsize=13)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    save(fig, "summary")


def _is_emu(ds: Dataset, backend: str) -> bool:
    return any(p.emulation for p in ds.points if p.backend == backend)


def plot(inputs: list[str], out_dir: str | os.PathLike, *, formats: tuple[str, ...] = FORMATS,
         machines: list[str] | None = None, commit: str | None = None,
         variant: str | None = None, note: str | None = None) -> tuple[list[Path], list[Dataset]]:
    """Read ``inputs`` and write every dataset's figures into ``out_dir``.

    Raises:
        PlotError: see :func:`load_inputs`; also a dataset with nothing to plot.
    """
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise PlotError(f"format {', '.join(map(repr, bad)) or '(none)'} is not supported: "
                        f"allowed {', '.join(FORMATS)}")
    created = _prepare_out_dir(Path(out_dir))
    try:
        datasets = load_inputs(inputs, machines=machines, commit=commit, variant=variant)
        written: list[Path] = []
        for ds in datasets:
            if not ds.points:
                raise PlotError(f"{ds.source}: no ok single-sequence (s<N>) results to plot for {ds.device}"
                                + (f" ({len(ds.notes)} records skipped/failed/ragged)" if ds.notes else ""))
            try:
                written += render(ds, Path(out_dir), formats, note)
            except OSError as exc:
                raise PlotError(f"cannot write figures into --out {out_dir}: {exc.strerror or exc}") from None
    except BaseException:
        for d in reversed(created):  # leave no empty output folders behind a refused plot
            try:
                d.rmdir()
            except OSError:
                pass
        raise
    return written, datasets


def _prepare_out_dir(out: Path) -> list[Path]:
    """Check that figures can be written into ``out`` before any input is read: create it (and missing
    parents) and write a probe file. Returns the folders it created (removed again if the plot fails).

    Raises:
        PlotError: ``out`` is a file, lies under a file, or is not writable; the message names it.
    """
    if out.exists() and not out.is_dir():
        raise PlotError(f"--out {out} is a file, not a directory: give a directory for the figures")
    created = [a for a in (out, *out.parents) if not a.exists()][::-1]
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".plot-probe", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
        raise PlotError(f"--out {out} is not a writable directory: {exc.strerror or exc}") from None
    return created


# ------------------------------------------------------------------------------------- CLI
def add_parser(subparsers) -> None:
    """Register ``plot`` on the CLI's sub-parsers."""
    p = subparsers.add_parser("plot", help="latency / max-abs-error / TFLOP/s vs seq_len from run JSONs or asv results")
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
    p.set_defaults(handler=cmd_plot)


def cmd_plot(args, console) -> int:
    """Handler of ``plot``: 0 when every input was plotted, 2 on bad input (one line naming it)."""
    formats = tuple(f.strip().lower() for f in args.format.split(",") if f.strip())
    try:
        written, datasets = plot(args.inputs, args.out, formats=formats, machines=args.machine, commit=args.commit,
                                 variant=args.variant, note=args.note)
    except PlotError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    for ds in datasets:
        console.print(f"{ds.device}: {len(ds.points)} points from {ds.source}", highlight=False)
        for n in ds.notes:
            console.print(f"  not plotted: {n}", highlight=False)
    for w in written:
        console.print(f"wrote {w}", highlight=False)
    return 0
