"""Cross-check of kernel-only timing: CUDA-graph replay vs the device time ``torch.profiler`` reports
(docs/methodology.md, section 3).

For one prepared call, in one process: ``graph_s`` (the suite's number,
:func:`mla_fp8_bench.measure.timing.time_device`); ``profiled_graph``, replays of a graph of the same
launches under the profiler, each bracketed by events, so the same launches give ``event_s`` (events,
per launch), ``device_sum_s`` (the self times of every device activity summed, per launch) and
``device_span_s`` (first start to last end, per launch); ``profiled_eager``, eager calls under the
profiler (device time per call as AITER's ``perftest`` reports it). Differences are in percent,
``(graph / profiler - 1) * 100``: ``diff_same_window_pct`` (events vs profiler sum over the same
replays), ``diff_graph_vs_profiled_graph_pct`` and ``diff_graph_vs_eager_pct``.

Command line (one process)::

    python3 studies/profcheck.py --backend fa3-fp8 --cases s128,s2048 --json out.json

and ``python3 studies/profcheck.py --summarize a.json b.json ...`` prints the run-to-run CV of
``graph_s`` across those processes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mla_fp8_bench.peers import first_line  # noqa: E402


def _device_events(prof) -> list[tuple[str, int, int]]:
    """(name, start_ns, end_ns) of every device-side activity the profiler recorded."""
    out = []
    cuda = torch.autograd.DeviceType.CUDA
    for e in prof.profiler.kineto_results.events():
        try:
            if e.device_type() != cuda:
                continue
            start, dur = int(e.start_ns()), int(e.duration_ns())
        except Exception:  # noqa: BLE001 - API drift across torch versions
            continue
        if dur <= 0:
            continue
        out.append((e.name(), start, start + dur))
    return out


def _summ(events: list[tuple[str, int, int]], launches: int) -> dict[str, Any]:
    if not events or launches <= 0:
        return {"device_sum_s": None, "device_span_s": None, "kernels_per_launch": 0.0, "kernel_names": []}
    total = sum(e - s for _, s, e in events)
    span = max(e for _, _, e in events) - min(s for _, s, _ in events)
    top = Counter(n for n, _, _ in events).most_common(6)
    return {"device_sum_s": total / 1e9 / launches, "device_span_s": span / 1e9 / launches,
            "kernels_per_launch": len(events) / launches,
            "kernel_names": [f"{n[:90]} x{c}" for n, c in top]}


def _graph_fields(tr: Any) -> dict[str, Any]:
    """The record fields of a :func:`~mla_fp8_bench.measure.timing.time_device` result."""
    return {"graph_s": tr.median_s, "graph_cv": tr.cv, "graph_method": tr.method, "graph_samples_s": tr.samples_s,
            "launches_per_sample": tr.launches_per_sample}


def _sm_clock_mhz(device: torch.device) -> int | None:
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # noqa: BLE001 - needs pynvml; informational only
        return None


def crosscheck(run: Callable[[], object], device: torch.device, *, replays: int = 10, eager_calls: int = 10,
               samples: int = 30) -> dict[str, Any]:
    """Graph-replay time vs profiler device time for the same graph-capturable call ``run`` (see module
    docstring): ``samples`` of the suite's graph timing, ``replays`` profiled graph replays and
    ``eager_calls`` profiled eager calls.

    Returns:
        A JSON-ready dict; ``*_pct`` keys hold differences in percent (None where not measurable).

    Raises:
        ValueError: on a CPU device.
    """
    from torch.profiler import ProfilerActivity, profile

    from mla_fp8_bench.measure.timing import _capture, _settle, time_device

    if device.type != "cuda":
        raise ValueError(f"the profiler cross-check needs a GPU, got {device}")
    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    stream = torch.cuda.current_stream(device)
    res: dict[str, Any] = {"sm_clock_mhz_before": _sm_clock_mhz(device)}
    tr = time_device(run, device, graph_capturable=True, samples=samples)
    res.update(_graph_fields(tr), sm_clock_mhz_after_timing=_sm_clock_mhz(device))
    launches = tr.launches_per_sample

    # --- the same launches timed by events and by the profiler, in one window
    g = None
    try:
        g = _capture(run, launches, stream, sync)
        # the same adaptive warm-up as time_device, so both windows run at the sustained-load clock
        res["profiled_graph_warmup"] = _settle(g.replay, tr.median_s * launches, stream, sync, 0.15, 0.6, 0.005)
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for a, b in evs:
                a.record(stream)
                g.replay()
                b.record(stream)
            sync()
        ev_s = statistics.median(a.elapsed_time(b) / 1e3 / launches for a, b in evs)
        pg = _summ(_device_events(prof), replays * launches)
        pg["event_s"] = ev_s
        res["profiled_graph"] = pg
    except Exception as exc:  # noqa: BLE001
        res["profiled_graph"] = {"error": first_line(exc)}
    finally:
        del g
        sync()

    # --- eager calls under the profiler (AITER perftest style)
    try:
        for _ in range(3):
            run()
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(eager_calls):
                run()
            sync()
        res["profiled_eager"] = _summ(_device_events(prof), eager_calls)
    except Exception as exc:  # noqa: BLE001
        res["profiled_eager"] = {"error": first_line(exc)}
    res["sm_clock_mhz_after"] = _sm_clock_mhz(device)

    def pct(a: float | None, b: float | None) -> float | None:
        return (a / b - 1.0) * 100.0 if a and b else None

    pg, pe = res["profiled_graph"], res["profiled_eager"]
    res["diff_same_window_pct"] = pct(pg.get("event_s"), pg.get("device_sum_s"))
    res["diff_same_window_span_pct"] = pct(pg.get("event_s"), pg.get("device_span_s"))
    res["diff_graph_vs_profiled_graph_pct"] = pct(res["graph_s"], pg.get("device_sum_s"))
    res["diff_graph_vs_eager_pct"] = pct(res["graph_s"], pe.get("device_sum_s"))
    return res


def measure(backend: str, case_ids: list[str], *, device: str = "auto", profile: bool = True,
            samples: int = 30) -> dict[str, Any]:
    """For each case: prepare ``backend``, time it (graph replay) and, with ``profile``, cross-check it.

    Returns:
        ``{"env": ..., "backend": ..., "records": [{"case", "status", "graph_s", "tflops", ...}]}``.
    """
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import environment, platform_info
    from mla_fp8_bench.problem.cases import resolve_cases
    from mla_fp8_bench.problem.flops import case_flops, tflops
    from mla_fp8_bench.problem.inputs import make_inputs

    pinfo = platform_info(device)
    b = get_backend(backend)
    avail = b.availability(pinfo)
    records: list[dict[str, Any]] = []
    for case in resolve_cases(case_ids):
        rec: dict[str, Any] = {"backend": backend, "case": case.id}
        if not avail:
            rec.update(status="skipped", reason=avail.reason)
            records.append(rec)
            continue
        prepared = None
        try:
            t0 = time.perf_counter()
            inputs = make_inputs(case, pinfo.device, pinfo.fp8_dtype)
            prepared = b.prepare(inputs)
            prepared.run()
            torch.cuda.synchronize(pinfo.device)
            rec["setup_s"] = time.perf_counter() - t0
            if profile:
                rec.update(crosscheck(prepared.run, pinfo.device, samples=samples))
            else:
                from mla_fp8_bench.measure.timing import time_device

                rec.update(_graph_fields(time_device(prepared.run, pinfo.device,
                                                     graph_capturable=prepared.graph_capturable, samples=samples)))
            rec["flops"] = case_flops(case)  # the runner's count, for every case family
            rec["tflops"] = tflops(rec["flops"], rec["graph_s"])
            rec["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
            rec.update(status="error", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        finally:
            if prepared is not None and prepared.cleanup is not None:
                prepared.cleanup()
            prepared = None
            inputs = None
            torch.cuda.empty_cache()
        records.append(rec)
    return {"env": environment(pinfo), "backend": backend, "records": records}


def summarize_cv(runs: list[dict[str, Any]], key: str = "graph_s") -> list[dict[str, Any]]:
    """Run-to-run statistics of ``key`` per (backend, case) across several :func:`measure` results.

    Returns:
        rows ``{"backend", "case", "n", "mean", "min", "max", "cv", "values", ...}``; ``cv`` is the
        sample stdev over the mean of the per-process medians. Profiler differences are summarised
        the same way (``diff_*_pct`` medians and ranges).
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for r in run.get("records", []):
            if r.get("status") == "ok" and r.get(key) is not None:
                groups.setdefault((r["backend"], r["case"]), []).append(r)
    rows = []
    for (bk, case), recs in groups.items():
        vals = [r[key] for r in recs]
        mean = statistics.fmean(vals)
        row: dict[str, Any] = {"backend": bk, "case": case, "n": len(vals), "mean": mean, "min": min(vals),
                               "max": max(vals), "cv": statistics.stdev(vals) / mean if len(vals) > 1 else 0.0,
                               "values": vals, "within_process_cv_median": statistics.median(
                                   r.get("graph_cv", 0.0) or 0.0 for r in recs),
                               "tflops_mean": statistics.fmean(r["tflops"] for r in recs if r.get("tflops"))
                               if any(r.get("tflops") for r in recs) else None}
        for dk in ("diff_same_window_pct", "diff_same_window_span_pct", "diff_graph_vs_profiled_graph_pct",
                   "diff_graph_vs_eager_pct"):
            ds = [r[dk] for r in recs if r.get(dk) is not None and math.isfinite(r[dk])]
            if ds:
                row[dk] = {"median": statistics.median(ds), "min": min(ds), "max": max(ds)}
        kpl = [r.get("profiled_graph", {}).get("kernels_per_launch") for r in recs]
        kpl = [k for k in kpl if k is not None]
        if kpl:
            row["kernels_per_launch_graph"] = statistics.median(kpl)
        rows.append(row)
    rows.sort(key=lambda r: (r["backend"], len(r["case"]), r["case"]))
    return rows


