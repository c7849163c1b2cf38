#!/usr/bin/env python3
"""Does averaging over buffer sets in separate allocation segments make a small case's latency hold
across processes? Separate processes on one GPU.

Each process builds ``--sets`` input sets of every case, each after a spacer allocation of 64-512 MiB
(so each set lands in its own allocation segment of torch's caching allocator), prepares each set and
times it with the suite's :func:`~mla_fp8_bench.measure.timing.time_device`. Per process and case it
records every set's latency (seconds per launch) and SM cycles per launch. ``--summarize`` compares,
across processes, two figures per case: the first set alone (what the suite times today) and the median
over the sets and the mean over the sets, as the max/min spread of each figure over processes::

    python3 studies/buffer_sets.py --procs 6 --cases s128,s512,s2048 --json out.json
    python3 studies/buffer_sets.py --summarize out.json

On an H200, small FA3-FP8 cases read at per-process levels 4-7% apart (studies/h200-measurements.md,
sections 12 and 13), and segment-separated buffer sets inside one process were seen 2-4% apart. A median
over sets removes the second; this measures how much of the process-to-process spread is left.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPACER_MIB = (64, 512)


def measure(backend: str, cases: list[str], sets: int, seed: int, samples: int = 30, settle_s: float = 0.15) -> dict:
    """One process: ``{case: {"latency_s": [per set], "sm_cycles": [per set], "timing_wall_s": float}}``;
    ``samples`` and ``settle_s`` go to :func:`time_device` (``samples``, ``warmup_s``); ``timing_wall_s`` is the
    host time of the case's ``time_device`` calls, summed over its sets."""
    import torch

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.measure.timing import clock_fields, time_device
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    rng = random.Random(seed)
    pinfo = platform_info("auto")
    dev = pinfo.device
    b = get_backend(backend)
    out = {}
    for cid in cases:
        case = parse_case_id(cid)
        keep, lat, cyc, wall = [], [], [], 0.0
        for _ in range(sets):
            mib = rng.randint(*SPACER_MIB)
            keep.append(torch.empty(mib << 20, dtype=torch.uint8, device=dev))
            prep = b.prepare_case(make_inputs(case, dev, pinfo.fp8_dtype))
            keep.append(prep)
            t0 = time.perf_counter()
            tr = time_device(prep.run, dev, graph_capturable=prep.graph_capturable, samples=samples,
                             warmup_s=settle_s)
            wall += time.perf_counter() - t0
            lat.append(tr.median_s)
            cyc.append(clock_fields(tr).get("latency_sm_cycles"))
        out[cid] = {"latency_s": lat, "sm_cycles": cyc, "timing_wall_s": wall}
        print(f"{cid}: " + " ".join(f"{x * 1e6:.2f}" for x in lat) + " us", flush=True)
        del keep
        torch.cuda.empty_cache()
    return out


def spread(vals: list[float]) -> float:
    return max(vals) / min(vals) - 1.0


def _check(doc: object, src: str) -> list[dict]:
    """The measured processes of a ``--json`` document; ValueError naming ``src`` and the first bad part."""
    procs = doc.get("processes") if isinstance(doc, dict) else None
    if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
        raise ValueError(f"{src}: no 'processes' list of objects (a buffer_sets.py --json document is needed)")
    out = [p["cases"] for p in procs if isinstance(p.get("cases"), dict)]
    for p in out:
        for cid, row in p.items():
            lat = row.get("latency_s") if isinstance(row, dict) else None
            if not (isinstance(lat, list) and lat and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          and math.isfinite(x) and x > 0 for x in lat)):
                raise ValueError(f"{src}: case {cid!r} has latency_s {lat!r}: a non-empty list of finite "
                                 "seconds > 0 is needed")
    return out


