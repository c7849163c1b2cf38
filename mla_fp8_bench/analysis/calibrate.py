"""``mla-fp8-bench calibrate`` where the backend runs (``--device`` only moves tensors): tolerance = max(floor, max
over seeds x margin) per (backend, case without seed, metric) over quant x dist x shape (+ probes for
``aiter-emulated``); validated on held-out seeds (no alarm) and :data:`FAULTS` injected around the real calls on
the first held-out seed of each case they change (all flagged). Why: docs/regressions.md, section 1."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import time
import types
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from functools import partial
from multiprocessing import get_context
from typing import Any

import torch

from mla_fp8_bench.analysis import tolerances
from mla_fp8_bench.analysis.probes import PROBES, probe_record
from mla_fp8_bench.analysis.stats import summary
from mla_fp8_bench.analysis.tolerances import FLOORS, METRICS, ZERO_METRICS
from mla_fp8_bench.backends import Backend, get_backend
from mla_fp8_bench.backends.aiter_real import AiterPsBackend
from mla_fp8_bench.backends.base import compose_prefix
from mla_fp8_bench.config import DEFAULT_EMU_CU_NUM, RunConfig
from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
from mla_fp8_bench.measure.devices import environment, platform_info
from mla_fp8_bench.problem.cases import parse_case_id
from mla_fp8_bench.problem.prefix import merge_attn_states

METHOD = "max_over_seeds_times_margin"
DEFAULT_MARGIN = 2.0
MIN_SEEDS = 20
VALIDATION_SEED0 = 1000
MAX_VALIDATION_SEEDS = 100_000  # most held-out seeds; calibration seeds stop below VALIDATION_SEED0
DEFAULT_NAME = "cpu-emulated-v1"
DEFAULT_CASES = ("s128", "s257", "s512", "ragged-255-257", "s512-h8",
                 # context chunk and prefix-cached prefill: unsplit tiles (lse-gap) and split ones
                 "ctx100-q64", "prefix256-q100", "ctx1024-q256", "prefix1024-q300")
DEFAULT_BACKENDS = ("aiter-emulated", "torch-fp8-ref")
QUANTS = ("per_tensor", "cast")
DISTS = ("normal", "outlier", "mla")
#: Faults injected around a backend's real calls to validate a calibration; counted where they change the result.
FAULTS = {
    "q_descale_x2": "the q descale passed to the kernel is doubled (backends given the fp8 inputs, every case)",
    "drop_reduce_group": "mla_reduce_v1 leaves the first group of >= 2 partials unmerged (AITER PS, split tiles)",
    "lse_merge_exp2": "the LSE merge of a prefix case's two chunks weighs natural-log LSEs with exp2 (prefix cases)",
    "drop_context_chunk": "the LSE merge of a prefix case leaves the context chunk out (prefix cases)",
}


# ------------------------------------------------------------------------------------------ faults
class FaultyBackend:
    """``inner`` with one fault of :data:`FAULTS` around its real calls, else ``inner`` (its name too: a regressed
    library still reports as itself)."""

    def __init__(self, inner: Backend, fault: str):
        self.inner, self.fault = inner, fault
        if fault == "drop_reduce_group" and isinstance(inner, AiterPsBackend):  # the aiter module, reduce wrapped
            driver, module = inner.driver(), types.ModuleType("aiter")  # the rest read from the real one
            module.__getattr__ = partial(getattr, driver.m)
            module.mla_reduce_v1 = partial(self._reduce, driver.m.mla_reduce_v1)
            driver.m = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def prepare(self, inputs):
        if self.fault == "q_descale_x2":
            inputs = replace(inputs, q8=replace(inputs.q8, descale=inputs.q8.descale * 2))
        return self.inner.prepare(inputs)

    def prepare_case(self, inputs):
        if inputs.case.kind.composed and self.fault in ("lse_merge_exp2", "drop_context_chunk") and self.context_chunks:
            return compose_prefix(self, inputs, merge=self._merge)
        return Backend.prepare_case(self, inputs)

    def _reduce(self, reduce, partial_output, partial_lse, indptr, final_map, partial_map, *rest):
        """The real reduce, then the first group of >= 2 partials' final rows and LSE (last) = its first partial."""
        reduce(partial_output, partial_lse, indptr, final_map, partial_map, *rest)
        ri, fmap = indptr.tolist(), final_map.tolist()
        for g in range(min(len(ri) - 1, len(fmap))):
            (q0, q1), p = fmap[g], ri[g]
            if ri[g + 1] - p >= 2 and q1 > q0:
                p = int(partial_map[p])
                rest[-2][q0:q1], rest[-1][q0:q1] = partial_output[p : p + q1 - q0], partial_lse[p : p + q1 - q0]
                return

    def _merge(self, ctx_out, ctx_lse, new_out, new_lse):
        if self.fault == "drop_context_chunk":
            return new_out, new_lse.float()
        out, lse = merge_attn_states(ctx_out, ctx_lse * math.log(2), new_out, new_lse * math.log(2))
        return out, lse / math.log(2)


