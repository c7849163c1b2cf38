#!/usr/bin/env python3
"""Does ``mla-fp8-bench ab`` catch a small device-side slowdown, and stay quiet on A/A? Trials on one GPU.

HEAD is a second *install* of the library under test, FA3: a directory holding a module
``fa3_fwd_interface`` that loads the real one and, after every ``every``-th call of
``flash_attn_varlen_func`` on a case of ``tokens`` query rows, launches an in-place ``mul_(1.0)`` over
``n`` fp32 elements on the same stream (inside the captured graph). ``n`` and ``every`` are calibrated
per case (``--calibrate``, on the device) so the extra device time per call is ``--slowdown`` x the
call's graph-replay time: a kernel inside a graph lasts at least about 1 us on an H200, so for small
cases (s512: 3 % is about 0.5 us) the kernel is ``every`` x longer and runs on every ``every``-th call.
BASE (and the second BASE of an A/A trial) is an empty directory: the real FA3.

Each trial is one :func:`mla_fp8_bench.analysis.ab.measure_ab` run (``--rounds`` rounds per side, BASE
and HEAD in alternating forked processes) judged by :func:`mla_fp8_bench.analysis.ab.judge`: what
``mla-fp8-bench ab`` does, except that the three sides' round servers (BASE, a second BASE for A/A,
the slowed HEAD) stay up across trials. A/A and slowdown trials alternate which goes first. Run from
the repository root on the device::

    python3 studies/ab_trials.py --work /tmp/abt --out $OUT/ab_trials.json --trials 5 --rounds 4

``--summarize A.json B.json ...`` pools trial files (two machine starts) and recomputes every verdict
with ``ab``'s rule (:func:`mla_fp8_bench.analysis.ab.judge`) at ``--factor`` / ``--noise-k`` from the stored
per-round values. A slowdown trial of a case whose calibration check (the injected kernel measured next
to the case's own, in one process) missed the target by more than 0.3 points counts as ``slow-off``:
it measured ``ab`` on a smaller slowdown than the one named.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "studies"))

SHIM = '''"""fa3_fwd_interface with an injected device-side slowdown (studies/ab_trials.py)."""
import importlib.machinery, importlib.util, json, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("fa3_fwd_interface", _path)
_real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
with open(os.path.join(_here, "slowdown.json")) as _f:
    _cfg = json.load(_f)
_state = {}


def flash_attn_varlen_func(q, *args, **kwargs):
    out = _real.flash_attn_varlen_func(q, *args, **kwargs)
    key = str(q.shape[0])
    c = _cfg.get(key)
    if c:
        import torch
        st = _state.get(key)
        if st is None:
            st = _state[key] = {"buf": torch.ones(c["n"], dtype=torch.float32, device=q.device), "i": 0}
        st["i"] += 1
        if st["i"] % c["every"] == 0:
            st["buf"].mul_(1.0)
    return out
'''


CALIBRATION_STEPS = 6
CALIBRATION_TOL = 0.003  # the injected slowdown, measured next to the case's kernel, within 0.3 points of the target


def _slowed(run, buf, every: int):
    """``run`` followed by ``buf.mul_(1.0)`` on every ``every``-th call (the shim's injection)."""
    state = {"i": 0}

    def slow():
        out = run()
        state["i"] += 1
        if state["i"] % every == 0:
            buf.mul_(1.0)
        return out
    return slow


def calibrate(cases: list[str], slowdown: float, backend: str = "fa3-fp8") -> dict:
    """{tokens: {"n", "every", "buf", "base_s", "kernel_s", "target_s", "verify_ratio"}} on this GPU."""
    import torch
    from latency_ab import _graph_kernel_s, extra_kernel

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.measure.timing import time_device
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    pinfo = platform_info("auto")
    dev = pinfo.device
    b = get_backend(backend)
    out = {}
    for cid in cases:
        case = parse_case_id(cid)
        inputs = make_inputs(case, dev, pinfo.fp8_dtype)
        prep = b.prepare_case(inputs)
        base_s = time_device(prep.run, dev, graph_capturable=prep.graph_capturable).median_s
        floor_s = _graph_kernel_s(functools.partial(torch.ones(1 << 10, dtype=torch.float32, device=dev).mul_, 1.0),
                                  dev)
        target = slowdown * base_s
        every = 1 if target >= 3 * floor_s else int(math.ceil(3 * floor_s / target))
        kernel_target = target * every
        # Measure the added time next to the case's own kernel, and resize until it is the target: a
        # kernel's time alone is not what it adds (at s8192, power-capped, it added about half of it).
        for _step in range(CALIBRATION_STEPS):
            _fn, info = extra_kernel(dev, kernel_target)
            n = int(info["n"])
            slow = _slowed(prep.run, torch.ones(n, dtype=torch.float32, device=dev), every)
            r = [time_device(slow, dev, graph_capturable=prep.graph_capturable).median_s /
                 time_device(prep.run, dev, graph_capturable=prep.graph_capturable).median_s for _ in range(3)]
            added = statistics.median(r) - 1.0
            if abs(added - slowdown) <= CALIBRATION_TOL:
                break
            kernel_target = info["kernel_s"] * min(4.0, max(0.25, slowdown / max(added, slowdown / 4)))
        tokens = int(inputs.q.shape[0]) if hasattr(inputs, "q") else case.total_tokens
        out[str(tokens)] = {"case": cid, "n": n, "every": every, "buf": n, "base_s": base_s, "floor_s": floor_s,
                            "kernel_s": info["kernel_s"], "target_s": target, "verify_ratio": r,
                            "calibrated": abs(statistics.median(r) - 1.0 - slowdown) <= CALIBRATION_TOL}
        print(f"{cid}: base {base_s * 1e6:.2f} us, kernel {info['kernel_s'] * 1e6:.2f} us every {every} "
              f"(target +{target * 1e6:.3f} us/call), measured ratio {[round(x, 4) for x in r]}", flush=True)
        del prep, slow
        torch.cuda.empty_cache()
    return out


def trial_verdicts(measured: dict, factor: float, k: float) -> dict:
    """The verdict per case of one :func:`mla_fp8_bench.analysis.ab.measure_ab` result, by the rule
    ``mla-fp8-bench ab`` applies (:func:`mla_fp8_bench.analysis.ab.judge`) at ``factor`` / ``k``."""
    from mla_fp8_bench.analysis.ab import judge

    _docs, rows = judge(measured, factor, k)
    return {r.case: {"verdict": r.verdict, "ratio": r.ratio, "detail": r.detail}
            for r in rows if r.metric == "latency_s"}


def summarize(files: list[str], factor: float, k: float) -> dict:
    trials = []
    for f in files:
        doc = json.loads(Path(f).read_text())
        off = {c["case"] for c in doc.get("calibration", {}).values()
               if abs(statistics.median(c["verify_ratio"]) - 1.0 - doc.get("slowdown", 0.03)) > CALIBRATION_TOL}
        trials.extend((t, off) for t in doc["trials"])
    table: dict = {}
    for t, off in trials:
        if "measured" not in t:
            continue
        v = trial_verdicts(t["measured"], factor, k)
        for case, x in v.items():
            kind = "slow-off" if t["kind"] == "slow" and case in off else t["kind"]
            e = table.setdefault((kind, case), {"n": 0, "alarms": 0, "ratios": []})
            e["n"] += 1
            e["alarms"] += x["verdict"] == "REGRESSION"
            e["ratios"].append(x["ratio"])
    res = []
    for (kind, case), e in sorted(table.items()):
        res.append({"kind": kind, "case": case, "trials": e["n"], "flagged": e["alarms"],
                    "median_ratio": statistics.median(e["ratios"]), "min_ratio": min(e["ratios"]),
                    "max_ratio": max(e["ratios"])})
        print(f"{kind:5s} {case:8s} flagged {e['alarms']}/{e['n']}  ratio median {statistics.median(e['ratios']):.4f} "
              f"({min(e['ratios']):.4f}-{max(e['ratios']):.4f})")
    return {"factor": factor, "noise_k": k, "rows": res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="s512,s8192")
    ap.add_argument("--slowdown", type=float, default=0.03)
    ap.add_argument("--trials", type=int, default=5, help="trials of each kind (A/A and slowdown)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--work", default="/tmp/ab_trials")
    ap.add_argument("--out", help="trials JSON")
    ap.add_argument("--deadline", type=float, default=300.0, help="start no trial after this many seconds")
    ap.add_argument("--calibrate", metavar="JSON", help="only calibrate, write the spec here")
    ap.add_argument("--summarize", nargs="+")
    ap.add_argument("--factor", type=float, default=None)
    ap.add_argument("--noise-k", type=float, default=None)
    a = ap.parse_args(argv)
    from mla_fp8_bench.analysis.gate import DEFAULT_AB_FACTOR, DEFAULT_AB_NOISE_K

    factor = a.factor or DEFAULT_AB_FACTOR
    k = DEFAULT_AB_NOISE_K if a.noise_k is None else a.noise_k
    if a.summarize:
        res = summarize(a.summarize, factor, k)
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1))
        return 0
    cases = a.cases.split(",")
    if a.calibrate:
        Path(a.calibrate).write_text(json.dumps(calibrate(cases, a.slowdown), indent=1))
        return 0
    t0 = time.monotonic()
    work = Path(a.work)
    base, base2, head = work / "base", work / "base2", work / "head"
    for d in (base, base2, head):
        d.mkdir(parents=True, exist_ok=True)
    spec = work / "slowdown.json"
    rc = subprocess.run([sys.executable, __file__, "--calibrate", str(spec), "--cases", a.cases, "--slowdown",
                         str(a.slowdown)]).returncode
    if rc != 0:
        print(f"calibration failed (rc {rc})")
        return 1
    (head / "slowdown.json").write_text(spec.read_text())
    (head / "fa3_fwd_interface.py").write_text(SHIM)
    doc = {"calibration": json.loads(spec.read_text()), "slowdown": a.slowdown, "rounds": a.rounds,
           "factor": factor, "noise_k": k, "trials": []}
    from mla_fp8_bench.analysis.ab import ServerRunner, measure_ab, parse_side

    sides = {"base": parse_side(str(base), "BASE"), "aa": parse_side(str(base2), "BASE2"),
             "slow": parse_side(str(head), "HEAD")}
    runner = ServerRunner(["fa3-fp8"])
    try:
        for i in range(a.trials):
            kinds = ("aa", "slow") if i % 2 == 0 else ("slow", "aa")
            for kind in kinds:
                last = max((x["wall_s"] for x in doc["trials"]), default=0.0)
                if time.monotonic() - t0 + last > a.deadline:
                    break
                t1 = time.monotonic()
                measured = measure_ab(sides["base"], sides[kind], ["fa3-fp8"], cases, a.rounds, runner, seed=i)
                v = trial_verdicts(measured, factor, k)
                doc["trials"].append({"kind": kind, "i": i, "wall_s": time.monotonic() - t1, "measured": measured,
                                      "verdicts": v})
                print(f"trial {i} {kind}: {time.monotonic() - t1:.1f}s " +
                      ", ".join(f"{c} {x['verdict']} {x['ratio']:.4f}" for c, x in v.items()), flush=True)
                if a.out:
                    Path(a.out).write_text(json.dumps(doc))
    finally:
        runner.close()
    doc["wall_s"] = time.monotonic() - t0
    if a.out:
        Path(a.out).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
