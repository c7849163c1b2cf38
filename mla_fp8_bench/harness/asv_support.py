"""What the asv classes in ``benchmarks/`` call: the static grid and the once-per-run measurement, configured
by :func:`check_knobs` (knobs: docs/usage.md). Defaults: the token cap :data:`GRID_CAPS` (ragged cases count
their total, ctx/prefix cases their keys), 30 latency samples within :data:`GRID_TIME_BUDGET_S`, and
:data:`DEFAULT_GPU_ROUNDS` latency rounds on GPUs (1 on CPU).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from mla_fp8_bench.backends import DEFAULT_BACKENDS, backend_names, get_backend
from mla_fp8_bench.config import RunConfig
from mla_fp8_bench.harness.asv_guard import asv_context, check_commit, stored_records
from mla_fp8_bench.problem.cases import SUITES, SWEEP_CAPS, SWEEP_SEQ_LENS

_PUBLISHED_CASES = tuple(f"s{s}" for s in SWEEP_SEQ_LENS) + (
    "s255", "s257", "ragged-6992-6896-2495", "ragged-4096x4", "s8175",
    # vLLM's unit-scale cast (the only mode vllm-aiter runs): appended, never reorder or reuse ids
    "s1024-cast", "s4096-cast", "ragged-6992-6896-2495-cast",
    # prefix-cached prefill: a context chunk, a whole prefix prefill, and one larger beyond the CPU cap
    "ctx1024-q256", "prefix1024-q300", "prefix8192-q1024",
)
_VLLM_CASES = SUITES["sweep-cast"] + SUITES["serving-heads"]
#: Case ids in the asv grid: never change or reuse an id that has results. After the published ones, vLLM's
#: entry over the whole sweep and the serving head counts (ids already there keep their place).
ASV_CASES = _PUBLISHED_CASES + tuple(c for i, c in enumerate(_VLLM_CASES)
                                     if c not in _PUBLISHED_CASES and c not in _VLLM_CASES[:i])
#: Default token cap of the asv grid per device type. On CPU (O(seq_len^2) reference and emulator) 1536
#: leaves out only s2048, a quarter of the CPU grid's time; ``MLA_FP8_BENCH_MAX_TOKENS=2048`` measures it.
GRID_CAPS = {"cpu": 1536, "cuda": SWEEP_CAPS["cuda"]}
#: Default seconds of latency sampling per (backend, case) of the asv grid, per device type.
GRID_TIME_BUDGET_S = {"cpu": 2.0, "cuda": 10.0}
#: Latency rounds of the asv grid on a GPU (round 0 in the accuracy pass, the rest in separate processes).
DEFAULT_GPU_ROUNDS = 3


def asv_backends() -> tuple[str, ...]:
    """Backends in the asv grid (static on every machine; unavailable ones are skips): the registry's
    defaults first (the published param order), then every other registered backend."""
    return tuple(DEFAULT_BACKENDS) + tuple(b for b in backend_names() if b not in DEFAULT_BACKENDS)


def plan_backends() -> tuple[str, ...]:
    """Backends with ``plan_stats`` (the AITER PS planner time and workspace tracks)."""
    return tuple(b for b in asv_backends() if callable(getattr(type(get_backend(b)), "plan_stats", None)))


def lookup(cache: dict[str, Any], backend: str, case: str) -> dict[str, Any]:
    """The cached record of (backend, case) for an asv ``setup``; NotImplementedError when the param was
    skipped (asv shows n/a), RuntimeError carrying the reason when it failed."""
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
    """Backends of the asv grid whose latency is an emulation's (``Backend.emulation``)."""
    return tuple(b for b in asv_backends() if get_backend(b).emulation)