# ------------------------------------------------------------------------------------------ measuring
def _measure_case(case_id: str, backends: tuple[str, ...], cu_num: int | None, device: str = "cpu",
                  faults: bool = False) -> dict[str, dict[str, Any]]:
    """Records of each backend on one case (no timing); with ``faults``, also each fault's record where it changed
    the result (status or a calibrated metric), keyed ``"<backend> <fault>"``."""
    pinfo = platform_info(device)
    case_data = CaseData(parse_case_id(case_id), pinfo, None)
    cfg, out = RunConfig(emu_cu_num=cu_num or DEFAULT_EMU_CU_NUM), {}
    for b, f in itertools.product(backends, [None, *FAULTS] if faults else [None]):
        backend = get_backend(b, cfg) if f is None else FaultyBackend(get_backend(b, cfg), f)
        rec = evaluate_one(backend, case_data, pinfo, RunOptions(timing=False, determinism=False)).as_dict()
        rec.pop("traceback", None)
        if f is None or rec["status"] != "skipped" and any(rec.get(k) != out[b].get(k) for k in ("status", *METRICS)):
            out[b if f is None else f"{b} {f}"] = rec
    return out


def _measure_task(task: tuple) -> tuple[tuple, dict[str, dict[str, Any]]]:
    torch.set_num_threads(1)  # one thread per worker process: --jobs sets the parallelism
    return task, {"aiter-emulated": probe_record(*task[1:])} if task[0] == "probe" else _measure_case(*task[1:])


def _run_tasks(tasks: list[tuple], jobs: int, progress) -> list[tuple[tuple, dict]]:
    """Each task's (task, records), in order: in this process, or over ``jobs`` worker processes."""
    with contextlib.ExitStack() as stack:
        run_all = map
        if jobs > 1:
            run_all = stack.enter_context(ProcessPoolExecutor(jobs, mp_context=get_context("spawn"))).map
        out = []
        for res in run_all(_measure_task, tasks):
            out.append(res)
            progress(res[0])
        return out


def _tasks(grid: tuple, seeds: range, backends: tuple, cu_num: int | None, probes: bool, device: str) -> list[tuple]:
    """Case tasks of the (shapes, quants, dists) grid (the first held-out seed's also run the faults), probes."""
    shapes, quants, dists = grid
    tasks = [("case", replace(base, quant=qm, dist=d, seed=s).id, backends, cu_num, device, s == VALIDATION_SEED0)
             for base, qm, d, s in itertools.product(map(parse_case_id, shapes), quants, dists, seeds)]
    return tasks + ([("probe", name, s) for name in PROBES for s in seeds] if probes else [])


