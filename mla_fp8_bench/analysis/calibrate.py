"""``mla-fp8-bench calibrate``: measure error distributions over seeds and derive tolerances.

Every backend x quantisation mode (:data:`QUANTS`) x input distribution (:data:`DISTS`) x case shape
runs over ``--seeds`` seeds (>= :data:`MIN_SEEDS`), plus the probes of
:mod:`mla_fp8_bench.analysis.probes`; tolerance = max(floor, max over seeds x margin) per (backend,
case without its seed, metric), checked on ``--validate-seeds`` held-out seeds (from
:data:`VALIDATION_SEED0`). Why the maximum and why x2.0: docs/regressions.md, section 1. The file
format and the check of records live in :mod:`mla_fp8_bench.analysis.tolerances`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import itertools
import math
import os
import platform as _platform
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from mla_fp8_bench.analysis import tolerances
from mla_fp8_bench.analysis.stats import summary
from mla_fp8_bench.analysis.tolerances import FLOORS, METRICS, ZERO_METRICS
from mla_fp8_bench.config import DEFAULT_EMU_CU_NUM, RunConfig

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

# ------------------------------------------------------------------------------------------ measuring
def _measure_case(case_id: str, backends: tuple[str, ...], cu_num: int | None) -> dict[str, dict[str, Any]]:
    """Records (metric dicts) of each backend on one case (CPU, no timing)."""
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    pinfo = platform_info("cpu")
    case_data = CaseData(parse_case_id(case_id), pinfo, None)
    opts = RunOptions(timing=False, determinism=False)
    cfg = RunConfig(emu_cu_num=cu_num or DEFAULT_EMU_CU_NUM)
    out = {}
    for b in backends:
        rec = evaluate_one(get_backend(b, cfg), case_data, pinfo, opts).as_dict()
        rec.pop("traceback", None)
        out[b] = rec
    return out


def _measure_task(task: tuple) -> tuple[tuple, dict[str, dict[str, Any]]]:
    import torch

    torch.set_num_threads(1)  # one thread per worker process: --jobs sets the parallelism
    if task[0] == "probe":
        from mla_fp8_bench.analysis.probes import probe_record

        _, name, seed = task
        return task, {"aiter-emulated": probe_record(name, seed)}
    _, case_id, backends, cu_num = task
    return task, _measure_case(case_id, backends, cu_num)


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
           backends: tuple[str, ...], cu_num: int | None, probes: bool) -> list[tuple]:
    from mla_fp8_bench.analysis.probes import PROBES
    from mla_fp8_bench.problem.cases import parse_case_id

    seeds = list(seeds)
    tasks = [("case", replace(base, quant=qm, dist=d, seed=s).id, backends, cu_num)
             for base, qm, d, s in itertools.product(map(parse_case_id, shapes), quants, dists, seeds)]
    return tasks + ([("probe", name, s) for name in PROBES for s in seeds] if probes else [])


def _check_args(backends: tuple[str, ...], shapes: tuple[str, ...], seeds: int, margin: float,
                validate_seeds: int = MIN_SEEDS) -> None:
    """Refuse bad calibrate arguments before any measuring (ValueError naming the value): seed counts
    outside ``MIN_SEEDS .. VALIDATION_SEED0`` (the held-out seeds must stay held out) and
    ``0 .. MAX_VALIDATION_SEEDS``, a margin < 1, unknown names, a backend that cannot run on this CPU."""
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
    pinfo = platform_info("cpu")
    for b in backends:
        verdict = get_backend(b).availability(pinfo)
        if not verdict:
            raise ValueError(f"backend {b!r} cannot be calibrated on this CPU ({verdict.reason}): calibrate runs "
                             f"on the CPU; e.g. --backends {','.join(DEFAULT_BACKENDS)}")
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


def _validation_summary(results: list[tuple[tuple, dict]], tol: tolerances.Tolerances) -> dict[str, Any]:
    """Per backend: held-out records, false alarms (with up to 3 violations each), worst value/tolerance."""
    out: dict[str, Any] = {}
    for _task, recs in results:
        for b, rec in recs.items():
            s = out.setdefault(b, {"records": 0, "false_alarms": 0, "alarms": [], "worst_ratio": 0.0, "worst": None})
            s["records"] += 1
            viol = tolerances.check(rec, tol)
            if viol:
                s["false_alarms"] += 1
                s["alarms"].extend(str(v) for v in viol[:3])
            r, _how = tolerances.ratios(rec, tol)
            for m, x in r.items():
                if x > s["worst_ratio"]:
                    s["worst_ratio"], s["worst"] = x, f"{rec['case']} {m} = {rec[m]:.4g}"
    for s in out.values():
        s["worst_ratio"] = round(s["worst_ratio"], 4)
    return out


def calibrate(*, backends: tuple[str, ...] = DEFAULT_BACKENDS, shapes: tuple[str, ...] = DEFAULT_CASES,
              quants: tuple[str, ...] = QUANTS, dists: tuple[str, ...] = DISTS, seeds: int = MIN_SEEDS,
              validate_seeds: int = MIN_SEEDS, margin: float = DEFAULT_MARGIN, name: str = DEFAULT_NAME,
              jobs: int = 1, cu_num: int | None = None, probes: bool = True,
              progress=None) -> dict[str, Any]:
    """Measure, derive and validate tolerances; returns the JSON document (see module docstring).

    Raises:
        ValueError: fewer than :data:`MIN_SEEDS` seeds, a margin < 1, or bad case/backend names.
        RuntimeError: a healthy calibration run failed.
    """
    from mla_fp8_bench.analysis.probes import PROBES

    _check_args(backends, shapes, seeds, margin, validate_seeds)
    probes = probes and "aiter-emulated" in backends
    progress = progress or (lambda t: None)
    t0 = time.perf_counter()
    cal = _run_tasks(_tasks(shapes, quants, dists, range(seeds), backends, cu_num, probes), jobs, progress)
    cal_s = time.perf_counter() - t0
    dists_out, tol_out, groups = _derive(_collect(cal), margin)
    doc: dict[str, Any] = {
        "schema": tolerances.SCHEMA, "version": tolerances.SCHEMA_VERSION, "name": name, "method": METHOD,
        "margin": margin,
        "method_text": (f"tolerance = max(floor, max over {seeds} calibration seeds x {margin}) per (backend, case "
                        "case, metric); case = case id without seed; groups = max over a (quant, dist) "
                        "group's shapes, used for shapes that were not calibrated"),
        "floors": FLOORS, "metrics": list(METRICS), "always_zero": list(ZERO_METRICS),
        "seeds": {"calibration": list(range(seeds)),
                  "validation": list(range(VALIDATION_SEED0, VALIDATION_SEED0 + validate_seeds))},
        "cases": {"shapes": list(shapes), "quants": list(quants), "dists": list(dists),
                  "probes": sorted(PROBES) if probes else []},
        "backends": list(backends),
        "env": _env(cu_num),
        "tolerances": tol_out, "groups": groups, "distributions": dists_out,
        "timing_s": {"calibration": round(cal_s, 1)},
    }
    if validate_seeds:
        tol = tolerances.Tolerances("<calibrating>", tolerances.validate_tolerances(doc))
        t1 = time.perf_counter()
        val = _run_tasks(_tasks(shapes, quants, dists, range(VALIDATION_SEED0, VALIDATION_SEED0 + validate_seeds),
                                backends, cu_num, probes), jobs, progress)
        doc["timing_s"]["validation"] = round(time.perf_counter() - t1, 1)
        doc["validation"] = _validation_summary(val, tol)
    return doc


def _env(cu_num: int | None) -> dict[str, Any]:
    import torch

    from mla_fp8_bench import __version__

    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = _platform.processor() or _platform.machine()
    return {"mla_fp8_bench": __version__, "torch": torch.__version__, "python": _platform.python_version(),
            "device": "cpu", "cpu": cpu, "num_cpu": os.cpu_count(), "emu_cu_num": cu_num or DEFAULT_EMU_CU_NUM,
            "fp8_dtype": "float8_e4m3fn", "reference_dtype": "float64",
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


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
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs} is invalid: >= 1")
    _check_args(backends, shapes, args.seeds, args.margin, args.validate_seeds)
    if args.out == "":
        raise ValueError("--out '' is empty: give a file path (default tolerances/<name>.json when --out is left out)")
    out = args.out or f"tolerances/{args.name}.json"
    check_output_path(out, "--out")  # before hours of measuring
    n_tasks = len(shapes) * len(quants) * len(dists) * (args.seeds + args.validate_seeds)
    console.print(f"calibrating {', '.join(backends)} on {len(shapes)} shapes x {len(quants)} quant x {len(dists)} "
                  f"dist x ({args.seeds} + {args.validate_seeds} held-out) seeds = {n_tasks} case runs "
                  f"(+ probes), {args.jobs} job(s)")
    done = [0]
    t0 = time.perf_counter()

    def progress(task):
        done[0] += 1
        if done[0] % 25 == 0:
            console.print(f"[dim]{done[0]} runs, {time.perf_counter() - t0:.0f} s[/dim]")

    doc = calibrate(backends=backends, shapes=shapes, quants=quants, dists=dists, seeds=args.seeds,
                    validate_seeds=args.validate_seeds, margin=args.margin, name=args.name, jobs=args.jobs,
                    cu_num=args.cu_num, probes=not args.no_probes, progress=progress)
    write_json_or_rescue(doc, out, "calibrated tolerances")  # atomic; hours of measuring survive a refused write
    t = Table(title=f"tolerances ({METHOD}, margin {doc['margin']}) - {out}")
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
    for b, s in doc.get("validation", {}).items():
        console.print(f"held-out validation {b}: {s['false_alarms']} false alarm(s) in {s['records']} records; "
                      f"worst value/tolerance {s['worst_ratio']} ({s['worst']})")
    console.print(f"wrote {out}")
    return 0


def add_parser(subparsers) -> None:
    from mla_fp8_bench.aiter_ps.facts import MAX_CU_NUM
    from mla_fp8_bench.argtypes import ascii_float, ascii_int, int_in, safe_name

    p = subparsers.add_parser("calibrate", help="measure error distributions over seeds and write tolerances JSON")
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
                   help="tolerance set name (file tolerances/<name>.json)")
    p.add_argument("--out", help="output JSON path (default tolerances/<name>.json)")
    cpus = os.cpu_count() or 1
    p.add_argument("--jobs", "-j", type=int_in(1, cpus), default=1,
                   help=f"worker processes (1 torch thread each; at most this machine's {cpus} CPUs)")
    p.add_argument("--cu-num", type=int_in(1, MAX_CU_NUM), default=None,
                   help="CU count of the emulated plan (default 256)")
    p.add_argument("--no-probes", action="store_true", help="skip the chunked-context / hot-LSE probes")
    p.set_defaults(handler=cmd_calibrate)
