#!/usr/bin/env python3
"""nvbench-compare-robust's verdicts on the suite's own A/A and slowdown trials, beside the gate's.

Reads a ``studies/latency_ab.py`` JSON (trials of BASE and HEAD samples, with the SM clock read during
each sample), writes each trial as a pair of nvbench JSON files (cold GPU time summaries plus the bulk
``sample_times`` / ``sample_freqs`` float32 files that nvbench's ``--jsonbin`` output carries), runs
``nvbench-compare-robust`` (``cuda.bench.scripts.nvbench_compare_robust`` from the ``cuda-bench``
wheel; needs numpy, colorama, tabulate) on each pair and records its status (FAST / SLOW / SAME /
AMBG). Beside it, per trial, the gate's latency rule on time and on SM cycles (time x clock).

    python3 studies/nvbench_verdicts.py studies/results/h200_latency_ab_factors.json --json out.json

Pure CPU; the comparison tool is never asked about a device.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STATUSES = ("FAST", "SLOW", "SAME", "AMBG")


def _summary(tag: str, value, kind: str = "float64") -> dict:
    return {"tag": tag, "name": tag, "data": [{"name": "value", "type": kind, "value": str(value)}]}


def _bin_summary(tag: str, filename: str, n: int) -> dict:
    return {"tag": tag, "name": tag, "data": [{"name": "filename", "type": "string", "value": filename},
                                              {"name": "size", "type": "int64", "value": str(n)}]}


def write_nvbench_json(path: Path, samples_s: list[float], freqs_hz: list[float] | None) -> None:
    """One nvbench result file (one benchmark, one state) holding ``samples_s`` as cold GPU times."""
    x = np.asarray(samples_s, dtype="<f4")
    times_f = path.with_suffix(".times.bin")
    x.tofile(times_f)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    summ = [_summary("nv/cold/sample_size", len(x), "int64"),
            _summary("nv/cold/time/gpu/mean", float(x.mean())),
            _summary("nv/cold/time/gpu/stdev/absolute", float(x.std(ddof=1))),
            _summary("nv/cold/time/gpu/stdev/relative", float(x.std(ddof=1) / x.mean())),
            _summary("nv/cold/time/gpu/min", float(x.min())), _summary("nv/cold/time/gpu/max", float(x.max())),
            _summary("nv/cold/time/gpu/q1", float(q1)), _summary("nv/cold/time/gpu/median", float(med)),
            _summary("nv/cold/time/gpu/q3", float(q3)),
            _summary("nv/cold/time/gpu/iqr/absolute", float(q3 - q1)),
            _summary("nv/cold/time/gpu/iqr/relative", float((q3 - q1) / med)),
            _bin_summary("nv/json/bin:nv/cold/sample_times", times_f.name, len(x))]
    if freqs_hz and len(freqs_hz) == len(x) and all(f for f in freqs_hz):
        f = np.asarray(freqs_hz, dtype="<f4")
        freqs_f = path.with_suffix(".freqs.bin")
        f.tofile(freqs_f)
        summ += [_summary("nv/cold/sm_clock_rate/mean", float(f.mean())),
                 _bin_summary("nv/json/freqs-bin:nv/cold/sample_freqs", freqs_f.name, len(f))]
    state = {"name": "Device=0", "min_samples": 10, "min_time": 0.5, "max_noise": 0.005, "skip_time": -1.0,
             "timeout": 15.0, "device": 0, "type_config_index": 0, "axis_values": None, "summaries": summ,
             "is_skipped": False}
    bench = {"name": "mla_prefill", "index": 0, "min_samples": 10, "min_time": 0.5, "max_noise": 0.005,
             "skip_time": -1.0, "timeout": 15.0, "devices": [0], "axes": None, "states": [state]}
    root = {"meta": {"argv": ["latency_ab"], "version": {"json": {"major": 1, "minor": 0, "patch": 0,
                                                                  "string": "1.0.0"}}},
            "devices": [{"id": 0, "name": "NVIDIA H200"}], "benchmarks": [bench]}
    path.write_text(json.dumps(root))


def robust_status(ref: Path, cmp: Path) -> tuple[str, str]:
    """Run nvbench-compare-robust on one pair; returns (status, the tool's output)."""
    p = subprocess.run([sys.executable, "-m", "cuda.bench.scripts.nvbench_compare_robust", "--no-color",
                        "--display", "simple", str(ref), str(cmp)], capture_output=True, text=True)
    text = p.stdout + p.stderr
    found = [s for s in STATUSES if re.search(rf"\b{s}\b", text.split("Summary")[0])]
    return (found[0] if len(found) == 1 else ("ERROR" if p.returncode else "/".join(found) or "?")), text


def verdicts(ab: dict, factor: float, alpha: float) -> dict:
    """Per trial: nvbench-compare-robust's status, and the gate rule on time and on SM cycles."""
    from mla_fp8_bench.analysis.gate import Measure, latency_verdict

    rows, example = [], None
    with tempfile.TemporaryDirectory() as td:
        for i, t in enumerate(ab["trials"]):
            ex = t.get("extra") or {}
            fb, fh = ex.get("base_sm_mhz") or [], ex.get("head_sm_mhz") or []
            ref, cmp = Path(td) / f"ref{i}.json", Path(td) / f"cmp{i}.json"
            write_nvbench_json(ref, t["base"], [f * 1e6 for f in fb if f] if fb else None)
            write_nvbench_json(cmp, t["head"], [f * 1e6 for f in fh if f] if fh else None)
            status, text = robust_status(ref, cmp)
            example = example or text[-3000:]
            vt = latency_verdict(Measure("ok", samples=t["base"]), Measure("ok", samples=t["head"]), factor, alpha)
            row = {"slowdown": t["slowdown"], "robust": status, "ratio_time": vt.ratio, "gate_time": vt.regressed}
            if fb and fh and len(fb) == len(t["base"]) and len(fh) == len(t["head"]):
                cb = [x * f for x, f in zip(t["base"], fb)]
                ch = [x * f for x, f in zip(t["head"], fh)]
                vc = latency_verdict(Measure("ok", samples=cb), Measure("ok", samples=ch), factor, alpha)
                row.update(ratio_cycles=vc.ratio, gate_cycles=vc.regressed)
            rows.append(row)
    levels = {}
    for r in rows:
        lv = levels.setdefault(r["slowdown"], {"trials": 0, "robust": {}, "gate_time": 0, "gate_cycles": 0})
        lv["trials"] += 1
        lv["robust"][r["robust"]] = lv["robust"].get(r["robust"], 0) + 1
        lv["gate_time"] += bool(r["gate_time"])
        lv["gate_cycles"] += bool(r.get("gate_cycles"))
        lv.setdefault("ratios_time", []).append(r["ratio_time"])
    for lv in levels.values():
        lv["median_ratio_time"] = statistics.median(lv.pop("ratios_time"))
    return {"factor": factor, "alpha": alpha, "rows": rows, "levels": levels, "example_output": example}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("latency_ab_json")
    ap.add_argument("--factor", type=float, default=1.01, help="gate factor beside the robust verdicts (1.01)")
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--json", help="write the verdicts here")
    a = ap.parse_args(argv)
    res = verdicts(json.loads(Path(a.latency_ab_json).read_text()), a.factor, a.alpha)
    print(f"| injected | trials | nvbench-compare-robust | gate rule on time (>{a.factor}, p<{a.alpha}) | "
          f"gate rule on SM cycles |\n|---|---|---|---|---|")
    for s, lv in sorted(res["levels"].items()):
        name = "A/A" if s == 0 else f"+{s * 100:g} %"
        rob = ", ".join(f"{k} {v}" for k, v in sorted(lv["robust"].items()))
        print(f"| {name} | {lv['trials']} | {rob} | {lv['gate_time']}/{lv['trials']} | "
              f"{lv['gate_cycles']}/{lv['trials']} |")
    if a.json:
        from mla_fp8_bench.jsonio import write_json_atomic

        write_json_atomic(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
