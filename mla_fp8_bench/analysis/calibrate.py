"""``mla-fp8-bench calibrate``: measure error distributions over seeds on the device the backend runs on,
derive tolerances and validate them.

Every backend x quantisation mode (:data:`QUANTS`) x input distribution (:data:`DISTS`) x case shape
runs over ``--seeds`` seeds (>= :data:`MIN_SEEDS`), plus the probes of
:mod:`mla_fp8_bench.analysis.probes` for ``aiter-emulated``; tolerance = max(floor, max over seeds x margin)
per (backend, case without its seed, metric). Validation: the held-out seeds (from
:data:`VALIDATION_SEED0`) must raise no alarm, and each fault of :data:`FAULTS`, injected around the
backend's real calls on the first held-out seed of every case where it changes the call, must be flagged.
Why the maximum and why x2.0: docs/regressions.md, section 1. The file format and the check of records
live in :mod:`mla_fp8_bench.analysis.tolerances`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from mla_fp8_bench.analysis import tolerances
from mla_fp8_bench.analysis.stats import summary
from mla_fp8_bench.analysis.tolerances import FLOORS, METRICS, ZERO_METRICS
from mla_fp8_bench.backends.base import Backend, compose_prefix
from mla_fp8_bench.config import DEFAULT_EMU_CU_NUM, RunConfig
from mla_fp8_bench.problem.prefix import merge_attn_states

METHOD = "max_over_seeds_times_margin"
DEFAULT_MARGIN = 2.0
MIN_SEEDS = 20
VALIDATION_SEED0 = 1000
#: Most held-out seeds (``--validate-seeds``); calibration seeds stop below :data:`VALIDATION_SEED0`.
MAX_VALIDATION_SEEDS = 100_000
DEFAULT_NAME = "cpu-emulated-v1"
DEFAULT_CASES = ("s128", "s257", "s512", "ragged-255-257", "s512-h8",
                 # context chunk and prefix-cached prefill: unsplit tiles (lse-gap) and split ones
                 "ctx100-q64", "prefix256-q100", "ctx1024-q256", "prefix1024-q300")
DEFAULT_BACKENDS = ("aiter-emulated", "torch-fp8-ref")
QUANTS = ("per_tensor", "cast")
DISTS = ("normal", "outlier", "mla")
#: Faults injected around a backend's real calls to validate a calibration; each where it changes the call.
FAULTS = {
    "q_descale_x2": "the q descale passed to the kernel is doubled (fp8 backends, every case)",
    "drop_reduce_group": "mla_reduce_v1 leaves the first group of >= 2 partials unmerged: its final rows and "
                         "LSE are its first partial (AITER PS backends, cases with split tiles)",
    "lse_merge_exp2": "the LSE merge of a prefix case's two chunks weighs natural-log LSEs with exp2 (prefix cases)",
    "drop_context_chunk": "the LSE merge of a prefix case leaves the context chunk out (prefix cases)",
}


# ------------------------------------------------------------------------------------------ faults
class _UnmergedGroup:
    """An ``aiter`` module whose ``mla_reduce_v1`` runs the real reduce, then overwrites the final rows and
    LSE of the first group of >= 2 partials with that group's first partial (as the kernel wrote it)."""

    def __init__(self, module: Any, owner: FaultyBackend):
        self._m, self._owner = module, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    def mla_reduce_v1(self, partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
                      *rest):
        self._m.mla_reduce_v1(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
                              *rest)
        final_output, final_lse = rest[-2:]  # the driver passes both last, positionally
        ri, fmap = reduce_indptr.tolist(), reduce_final_map.tolist()
        for g in range(min(len(ri) - 1, len(fmap))):
            (q0, q1), p = fmap[g], int(reduce_partial_map[ri[g]])
            if ri[g + 1] - ri[g] >= 2 and q1 > q0:
                final_output[q0:q1] = partial_output[p : p + q1 - q0].to(final_output.dtype)
                final_lse[q0:q1] = partial_lse[p : p + q1 - q0]
                self._owner.injected = True
                return


