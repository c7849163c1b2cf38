"""What the asv classes in ``benchmarks/`` call: the static grid and the once-per-run measurement, configured
by :func:`check_knobs` (knobs: docs/usage.md). ``MLA_FP8_BENCH_BACKENDS`` / ``_CASES`` only save time: pair
them with an ``asv run -b`` selecting the same params (:func:`selection_knobs`)."""

from __future__ import annotations

import contextlib
import re
import sys
from typing import Any

from mla_fp8_bench.backends import DEFAULT_BACKENDS, EMULATION_BACKENDS, PLAN_BACKENDS, backend_names, get_backend
from mla_fp8_bench.config import PREFIX, RunConfig
from mla_fp8_bench.problem.cases import SUITES, SWEEP_CAPS, SWEEP_SEQ_LENS

_PUBLISHED_CASES = tuple(f"s{s}" for s in SWEEP_SEQ_LENS) + (
    "s255", "s257", "ragged-6992-6896-2495", "ragged-4096x4", "s8175",
    # vLLM's unit-scale cast (the only mode vllm-aiter runs): appended, never reorder or reuse ids
    "s1024-cast", "s4096-cast", "ragged-6992-6896-2495-cast",
    # prefix-cached prefill: a context chunk, a whole prefix prefill, and one larger beyond the CPU cap
    "ctx1024-q256", "prefix1024-q300", "prefix8192-q1024",
)
_APPENDED = SUITES["sweep-cast"] + SUITES["serving-heads"] + SUITES["b2b"]
#: Case ids in the asv grid: never change or reuse an id that has results. After the published ones, vLLM's
#: entry over the whole sweep and the serving head counts, then the back-to-back batches (ids already there
#: keep their place).
ASV_CASES = _PUBLISHED_CASES + tuple(c for i, c in enumerate(_APPENDED)
                                     if c not in _PUBLISHED_CASES and c not in _APPENDED[:i])
#: Default token cap of the asv grid per device type. On CPU (O(seq_len^2) reference and emulator) 1536
#: leaves out only s2048, a quarter of the CPU grid's time; ``MLA_FP8_BENCH_MAX_TOKENS=2048`` measures it.
GRID_CAPS = {"cpu": 1536, "cuda": SWEEP_CAPS["cuda"]}
#: Default seconds of latency sampling per (backend, case) of the asv grid, per device type.
GRID_TIME_BUDGET_S = {"cpu": 2.0, "cuda": 10.0}
#: Latency rounds of the asv grid on a GPU (round 0 in the accuracy pass, the rest in separate processes).
DEFAULT_GPU_ROUNDS = 3


def asv_backends() -> tuple[str, ...]:
    """Backends in the asv grid (unavailable ones are skips): the defaults first (the published order)."""
    return tuple(DEFAULT_BACKENDS) + tuple(b for b in backend_names() if b not in DEFAULT_BACKENDS)


def plan_backends() -> tuple[str, ...]:  # backends with plan_stats (the AiterPlan tracks)
    return tuple(b for b in asv_backends() if b in PLAN_BACKENDS)


def selection_knobs(regex: str) -> dict[str, str]:
    """``MLA_FP8_BENCH_BACKENDS`` / ``_CASES`` that measure only the params ``asv run -b REGEX`` selects."""
    from mla_fp8_bench.measure.metric_table import asv_metrics

    rx, grid = re.compile(regex), asv_backends()
    hits = [(b, c) for m in asv_metrics() for b in grid for c in ASV_CASES if rx.search(f"{m.asv_name}({b!r}, {c!r})")]
    out = {}
    for var, axis, hit in (("BACKENDS", grid, {b for b, _ in hits}), ("CASES", ASV_CASES, {c for _, c in hits})):
        if hit and len(hit) < len(axis):
            out[PREFIX + var] = ",".join(x for x in axis if x in hit)
    return out


def lookup(cache: dict[str, Any], backend: str, case: str) -> dict[str, Any]:
    """The cached record of (backend, case); NotImplementedError (asv's n/a) for a skip, RuntimeError a failure."""
    rec = cache["records"].get(f"{backend}|{case}")
    if rec is None:
        raise NotImplementedError(f"{backend} on {case}: not measured in this run ({PREFIX}BACKENDS / _CASES)")
    if rec["status"] == "skipped":
        raise NotImplementedError(f"{backend} on {case}: {rec['reason']}")
    if rec["status"] != "ok":
        raise RuntimeError(f"{backend} on {case} failed: {rec['reason']}")
    return rec


def emulation_backends() -> tuple[str, ...]:
    return tuple(b for b in asv_backends() if b in EMULATION_BACKENDS)


