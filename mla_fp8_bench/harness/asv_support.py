"""What the asv classes in ``benchmarks/`` call: the static grid and the once-per-run measurement.

Environment variables read by :func:`measure_grid` (all optional):

* ``MLA_FP8_BENCH_DEVICE`` - ``auto`` (default), ``cpu``, ``cuda``, ``cuda:N``.
* ``MLA_FP8_BENCH_MAX_TOKENS`` - skip cases with more total tokens (default :data:`GRID_CAPS`: 1536 on
  CPU, 32768 on GPUs; ragged cases count their total, ctx/prefix cases their keys). ``2048`` measures
  every case the CPU sweep of ``mla-fp8-bench run`` has.
* ``MLA_FP8_BENCH_BACKENDS`` - comma-separated subset of :data:`ASV_BACKENDS` to measure.
* ``MLA_FP8_BENCH_CASES`` - comma-separated subset of :data:`ASV_CASES` to measure (the others are
  asv skips; ``mla-fp8-bench bisect`` sets it, with ``MLA_FP8_BENCH_BACKENDS``, to the probed params).
* ``MLA_FP8_BENCH_SAMPLES`` / ``MLA_FP8_BENCH_TIME_BUDGET`` - latency samples / seconds per param
  (default 30 samples within :data:`GRID_TIME_BUDGET_S`: 2 s on CPU, where latency is host time and
  informational, 10 s on GPUs).
* ``MLA_FP8_BENCH_ROUNDS`` - latency rounds (default 3 on GPUs, 1 on CPU): round 0 is the accuracy
  pass's own timing, each further round a latency-only pass in a separate process in alternating
  case order (:mod:`mla_fp8_bench.harness.rounds`); the tracked latency is the median over rounds.
* ``MLA_FP8_BENCH_EXPECT_COMMIT`` - in ``-E existing`` runs asv sets no ``ASV_COMMIT``: export the
  SHA you pass to ``--set-commit-hash`` here and the measurement refuses to run on other code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mla_fp8_bench.argtypes import env_float, env_int
from mla_fp8_bench.backends import DEFAULT_BACKENDS, backend_names, get_backend
from mla_fp8_bench.harness.asv_guard import check_commit, stored_records
from mla_fp8_bench.problem.cases import SWEEP_CAPS, SWEEP_SEQ_LENS

#: Backends in the asv grid (static on every machine; unavailable ones are skips): every registered
#: backend, the registry's defaults first (their order is the published param order), others appended.
ASV_BACKENDS = tuple(DEFAULT_BACKENDS) + tuple(b for b in backend_names() if b not in DEFAULT_BACKENDS)
#: Case ids in the asv grid: never change or reuse an id that has results.
ASV_CASES = tuple(f"s{s}" for s in SWEEP_SEQ_LENS) + (
    "s255", "s257", "ragged-6992-6896-2495", "ragged-4096x4", "s8175",
    # vLLM's unit-scale cast (the only mode vllm-aiter runs): appended, never reorder or reuse ids
    "s1024-cast", "s4096-cast", "ragged-6992-6896-2495-cast",
    # prefix-cached prefill: a context chunk, a whole prefix prefill, and one larger beyond the CPU cap
    "ctx1024-q256", "prefix1024-q300", "prefix8192-q1024",
)
#: Default token cap of the asv grid per device type. On CPU the float64 reference and the emulator are
#: O(seq_len^2): 1536 keeps every CPU case but s2048 (about a quarter of the CPU grid's time) and keeps
#: the main job within minutes; ``MLA_FP8_BENCH_MAX_TOKENS=2048`` measures it too.
GRID_CAPS = {"cpu": 1536, "cuda": SWEEP_CAPS["cuda"]}
#: Default seconds of latency sampling per (backend, case) of the asv grid, per device type.
GRID_TIME_BUDGET_S = {"cpu": 2.0, "cuda": 10.0}
#: Backends of the AITER PS path (planner time and workspace tracks): those that provide ``plan_stats``.
PLAN_BACKENDS = tuple(b for b in ASV_BACKENDS if callable(getattr(type(get_backend(b)), "plan_stats", None)))

_DROP = ("traceback",)


def lookup(cache: dict[str, Any], backend: str, case: str) -> dict[str, Any]:
    """The cached record of (backend, case) for an asv ``setup``.

    Raises:
        NotImplementedError: the param was skipped (asv records a skip, shown n/a).
        RuntimeError: the param failed (asv records a failure); the message carries the reason.
    """
    rec = cache.get("records", {}).get(f"{backend}|{case}")
    if rec is None and cache.get("failure"):
        raise RuntimeError(f"{backend} on {case}: the measurement failed: {cache['failure']}")
    if rec is None:
        raise NotImplementedError(f"{backend} on {case}: not measured in this run")
    if rec["status"] == "skipped":
        raise NotImplementedError(f"{backend} on {case}: {rec['reason']}")
    if rec["status"] != "ok":
        raise RuntimeError(f"{backend} on {case} failed: {rec['reason']}")
    return rec


def emulation_backends() -> tuple[str, ...]:
    """Backends of the asv grid whose latency is an emulation's (``Backend.emulation``), from the registry."""
    return tuple(b for b in ASV_BACKENDS if get_backend(b).emulation)