def emulation_apart(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` of an emulation backend (by backend: an asv series is one backend's) with its latency and
    samples moved to ``track_emulation_latency``'s keys, so asv never draws the two on one axis."""
    from mla_fp8_bench.measure.metric_table import find

    if rec.get("backend") not in emulation_backends():
        return rec
    lat, emu = find("track_latency"), find("track_emulation_latency")
    out = dict(rec)
    out[emu.record_key], out[lat.record_key] = out.get(lat.record_key), None
    out[emu.samples_key], out[lat.samples_key] = out.get(lat.samples_key), None
    return out


def check_knobs(environ: dict[str, str] | None = None) -> RunConfig:
    """:meth:`RunConfig.from_env` over this grid (default ``os.environ``); ValueError naming a bad knob."""
    return RunConfig.from_env(environ, grid=(asv_backends(), ASV_CASES))


def _grid_setup(cfg: RunConfig):
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    check_commit(cfg)
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


def never_raising(measure: Callable[[str | None, RunConfig], dict[str, Any]], class_name: str,
                  params: tuple[list, list], version: str | None) -> dict[str, Any]:
    """``measure(version, check_knobs())`` for an asv ``setup_cache``: an exception (which asv would store
    as ``null`` over every param's stored value) becomes a cache of the stored values
    (:func:`~mla_fp8_bench.harness.asv_guard.stored_records`), other params failing with the reason."""
    cfg = None
    try:
        cfg = check_knobs()
        return measure(version, cfg)
    except Exception as exc:  # noqa: BLE001 - whatever failed, stored values are not replaced by null
        why = f"{type(exc).__name__}: {exc}"
        print(f"[mla_fp8_bench] {class_name}: the measurement failed ({why}); stored values are kept", flush=True)
        keys = [(str(b), str(c)) for b in params[0] for c in params[1]]
        try:
            kept = stored_records(cfg or RunConfig.locating(), class_name, version, keys) if version else {}
        except Exception as exc2:  # noqa: BLE001 - no stored file readable: every param fails with the reason
            print(f"[mla_fp8_bench] {class_name}: stored values could not be read ({exc2})", flush=True)
            kept = {}
        return {"records": kept, "failure": why}


def _keep_stored(cfg: RunConfig, records: dict[str, Any], class_name: str, version: str | None,
                 backends: tuple[str, ...], skipped: dict[str, str]) -> None:
    """With ``version``, params of ``backends`` x :data:`ASV_CASES` this run did not measure, or measured
    with an ``error``, get the values stored for this commit (a failure never replaces a stored value)."""
    if version is None:
        return
    unmeasured = [(b, c) for b in backends for c in ASV_CASES if records.get(f"{b}|{c}") is None or c in skipped]
    records.update(stored_records(cfg, class_name, version, unmeasured))
    failed = [tuple(k.split("|", 1)) for k, r in records.items() if r.get("status") == "error"]
    for key, rec in stored_records(cfg, class_name, version, failed).items():
        why = records[key].get("reason", "")
        print(f"[mla_fp8_bench] {key.replace('|', ' ')}: error in this run ({why}); the stored value is kept",
              flush=True)
        rec["reason"] = f"error in this run ({why}): stored value kept ({rec['stored_from']})"
        records[key] = rec


def measure_grid(version: str | None = None, config: RunConfig | None = None) -> dict[str, Any]:
    """Measure every (backend, case) of the asv grid once (``config``: default :func:`check_knobs`) into
    picklable records, one progress line each on stderr and, inside ``asv run`` (which shows a setup_cache's
    stderr only when it fails), on the asv process's; with ``version`` (the asv benchmark version), params
    not measured keep the values stored for this commit (:func:`_keep_stored`).

    Returns:
        ``{"env", "ceilings", "cap": int, "records": {"backend|case": record}, "rounds"}``.
    """
    from mla_fp8_bench.harness.rounds import fold_rounds
    from mla_fp8_bench.harness.runner import RunOptions, evaluate
    from mla_fp8_bench.peers.ceilings import attach
    from mla_fp8_bench.terminal import case_progress, open_parent_stderr

    cfg = config or check_knobs()
    pinfo, cap, backends, cases, skipped = _grid_setup(cfg)
    opts = RunOptions(samples=cfg.samples or 30,
                      time_budget_s=cfg.time_budget_s or GRID_TIME_BUDGET_S[pinfo.device_type])
    parent = open_parent_stderr() if asv_context(cfg) is not None else None
    streams = (sys.stderr,) + ((parent,) if parent is not None else ())
    head = (f"[mla_fp8_bench] measuring {len(backends)} backends x {len(cases)} cases on {pinfo.device} "
            f"(cases above {cap} tokens skipped: {len(skipped)}); one line per (backend, case):")
    with contextlib.closing(parent) if parent is not None else contextlib.nullcontext():
        for s in streams:
            with contextlib.suppress(OSError, ValueError):
                print(("\n" if s is parent else "") + head, file=s, flush=True)
        with case_progress(len(backends) * len(cases), stream=streams) as step:
            data = evaluate(backends, cases, device=pinfo.device, options=opts, config=cfg, progress=step)
    attach(data, enabled=cfg.ceilings)
    n_rounds = cfg.rounds or (DEFAULT_GPU_ROUNDS if pinfo.device.type == "cuda" else 1)
    data["rounds"] = fold_rounds(data["records"], n_rounds, str(pinfo.device),
                                 log=lambda m: print(f"[mla_fp8_bench] {m}", flush=True))
    records = {f"{r['backend']}|{r['case']}": emulation_apart({k: v for k, v in r.items() if k != "traceback"})
               for r in data["records"]}
    grid = asv_backends()
    records.update({f"{b}|{cid}": {"backend": b, "case": cid, "status": "skipped", "reason": why}
                    for cid, why in skipped.items() for b in grid})
    _keep_stored(cfg, records, "MLAPrefill", version, grid, skipped)
    return {"env": data["env"], "ceilings": data.get("ceilings"), "cap": cap, "records": records,
            "rounds": data["rounds"]}


def measure_plans(version: str | None = None, config: RunConfig | None = None) -> dict[str, Any]:
    """``plan_stats(case, platform)`` (planner time, live partial slots, workspace bytes) of each available
    :func:`plan_backends` backend over the asv grid; arguments as for :func:`measure_grid`. Returns
    ``{"records": {"backend|case": record}}`` with ``planner_samples_s``, ``workspace_bytes``, ``num_partials``.
    """
    cfg = config or check_knobs()
    pinfo, _cap, _backends, cases, skipped = _grid_setup(cfg)
    records: dict[str, Any] = {}
    plan = plan_backends()
    for name in plan:
        b = get_backend(name, cfg)
        avail = b.availability(pinfo)
        for c in cases:
            key = f"{name}|{c.id}"
            try:
                if not avail:
                    raise NotImplementedError(avail.reason)
                records[key] = {"status": "ok", "reason": "", **b.plan_stats(c, pinfo)}
            except NotImplementedError as exc:
                records[key] = {"status": "skipped", "reason": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
                records[key] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
        records.update({f"{name}|{cid}": {"status": "skipped", "reason": why} for cid, why in skipped.items()})
    _keep_stored(cfg, records, "AiterPlan", version, plan, skipped)
    return {"records": records}
