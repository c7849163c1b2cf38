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

Each trial is one ``mla-fp8-bench ab`` run (``--rounds`` rounds per side, alternating processes); A/A
and slowdown trials alternate. Run from the repository root on the device::

    python3 studies/ab_trials.py --work /tmp/abt --out $OUT/ab_trials.json --trials 5 --rounds 5

``--summarize A.json B.json ...`` pools trial files (two machine starts) and recomputes every verdict
with the gate's rounds rule at ``--factor`` / ``--noise-k`` from the stored per-round values.
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
_state = {"buf": None, "i": 0}


def flash_attn_varlen_func(q, *args, **kwargs):
    out = _real.flash_attn_varlen_func(q, *args, **kwargs)
    c = _cfg.get(str(q.shape[0]))
    if c:
        import torch
        if _state["buf"] is None:
            _state["buf"] = torch.ones(c["buf"], dtype=torch.float32, device=q.device)
        _state["i"] += 1
        if _state["i"] % c["every"] == 0:
            _state["buf"][: c["n"]].mul_(1.0)
    return out
'''


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
        fn, info = extra_kernel(dev, target * every)
        n = int(info["n"])
        slow = _slowed(prep.run, torch.ones(n, dtype=torch.float32, device=dev), every)
        r = [time_device(slow, dev, graph_capturable=prep.graph_capturable).median_s /
             time_device(prep.run, dev, graph_capturable=prep.graph_capturable).median_s for _ in range(2)]
        tokens = int(inputs.q.shape[0]) if hasattr(inputs, "q") else case.total_tokens
        out[str(tokens)] = {"case": cid, "n": n, "every": every, "buf": n, "base_s": base_s, "floor_s": floor_s,
                            "kernel_s": info["kernel_s"], "target_s": target, "verify_ratio": r}
        print(f"{cid}: base {base_s * 1e6:.2f} us, kernel {info['kernel_s'] * 1e6:.2f} us every {every} "
              f"(target +{target * 1e6:.3f} us/call), measured ratio {[round(x, 4) for x in r]}", flush=True)
        del prep, slow
        torch.cuda.empty_cache()
    return out


def trial_verdicts(doc: dict, factor: float, k: float) -> dict:
    """Recompute the gate's verdict per (backend, case) of one ab JSON at ``factor`` / ``k``, for the
    median over rounds and for each gated figure (time, cycles) with the gate's physics choice."""
    from mla_fp8_bench.analysis import gate as G

    bs = G.side_from_run_json(doc["base"], "BASE")
    hs = G.side_from_run_json(doc["head"], "HEAD")
    rows = G.compare(bs, hs, factor=factor, noise_k=k)
    out = {}
    for r in rows:
        if r.metric == "latency_s":
            out[r.case] = {"verdict": r.verdict, "ratio": r.ratio, "detail": r.detail}
    return out


def summarize(files: list[str], factor: float, k: float) -> dict:
    trials = []
    for f in files:
        trials.extend(json.loads(Path(f).read_text())["trials"])
    table: dict = {}
    for t in trials:
        if "ab" not in t:
            continue
        v = trial_verdicts(t["ab"], factor, k)
        for case, x in v.items():
            e = table.setdefault((t["kind"], case), {"n": 0, "alarms": 0, "ratios": []})
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
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="/tmp/ab_trials")
    ap.add_argument("--out", help="trials JSON")
    ap.add_argument("--deadline", type=float, default=300.0, help="start no trial after this many seconds")
    ap.add_argument("--calibrate", metavar="JSON", help="only calibrate, write the spec here")
    ap.add_argument("--summarize", nargs="+")
    ap.add_argument("--factor", type=float, default=None)
    ap.add_argument("--noise-k", type=float, default=None)
    a = ap.parse_args(argv)
    from mla_fp8_bench.analysis.gate import DEFAULT_AB_FACTOR, DEFAULT_NOISE_K

    factor = a.factor or DEFAULT_AB_FACTOR
    k = DEFAULT_NOISE_K if a.noise_k is None else a.noise_k
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
    doc = {"calibration": json.loads(spec.read_text()), "slowdown": a.slowdown, "rounds": a.rounds, "trials": []}
    for i in range(a.trials):
        for kind, h in (("aa", base2), ("slow", head)):
            last = max((x["wall_s"] for x in doc["trials"]), default=0.0)
            if time.monotonic() - t0 + last > a.deadline:
                break
            js = work / f"trial{i}_{kind}.json"
            t1 = time.monotonic()
            p = subprocess.run([sys.executable, "-m", "mla_fp8_bench.cli", "ab", str(base), str(h), "-b", "fa3-fp8",
                                "-c", a.cases, "--rounds", str(a.rounds), "--seed", str(i), "--json", str(js)],
                               capture_output=True, text=True)
            entry = {"kind": kind, "i": i, "rc": p.returncode, "wall_s": time.monotonic() - t1,
                     "tail": (p.stdout + p.stderr)[-1500:]}
            if js.is_file():
                entry["ab"] = json.loads(js.read_text())
                v = trial_verdicts(entry["ab"], factor, k)
                print(f"trial {i} {kind}: rc {p.returncode} in {entry['wall_s']:.1f}s " +
                      ", ".join(f"{c} {x['verdict']} {x['ratio']:.4f}" for c, x in v.items()), flush=True)
            else:
                print(f"trial {i} {kind}: rc {p.returncode}, no JSON: {entry['tail'][-600:]}", flush=True)
            doc["trials"].append(entry)
            if a.out:
                Path(a.out).write_text(json.dumps(doc))
    doc["wall_s"] = time.monotonic() - t0
    if a.out:
        Path(a.out).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
