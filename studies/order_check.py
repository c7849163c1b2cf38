#!/usr/bin/env python3
"""Does the order in which cases are measured change their latency? One process per order.

``--order sorted|reversed|shuffled`` measures the (backend, case) grid in that order in this process
with the suite's kernel timing (:func:`mla_fp8_bench.measure.timing.measure_latency`: graph replay,
clock-aware settle, per-sample SM clock) and writes one JSON per process. Only latency is measured
(no references, no call latency), so a process costs seconds. Run it as separate processes on a
freshly started machine, the first process included, then ``--summarize`` the files::

    python3 studies/order_check.py --order sorted --json o1.json
    python3 studies/order_check.py --order reversed --json o2.json
    python3 studies/order_check.py --order shuffled --seed 1 --json o3.json
    python3 studies/order_check.py --summarize o1.json o2.json o3.json --json summary.json

The summary gives per (backend, case) the spread across processes ``(max - min) / min`` of the
medians, its largest value, and whether every spread is within ``--tolerance`` (default 1 %).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mla_fp8_bench.harness.rounds import ordered  # noqa: E402,F401 - the one definition of the orders

DEFAULT_BACKENDS = "fa3-fp8,fa3-bf16,torch-sdpa-bf16,torch-fp8-ref"


def measure_process(backends: list[str], cases: list[str], order: str, seed: int) -> dict:
    """Latency of every (backend, case) in ``order`` in this process (GPU; skips what cannot run)."""
    import torch

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.measure.timing import _PROCESS_STATE, clock_fields, measure_latency
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    t_start = time.time()
    pinfo = platform_info("auto")
    bks = {b: get_backend(b) for b in backends}
    ok = {b: bool(bk.availability(pinfo)) for b, bk in bks.items()}
    rows = []
    inputs_cache: dict = {}
    for b, c in ordered([(b, c) for c in cases for b in backends], order, seed):
        row = {"backend": b, "case": c}
        t0 = time.perf_counter()
        try:
            if not ok[b]:
                raise RuntimeError("unavailable")
            if c not in inputs_cache:
                inputs_cache.clear()
                torch.cuda.empty_cache() if pinfo.device.type == "cuda" else None
                inputs_cache[c] = make_inputs(parse_case_id(c), pinfo.device, pinfo.fp8_dtype)
            prep = bks[b].prepare(inputs_cache[c])
            tr = measure_latency(prep.run, pinfo.device, graph_capturable=prep.graph_capturable)
            row.update(latency_s=tr.median_s, cv=tr.cv, n=len(tr.samples_s), launches=tr.launches_per_sample,
                       method=tr.method, warmup_device_s=tr.extra.get("warmup_device_s"),
                       warmup_sm_mhz=tr.extra.get("warmup_sm_mhz"), **clock_fields(tr))
            if prep.cleanup:
                prep.cleanup()
        except Exception as exc:  # noqa: BLE001 - one failing pair never loses the others
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
    st = next(iter(_PROCESS_STATE.values()), {})
    heat = st.get("heat_up")
    return {"order": order, "seed": seed, "started": t_start, "wall_s": time.time() - t_start, "device": pinfo.name,
            "clock_policy": st.get("policy"), "heat_up": heat, "rows": rows}


def summarize(runs: list[dict], tolerance: float = 0.01) -> dict:
    """Spread across processes of each (backend, case)'s median latency.

    Returns:
        ``{"pairs": [{"backend", "case", "medians_s", "orders", "spread", "cv"}], "max_spread",
        "worst", "within_tolerance", "tolerance"}`` (spread = (max - min) / min).
    """
    by: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for r in runs:
        for row in r["rows"]:
            if row.get("latency_s"):
                by.setdefault((row["backend"], row["case"]), []).append((r["order"], row["latency_s"]))
    pairs = []
    for (b, c), vals in by.items():
        v = [x for _, x in vals]
        cv = statistics.stdev(v) / statistics.fmean(v) if len(v) > 1 else 0.0
        pairs.append({"backend": b, "case": c, "medians_s": v, "orders": [o for o, _ in vals],
                      "spread": (max(v) - min(v)) / min(v), "cv": cv})
    worst = max(pairs, key=lambda p: p["spread"]) if pairs else None
    return {"pairs": pairs, "max_spread": worst["spread"] if worst else None,
            "worst": {k: worst[k] for k in ("backend", "case", "spread")} if worst else None,
            "within_tolerance": bool(pairs) and all(p["spread"] <= tolerance for p in pairs),
            "tolerance": tolerance, "processes": len(runs)}


def measure_tracked(backends: list[str], cases: list[str], order: str, rounds: int, seed: int) -> dict:
    """The tracked figure (median over ``rounds`` rounds, each a fresh process forked from one round
    server), the cases listed in ``order`` and the rounds' backend orders starting with ``order``;
    returns an order-check document whose rows carry the medians over rounds."""
    import os
    import tempfile

    from mla_fp8_bench.harness.rounds import ORDERS, RoundServer, records_from_rounds, suite_env

    seq = [order] + [o for o in ORDERS if o != order]
    cases = list(cases)  # the order a user lists: the rounds measure cases small to large whatever it is
    if order == "reversed":
        cases.reverse()
    elif order == "shuffled":
        import random

        random.Random(seed).shuffle(cases)
    srv = RoundServer(sys.executable, suite_env(), backends)
    docs = []
    t0 = time.time()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for j in range(rounds):
                docs.append(srv.round(backends, cases, seq[j % len(seq)], seed + j, os.path.join(tmp, f"r{j}.json")))
    finally:
        srv.close()
    rows = records_from_rounds(docs)
    return {"order": order, "seed": seed, "rounds": rounds, "round_orders": [d.get("order") for d in docs],
            "errors": [d.get("error") for d in docs if d.get("error")], "started": t0, "wall_s": time.time() - t0,
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=DEFAULT_BACKENDS)
    ap.add_argument("--cases", default=None, help="comma-separated case ids (default: the asv grid's cases)")
    ap.add_argument("--order", default="sorted", choices=("sorted", "reversed", "shuffled"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--summarize", nargs="+", metavar="JSON")
    ap.add_argument("--tracked-rounds", type=int, default=0,
                    help="measure the tracked figure instead: the median over this many rounds (forked processes)")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    if a.summarize:
        res = summarize([json.loads(Path(p).read_text()) for p in a.summarize], a.tolerance)
        for p in sorted(res["pairs"], key=lambda p: -p["spread"])[:12]:
            print(f"{p['backend']:16s} {p['case']:24s} spread {p['spread'] * 100:6.3f}%  cv {p['cv'] * 100:6.3f}%  "
                  f"{[round(x * 1e6, 2) for x in p['medians_s']]} us")
        print(f"max spread {res['max_spread']}; within {a.tolerance:.1%}: {res['within_tolerance']}")
    else:
        from mla_fp8_bench.harness.asv_support import ASV_CASES

        cases = a.cases.split(",") if a.cases else list(ASV_CASES)
        if a.tracked_rounds:
            res = measure_tracked(a.backends.split(","), cases, a.order, a.tracked_rounds, a.seed)
        else:
            res = measure_process(a.backends.split(","), cases, a.order, a.seed)
        ok = [r for r in res["rows"] if r.get("latency_s")]
        print(f"{a.order}: {len(ok)}/{len(res['rows'])} pairs measured in {res['wall_s']:.1f}s; heat-up "
              f"{(res.get('heat_up') or {}).get('sm_mhz')}")
    if a.json:
        from mla_fp8_bench.jsonio import write_json_atomic

        write_json_atomic(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