class FaultyBackend(Backend):
    """``inner`` with one fault of :data:`FAULTS` injected around its real calls, under ``inner``'s name (a
    regressed library still reports as itself). ``injected``: whether a call was changed."""

    def __init__(self, inner: Backend, fault: str):
        from mla_fp8_bench.backends.aiter_real import AiterPsBackend

        self.inner, self.fault, self.injected, self.config = inner, fault, False, inner.config
        self.name, self.fp8, self.emulation = inner.name, inner.fp8, inner.emulation
        self.context_chunks = inner.context_chunks
        if fault == "drop_reduce_group" and isinstance(inner, AiterPsBackend):
            driver = inner.driver()
            driver.m = _UnmergedGroup(driver.m, self)

    def availability(self, platform):
        return self.inner.availability(platform)

    def supports(self, case, platform):
        return self.inner.supports(case, platform)

    def prepare(self, inputs):
        if self.fault == "q_descale_x2" and self.fp8:
            inputs = replace(inputs, q8=replace(inputs.q8, descale=inputs.q8.descale * 2))
            self.injected = True
        return self.inner.prepare(inputs)

    def prepare_case(self, inputs):
        if inputs.case.kind.composed and self.fault in ("lse_merge_exp2", "drop_context_chunk"):
            self.supports_kind(inputs.case.kind)
            return compose_prefix(self, inputs, merge=self._merge)
        return super().prepare_case(inputs)

    def _merge(self, ctx_out, ctx_lse, new_out, new_lse):
        self.injected = True
        if self.fault == "drop_context_chunk":
            return new_out, new_lse.float()
        out, lse = merge_attn_states(ctx_out, ctx_lse * math.log(2), new_out, new_lse * math.log(2))
        return out, lse / math.log(2)


# ------------------------------------------------------------------------------------------ measuring
def _measure_case(case_id: str, backends: tuple[str, ...], cu_num: int | None, device: str = "cpu",
                  faults: bool = False) -> dict[str, dict[str, Any]]:
    """Records (metric dicts) of each backend on one case (no timing); with ``faults``, also each fault's
    record where the fault changed the call, keyed ``"<backend> <fault>"``."""
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    pinfo = platform_info(device)
    case_data = CaseData(parse_case_id(case_id), pinfo, None)
    opts = RunOptions(timing=False, determinism=False)
    cfg = RunConfig(emu_cu_num=cu_num or DEFAULT_EMU_CU_NUM)
    out = {}
    for b, f in itertools.product(backends, [None, *FAULTS] if faults else [None]):
        backend = get_backend(b, cfg) if f is None else FaultyBackend(get_backend(b, cfg), f)
        rec = evaluate_one(backend, case_data, pinfo, opts).as_dict()
        rec.pop("traceback", None)
        if f is None or (backend.injected and rec["status"] != "skipped"):
            out[b if f is None else f"{b} {f}"] = rec
    return out


def _measure_task(task: tuple) -> tuple[tuple, dict[str, dict[str, Any]]]:
    torch.set_num_threads(1)  # one thread per worker process: --jobs sets the parallelism
    if task[0] == "probe":
        from mla_fp8_bench.analysis.probes import probe_record

        _, name, seed = task
        return task, {"aiter-emulated": probe_record(name, seed)}
    return task, _measure_case(*task[1:])