def emulation_apart(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` of an emulation backend with its latency moved to ``track_emulation_latency``'s keys."""
    from mla_fp8_bench.measure.metric_table import find

    if rec.get("backend") not in emulation_backends():
        return rec
    lat, emu = find("track_latency"), find("track_emulation_latency")
    out = dict(rec)
    out[emu.record_key], out[lat.record_key] = out.get(lat.record_key), None
    out[emu.samples_key], out[lat.samples_key] = out.get(lat.samples_key), None
    return out


def check_knobs(environ: dict[str, str] | None = None) -> RunConfig:  # ValueError naming a bad knob
    return RunConfig.from_env(environ, grid=(asv_backends(), ASV_CASES))


def _grid_setup(cfg: RunConfig):
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    pinfo = platform_info(cfg.device)
    cap = cfg.max_tokens or GRID_CAPS[pinfo.device_type]
    backends = list(cfg.backends or asv_backends())
    cases, skipped = [], {}
    for cid in ASV_CASES:
        if cfg.cases and cid not in cfg.cases:
            continue  # not measured: lookup() makes it an asv skip
        c = parse_case_id(cid)
        tokens = max(c.total_tokens, c.total_kv_tokens)
        if tokens > cap:
            skipped[cid] = f"{tokens} tokens exceed this run's cap of {cap} on {pinfo.device_type}"
        else:
            cases.append(c)
    return pinfo, cap, backends, cases, skipped


def measure_grid(config: RunConfig | None = None) -> dict[str, Any]:
    """``{"env", "cap", "records": {"backend|case": record}, "rounds"}`` of every (backend, case) of the grid,
    one progress line each on stderr and, when set, ``MLA_FP8_BENCH_PROGRESS`` (asv hides a passing
    ``setup_cache``'s output)."""
    from mla_fp8_bench.harness.rounds import fold_rounds
    from mla_fp8_bench.harness.runner import RunOptions, evaluate
    from mla_fp8_bench.terminal import case_progress

    cfg = config or check_knobs()
    pinfo, cap, backends, cases, skipped = _grid_setup(cfg)
    opts = RunOptions(samples=cfg.samples or 30,
                      time_budget_s=cfg.time_budget_s or GRID_TIME_BUDGET_S[pinfo.device_type])
    with contextlib.ExitStack() as stack:
        streams: tuple = (sys.stderr,)
        try:
            streams += (stack.enter_context(open(cfg.progress, "a", buffering=1)),) if cfg.progress else ()
        except OSError as exc:  # the measurement goes on: its lines still reach stderr
            print(f"[mla_fp8_bench] {PREFIX}PROGRESS={cfg.progress} cannot be written: {exc}", flush=True)
        head = (f"[mla_fp8_bench] measuring {len(backends)} backends x {len(cases)} cases on {pinfo.device} "
                f"(cases above {cap} tokens skipped: {len(skipped)}); one line per (backend, case):")
        for s in streams:
            print(head, file=s, flush=True)
        with case_progress(len(backends) * len(cases), streams=streams) as step:
            data = evaluate(backends, cases, device=pinfo.device, options=opts, config=cfg, progress=step)
    n_rounds = cfg.rounds or (DEFAULT_GPU_ROUNDS if pinfo.device.type == "cuda" else 1)
    data["rounds"] = fold_rounds(data["records"], n_rounds, str(pinfo.device),
                                 log=lambda m: print(f"[mla_fp8_bench] {m}", flush=True))
    records = {f"{r['backend']}|{r['case']}": emulation_apart({k: v for k, v in r.items() if k != "traceback"})
               for r in data["records"]}
    records.update({f"{b}|{cid}": {"backend": b, "case": cid, "status": "skipped", "reason": why}
                    for cid, why in skipped.items() for b in backends})
    return {"env": data["env"], "cap": cap, "records": records, "rounds": data["rounds"]}


def measure_plans(config: RunConfig | None = None) -> dict[str, Any]:
    """``{"records": {"backend|case": plan_stats record}}`` of each :func:`plan_backends` backend over the grid."""
    cfg = config or check_knobs()
    pinfo, _cap, _backends, cases, skipped = _grid_setup(cfg)
    records: dict[str, Any] = {}
    plan = [b for b in plan_backends() if not cfg.backends or b in cfg.backends]
    for name in plan:
        b = get_backend(name, cfg)
        avail = b.availability(pinfo)
        records.update({f"{name}|{cid}": {"status": "skipped", "reason": why} for cid, why in skipped.items()})
        for c in cases:
            try:
                if not avail:
                    raise NotImplementedError(avail.reason)
                rec = {"status": "ok", "reason": "", **b.plan_stats(c, pinfo)}
            except NotImplementedError as exc:
                rec = {"status": "skipped", "reason": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
                rec = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
            records[f"{name}|{c.id}"] = rec
    return {"records": records}