def format_cv_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of :func:`summarize_cv` rows."""
    lines = [f"{'backend':<16} {'case':<8} {'n':>2} {'mean us':>10} {'CV %':>6} {'TFLOP/s':>8} "
             f"{'ev/prof-1 %':>11} {'graph/prof-1 %':>14} {'graph/eager-1 %':>15}"]
    def d(r: dict[str, Any], k: str) -> str:
        v = r.get(k)
        return f"{v['median']:+.1f}" if v else "-"

    for r in rows:
        tf = r.get("tflops_mean")
        lines.append(f"{r['backend']:<16} {r['case']:<8} {r['n']:>2} {r['mean'] * 1e6:>10.2f} {r['cv'] * 100:>6.2f} "
                     f"{(f'{tf:.0f}' if tf else '-'):>8} {d(r, 'diff_same_window_pct'):>11} "
                     f"{d(r, 'diff_graph_vs_profiled_graph_pct'):>14} {d(r, 'diff_graph_vs_eager_pct'):>15}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 studies/profcheck.py", description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="fa3-fp8")
    p.add_argument("--cases", default="s128,s2048,s8192,s32768", help="comma-separated case ids")
    p.add_argument("--device", default="auto")
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--no-profile", action="store_true", help="graph timing only (no profiler cross-check)")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--summarize", nargs="+", metavar="JSON", help="summarise earlier --json results (CV across them)")
    args = p.parse_args(argv)
    if args.summarize:
        runs = [json.load(open(f)) for f in args.summarize]
        rows = summarize_cv(runs)
        print(format_cv_table(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "sources": args.summarize}, f, indent=1)
        return 0
    res = measure(args.backend, [c for c in args.cases.split(",") if c], device=args.device,
                  profile=not args.no_profile, samples=args.samples)
    for r in res["records"]:
        if r["status"] != "ok":
            print(f"{r['backend']} {r['case']}: {r['status']} {r.get('reason', '')}")
            continue
        print(f"{r['backend']} {r['case']}: graph {r['graph_s'] * 1e6:.2f} us (cv {r['graph_cv'] * 100:.2f}%), "
              f"{r['tflops']:.0f} TFLOP/s, events/profiler-1 {r.get('diff_same_window_pct')}, "
              f"graph/eager-profiler-1 {r.get('diff_graph_vs_eager_pct')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