def _check_args(backends: tuple[str, ...], grid: tuple, seeds: int, margin: float, validate_seeds: int = MIN_SEEDS,
                device: str = "cpu") -> None:
    """ValueError naming the first bad argument (seed counts, margin, names, a backend ``device`` lacks)."""
    if not MIN_SEEDS <= seeds <= VALIDATION_SEED0:
        raise ValueError(f"--seeds {seeds} is too " + (
            f"few: at least {MIN_SEEDS} (a tolerance from fewer seeds says little about the tail)" if seeds < MIN_SEEDS
            else f"many: at most {VALIDATION_SEED0} (the held-out seeds start at {VALIDATION_SEED0})"))
    if not 0 <= validate_seeds <= MAX_VALIDATION_SEEDS:
        raise ValueError(f"--validate-seeds {validate_seeds} is invalid: an integer from 0 (skip) to "
                         f"{MAX_VALIDATION_SEEDS}")
    if not (margin >= 1.0 and math.isfinite(margin)):
        raise ValueError(f"--margin {margin} is invalid: a finite factor >= 1")
    pinfo = platform_info(device)
    for b in backends:
        verdict = get_backend(b).availability(pinfo)
        if not verdict:
            where = "this CPU" if pinfo.device_type == "cpu" else f"{pinfo.describe()} ({pinfo.device})"
            raise ValueError(f"backend {b!r} cannot be calibrated on {where} ({verdict.reason}): calibrate runs "
                             f"a backend where it runs (--device); e.g. --backends {','.join(DEFAULT_BACKENDS)}")
    for s in grid[0]:
        c = parse_case_id(s)
        if (c.quant, c.dist, c.seed) != ("per_tensor", "normal", 0):
            raise ValueError(f"case {s!r}: give shapes only (no -cast/-outlier/-mla/-seed suffix); quantisation "
                             "modes, distributions and seeds are crossed by calibrate")
        [replace(c, quant=q, dist=d) for q in grid[1] for d in grid[2]]  # CaseError: an unknown mode or distribution