def _run_tasks(tasks: list[tuple], jobs: int, progress) -> list[tuple[tuple, dict]]:
    """Each task's (task, records), in task order: in this process, or over ``jobs`` worker processes."""
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            pool = stack.enter_context(ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")))
            results = pool.map(_measure_task, tasks)
        else:
            results = map(_measure_task, tasks)
        out = []
        for res in results:
            out.append(res)
            progress(res[0])
    return out


def _tasks(shapes: Iterable[str], quants: Iterable[str], dists: Iterable[str], seeds: Iterable[int],
           backends: tuple[str, ...], cu_num: int | None, probes: bool, device: str) -> list[tuple]:
    """Case tasks; the first held-out seed's also run the faults."""
    from mla_fp8_bench.analysis.probes import PROBES
    from mla_fp8_bench.problem.cases import parse_case_id

    seeds = list(seeds)
    tasks = [("case", replace(base, quant=qm, dist=d, seed=s).id, backends, cu_num, device, s == VALIDATION_SEED0)
             for base, qm, d, s in itertools.product(map(parse_case_id, shapes), quants, dists, seeds)]
    return tasks + ([("probe", name, s) for name in PROBES for s in seeds] if probes else [])


def _check_args(backends: tuple[str, ...], shapes: tuple[str, ...], seeds: int, margin: float,
                validate_seeds: int = MIN_SEEDS, device: str = "cpu") -> None:
    """Refuse bad calibrate arguments before any measuring (ValueError naming the value): seed counts
    outside ``MIN_SEEDS .. VALIDATION_SEED0`` (the held-out seeds must stay held out) and
    ``0 .. MAX_VALIDATION_SEEDS``, a margin < 1, unknown names, a backend that cannot run on ``device``."""
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    if seeds < MIN_SEEDS:
        raise ValueError(f"--seeds {seeds} is too few: at least {MIN_SEEDS} (a tolerance from fewer seeds "
                         "says little about the tail)")
    if seeds > VALIDATION_SEED0:
        raise ValueError(f"--seeds {seeds} is too many: at most {VALIDATION_SEED0} (the held-out seeds start at "
                         f"{VALIDATION_SEED0})")
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
            raise ValueError(f"backend {b!r} cannot be calibrated on {where} ({verdict.reason}): calibrate "
                             f"runs the backend where it runs (--device); e.g. --backends {','.join(DEFAULT_BACKENDS)}")
    for s in shapes:
        c = parse_case_id(s)
        if (c.quant, c.dist, c.seed) != ("per_tensor", "normal", 0):
            raise ValueError(f"case {s!r}: give shapes only (no -cast/-outlier/-mla/-seed suffix); quantisation "
                             "modes, distributions and seeds are crossed by calibrate")


def _collect(results: list[tuple[tuple, dict]]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """backend -> tolerance key (case id without seed) -> metric -> values over seeds.

    Raises:
        RuntimeError: a healthy calibration run failed or produced non-finite outputs.
    """
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    failures: list[str] = []
    for _task, recs in results:
        for b, rec in recs.items():
            if rec["status"] != "ok" or any(rec.get(m) for m in ZERO_METRICS):
                failures.append(f"{b} {rec['case']}: {rec['status']} {rec.get('reason', '')} "
                                f"nonfinite={rec.get('nonfinite_count_fp8_ref')}")
                continue
            key = tolerances.tolerance_key(rec)
            for m in METRICS:
                if rec.get(m) is not None:  # e.g. no LSE from a backend that does not return one
                    values.setdefault(b, {}).setdefault(key, {}).setdefault(m, []).append(float(rec[m]))
    if failures:
        raise RuntimeError("healthy calibration runs failed (fix before calibrating):\n  " + "\n  ".join(failures[:10]))
    return values


def _derive(values: dict[str, dict[str, dict[str, list[float]]]], margin: float) -> tuple[dict, dict, dict]:
    """(distributions, tolerances, groups): tolerance = max(floor, max over seeds x margin); a group's
    tolerance is the max over its shapes' tolerances."""
    dists_out: dict[str, Any] = {}
    tol_out: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for b, by_key in values.items():
        for key, mets in sorted(by_key.items()):
            dists_out.setdefault(b, {})[key] = {m: summary(v) for m, v in mets.items()}
            tol_out.setdefault(b, {})[key] = {m: max(FLOORS[m], max(v) * margin) for m, v in mets.items()}
            grp = tolerances.group_of(key)
            if grp:
                g = groups.setdefault(b, {}).setdefault(grp, {})
                for m, lim in tol_out[b][key].items():
                    g[m] = max(g.get(m, 0.0), lim)
    return dists_out, tol_out, groups


def _validation_summary(results: list[tuple[tuple, dict]], tol: tolerances.Tolerances, seeds: int) -> dict:
    """Per backend: held-out records, false alarms (with up to 3 violations each), worst value/tolerance and
    per fault the records it changed and how many were flagged; ``passed``: 0 false alarms, every fault caught."""
    out: dict[str, Any] = {}
    for _task, recs in results:
        for key, rec in recs.items():
            b, _, fault = key.partition(" ")
            s = out.setdefault(b, {"records": 0, "false_alarms": 0, "alarms": [], "worst_ratio": 0.0, "worst": None,
                                   "faults": {}})
            viol = tolerances.check(rec, tol)
            if fault:
                f = s["faults"].setdefault(fault, {"injected": 0, "caught": 0, "missed": []})
                f["injected"] += 1
                f["caught"] += bool(viol)
                f["missed"] += [] if viol else [rec["case"]]
                continue
            s["records"] += 1
            s["false_alarms"] += bool(viol)
            s["alarms"].extend(str(v) for v in viol[:3])
            for m, x in tolerances.ratios(rec, tol)[0].items():
                if x > s["worst_ratio"]:
                    s["worst_ratio"], s["worst"] = x, f"{rec['case']} {m} = {rec[m]:.4g}"
    for s in out.values():
        s["worst_ratio"] = round(s["worst_ratio"], 4)
    faults = [f for s in out.values() for f in s["faults"].values()]
    alarms = sum(s["false_alarms"] for s in out.values())
    caught, injected = sum(f["caught"] for f in faults), sum(f["injected"] for f in faults)
    return {"held_out_seeds": seeds, "fault_seed": VALIDATION_SEED0, "false_alarms": alarms, "faults_caught": caught,
            "faults_injected": injected, "passed": alarms == 0 and caught == injected > 0, "backends": out}


def calibrate(*, backends: tuple[str, ...] = DEFAULT_BACKENDS, shapes: tuple[str, ...] = DEFAULT_CASES,
              quants: tuple[str, ...] = QUANTS, dists: tuple[str, ...] = DISTS, seeds: int = MIN_SEEDS,
              validate_seeds: int = MIN_SEEDS, margin: float = DEFAULT_MARGIN, name: str = DEFAULT_NAME,
              jobs: int = 1, cu_num: int | None = None, probes: bool = True, device: str = "cpu",
              progress=None) -> dict[str, Any]:
    """Measure on ``device``, derive and validate tolerances; returns the JSON document (module docstring).

    Raises:
        ValueError: bad arguments (:func:`_check_args`). RuntimeError: a healthy calibration run failed.
    """
    from mla_fp8_bench.analysis.probes import PROBES
    from mla_fp8_bench.measure.devices import environment, platform_info

    _check_args(backends, shapes, seeds, margin, validate_seeds, device)
    pinfo = platform_info(device)
    probes = probes and "aiter-emulated" in backends
    progress = progress or (lambda t: None)
    grid = (shapes, quants, dists)
    t0 = time.perf_counter()
    cal = _run_tasks(_tasks(*grid, range(seeds), backends, cu_num, probes, str(pinfo.device)), jobs, progress)
    timing = {"calibration": round(time.perf_counter() - t0, 1)}
    dists_out, tol_out, groups = _derive(_collect(cal), margin)
    doc: dict[str, Any] = {
        "schema": tolerances.SCHEMA, "version": tolerances.SCHEMA_VERSION, "name": name, "method": METHOD,
        "margin": margin,
        "method_text": (f"tolerance = max(floor, max over {seeds} calibration seeds x {margin}) per (backend, case, "
                        "metric); case = case id without seed; groups = max over a (quant, dist) group's shapes, "
                        "used for shapes not calibrated that are at least as large as its smallest"),
        "floors": FLOORS, "metrics": list(METRICS), "always_zero": list(ZERO_METRICS),
        "seeds": {"calibration": list(range(seeds)),
                  "validation": list(range(VALIDATION_SEED0, VALIDATION_SEED0 + validate_seeds))},
        "cases": {"shapes": list(shapes), "quants": list(quants), "dists": list(dists),
                  "probes": sorted(PROBES) if probes else []},
        "backends": list(backends), "faults": FAULTS,
        "env": {**environment(pinfo), "emu_cu_num": cu_num or DEFAULT_EMU_CU_NUM,
                "reference_dtype": "float64" if pinfo.device_type == "cpu" else "float32"},
        "tolerances": tol_out, "groups": groups, "distributions": dists_out, "timing_s": timing,
    }
    if validate_seeds:
        tol = tolerances.Tolerances("<calibrating>", tolerances.validate_tolerances(doc))
        t1 = time.perf_counter()
        val = _run_tasks(_tasks(*grid, range(VALIDATION_SEED0, VALIDATION_SEED0 + validate_seeds), backends, cu_num,
                                probes, str(pinfo.device)), jobs, progress)
        timing["validation"] = round(time.perf_counter() - t1, 1)
        doc["validation"] = _validation_summary(val, tol, validate_seeds)
    return doc


# ------------------------------------------------------------------------------------------ CLI
def cmd_calibrate(args: argparse.Namespace, console) -> int:
    from rich.table import Table

    from mla_fp8_bench.argtypes import split_list
    from mla_fp8_bench.jsonio import check_output_path, write_json_or_rescue

    backends, shapes, quants, dists = (tuple(split_list(v, opt) or default) for v, opt, default in (
        (args.backends, "--backends", DEFAULT_BACKENDS), (args.cases, "--cases", DEFAULT_CASES),
        (args.quants, "--quants", QUANTS), (args.dists, "--dists", DISTS)))
    for what, vals, allowed in (("quantisation mode", quants, QUANTS), ("distribution", dists, DISTS)):
        for v in vals:
            if v not in allowed:
                raise ValueError(f"{what} {v!r} is unknown: allowed {', '.join(allowed)}")
    _check_args(backends, shapes, args.seeds, args.margin, args.validate_seeds, args.device)
    if args.out == "":
        raise ValueError("--out '' is empty: give a file path (default tolerances/<name>.json when --out is left out)")
    out = args.out or f"tolerances/{args.name}.json"
    if check_output_path(out, "--out").exists():  # before hours of measuring
        raise ValueError(f"--out {out} exists: calibrate never replaces a tolerance file (a shipped one included); "
                         "give a new --name or --out")
    n_tasks = len(shapes) * len(quants) * len(dists) * (args.seeds + args.validate_seeds)
    console.print(f"calibrating {', '.join(backends)} on {args.device}: {len(shapes)} shapes x {len(quants)} quant x "
                  f"{len(dists)} dist x ({args.seeds} + {args.validate_seeds} held-out) seeds = {n_tasks} case runs "
                  f"(+ probes, + faults on held-out seed {VALIDATION_SEED0}), {args.jobs} job(s)")
    done, t0 = [0], time.perf_counter()

    def progress(task):
        done[0] += 1
        if done[0] % 25 == 0:
            console.print(f"[dim]{done[0]} runs, {time.perf_counter() - t0:.0f} s[/dim]")

    doc = calibrate(backends=backends, shapes=shapes, quants=quants, dists=dists, seeds=args.seeds,
                    validate_seeds=args.validate_seeds, margin=args.margin, name=args.name, jobs=args.jobs,
                    cu_num=args.cu_num, probes=not args.no_probes, device=args.device, progress=progress)
    write_json_or_rescue(doc, out, "calibrated tolerances")  # atomic; hours of measuring survive a refused write
    t = Table(title=f"tolerances ({METHOD}, margin {doc['margin']}) on {doc['env']['device_name']} - {out}")
    for col in ("backend", "case", "max-abs fp8 (med/max -> tol)", "max-abs bf16 (med/max -> tol)",
                "rel-L2 fp8 tol", "mismatch tol"):
        t.add_column(col)
    for b, by_key in doc["tolerances"].items():
        for key, mets in by_key.items():
            d = doc["distributions"][b][key]
            spread = [f"{d[m]['median']:.3g}/{d[m]['max']:.3g} -> {mets[m]:.3g}"
                      for m in ("max_abs_error_fp8_ref", "max_abs_error_bf16_ref")]
            t.add_row(b, key, *spread, f"{mets['rel_l2_error_fp8_ref']:.3g}", f"{mets['mismatch_fraction']:.3g}")
    console.print(t)
    val = doc.get("validation")
    for b, s in (val or {}).get("backends", {}).items():
        caught = ", ".join(f"{f} {x['caught']}/{x['injected']}" for f, x in s["faults"].items())
        console.print(f"held-out validation {b}: {s['false_alarms']} false alarm(s) in {s['records']} records; worst "
                      f"value/tolerance {s['worst_ratio']} ({s['worst']}); faults caught: {caught or 'none injected'}")
    console.print(f"wrote {out}")
    if val and not val["passed"]:
        console.print(f"VALIDATION FAILED: {val['false_alarms']} false alarm(s), faults caught {val['faults_caught']}/"
                      f"{val['faults_injected']}: the file is kept, and refused as a tolerance file")
        return 1
    return 0


def add_parser(subparsers) -> None:
    from mla_fp8_bench.aiter_ps.facts import MAX_CU_NUM
    from mla_fp8_bench.argtypes import ascii_float, ascii_int, int_in, safe_name

    p = subparsers.add_parser("calibrate", help="measure error distributions over seeds on this device, write "
                                                "tolerances JSON validated on held-out seeds and injected faults")
    p.add_argument("--seeds", type=ascii_int, default=MIN_SEEDS, help=f"calibration seeds 0..N-1 (>= {MIN_SEEDS})")
    p.add_argument("--validate-seeds", type=ascii_int, default=MIN_SEEDS,
                   help=f"held-out seeds {VALIDATION_SEED0}.. checked against the new tolerances (0: skip)")
    p.add_argument("--backends", "-b", action="append", help=f"comma-separated (default {','.join(DEFAULT_BACKENDS)})")
    p.add_argument("--cases", "-c", action="append",
                   help=f"comma-separated case shapes, no suffixes (default {','.join(DEFAULT_CASES)})")
    p.add_argument("--quants", action="append", help=f"comma-separated (default {','.join(QUANTS)})")
    p.add_argument("--dists", action="append", help=f"comma-separated (default {','.join(DISTS)})")
    p.add_argument("--margin", type=ascii_float, default=DEFAULT_MARGIN, help="tolerance = max over seeds x margin")
    p.add_argument("--name", default=DEFAULT_NAME, type=safe_name("tolerance set name"),
                   help="tolerance set name (file tolerances/<name>.json, never replaced)")
    p.add_argument("--out", help="output JSON path (default tolerances/<name>.json); an existing file is refused")
    cpus = os.cpu_count() or 1
    p.add_argument("--jobs", "-j", type=int_in(1, cpus), default=1,
                   help=f"worker processes (1 torch thread each; at most this machine's {cpus} CPUs)")
    p.add_argument("--cu-num", type=int_in(1, MAX_CU_NUM), default=None,
                   help="CU count of the emulated plan (default 256)")
    p.add_argument("--no-probes", action="store_true", help="skip the chunked-context / hot-LSE probes")
    p.set_defaults(handler=cmd_calibrate)