def summarize(doc: dict, src: str = "document") -> dict:
    """Per case: the spread over processes of the first set's latency and of the median over sets.
    ValueError naming ``src`` for a document that is not a buffer_sets.py result."""
    procs = _check(doc, src)
    rows = {}
    for cid in procs[0] if procs else []:
        first = [p[cid]["latency_s"][0] for p in procs if cid in p]
        med = [statistics.median(p[cid]["latency_s"]) for p in procs if cid in p]
        mean = [statistics.fmean(p[cid]["latency_s"]) for p in procs if cid in p]
        inside = [spread(p[cid]["latency_s"]) for p in procs if cid in p]
        rows[cid] = {"processes": len(first), "first_set_spread": spread(first), "median_of_sets_spread": spread(med),
                     "mean_of_sets_spread": spread(mean), "within_process_spread_median": statistics.median(inside)}
        print(f"{cid:8s} processes {len(first)}  first set {spread(first) * 100:5.2f}%  median of sets "
              f"{spread(med) * 100:5.2f}%  mean of sets {spread(mean) * 100:5.2f}%  inside a process "
              f"{statistics.median(inside) * 100:5.2f}%")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="fa3-fp8")
    ap.add_argument("--cases", default="s128,s512,s2048")
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--procs", type=int, default=6, help="separate processes (0: measure in this one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=30, help="time_device samples per set (at least 5)")
    ap.add_argument("--settle-s", type=float, default=0.15, help="time_device warmup_s per set (seconds, >= 0)")
    ap.add_argument("--deadline", type=float, default=0.0, help="start no process after this many seconds")
    ap.add_argument("--json")
    ap.add_argument("--summarize", metavar="JSON")
    a = ap.parse_args(argv)
    from mla_fp8_bench.jsonio import check_output_path, load_json, write_json_atomic

    if a.summarize is not None:
        try:
            summarize(load_json(a.summarize, "--summarize"), a.summarize)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    cases = [c for c in a.cases.split(",") if c]
    try:
        if a.sets < 1 or a.procs < 0:
            raise ValueError(f"--sets {a.sets} / --procs {a.procs}: need --sets >= 1 and --procs >= 0")
        if a.samples < 5 or not 0 <= a.settle_s <= 10:
            raise ValueError(f"--samples {a.samples} / --settle-s {a.settle_s}: need --samples >= 5 and "
                             "0 <= --settle-s <= 10")
        from mla_fp8_bench.backends import get_backend
        from mla_fp8_bench.problem.cases import parse_case_id

        get_backend(a.backend)
        if not cases:
            raise ValueError(f"--cases {a.cases!r} names no case, e.g. s128,s512")
        for c in cases:
            parse_case_id(c)
        if a.json:
            if Path(a.json).exists():
                raise ValueError(f"--json {a.json} exists: give a new file (a stored result is never replaced)")
            check_output_path(a.json, "--json")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.procs == 0:
        print(json.dumps(measure(a.backend, cases, a.sets, a.seed, a.samples, a.settle_s)))
        return 0
    t0 = time.monotonic()
    doc = {"backend": a.backend, "sets": a.sets, "samples": a.samples, "settle_s": a.settle_s,
           "spacer_mib": SPACER_MIB, "processes": []}
    for i in range(a.procs):
        if a.deadline and time.monotonic() - t0 > a.deadline:
            break
        r = subprocess.run([sys.executable, __file__, "--procs", "0", "--backend", a.backend, "--cases", a.cases,
                            "--sets", str(a.sets), "--seed", str(a.seed + i), "--samples", str(a.samples),
                            "--settle-s", str(a.settle_s)], capture_output=True, text=True)
        sys.stderr.write(r.stderr[-2000:])
        lines = r.stdout.strip().splitlines()
        print("\n".join(lines[:-1]), flush=True)
        try:
            cases_out = json.loads(lines[-1]) if r.returncode == 0 and lines else None
        except json.JSONDecodeError:
            cases_out = None
        doc["processes"].append({"seed": a.seed + i, "rc": r.returncode, "cases": cases_out})
        if a.json:
            write_json_atomic(doc, a.json)
    measured = any(p["cases"] for p in doc["processes"])
    doc["summary"] = summarize(doc, "this run") if measured else {}
    if a.json:
        write_json_atomic(doc, a.json)
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