def _collect(results: list[tuple[tuple, dict]]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """backend -> tolerance key -> metric -> values over seeds; RuntimeError: a healthy run failed or was not finite."""
    recs = [(b, rec) for _task, by_b in results for b, rec in by_b.items()]
    if failed := [f"{b} {r['case']}: {r['status']} {r.get('reason', '')} nonfinite={r.get('nonfinite_count_fp8_ref')}"
                  for b, r in recs if r["status"] != "ok" or any(r.get(m) for m in ZERO_METRICS)]:
        raise RuntimeError("healthy calibration runs failed (fix before calibrating):\n  " + "\n  ".join(failed[:10]))
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    for (b, rec), m in itertools.product(recs, METRICS):
        if rec.get(m) is not None:  # e.g. no LSE from a backend that does not return one
            values.setdefault(b, {}).setdefault(tolerances.tolerance_key(rec), {}).setdefault(m, []).append(rec[m])
    return values


def _derive(values: dict[str, dict[str, dict[str, list[float]]]], margin: float) -> tuple[dict, dict, dict]:
    """(distributions, tolerances, groups): tolerance = max(floor, max over seeds x margin); a group's
    tolerance is the max over its shapes' tolerances."""
    dists_out, tol_out, groups = {}, {}, {}
    for b, by_key in values.items():
        for key, mets in sorted(by_key.items()):
            dists_out.setdefault(b, {})[key] = {m: summary(v) for m, v in mets.items()}
            tol_out.setdefault(b, {})[key] = {m: max(FLOORS[m], max(v) * margin) for m, v in mets.items()}
            if grp := tolerances.group_of(key):
                g = groups.setdefault(b, {}).setdefault(grp, {})
                g.update({m: max(g.get(m, 0.0), lim) for m, lim in tol_out[b][key].items()})
    return dists_out, tol_out, groups


def _validation_summary(results: list[tuple[tuple, dict]], tol: tolerances.Tolerances, seeds: int) -> dict:
    """Per backend: held-out records, false alarms (up to 3 violations each), worst value/tolerance, and per
    fault the records it changed, how many were flagged; ``passed``: no false alarm, every fault caught."""
    out: dict[str, Any] = {}
    for key, rec in ((k, r) for _task, recs in results for k, r in recs.items()):
        (b, _, fault), viol = key.partition(" "), tolerances.check(rec, tol)
        s = out.setdefault(b, {"records": 0, "false_alarms": 0, "alarms": [], "worst_ratio": 0.0, "worst": None,
                               "faults": {}})
        if fault:
            f = s["faults"].setdefault(fault, {"injected": 0, "caught": 0, "missed": []})
            f["injected"], f["caught"] = f["injected"] + 1, f["caught"] + bool(viol)
            f["missed"] += [] if viol else [rec["case"]]
            continue
        s["records"], s["false_alarms"] = s["records"] + 1, s["false_alarms"] + bool(viol)
        s["alarms"] += [str(v) for v in viol[:3]]
        w = max(tolerances.measured(rec, tol), key=lambda v: v.ratio, default=None)
        if w and w.ratio > s["worst_ratio"]:
            s["worst_ratio"], s["worst"] = round(w.ratio, 4), f"{rec['case']} {w.metric} = {w.value:.4g}"
    faults = [f for s in out.values() for f in s["faults"].values()]
    alarms = sum(s["false_alarms"] for s in out.values())
    caught, injected = sum(f["caught"] for f in faults), sum(f["injected"] for f in faults)
    return {"held_out_seeds": seeds, "fault_seed": VALIDATION_SEED0, "false_alarms": alarms, "faults_caught": caught,
            "faults_injected": injected, "passed": alarms == 0 and caught == injected > 0, "backends": out}


def calibrate(*, backends: tuple = DEFAULT_BACKENDS, shapes: tuple = DEFAULT_CASES, quants: tuple = QUANTS,
              dists: tuple = DISTS, seeds: int = MIN_SEEDS, validate_seeds: int = MIN_SEEDS,
              margin: float = DEFAULT_MARGIN, name: str = DEFAULT_NAME, jobs: int = 1, cu_num: int | None = None,
              probes: bool = True, device: str = "cpu", progress=None) -> dict[str, Any]:
    """Measure on ``device``, derive and validate tolerances; returns the JSON document. ValueError: bad
    arguments (:func:`_check_args`); RuntimeError: a healthy calibration run failed."""
    grid, held_out = (shapes, quants, dists), range(VALIDATION_SEED0, VALIDATION_SEED0 + validate_seeds)
    _check_args(backends, grid, seeds, margin, validate_seeds, device)
    pinfo = platform_info(device)
    probes, progress, t0 = probes and "aiter-emulated" in backends, progress or (lambda t: None), time.perf_counter()
    cal = _run_tasks(_tasks(grid, range(seeds), backends, cu_num, probes, str(pinfo.device)), jobs, progress)
    timing = {"calibration": round(time.perf_counter() - t0, 1)}
    dists_out, tol_out, groups = _derive(_collect(cal), margin)
    doc: dict[str, Any] = {
        "schema": tolerances.SCHEMA, "version": tolerances.SCHEMA_VERSION, "name": name, "method": METHOD,
        "margin": margin,
        "floors": FLOORS, "metrics": list(METRICS), "always_zero": list(ZERO_METRICS),
        "seeds": {"calibration": list(range(seeds)), "validation": list(held_out)},
        "cases": {"shapes": shapes, "quants": quants, "dists": dists, "probes": sorted(PROBES) if probes else []},
        "backends": backends, "faults": FAULTS,
        "env": {**environment(pinfo), "emu_cu_num": cu_num or DEFAULT_EMU_CU_NUM,
                "reference_dtype": "float64" if pinfo.device_type == "cpu" else "float32"},
        "tolerances": tol_out, "groups": groups, "distributions": dists_out, "timing_s": timing,
    }
    if validate_seeds:
        tol, t1 = tolerances.Tolerances("<calibrating>", tolerances.validate_tolerances(doc)), time.perf_counter()
        val = _run_tasks(_tasks(grid, held_out, backends, cu_num, probes, str(pinfo.device)), jobs, progress)
        timing["validation"] = round(time.perf_counter() - t1, 1)
        doc["validation"] = _validation_summary(val, tol, validate_seeds)
    return doc


# ------------------------------------------------------------------------------------------ CLI
def cmd_calibrate(args: argparse.Namespace, console) -> int:
    from mla_fp8_bench.argtypes import split_list
    from mla_fp8_bench.jsonio import check_output_path, write_json_or_rescue

    backends, shapes, quants, dists = (tuple(split_list(v, opt) or default) for v, opt, default in (
        (args.backends, "--backends", DEFAULT_BACKENDS), (args.cases, "--cases", DEFAULT_CASES),
        (args.quants, "--quants", QUANTS), (args.dists, "--dists", DISTS)))
    _check_args(backends, (shapes, quants, dists), args.seeds, args.margin, args.validate_seeds, args.device)
    if args.out == "":
        raise ValueError("--out '' is empty: give a file path (default tolerances/<name>.json when --out is left out)")
    out = args.out or f"tolerances/{args.name}.json"
    if check_output_path(out, "--out").exists():  # before hours of measuring
        raise ValueError(f"--out {out} exists: calibrate never replaces a tolerance file (a shipped one included); "
                         "give a new --name or --out")
    console.print(f"calibrating {', '.join(backends)} on {args.device}: {len(shapes)} shapes x {len(quants)} quant x "
                  f"{len(dists)} dist x ({args.seeds} + {args.validate_seeds} held-out) seeds, {args.jobs} job(s)")
    done, t0 = itertools.count(1), time.perf_counter()

    def progress(task):
        if (n := next(done)) % 25 == 0:
            console.print(f"[dim]{n} runs, {time.perf_counter() - t0:.0f} s[/dim]")

    doc = calibrate(backends=backends, shapes=shapes, quants=quants, dists=dists, seeds=args.seeds,
                    validate_seeds=args.validate_seeds, margin=args.margin, name=args.name, jobs=args.jobs,
                    cu_num=args.cu_num, probes=not args.no_probes, device=args.device, progress=progress)
    write_json_or_rescue(doc, out, "calibrated tolerances")  # atomic; hours of measuring survive a refused write
    val = doc.get("validation")
    for b, s in (val or {}).get("backends", {}).items():
        caught = ", ".join(f"{f} {x['caught']}/{x['injected']}" for f, x in s["faults"].items())
        console.print(f"held-out validation {b}: {s['false_alarms']} false alarm(s) in {s['records']} records; worst "
                      f"value/tolerance {s['worst_ratio']} ({s['worst']}); faults caught: {caught or 'none injected'}")
    console.print(f"wrote {out}")
    if val and not val["passed"]:
        console.print(f"VALIDATION FAILED: {val['false_alarms']} false alarm(s), faults caught {val['faults_caught']}/"
                      f"{val['faults_injected']}: the file is kept, and refused as a tolerance file")
    return 1 if val and not val["passed"] else 0


def add_parser(subparsers) -> None:
    from mla_fp8_bench.aiter_ps.facts import MAX_CU_NUM
    from mla_fp8_bench.argtypes import ascii_float, ascii_int, int_in, safe_name

    p = subparsers.add_parser("calibrate", help="measure error distributions over seeds on this device, write "
                                                "tolerances JSON validated on held-out seeds and injected faults")
    p.add_argument("--seeds", type=ascii_int, default=MIN_SEEDS, help=f"calibration seeds 0..N-1 (>= {MIN_SEEDS})")
    p.add_argument("--validate-seeds", type=ascii_int, default=MIN_SEEDS,
                   help=f"held-out seeds {VALIDATION_SEED0}.. checked against the new tolerances (0: skip)")
    p.add_argument("--backends", "-b", action="append", help=f"comma-separated (default {','.join(DEFAULT_BACKENDS)})")
    p.add_argument("--cases", "-c", action="append", help=f"comma-separated shapes (default {','.join(DEFAULT_CASES)})")
    p.add_argument("--quants", action="append", help=f"comma-separated (default {','.join(QUANTS)})")
    p.add_argument("--dists", action="append", help=f"comma-separated (default {','.join(DISTS)})")
    p.add_argument("--margin", type=ascii_float, default=DEFAULT_MARGIN, help="tolerance = max over seeds x margin")
    p.add_argument("--name", default=DEFAULT_NAME, type=safe_name("tolerance set name"),
                   help="tolerance set name (file tolerances/<name>.json, never replaced)")
    p.add_argument("--out", help="output JSON path (default tolerances/<name>.json); an existing file is refused")
    cpus = os.cpu_count() or 1
    p.add_argument("--jobs", "-j", type=int_in(1, cpus), default=1,
                   help=f"worker processes (1 torch thread each; at most this machine's {cpus} CPUs)")
    p.add_argument("--cu-num", type=int_in(1, MAX_CU_NUM), help="CU count of the emulated plan (default 256)")
    p.add_argument("--no-probes", action="store_true", help="skip the chunked-context / hot-LSE probes")
    p.set_defaults(handler=cmd_calibrate)
