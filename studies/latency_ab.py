#!/usr/bin/env python3
"""How small a latency regression does the gate catch? A/A runs and injected slowdowns on one device.

For one backend and case, each *trial* measures a BASE and a HEAD sample set (``--samples`` samples each,
the suite's own timing: CUDA-graph replay between events on GPUs, ``perf_counter`` on CPU) and applies
the gate's latency rule (:func:`mla_fp8_bench.analysis.gate.latency_verdict`: ratio of medians > ``--factor`` AND
one-sided Mann-Whitney U p < ``--alpha``). HEAD is either the same call (A/A, ``--aa`` trials) or the
call followed by an injected slowdown of 1 / 2 / 3 / 5 % (``--slowdowns``, ``--reps`` trials each):

* GPU: an extra device kernel inside the timed region and the captured graph, right after the call:
  an in-place ``mul_(1.0)`` over ``n`` fp32 elements, ``n`` calibrated by bisection on the kernel's own
  graph-replay time so that it lasts ``slowdown x`` the call's measured median latency
  (:func:`extra_kernel`; a kernel inside a graph cannot be shorter than about 1 us on an H200, so
  +1 % needs a call of >= 100 us: use s8192 or larger);
* CPU (``--device cpu``, for a smoke test only): a ``perf_counter`` busy-wait of the same length.

BASE and HEAD of a trial are measured back to back, alternating which goes first. The report gives,
per slowdown, the measured ratio (how well the injection hit its target) and the detection rate, for
the gate's rule at ``--factor`` and for the significance test alone (factor 1.0); the *smallest
reliably caught slowdown* is the smallest one detected in >= 90 % of trials while A/A raised at most
``--max-aa-alarms`` (default 1) false alarms.

Run on the H200 (one call, from the repository root; wheels as in studies/h200_session.py)::

    python3 studies/latency_ab.py --backend fa3-fp8 --case s8192 --aa 10 --reps 10 --samples 30 \
        --out $OUT/latency_ab.json

Caveat: trials run in one process; the cross-process, cross-boot variance of a real PR gate (two asv
runs hours apart) is larger than this A/A spread, so treat the result as a lower bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mla_fp8_bench.analysis.gate import DEFAULT_ALPHA, DEFAULT_FACTOR, Measure, latency_verdict  # noqa: E402

RELIABLE = 0.9


@dataclass
class Trial:
    slowdown: float  # 0.0 for A/A
    base: list[float]
    head: list[float]
    extra: dict[str, Any] = field(default_factory=dict)


def summarize(trials: list[Trial], factor: float = DEFAULT_FACTOR, alpha: float = DEFAULT_ALPHA,
              max_aa_alarms: int = 1) -> dict[str, Any]:
    """Detection table of trials under the gate's rule (``factor``) and significance alone (factor 1.0).

    Returns:
        ``{"levels": [{"slowdown", "trials", "median_ratio", "detected_gate", "detected_sig", "rate_gate",
        "rate_sig"}], "aa_false_alarms_gate", "aa_false_alarms_sig", "smallest_caught_gate",
        "smallest_caught_sig"}`` (None where no level is caught reliably or A/A alarms exceed the limit).
    """
    levels: dict[float, list[Trial]] = {}
    for t in trials:
        levels.setdefault(round(t.slowdown, 6), []).append(t)
    rows = []
    for s in sorted(levels):
        ts = levels[s]
        vg = [latency_verdict(Measure("ok", samples=t.base), Measure("ok", samples=t.head), factor, alpha) for t in ts]
        vs = [latency_verdict(Measure("ok", samples=t.base), Measure("ok", samples=t.head), 1.0, alpha) for t in ts]
        rows.append({"slowdown": s, "trials": len(ts),
                     "median_ratio": statistics.median(v.ratio for v in vg),
                     "min_ratio": min(v.ratio for v in vg), "max_ratio": max(v.ratio for v in vg),
                     "detected_gate": sum(v.regressed for v in vg), "detected_sig": sum(v.regressed for v in vs),
                     "rate_gate": sum(v.regressed for v in vg) / len(ts),
                     "rate_sig": sum(v.regressed for v in vs) / len(ts)})
    aa = next((r for r in rows if r["slowdown"] == 0.0), None)
    out: dict[str, Any] = {"factor": factor, "alpha": alpha, "reliable_rate": RELIABLE, "levels": rows,
                           "aa_false_alarms_gate": aa["detected_gate"] if aa else None,
                           "aa_false_alarms_sig": aa["detected_sig"] if aa else None}
    for key, alarms in (("gate", out["aa_false_alarms_gate"]), ("sig", out["aa_false_alarms_sig"])):
        caught = [r["slowdown"] for r in rows if r["slowdown"] > 0 and r[f"rate_{key}"] >= RELIABLE]
        ok_aa = alarms is not None and alarms <= max_aa_alarms
        out[f"smallest_caught_{key}"] = min(caught) if caught and ok_aa else None
    return out


def format_table(summary: dict[str, Any]) -> str:
    lines = [f"gate rule: ratio of medians > {summary['factor']} and Mann-Whitney p < {summary['alpha']}",
             "| injected | trials | measured ratio (median, min-max) | caught by gate rule | caught by test alone |",
             "|---|---|---|---|---|"]
    for r in summary["levels"]:
        name = "A/A" if r["slowdown"] == 0 else f"+{r['slowdown'] * 100:g} %"
        lines.append(f"| {name} | {r['trials']} | {r['median_ratio']:.4f} "
                     f"({r['min_ratio']:.4f}-{r['max_ratio']:.4f}) | "
                     f"{r['detected_gate']}/{r['trials']} | {r['detected_sig']}/{r['trials']} |")
    sg, ss = summary["smallest_caught_gate"], summary["smallest_caught_sig"]
    lines.append(f"smallest reliably caught (>= {RELIABLE:.0%} of trials, A/A alarms within limit): gate rule "
                 f"{'none' if sg is None else f'+{sg * 100:g} %'}; significance alone "
                 f"{'none' if ss is None else f'+{ss * 100:g} %'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ measuring
def _graph_kernel_s(fn: Callable[[], Any], device, copies: int = 50, replays: int = 20) -> float:
    """Device time of one ``fn()`` launch: ``copies`` launches captured in a CUDA graph, the median of
    ``replays`` replays between events, divided by ``copies``."""
    import torch

    from mla_fp8_bench.measure.timing import _capture

    stream = torch.cuda.current_stream(device)
    g = _capture(fn, copies, stream, lambda: torch.cuda.synchronize(device))
    for _ in range(5):
        g.replay()
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        g.replay()
        e1.record(stream)
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / copies)
    return statistics.median(times)


def extra_kernel(device, extra_s: float) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A device kernel lasting about ``extra_s``: an in-place ``mul_(1.0)`` over ``n`` fp32 elements, with
    ``n`` found by bisection on the kernel's measured graph-replay time (its floor, a launch inside a
    graph, is about 1 us on an H200). Returns ``(launch, {"n", "kernel_s", "target_s", "floor_s"})``."""
    import torch

    buf = torch.ones(1 << 27, dtype=torch.float32, device=device)

    def k(n: int) -> Callable[[], Any]:
        view = buf[:n]
        return lambda: view.mul_(1.0)

    lo, hi = 1 << 10, 1 << 27
    floor_s = _graph_kernel_s(k(lo), device)
    info: dict[str, Any] = {"target_s": extra_s, "floor_s": floor_s}
    if extra_s <= floor_s:
        info.update(n=lo, kernel_s=floor_s)
        return k(lo), info
    for _ in range(22):
        mid = (lo + hi) // 2
        if _graph_kernel_s(k(mid), device, copies=20, replays=10) < extra_s:
            lo = mid
        else:
            hi = mid
        if hi - lo <= max(256, lo // 500):
            break
    info.update(n=lo, kernel_s=_graph_kernel_s(k(lo), device))
    return k(lo), info


def make_slow(run: Callable[[], Any], device, extra_s: float, kernel: Callable[[], Any] | None = None
              ) -> Callable[[], Any]:
    """``run`` followed by ``extra_s`` of extra work: on a GPU the calibrated device kernel ``kernel``
    (:func:`extra_kernel`), inside the timed region and the captured graph; on the CPU (smoke tests
    only) a ``perf_counter`` busy-wait."""
    if extra_s <= 0:
        return run
    if device.type == "cuda":
        assert kernel is not None, "a GPU slowdown needs its calibrated kernel"

        def slow():
            out = run()
            kernel()
            return out
        return slow

    def slow_cpu():
        out = run()
        t_end = time.perf_counter() + extra_s
        while time.perf_counter() < t_end:
            pass
        return out
    return slow_cpu


def measure(run, device, samples: int, graph_capturable: bool) -> tuple[list[float], list]:
    """Latency samples (seconds) and per-sample SM clocks (MHz, empty without a clock reader)."""
    from mla_fp8_bench.measure.timing import measure_latency

    kw = {"samples": samples, "time_budget_s": 60.0}
    if device.type != "cuda":
        kw["min_samples"] = samples
    tr = measure_latency(run, device, graph_capturable=graph_capturable, **kw)
    return tr.samples_s, (tr.extra.get("clocks") or {}).get("sm_mhz", [])


def run_trials(backend: str, case: str, device: str, aa: int, reps: int, slowdowns: list[float], samples: int,
               deadline: float, log=print) -> tuple[list[Trial], dict[str, Any]]:
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    pinfo = platform_info(device)
    b = get_backend(backend)
    v = b.availability(pinfo)
    if not v:
        raise SystemExit(f"backend {backend} is unavailable here: {v.reason}")
    inputs = make_inputs(parse_case_id(case), pinfo.device, pinfo.fp8_dtype)
    prep = b.prepare(inputs)
    gc, dev = prep.graph_capturable, pinfo.device
    base_lat = statistics.median(measure(prep.run, dev, samples, gc)[0])
    kernels: dict[float, tuple] = {}
    if dev.type == "cuda":
        for s in slowdowns:
            kernels[s] = extra_kernel(dev, s * base_lat)
    info = {"backend": backend, "case": case, "device": pinfo.name, "arch": pinfo.arch, "base_median_s": base_lat,
            "samples": samples, "graph_capturable": gc, "injection": "device kernel" if kernels else "host busy-wait",
            "kernels": {str(s): kv[1] for s, kv in kernels.items()}}
    log(f"{backend} {case} on {pinfo.name}: median {base_lat * 1e6:.2f} us; kernels {info['kernels']}")
    plan = [0.0] * aa + [s for s in slowdowns for _ in range(reps)]
    trials = []
    for i, s in enumerate(plan):
        if time.monotonic() > deadline:
            log(f"deadline reached after {len(trials)} trials")
            break
        head_run = make_slow(prep.run, dev, s * base_lat, kernels[s][0] if s in kernels else None)
        sides = [("base", prep.run), ("head", head_run)]
        got = {}
        for name, fn in (sides if i % 2 == 0 else sides[::-1]):
            got[name] = measure(fn, dev, samples, gc)
        trials.append(Trial(s, got["base"][0], got["head"][0],
                            {"base_sm_mhz": got["base"][1], "head_sm_mhz": got["head"][1]}))
        ratio = statistics.median(got["head"][0]) / statistics.median(got["base"][0])
        log(f"trial {i:3d} slowdown {s:5.3f}: ratio {ratio:.4f}")
    if prep.cleanup:
        prep.cleanup()
    return trials, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="fa3-fp8")
    ap.add_argument("--case", default="s2048")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--aa", type=int, default=10, help="A/A trials (>= 10)")
    ap.add_argument("--reps", type=int, default=10, help="trials per injected slowdown")
    ap.add_argument("--slowdowns", default="0.01,0.02,0.03,0.05")
    ap.add_argument("--samples", type=int, default=30, help="latency samples per side per trial")
    ap.add_argument("--factor", type=float, default=DEFAULT_FACTOR)
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    ap.add_argument("--max-aa-alarms", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=480.0, help="stop starting trials after this many seconds")
    ap.add_argument("--out", help="write trials + summary JSON here")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    trials, info = run_trials(a.backend, a.case, a.device, a.aa, a.reps, [float(x) for x in a.slowdowns.split(",")],
                              a.samples, t0 + a.deadline)
    summary = summarize(trials, a.factor, a.alpha, a.max_aa_alarms)
    sig_only = summarize(trials, 1.0, a.alpha, a.max_aa_alarms)
    tight = summarize(trials, 1.01, a.alpha, a.max_aa_alarms)
    text = format_table(summary) + "\n" + format_table(tight)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"info": info, "summary": summary, "summary_factor_1": sig_only, "summary_factor_1.01": tight,
                       "table": text,
                       "trials": [asdict(t) for t in trials], "wall_s": time.monotonic() - t0}, f, indent=1)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
