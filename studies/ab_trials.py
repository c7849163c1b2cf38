#!/usr/bin/env python3
"""Does ``mla-fp8-bench ab`` catch a small device-side slowdown, and stay quiet on A/A? Trials on one GPU.

HEAD is a second *install* of the library under test, FA3: a directory holding a module
``fa3_fwd_interface`` that loads the real one and, after every ``every``-th call of
``flash_attn_varlen_func`` on a case of ``tokens`` query rows, launches an in-place ``mul_(1.0)`` over
``n`` fp32 elements on the same stream (inside the captured graph). ``n`` and ``every`` are calibrated
per case (``--calibrate``, on the device) so the extra device time per call is ``--slowdown`` x the
call's graph-replay time: a kernel inside a graph lasts at least about 1 us on an H200, so for small
cases (s512: 3 % is about 0.5 us) the kernel is ``every`` x longer and runs on every ``every``-th call.
With ``--pad-injection``, cases whose target is at least ``PAD_MIN_S`` are slowed by the same kernel
doing more work instead: a causal single sequence of ``S`` tokens runs as ``S + rows`` (zero rows appended
to q, k and v once, on the first eager call; the output and LSE are the first ``S`` rows, unchanged, since
causal row i sees keys <= i). ``rows`` is calibrated in process, starting from ``S * (sqrt(1 + slowdown) -
1)``; the work grows in whole query tiles (with 128-row tiles, one more of s8192 is +3.1% of the causal
tile pairs). The slowdown should then share the case's power and clock behaviour, where an added memory-bound
kernel under the power cap did not add a constant share (studies/h200-measurements.md, section 13).
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
_real = sys.modules.get("fa3_fwd_interface")
if _real is None or os.path.dirname(os.path.abspath(getattr(_real, "__file__", "") or _here)) == _here:
    # HEAD's install: load the real module under another name (one copy of its custom ops per process)
    _path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _spec = importlib.machinery.PathFinder.find_spec("fa3_fwd_interface", _path)
    _real = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
with open(os.path.join(_here, "slowdown.json")) as _f:
    _cfg = json.load(_f)
_state = {}


def _padded(x, rows):
    import torch
    y = torch.zeros((x.shape[0] + rows,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    y[:x.shape[0]] = x
    return y


def _pad_call(q, k, v, cu_q, cu_k, max_q, max_k, rows, **kwargs):
    import torch
    t = q.shape[0]
    st = _state.setdefault(("pad", t), {})
    ident = (q.data_ptr(), k.data_ptr(), v.data_ptr(), t, rows)
    if st.get("ident") != ident:  # first (eager) call on these inputs: padded copies, reused by captured calls
        # (the inputs of a timed case do not change between calls; a latency round reads no output)
        st.update(ident=ident, q=_padded(q, rows), k=_padded(k, rows), v=_padded(v, rows),
                  cu=torch.tensor([0, t + rows], dtype=torch.int32, device=q.device))
    res = _real.flash_attn_varlen_func(st["q"], st["k"], st["v"], st["cu"], st["cu"], t + rows, t + rows, **kwargs)
    if isinstance(res, torch.Tensor):
        return res[:t]
    out, lse, *rest = res
    return (out[:t], lse[..., :t] if lse.shape[-1] == t + rows else lse[:t], *rest)


def flash_attn_varlen_func(q, *args, **kwargs):
    key = str(q.shape[0])
    c = _cfg.get(key)
    if c and c.get("mode") == "pad" and args[2].numel() == 2 and args[0].shape[0] == q.shape[0]:
        return _pad_call(q, *args[:6], rows=int(c["rows"]), **kwargs)
    out = _real.flash_attn_varlen_func(q, *args, **kwargs)
    if c:
        import torch
        st = _state.setdefault(key, {"i": 0})
        st["i"] += 1
        if "buf" not in st:
            st["buf"] = torch.ones(c["n"], dtype=torch.float32, device=q.device)
        if st["i"] % c["every"] == 0:
            st["buf"].mul_(1.0)
    return out
'''


CALIBRATION_STEPS = 6
PAD_MIN_S = 5e-6  # targets from here on are padded (with --pad-injection); below, the extra kernel
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


def _verify_ratio(slow, base, dev, graph_capturable: bool) -> list[float]:
    """Three in-process readings of slowed / unslowed kernel time (graph replay, :func:`time_device`)."""
    from mla_fp8_bench.measure.timing import time_device

    return [time_device(slow, dev, graph_capturable=graph_capturable).median_s /
            time_device(base, dev, graph_capturable=graph_capturable).median_s for _ in range(3)]


def _calibrate_pad(b, inputs, dev, slowdown: float, work_dir: Path) -> dict:
    """``rows`` appended to the sequence that add ``slowdown`` next to the case's own call, found in this
    process through the shim itself (its ``flash_attn_varlen_func`` bound into a second prepared case)."""
    import importlib.util

    from mla_fp8_bench.peers.fa3 import load_fa3

    key = str(int(inputs.q.shape[0]))
    seq = int(inputs.max_seqlen_q)
    rows = max(1, math.ceil(seq * (math.sqrt(1 + slowdown) - 1)))
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "slowdown.json").write_text(json.dumps({key: {"mode": "pad", "rows": rows}}))
    (work_dir / "fa3_fwd_interface.py").write_text(SHIM)
    mod = load_fa3()  # imported first: the shim then wraps this module instead of loading a second copy
    spec = importlib.util.spec_from_file_location("ab_trials_shim", work_dir / "fa3_fwd_interface.py")
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    real = mod.flash_attn_varlen_func
    base = b.prepare_case(inputs)
    mod.flash_attn_varlen_func = shim.flash_attn_varlen_func
    try:
        slow = b.prepare_case(inputs)
    finally:
        mod.flash_attn_varlen_func = real
    for _step in range(CALIBRATION_STEPS):
        shim._cfg[key]["rows"] = rows
        r = _verify_ratio(slow.run, base.run, dev, base.graph_capturable)
        added = statistics.median(r) - 1.0
        if abs(added - slowdown) <= CALIBRATION_TOL:
            break
        rows = max(1, min(seq, round(rows * slowdown / max(added, slowdown / 4))))
    return {"mode": "pad", "rows": shim._cfg[key]["rows"], "verify_ratio": r}


def calibrate(cases: list[str], slowdown: float, backend: str = "fa3-fp8", pad_dir: Path | None = None) -> dict:
    """{tokens: {"n", "every", "buf", "base_s", "kernel_s", "target_s", "verify_ratio"}} on this GPU; with
    ``pad_dir`` (a scratch directory), cases whose target is at least ``PAD_MIN_S`` get
    {"mode": "pad", "rows", "base_s", "target_s", "verify_ratio"} instead."""
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
        tokens = int(inputs.q.shape[0]) if hasattr(inputs, "q") else case.total_tokens
        if pad_dir is not None and target >= PAD_MIN_S:
            w = _calibrate_pad(b, inputs, dev, slowdown, pad_dir / cid)
            on_target = abs(statistics.median(w["verify_ratio"]) - 1.0 - slowdown) <= CALIBRATION_TOL
            out[str(tokens)] = {"case": cid, **w, "base_s": base_s, "target_s": target, "calibrated": on_target}
            print(f"{cid}: base {base_s * 1e6:.2f} us, padded by {w['rows']} rows, measured ratio "
                  f"{[round(x, 4) for x in w['verify_ratio']]}", flush=True)
            del prep
            torch.cuda.empty_cache()
            continue
        every = 1 if target >= 3 * floor_s else int(math.ceil(3 * floor_s / target))
        kernel_target = target * every
        # Measure the added time next to the case's own kernel, and resize until it is the target: a
        # kernel's time alone is not what it adds (at s8192, power-capped, it added about half of it).
        for _step in range(CALIBRATION_STEPS):
            _fn, info = extra_kernel(dev, kernel_target)
            n = int(info["n"])
            slow = _slowed(prep.run, torch.ones(n, dtype=torch.float32, device=dev), every)
            r = _verify_ratio(slow, prep.run, dev, prep.graph_capturable)
            added = statistics.median(r) - 1.0
            if abs(added - slowdown) <= CALIBRATION_TOL:
                break
            kernel_target = info["kernel_s"] * min(4.0, max(0.25, slowdown / max(added, slowdown / 4)))
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
    ap.add_argument("--pad-injection", action="store_true",
                    help=f"targets of at least {PAD_MIN_S * 1e6:.0f} us: the sequence padded, not an extra kernel")
    ap.add_argument("--factor", type=float, default=None)
    ap.add_argument("--noise-k", type=float, default=None)
    a = ap.parse_args(argv)
    from mla_fp8_bench.analysis.stats import DEFAULT_AB_FACTOR
    from mla_fp8_bench.analysis.stats import DEFAULT_NOISE_K as DEFAULT_AB_NOISE_K

    factor = a.factor or DEFAULT_AB_FACTOR
    k = DEFAULT_AB_NOISE_K if a.noise_k is None else a.noise_k
    if a.summarize:
        res = summarize(a.summarize, factor, k)
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1))
        return 0
    cases = a.cases.split(",")
    if a.calibrate:
        scratch = Path(a.calibrate).parent / "pad_calibration" if a.pad_injection else None
        spec = calibrate(cases, a.slowdown, pad_dir=scratch)
        Path(a.calibrate).write_text(json.dumps(spec, indent=1))
        return 0
    t0 = time.monotonic()
    work = Path(a.work)
    base, base2, head = work / "base", work / "base2", work / "head"
    for d in (base, base2, head):
        d.mkdir(parents=True, exist_ok=True)
    spec = work / "slowdown.json"
    for _attempt in range(3):  # a fresh process each time
        rc = subprocess.run([sys.executable, __file__, "--calibrate", str(spec), "--cases", a.cases, "--slowdown",
                             str(a.slowdown)] + (["--pad-injection"] if a.pad_injection else [])).returncode
        if rc == 0:
            break
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