def emulation_apart(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` of an emulation (the record's ``emulation`` / ``timing_scope``, e.g. ``aiter-emulated``)
    with its latency moved from ``latency_s`` / ``latency_samples_s`` (asv's ``track_latency``, kernel
    latencies) to ``emulation_latency_s`` / ``emulation_latency_samples_s`` (``track_emulation_latency``),
    so asv never draws the two on one axis. Other records unchanged."""
    from mla_fp8_bench.measure.metric_table import find, record_is_emulation

    if not record_is_emulation(rec):
        return rec
    lat, emu = find("track_latency"), find("track_emulation_latency")
    out = dict(rec)
    out[emu.record_key], out[lat.record_key] = out.get(lat.record_key), None
    out[emu.samples_key], out[lat.samples_key] = out.get(lat.samples_key), None
    return out


def _env_int(name: str) -> int | None:
    return env_int(name, None, minimum=1)


def _env_list(name: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """The comma-separated names in ``name`` (each once, in order); ``[]`` when unset.

    Raises:
        ValueError: naming the variable, when it names nothing (``","``) or a name outside ``allowed``.
    """
    raw = os.environ.get(name, "")
    if not raw.strip():
        return []
    items = list(dict.fromkeys(x.strip() for x in raw.split(",") if x.strip()))
    if not items:
        raise ValueError(f"{name}={raw!r} names nothing: give comma-separated {what}, or unset it for all")
    unknown = [x for x in items if x not in allowed]
    if unknown:
        label = "unknown backends" if what == "backends" else "cases"
        tail = "" if what == "backends" else " outside the asv grid"
        raise ValueError(f"{name} names {label} {unknown}{tail}: allowed {', '.join(allowed)}")
    return items


def check_knobs() -> dict[str, Any]:
    """Read and check every environment variable an asv run of the grid uses, before any work.

    Called while asv discovers the benchmarks (a refusal there stops asv before it writes anything)
    and again by :func:`measure_grid` / :func:`measure_plans`.

    Returns:
        ``{"device", "max_tokens", "backends", "cases", "samples", "time_budget_s", "rounds"}`` (``None`` / ``[]``
        where unset).

    Raises:
        ValueError: naming the variable and what is allowed.
    """
    from mla_fp8_bench.backends.aiter_emulated import emulated_aiter_version, emulated_cu_num, emulated_max_tokens
    from mla_fp8_bench.measure.devices import normalize_device

    device = os.environ.get("MLA_FP8_BENCH_DEVICE", "").strip() or "auto"
    if device != "auto":
        try:
            normalize_device(device)
        except ValueError as exc:
            raise ValueError(f"MLA_FP8_BENCH_DEVICE={device!r}: {exc}") from None
    from mla_fp8_bench.harness.runner import MAX_SAMPLES

    emulated_aiter_version()
    emulated_cu_num()
    emulated_max_tokens("cpu")
    samples = _env_int("MLA_FP8_BENCH_SAMPLES")
    if samples is not None and samples > MAX_SAMPLES:
        raise ValueError(f"MLA_FP8_BENCH_SAMPLES={samples} is invalid: at most {MAX_SAMPLES}")
    return {"device": device, "max_tokens": _env_int("MLA_FP8_BENCH_MAX_TOKENS"),
            "backends": _env_list("MLA_FP8_BENCH_BACKENDS", ASV_BACKENDS, "backends"),
            "cases": _env_list("MLA_FP8_BENCH_CASES", ASV_CASES, "case ids"),
            "samples": samples,
            "time_budget_s": env_float("MLA_FP8_BENCH_TIME_BUDGET", None),
            "rounds": _env_int("MLA_FP8_BENCH_ROUNDS")}


def _grid_setup():
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    check_commit()
    knobs = check_knobs()
    pinfo = platform_info(knobs["device"])
    cap = knobs["max_tokens"] or GRID_CAPS[pinfo.device_type]
    backends = knobs["backends"] or list(ASV_BACKENDS)
    only = knobs["cases"]
    cases, skipped = [], {}
    for cid in ASV_CASES:
        if only and cid not in only:
            continue  # not measured: lookup() makes it an asv skip
        c = parse_case_id(cid)
        tokens = max(c.total_tokens, c.total_kv_tokens)
        if tokens > cap:
            skipped[cid] = f"{tokens} tokens exceed this run's cap of {cap} on {pinfo.device_type}"
        else:
            cases.append(c)
    return pinfo, cap, backends, cases, skipped


def never_raising(measure: Callable[[str | None], dict[str, Any]], class_name: str, params: tuple[list, list],
                  version: str | None) -> dict[str, Any]:
    """``measure(version)`` for an asv ``setup_cache`` that never raises.

    asv stores a ``setup_cache`` exception as a failure (``null``) of every param of the class, over the
    values stored for this commit. Here any exception becomes a cache whose params keep their stored
    values (:func:`mla_fp8_bench.harness.asv_guard.stored_records`); the others are failures carrying
    the reason (:func:`lookup`).
    """
    try:
        return measure(version)
    except Exception as exc:  # noqa: BLE001 - whatever failed, stored values are not replaced by null
        why = f"{type(exc).__name__}: {exc}"
        print(f"[mla_fp8_bench] {class_name}: the measurement failed ({why}); stored values are kept", flush=True)
        keys = [(str(b), str(c)) for b in params[0] for c in params[1]]
        try:
            kept = stored_records(class_name, version, keys) if version is not None else {}
        except Exception as exc2:  # noqa: BLE001 - no stored file readable: every param fails with the reason
            print(f"[mla_fp8_bench] {class_name}: stored values could not be read ({exc2})", flush=True)
            kept = {}
        return {"records": kept, "failure": why}


def _keep_stored_over_errors(records: dict[str, Any], class_name: str, version: str) -> None:
    """An ``error`` record of this run whose param has a value stored for this commit keeps that value
    (the reason names the error): a failure never replaces a stored measurement of the same code."""
    failed = [tuple(k.split("|", 1)) for k, r in records.items() if r.get("status") == "error"]
    for key, rec in stored_records(class_name, version, failed).items():
        why = records[key].get("reason", "")
        print(f"[mla_fp8_bench] {key.replace('|', ' ')}: error in this run ({why}); the stored value is kept",
              flush=True)
        rec["reason"] = f"error in this run ({why}): stored value kept ({rec['stored_from']})"
        records[key] = rec


def _evaluate_with_progress(backends, cases, pinfo, cap, skipped, opts) -> dict[str, Any]:
    """``runner.evaluate`` with one line per (backend, case) on stderr and, inside ``asv run`` (which
    shows a setup_cache's own stderr only when it fails), on the stderr of the asv process."""
    import sys

    from mla_fp8_bench.harness.asv_guard import asv_context
    from mla_fp8_bench.harness.runner import evaluate
    from mla_fp8_bench.terminal import CaseProgress, open_parent_stderr

    parent = open_parent_stderr() if asv_context() is not None else None
    streams = (sys.stderr,) + ((parent,) if parent is not None else ())
    head = (f"[mla_fp8_bench] measuring {len(backends)} backends x {len(cases)} cases on {pinfo.device} "
            f"(cases above {cap} tokens skipped: {len(skipped)}); one line per (backend, case):")
    try:
        for s in streams:
            try:
                print(("\n" if s is parent else "") + head, file=s, flush=True)
            except (OSError, ValueError):
                continue
        with CaseProgress(len(backends) * len(cases), stream=streams) as prog:
            return evaluate(backends, cases, device=pinfo.device, options=opts, progress=prog.step)
    finally:
        if parent is not None:
            parent.close()


def measure_grid(version: str | None = None) -> dict[str, Any]:
    """Measure every (backend, case) of the asv grid once; return plain-Python (picklable) records.

    With ``version`` (the asv benchmark version), params this run does not measure (narrowed by
    ``MLA_FP8_BENCH_BACKENDS`` / ``_CASES`` / ``_MAX_TOKENS``) get the values stored for this commit
    (:func:`mla_fp8_bench.harness.asv_guard.stored_records`) instead of becoming n/a.

    Returns:
        ``{"env": {...}, "cap": int, "records": {"backend|case": record}}``.
    """
    from mla_fp8_bench.harness.runner import RunOptions

    pinfo, cap, backends, cases, skipped = _grid_setup()
    knobs = check_knobs()
    opts = RunOptions(samples=knobs["samples"] or 30,
                      time_budget_s=knobs["time_budget_s"] or GRID_TIME_BUDGET_S[pinfo.device_type])
    data = _evaluate_with_progress(backends, cases, pinfo, cap, skipped, opts)
    from mla_fp8_bench.peers.ceilings import attach

    attach(data)
    n_rounds = knobs["rounds"] or (DEFAULT_GPU_ROUNDS if pinfo.device.type == "cuda" else 1)
    data["rounds"] = _extra_rounds(data["records"], n_rounds, str(pinfo.device))
    records: dict[str, Any] = {}
    for r in data["records"]:
        records[f"{r['backend']}|{r['case']}"] = emulation_apart({k: v for k, v in r.items() if k not in _DROP})
    for cid, why in skipped.items():
        for b in ASV_BACKENDS:
            records[f"{b}|{cid}"] = {"backend": b, "case": cid, "status": "skipped", "reason": why}
    if version is not None:  # params this run did not measure keep their stored values
        unmeasured = [(b, c) for b in ASV_BACKENDS for c in ASV_CASES
                      if records.get(f"{b}|{c}") is None or c in skipped]
        records.update(stored_records("MLAPrefill", version, unmeasured))
        _keep_stored_over_errors(records, "MLAPrefill", version)
    return {"env": data["env"], "ceilings": data.get("ceilings"), "cap": cap, "records": records,
            "rounds": data["rounds"]}


#: Latency rounds of the asv grid on a GPU (round 0 in the accuracy pass, the rest in separate processes).
DEFAULT_GPU_ROUNDS = 3


def _extra_rounds(records: list[dict[str, Any]], rounds: int, device: str) -> dict[str, Any]:
    """Rounds 1 .. ``rounds - 1`` of the kernel records' (backend, case) pairs in separate processes,
    folded into ``records`` (:func:`mla_fp8_bench.harness.rounds.merge_rounds`); returns what ran
    (orders, wall time, errors) for the cache."""
    import time

    from mla_fp8_bench.harness.rounds import merge_rounds, run_rounds

    kernel = [r for r in records
              if r.get("status") == "ok" and r.get("latency_s") and r.get("timing_scope") != "emulation"]
    backends = list(dict.fromkeys(r["backend"] for r in kernel))
    cases = list(dict.fromkeys(r["case"] for r in kernel))
    if rounds <= 1 or not kernel:
        return {"rounds": 1, "extra": []}
    t0 = time.perf_counter()
    docs = run_rounds(backends, cases, rounds - 1, device=device,
                      log=lambda m: print(f"[mla_fp8_bench] {m}", flush=True))
    merge_rounds(records, docs)
    return {"rounds": rounds, "wall_s": time.perf_counter() - t0,
            "extra": [{"round": d.get("round"), "order": d.get("order"), "wall_s": d.get("process_wall_s"),
                       "error": d.get("error")} for d in docs]}


def measure_plans(version: str | None = None) -> dict[str, Any]:
    """Planner time, live partial slots and workspace bytes of the AITER PS path for the asv grid.

    ``version``: as for :func:`measure_grid` (params not measured keep their stored values).

    Each backend of :data:`PLAN_BACKENDS` that is available provides ``plan_stats(case, platform)``.

    Returns:
        ``{"records": {"backend|case": record}}``; records carry ``planner_samples_s``,
        ``workspace_bytes`` and ``num_partials``.
    """
    from mla_fp8_bench.backends import get_backend

    pinfo, cap, _backends, cases, skipped = _grid_setup()
    records: dict[str, Any] = {}
    for name in PLAN_BACKENDS:
        b = get_backend(name)
        avail = b.availability(pinfo)
        for c in cases:
            key = f"{name}|{c.id}"
            if not avail:
                records[key] = {"status": "skipped", "reason": avail.reason}
                continue
            try:
                stats = b.plan_stats(c, pinfo)
                records[key] = {"status": "ok", "reason": "", **stats}
            except NotImplementedError as exc:
                records[key] = {"status": "skipped", "reason": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
                records[key] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
        for cid, why in skipped.items():
            records[f"{name}|{cid}"] = {"status": "skipped", "reason": why}
    if version is not None:
        unmeasured = [(b, c) for b in PLAN_BACKENDS for c in ASV_CASES
                      if records.get(f"{b}|{c}") is None or c in skipped]
        records.update(stored_records("AiterPlan", version, unmeasured))
        _keep_stored_over_errors(records, "AiterPlan", version)
    return {"records": records}
