#!/usr/bin/env python3
"""Does averaging input placements make a case's latency hold across processes? Separate processes on one GPU.

Each process runs the suite's latency round (:func:`mla_fp8_bench.harness.rounds.measure_round`, what the
asv grid's rounds, ``ab`` and the order check measure) twice over the same cases: once with one input
placement (the case's own inputs) and once with ``--placements`` (the default figure,
:mod:`mla_fp8_bench.harness.placements`), which goes first alternating by process. ``--summarize``
gives per case the spread ``max / min - 1`` over processes of each figure and the time of its timing phase::

    python3 studies/placement_figure.py --procs 8 --cases s128,s512,s1024,s2048,s8192 --json out.json
    python3 studies/placement_figure.py --summarize out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(backend: str, cases: list[str], placements: int, first: str) -> dict:
    """One process: ``{"one": round document, "many": round document}``, ``first`` of them measured first."""
    from mla_fp8_bench.config import RunConfig
    from mla_fp8_bench.harness.rounds import measure_round

    out = {}
    for which in (first, "many" if first == "one" else "one"):
        cfg = RunConfig(placements=1 if which == "one" else placements)
        out[which] = measure_round([backend], cases, "sorted", 0, config=cfg)
    return out


def summarize(doc: dict) -> dict:
    """Per (backend, case) and figure: the spread over processes, the median latency (s), the median timing
    phase (s), the placements used and the median spread of the placements' medians inside a process.
    ValueError: not a placement_figure.py document."""
    procs = doc.get("processes") if isinstance(doc, dict) else None
    if not isinstance(procs, list):
        raise ValueError("no 'processes' list: a placement_figure.py --json document is needed")
    rows: dict = {}
    for p in procs:
        for which, rd in (p.get("rounds") or {}).items():
            for r in rd.get("rows", []):
                if isinstance(r.get("latency_s"), (int, float)):
                    d = rows.setdefault((r["backend"], r["case"]), {}).setdefault(which, {"lat": [], "t": [], "k": [],
                                                                                        "inside": []})
                    d["lat"].append(r["latency_s"])
                    per = r.get("placement_latency_s") or []
                    if len(per) > 1:
                        d["inside"].append(max(per) / min(per) - 1)
                    d["t"].append((r.get("phases_s") or {}).get("timing", 0.0) + (r.get("phases_s") or {}).get(
                        "placements", 0.0))
                    d["k"].append(r.get("placements", 1))
    out = {}
    for (b, c), figs in rows.items():
        res = {}
        for which, d in figs.items():
            res[which] = {"processes": len(d["lat"]), "spread": max(d["lat"]) / min(d["lat"]) - 1,
                          "median_s": statistics.median(d["lat"]), "timing_s": statistics.median(d["t"]),
                          "placements": max(d["k"]),
                          "inside_spread": statistics.median(d["inside"]) if d["inside"] else None}
        out[f"{b}|{c}"] = res
        print(f"{b:10s} {c:8s} " + "  ".join(
            f"{w}: {r['spread'] * 100:5.2f}% over {r['processes']} ({r['median_s'] * 1e6:9.2f} us, "
            f"{r['placements']:2d} placements, {r['timing_s']:.2f} s"
            + (f", inside {r['inside_spread'] * 100:.2f}%)" if r["inside_spread"] is not None else ")")
            for w, r in sorted(res.items())))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="fa3-fp8")
    ap.add_argument("--cases", default="s128,s512,s1024,s2048,s8192")
    ap.add_argument("--procs", type=int, default=8, help="separate processes (0: measure in this one)")
    ap.add_argument("--placements", type=int, default=0, help="the many-placement figure's count (0: the default)")
    ap.add_argument("--first", default="one", choices=("one", "many"), help="with --procs 0: which figure first")
    ap.add_argument("--deadline", type=float, default=0.0, help="start no process after this many seconds")
    ap.add_argument("--json")
    ap.add_argument("--summarize", metavar="JSON")
    a = ap.parse_args(argv)
    from mla_fp8_bench.config import DEFAULT_PLACEMENTS
    from mla_fp8_bench.jsonio import load_json, write_json_atomic

    if a.summarize:
        try:
            summarize(load_json(a.summarize, "--summarize"))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    cases = [c for c in a.cases.split(",") if c]
    k = a.placements or DEFAULT_PLACEMENTS
    if a.procs == 0:
        print(json.dumps(measure(a.backend, cases, k, a.first)))
        return 0
    if a.json and Path(a.json).exists():
        print(f"error: --json {a.json} exists: give a new file", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    doc: dict = {"backend": a.backend, "cases": cases, "placements": k, "processes": []}
    for i in range(a.procs):
        if a.deadline and time.monotonic() - t0 > a.deadline:
            break
        first = "one" if i % 2 == 0 else "many"
        r = subprocess.run([sys.executable, __file__, "--procs", "0", "--backend", a.backend, "--cases", a.cases,
                            "--placements", str(k), "--first", first], capture_output=True, text=True)
        sys.stderr.write(r.stderr[-2000:])
        lines = r.stdout.strip().splitlines()
        try:
            rounds = json.loads(lines[-1]) if r.returncode == 0 and lines else None
        except json.JSONDecodeError:
            rounds = None
        doc["processes"].append({"first": first, "rc": r.returncode, "rounds": rounds})
        print(f"process {i} ({first} first): rc {r.returncode}", flush=True)
        if a.json:
            write_json_atomic(doc, a.json)
    doc["summary"] = summarize(doc)
    if a.json:
        write_json_atomic(doc, a.json)
    return 0 if any(p["rounds"] for p in doc["processes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
