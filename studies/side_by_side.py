#!/usr/bin/env python3
"""The suite's kernel timing side by side with nvbench, Triton and torch.utils.benchmark (one GPU process).

For one backend (default ``fa3-fp8``) and the cases ``--cases`` (default s128, s2048, s8192, s32768),
in the order ``--order`` (``sorted`` / ``reversed``), each case is timed by:

* ``suite`` - :func:`mla_fp8_bench.measure.timing.time_device` (graph replay of back-to-back launches,
  L2-warm, clock-aware settle at the sustained-load clock), median, with the SM clock per sample;
* ``profiler_span`` - the same graph of ``launches`` calls replayed 10 times under ``torch.profiler``:
  first kernel start to last kernel end, per launch (the device's own timestamps);
* ``do_bench`` - ``triton.testing.do_bench(fn, return_mode="median")``: eager launches, L2 flushed
  (a 256 MB buffer zeroed) before each, events around each launch;
* ``do_bench_cudagraph`` - ``triton.testing.do_bench_cudagraph(fn, return_mode="median")``: the call
  captured in a graph, replays timed, L2-warm;
* ``torch_benchmark`` - ``torch.utils.benchmark.Timer("run(); sync()").blocked_autorange()``: host
  wall time of eager calls with a synchronize, median;
* ``nvbench`` (after the others, all cases in one ``cuda.bench`` run) - cold (isolated launches, L2
  flushed, a blocking kernel holds the launch queue, samples under the throttle threshold discarded)
  and batch ("hot": back-to-back launches) GPU time, from ``cuda-bench``'s JSON.

Each figure carries its wall seconds. On a machine without a CUDA GPU the script writes
``{"skipped": reason}`` and exits 0. ``--summarize`` combines process files into CV across processes,
sorted-vs-reversed order dependence, and each tool's level against the suite and the profiler span.

Device call (5 processes, alternating order)::

    for i in 0 1 2 3 4; do python3 studies/side_by_side.py --order $([ $((i % 2)) = 0 ] && echo sorted || \
        echo reversed) --json sbs_p$i.json; done
    python3 studies/side_by_side.py --summarize sbs_p*.json --json sbs_summary.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = "s128,s2048,s8192,s32768"
TOOLS = ("suite", "profiler_span", "do_bench", "do_bench_cudagraph", "torch_benchmark", "nvbench_cold",
         "nvbench_hot")


def _timed(fn):
    t0 = time.perf_counter()
    v = fn()
    return v, time.perf_counter() - t0


def _profiler_span_s(run, device, launches: int, replays: int = 10) -> float | None:
    """Per-launch device span of ``launches`` captured calls, ``replays`` replays under the profiler."""
    import torch
    from profcheck import _device_events, _summ  # studies/profcheck.py, beside this script
    from torch.profiler import ProfilerActivity, profile

    from mla_fp8_bench.measure.timing import _capture

    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    g = _capture(run, launches, torch.cuda.current_stream(device), sync)
    for _ in range(3):
        g.replay()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        sync()
    return _summ(_device_events(prof), replays * launches)["device_span_s"]


def measure_case(run, device) -> dict:
    """Every tool but nvbench on one prepared call; seconds, with wall seconds per tool."""
    import torch
    import torch.utils.benchmark as tub
    import triton.testing as tt

    from mla_fp8_bench.measure.timing import clock_fields, time_device

    out: dict = {}
    tr, w = _timed(lambda: time_device(run, device, graph_capturable=True))
    clk = {k: v for k, v in clock_fields(tr).items() if not k.endswith("_samples_mhz")}
    out["suite"] = {"s": tr.median_s, "wall_s": w, "cv": tr.cv, "launches": tr.launches_per_sample,
                    "n": len(tr.samples_s), **clk}
    span, w = _timed(lambda: _profiler_span_s(run, device, tr.launches_per_sample))
    out["profiler_span"] = {"s": span, "wall_s": w}
    ms, w = _timed(lambda: tt.do_bench(run, return_mode="median"))
    out["do_bench"] = {"s": ms / 1e3, "wall_s": w}
    ms, w = _timed(lambda: tt.do_bench_cudagraph(run, return_mode="median"))
    out["do_bench_cudagraph"] = {"s": ms / 1e3, "wall_s": w}
    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    m, w = _timed(lambda: tub.Timer("run(); sync()", globals={"run": run, "sync": sync}).blocked_autorange(
        min_run_time=0.2))
    out["torch_benchmark"] = {"s": m.median, "wall_s": w}
    return out


def _import_cuda_bench():
    """``cuda.bench``; when an installed regular ``cuda`` package hides the wheel's namespace portion
    (a ``--target`` install next to the image's cuda-bindings), the portion is added to ``cuda.__path__``."""
    import importlib
    import os

    try:
        return importlib.import_module("cuda.bench")
    except ImportError:
        import cuda

        for p in sys.path:
            d = os.path.join(p, "cuda")
            if os.path.isdir(os.path.join(d, "bench")) and d not in list(cuda.__path__):
                cuda.__path__.append(d)
        return importlib.import_module("cuda.bench")


def run_nvbench(preps: dict, order: list[str], json_path: str, timeout_s: float) -> dict:
    """nvbench cold + batch GPU time of each prepared call (one ``cuda.bench`` run, cases in ``order``)."""
    import torch

    bench = _import_cuda_bench()

    def bench_fn(state):
        case = state.get_string("case")
        run = preps[case]

        def launcher(launch):
            with torch.cuda.stream(torch.cuda.ExternalStream(launch.get_stream().addressof())):
                run()

        state.exec(launcher)

    b = bench.register(bench_fn)
    b.set_name("mla_prefill")
    b.add_string_axis("case", order)
    t0 = time.perf_counter()
    try:
        bench.run_all_benchmarks(["side_by_side", "--json", json_path, "--devices", "0", "--timeout", str(timeout_s)])
    except SystemExit:
        pass
    wall = time.perf_counter() - t0
    return parse_nvbench(json.loads(Path(json_path).read_text()), wall)


def parse_nvbench(root: dict, wall: float) -> dict:
    """Per case: cold/batch GPU mean, cold median, noise, sample counts, SM clock and walltimes."""
    out: dict = {}
    tags = {"nv/cold/time/gpu/mean": "cold_mean_s", "nv/cold/time/gpu/median": "cold_median_s",
            "nv/cold/time/gpu/stdev/relative": "cold_noise", "nv/cold/sample_size": "cold_samples",
            "nv/batch/time/gpu/mean": "batch_mean_s", "nv/batch/sample_size": "batch_samples",
            "nv/cold/walltime": "cold_wall_s", "nv/batch/walltime": "batch_wall_s",
            "nv/cold/sm_clock_rate/mean": "cold_sm_hz"}
    for bm in root.get("benchmarks", []):
        for st in bm.get("states", []):
            case = None
            for av in st.get("axis_values") or []:
                if av.get("name") == "case":
                    case = av.get("value")
            row: dict = {"skipped": st.get("is_skipped")}
            for s in st.get("summaries") or []:
                key = tags.get(s.get("tag"))
                if key:
                    val = next((d.get("value") for d in s.get("data", []) if d.get("name") == "value"), None)
                    row[key] = float(val) if val is not None else None
            out[case] = row
    out["_wall_s"] = wall
    return out


def measure_process(backend: str, cases: list[str], order: str, nvbench_json: str | None, nvbench_timeout: float
                    ) -> dict:
    """All tools for every case in this process (GPU only; ``{"skipped": reason}`` elsewhere)."""
    import torch

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU: the side-by-side needs one"}
    pinfo = platform_info("auto")
    b = get_backend(backend)
    v = b.availability(pinfo)
    if not v:
        return {"skipped": f"{backend}: {v.reason}"}
    seq = cases if order == "sorted" else list(reversed(cases))
    preps, res = {}, {"order": order, "backend": backend, "device": pinfo.name, "started": time.time(), "cases": {}}
    for c in seq:
        preps[c] = b.prepare(make_inputs(parse_case_id(c), pinfo.device, pinfo.fp8_dtype)).run
        try:
            res["cases"][c] = measure_case(preps[c], pinfo.device)
        except Exception as exc:  # noqa: BLE001 - one failing tool/case never loses the rest
            res["cases"][c] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if nvbench_json:
        try:
            nv = run_nvbench(preps, seq, nvbench_json, nvbench_timeout)
            res["nvbench_wall_s"] = nv.pop("_wall_s")
            for c, row in nv.items():
                if c in res["cases"] and "error" not in res["cases"][c]:
                    res["cases"][c]["nvbench_cold"] = {
                        "s": row.get("cold_mean_s"), "median_s": row.get("cold_median_s"),
                        "noise": row.get("cold_noise"), "wall_s": row.get("cold_wall_s"),
                        "sm_hz": row.get("cold_sm_hz"), "samples": row.get("cold_samples")}
                    res["cases"][c]["nvbench_hot"] = {"s": row.get("batch_mean_s"), "wall_s": row.get("batch_wall_s"),
                                                      "samples": row.get("batch_samples")}
        except Exception as exc:  # noqa: BLE001
            res["nvbench_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    res["wall_s"] = time.time() - res["started"]
    return res


def summarize(runs: list[dict]) -> dict:
    """CV across processes, order dependence (sorted vs reversed means) and levels vs the suite / span.

    Returns:
        ``{"rows": [{"case", "tool", "mean_s", "cv", "order_effect", "vs_suite", "vs_span", "wall_s"}]}``
        (``order_effect`` = mean(sorted) / mean(reversed) - 1; ``vs_*`` = mean / mean(other) - 1).
    """
    runs = [r for r in runs if "cases" in r]
    cases = list(dict.fromkeys(c for r in runs for c in r["cases"]))
    rows = []
    def vals(c, tool, order=None):
        return [r["cases"][c][tool]["s"] for r in runs if c in r["cases"] and tool in r["cases"][c]
                and r["cases"][c][tool].get("s") and (order is None or r["order"] == order)]

    for c in cases:
        ref = {t: statistics.fmean(vals(c, t)) if vals(c, t) else None for t in ("suite", "profiler_span")}
        for tool in TOOLS:
            v = vals(c, tool)
            if not v:
                continue
            mean = statistics.fmean(v)
            so, ro = vals(c, tool, "sorted"), vals(c, tool, "reversed")
            walls = [r["cases"][c][tool].get("wall_s") for r in runs if tool in r["cases"].get(c, {})]
            walls = [w for w in walls if w is not None]
            rows.append({"case": c, "tool": tool, "mean_s": mean, "n": len(v),
                         "cv": statistics.stdev(v) / mean if len(v) > 1 else None,
                         "range": (max(v) - min(v)) / min(v),
                         "order_effect": statistics.fmean(so) / statistics.fmean(ro) - 1 if so and ro else None,
                         "vs_suite": mean / ref["suite"] - 1 if ref["suite"] else None,
                         "vs_span": mean / ref["profiler_span"] - 1 if ref["profiler_span"] else None,
                         "wall_s": statistics.median(walls) if walls else None})
    return {"rows": rows, "processes": len(runs)}


def format_table(summary: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{x * 100:+.2f}%"

    lines = ["| case | tool | mean | CV across processes | range | sorted/reversed - 1 | vs suite | vs profiler span "
             "| wall s / point |", "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        cv = "-" if r["cv"] is None else f"{r['cv'] * 100:.2f}%"
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.2f}"
        lines.append(f"| {r['case']} | {r['tool']} | {r['mean_s'] * 1e6:.2f} us | {cv} | {r['range'] * 100:.2f}% | "
                     f"{pct(r['order_effect'])} | {pct(r['vs_suite'])} | {pct(r['vs_span'])} | {wall} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="fa3-fp8")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--order", default="sorted", choices=("sorted", "reversed"))
    ap.add_argument("--nvbench-json", help="nvbench's own JSON output (omit to skip nvbench)")
    ap.add_argument("--nvbench-timeout", type=float, default=4.0)
    ap.add_argument("--summarize", nargs="+", metavar="JSON")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    if a.summarize:
        res = summarize([json.loads(Path(p).read_text()) for p in a.summarize])
        res["table"] = format_table(res)
        print(res["table"])
    else:
        res = measure_process(a.backend, a.cases.split(","), a.order, a.nvbench_json, a.nvbench_timeout)
        print(json.dumps({c: {t: round(v["s"] * 1e6, 3) for t, v in d.items() if isinstance(v, dict) and v.get("s")}
                          for c, d in res.get("cases", {}).items()}) if "cases" in res else res)
    if a.json:
        from mla_fp8_bench.jsonio import write_json_atomic

        write_json_atomic(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
