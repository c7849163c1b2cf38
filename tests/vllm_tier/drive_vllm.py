"""Driver of the real-vLLM tier. Runs INSIDE a vLLM environment built by ``scripts/vllm_envs.sh``
(``<env>/bin/python tests/vllm_tier/drive_vllm.py --repo <repo> --out result.json``), with the repo on
``PYTHONPATH``; ``test_vllm_real.py`` starts it and asserts on what it reports.

It runs the suite's REAL ``vllm-aiter`` adapter (:mod:`mla_fp8_bench.backends.vllm_aiter`) against
vLLM's REAL ``AiterMLAImpl`` / ``AiterMLAMetadataBuilder`` / workspace manager, with the stand-in
``aiter`` (:func:`mla_fp8_bench.aiter_ps.standin.make_standin_aiter`, MI355X's 256 CUs) in
``sys.modules``, and compares every output bit for bit with the suite's ``aiter`` backend (the raw driver)
over the same ``aiter`` doing the same work: the same inputs, or vLLM's padded inputs where vLLM pads heads.

CPU shims (docs: vllm-on-cpu.md), applied by detected feature, not by version string:

* ``VLLM_TARGET_DEVICE=cpu`` before vLLM is imported (the CPU platform);
* every release: ``torch.accelerator.empty_cache`` is a no-op (the workspace manager calls it);
* plan staging (>= 0.32): ``torch.empty(pin_memory=True)`` drops ``pin_memory``; ``torch.cuda.Event``
  is a host no-op event;
* budget-aware sizing (>= 0.31): ``current_platform.num_compute_units()`` returns the stand-in's CU
  count (256). On gfx950 vLLM's CU count and AITER's are the same number; the CPU platform would
  report ``torch.get_num_threads()`` and size the locked workspace for a 2-CU device while the plan
  is for 256 CUs, so the forward would (correctly) fail with "Workspace is locked";
* the gate check only: a fake ``vllm.platforms.rocm`` with ``on_gfx950() -> True``.

Modes:

* default: every check, JSON to ``--out``; exit 0 unless the driver itself broke;
* ``--fault NAME``: the per-case tier check with a deliberately wrong adapter
  (:data:`support.vllm_faults.ADAPTER_FAULTS`, ``tests/support``); exits 1 with a line
  ``VLLM TIER FAILURE ...`` on stderr when the tier catches it, 0 when it does not.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback
import types
from dataclasses import asdict, replace
from pathlib import Path

import torch

from mla_fp8_bench.problem.cases import SUITES, SWEEP_CAPS, parse_case_id

CU_NUM = 256  # MI355X
#: The asv grid's vLLM cases up to the CPU cap: every sweep seq_len (cast as vLLM casts) and each serving
#: head count (8, 12, 24 padded from 0.29: repeat_interleave, tile+slice, tile+slice).
GRID_CASES = tuple(c for c in dict.fromkeys(SUITES["sweep-cast"] + SUITES["serving-heads"])
                   if parse_case_id(c).total_tokens <= SWEEP_CAPS["cpu"])
CASES = (
    "s255-cast", "s257-cast",                         # q-tile edges
    "ragged-255-1-300-257-cast",                      # ragged, with a 1-token sequence
    "s257-cast-mla",                                  # strided v view, as forward_mha passes it
    "s129-cast-outlier",                              # values beyond +-448: torch's saturating cast
    *GRID_CASES,
)
REPEAT_CASE = "s257-cast"
PLAN_CASES = ("s600-cast", "ragged-300-17-1000-cast", "s300-h12-cast", "s300-h24-cast")


class TierFailure(AssertionError):
    """The adapter on real vLLM broke a contract the tier checks."""


# ------------------------------------------------------------------------------------------------
# shims


class _HostEvent:
    """Stand-in for ``torch.cuda.Event`` on a CPU-only torch (plans are staged synchronously)."""

    def __init__(self, *args, **kwargs):
        self.recorded = 0

    def record(self, stream=None):
        self.recorded += 1

    def synchronize(self):
        return None

    def query(self):
        return True

    def wait(self, stream=None):
        return None


def apply_shims(features, shims: list[str]) -> None:
    torch.accelerator.empty_cache = lambda: None
    shims.append("torch.accelerator.empty_cache -> no-op")
    if features.staging:
        real_empty = torch.empty

        def empty(*args, pin_memory=False, **kwargs):
            return real_empty(*args, **kwargs)

        torch.empty = empty
        torch.cuda.Event = _HostEvent
        shims.append("torch.empty(pin_memory=True) -> unpinned; torch.cuda.Event -> host event")


def real_info_shapes(aiter, shims: list[str] | None = None):
    """Make the stand-in's ``get_ps_metadata_info_v1`` return 1-D sizes as bare ints, as real AITER
    does (``(2, torch.uint64)``, ``(cu_num + 1, torch.int32)``, ...; 2-D ones stay tuples). vLLM 0.28
    multiplies the ``reduce_partial_map`` size by 256 for its reservation, which needs the int. A
    no-op once the stand-in itself returns ints."""
    import functools

    fn = aiter.get_ps_metadata_info_v1
    probe = fn(batch_size=1, num_head_k=16, max_qlen=256, qlen_granularity=256)
    aiter.calls.pop()
    if all(not isinstance(shape, tuple) or len(shape) != 1 for shape, _ in probe):
        return aiter

    @functools.wraps(fn)
    def get_ps_metadata_info_v1(*args, **kwargs):
        return [(shape[0] if isinstance(shape, tuple) and len(shape) == 1 else shape, dt)
                for shape, dt in fn(*args, **kwargs)]

    aiter.get_ps_metadata_info_v1 = get_ps_metadata_info_v1
    if shims is not None:
        shims.append("stand-in get_ps_metadata_info_v1: 1-D sizes as ints, like real AITER")
    return aiter


def set_compute_units(n: int) -> None:
    from vllm.platforms import current_platform

    type(current_platform).num_compute_units = classmethod(lambda cls, device_id=0: n)


# ------------------------------------------------------------------------------------------------
# checks


def _pad_like_vllm(x: torch.Tensor, real: int, padded: int) -> torch.Tensor:
    """Replicate-pad heads: repeat_interleave when ``padded`` is a multiple, else tile and slice."""
    if padded % real == 0:
        return x.repeat_interleave(padded // real, dim=1)
    return x.repeat(1, -(-padded // real), 1)[:, :padded].contiguous()


def _real_heads(x: torch.Tensor, real: int) -> torch.Tensor:
    padded = x.shape[1]
    return x[:, :: padded // real] if padded % real == 0 else x[:, :real]


def _source_heads(real: int, padded: int) -> list[int]:
    if padded % real == 0:
        r = padded // real
        return [i // r * r for i in range(padded)]
    return [i % real for i in range(padded)]


def aiter_output(raw, inputs, padded: int) -> tuple[torch.Tensor, bool | None]:
    """The ``aiter`` backend ``raw`` on the case's inputs, padded to ``padded`` heads the way vLLM pads them
    (the same work as vLLM's call). Returns (output of the real heads, whether pad heads were duplicates)."""
    from mla_fp8_bench.problem.fp8 import quantize

    real = inputs.case.num_heads
    dup = None
    if padded != real:
        q, k, v = (_pad_like_vllm(x, real, padded) for x in (inputs.q, inputs.k, inputs.v))
        inputs = replace(inputs, case=replace(inputs.case, num_heads=padded), q=q, k=k, v=v,
                         q8=quantize(q, "cast"), k8=quantize(k, "cast"), v8=quantize(v, "cast"))
    out = raw.prepare(inputs).run().clone()
    if padded != real:
        dup = bool(torch.equal(out, out[:, _source_heads(real, padded)]))
        out = _real_heads(out, real)
    return out, dup


def check_case(adapter, ws, aiter, cid: str, repeat: bool = False, raw=None) -> dict:
    """Prepare / run / cleanup one case through the adapter on real vLLM; compare with the ``aiter``
    backend ``raw`` (default: over the ``aiter`` in ``sys.modules``) doing the same work.

    Raises:
        TierFailure: workspace not locked after setup or not reset after cleanup, output not equal.
    """
    from mla_fp8_bench.problem.inputs import make_inputs

    case = parse_case_id(cid)
    rec: dict = {"case": cid}
    sup = adapter.supports(case, None)
    rec["supported"], rec["reason"] = bool(sup), sup.reason
    if not sup:
        return rec
    inputs = make_inputs(case)
    n_calls = len(aiter.calls)
    t0 = time.perf_counter()
    p = adapter.prepare(inputs)
    try:
        rec["locked_after_setup"] = bool(ws.current_workspace_manager().is_locked())
        if not rec["locked_after_setup"]:
            raise TierFailure(f"{cid}: the workspace is not locked after setup: the adapter must call "
                              "lock_workspace() after the metadata build so a forward needing more scratch than vLLM "
                              "reserved fails loudly (vLLM #42978)")
        out = p.run().clone()
        if repeat:
            rec["repeatable"] = bool(torch.equal(p.run(), out))
    finally:
        p.cleanup()
    rec["vllm_s"] = time.perf_counter() - t0
    rec["reset_after_cleanup"] = not ws.is_workspace_manager_initialized()
    if not rec["reset_after_cleanup"]:
        raise TierFailure(f"{cid}: the workspace manager is still initialised after Prepared.cleanup()")
    rec.update({k: p.extras[k] for k in ("num_head_k", "num_partials", "workspace_bytes", "timing_scope",
                                         "vllm_fp8_path") if k in p.extras})
    rec["timing_scope"] = p.timing_scope
    calls = aiter.calls[n_calls:]
    pick = {c["name"]: c["args"] for c in calls}
    rec["info_args"] = pick.get("get_ps_metadata_info_v1")
    asm, red = pick.get("mla_prefill_ps_asm_fwd"), pick.get("mla_reduce_v1")
    rec["asm_q"] = asm and asm["Q"]
    rec["asm_v"] = asm and asm["V"]
    rec["asm_output"] = asm and asm["output"]
    rec["asm_scale"] = asm and asm["q_scale"]
    rec["asm_softmax_scale"] = asm and asm["softmax_scale"]
    rec["reduce_ints"] = red and [red["max_seqlen_q"], red.get("num_kv_splits")]
    raw = raw or raw_aiter()
    real_heads = raw.supports(case, None)
    rec["aiter_real_heads"], rec["aiter_reason"] = bool(real_heads), real_heads.reason
    rec["same_work"] = p.extras["num_head_k"] == case.num_heads  # else aiter runs vLLM's padded inputs
    t0 = time.perf_counter()
    ref, dup = aiter_output(raw, inputs, p.extras["num_head_k"])
    rec["aiter_s"] = time.perf_counter() - t0
    rec["pad_heads_are_duplicates"] = dup
    rec["equal_aiter"] = bool(out.shape == ref.shape and torch.equal(out, ref))
    if not rec["equal_aiter"]:
        diff = (out.float() - ref.float()).abs().nan_to_num(nan=float("inf"))
        rec["max_abs_diff"] = float(diff.max())
        raise TierFailure(f"{cid}: vLLM's output differs from aiter on the same work: max |diff| "
                          f"{rec['max_abs_diff']:.3g} ({int((diff > 0).sum())} of {diff.numel()} elements)")
    return rec


def raw_aiter():
    """The suite's ``aiter`` backend over the ``aiter`` in ``sys.modules`` (opted in off gfx950)."""
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.config import RunConfig
    from mla_fp8_bench.measure.devices import platform_info

    raw = get_backend("aiter", RunConfig(aiter_any_device=True))
    avail = raw.availability(platform_info("cpu"))
    if not avail:
        raise TierFailure(f"the aiter backend is unavailable over the tier's aiter: {avail.reason}")
    return raw


def check_gate(vmod) -> dict:
    """vLLM's own gate: False on CPU (vllm.platforms.rocm unusable); True with a fake gfx950 + the stand-in."""
    gate = vmod._fp8_mla_prefill_supported
    gate.cache_clear()
    res = {"cpu": bool(gate())}
    fake = types.ModuleType("vllm.platforms.rocm")
    fake.on_gfx950 = lambda: True
    old = sys.modules.get("vllm.platforms.rocm")
    sys.modules["vllm.platforms.rocm"] = fake
    try:
        gate.cache_clear()
        res["fake_gfx950"] = bool(gate())
    finally:
        if old is None:
            sys.modules.pop("vllm.platforms.rocm", None)
        else:
            sys.modules["vllm.platforms.rocm"] = old
        gate.cache_clear()
    return res


def check_raising(ws, vllm_faults_mod) -> dict:
    """Global state is reset when prepare raises (adapter's own path) and when the call raises (runner)."""
    from mla_fp8_bench.aiter_ps.standin import make_standin_aiter
    from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.inputs import make_inputs

    res = {}
    installed = sys.modules.get("aiter")
    planner_boom = real_info_shapes(make_standin_aiter(cu_num=CU_NUM))

    def boom_plan(*a, **k):
        raise RuntimeError("injected planner failure")

    planner_boom.get_ps_metadata_v1 = boom_plan
    try:
        vllm_faults_mod.for_testing(planner_boom).prepare(make_inputs(parse_case_id("s64-cast")))
        res["prepare_raised"] = False
    except RuntimeError as exc:
        res["prepare_raised"] = "injected planner failure" in str(exc)
    res["prepare_reset"] = not ws.is_workspace_manager_initialized()
    res["aiter_restored"] = sys.modules.get("aiter") is installed

    kernel_boom = real_info_shapes(make_standin_aiter(cu_num=CU_NUM))

    def boom_kernel(*a, **k):
        raise RuntimeError("injected kernel failure")

    kernel_boom.mla_prefill_ps_asm_fwd = boom_kernel
    pinfo = platform_info("cpu")
    case = parse_case_id("s64-cast")
    rec = evaluate_one(vllm_faults_mod.for_testing(kernel_boom), CaseData(case, pinfo, None), pinfo,
                       RunOptions(timing=False, determinism=False))
    res["call_status"], res["call_reason"] = rec.status, rec.reason
    res["call_reset"] = not ws.is_workspace_manager_initialized()
    return res


def check_locked_growth(adapter, vmod) -> dict:
    """>= 0.31: a reservation sized for 1 CU under a 256-CU plan grows the locked workspace: the runner's
    record of s600 (16 heads) and, where vLLM pads, of 24 heads with the builder sized as a short-lived
    revision did (``max(16, n)``: 24 wide) while the forward pads to 32."""
    from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
    from mla_fp8_bench.measure.devices import platform_info

    helper, builder = vmod.AiterMLAHelper, vmod.AiterMLAMetadataBuilder
    padded = vars(helper).get("get_fp8_prefill_num_heads")
    originals = {n: vars(builder)[n] for n in ("_init_fp8_prefill_ps_buffers", "_build_fp8_prefill_ps_metadata")}

    def sized_max16(method):
        def wrapped(self, *args, **kwargs):
            helper.get_fp8_prefill_num_heads = staticmethod(lambda n: max(16, n))
            try:
                return method(self, *args, **kwargs)
            finally:
                helper.get_fp8_prefill_num_heads = padded
        return functools.wraps(method)(wrapped)

    cpu, out = platform_info("cpu"), {}
    set_compute_units(1)
    try:
        for cid in ("s600-cast", "s300-h24-cast") if padded is not None else ("s600-cast",):
            if cid != "s600-cast":
                for n, fn in originals.items():
                    setattr(builder, n, sized_max16(fn))
            rec = evaluate_one(adapter, CaseData(parse_case_id(cid), cpu, None), cpu,
                               RunOptions(timing=False, determinism=False))
            out[cid] = {"status": rec.status, "reason": rec.reason}
    finally:
        set_compute_units(CU_NUM)
        for n, fn in originals.items():
            setattr(builder, n, fn)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="repo root the suite must be imported from")
    ap.add_argument("--out", help="JSON result path (default mode)")
    ap.add_argument("--fault", help="run the per-case check with this deliberately wrong adapter")
    ap.add_argument("--cases", nargs="*", help="case ids (default: the tier's list)")
    ap.add_argument("--aiter-root", help="drive AITER's real Python layer from this source tree instead of the "
                                         "stand-in (tests/aiter_tier/real_layer.py; with --aiter-version, --work)")
    ap.add_argument("--aiter-version", help="release whose compiled reduce the real layer's binding emulates")
    ap.add_argument("--work", help="scratch folder of the real layer")
    args = ap.parse_args(argv)
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # the CPU platform; must precede the first vllm import
    torch.set_num_threads(1)

    import mla_fp8_bench

    where = Path(mla_fp8_bench.__file__).resolve()
    if not str(where).startswith(str(Path(args.repo).resolve()) + os.sep):
        print(f"VLLM TIER SETUP ERROR: mla_fp8_bench imported from {where}, not from {args.repo} (PYTHONPATH?)",
              file=sys.stderr)
        return 2

    import vllm
    from vllm.v1.attention.backends.mla import rocm_aiter_mla as vmod
    from vllm.v1.worker import workspace as ws

    from mla_fp8_bench.aiter_ps.standin import make_standin_aiter
    from mla_fp8_bench.aiter_ps.workspace import vllm_reserved
    from mla_fp8_bench.backends import vllm_aiter

    sys.path.insert(0, str(Path(args.repo) / "tests"))
    from support import vllm_faults

    feats = vllm_aiter.detect_features(vmod)
    shims: list[str] = []
    apply_shims(feats, shims)
    if feats.budget_sizing:
        set_compute_units(CU_NUM)
        shims.append(f"current_platform.num_compute_units() -> {CU_NUM} (the stand-in's CU count)")
    if args.aiter_root:
        sys.path.insert(0, str(Path(args.repo) / "tests" / "aiter_tier"))
        import real_layer

        aiter = real_layer.install(Path(args.aiter_root), Path(args.work), args.aiter_version, cu_num=CU_NUM)
        aiter.calls = aiter.real_layer["standin"].calls  # what the compiled modules were handed
        shims.append(f"AITER's real Python layer from {args.aiter_root}, compiled modules emulated")
    else:
        aiter = real_info_shapes(make_standin_aiter(cu_num=CU_NUM), shims)
    sys.modules["aiter"] = aiter
    cases = args.cases or list(CASES)

    if args.fault:
        adapter = vllm_faults.for_testing(aiter, adapter_fault=args.fault)
        for cid in cases:
            try:
                check_case(adapter, ws, aiter, cid)
            except Exception as exc:  # noqa: BLE001 - any failure is the tier catching the fault
                print(f"VLLM TIER FAILURE [vllm {vllm.__version__}, {cid}, adapter fault {args.fault}]: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
        print(f"the tier did not catch adapter fault {args.fault} on vllm {vllm.__version__}", file=sys.stderr)
        return 0

    t_start = time.perf_counter()
    out: dict = {"vllm": vllm.__version__, "torch": torch.__version__, "features": asdict(feats), "shims": shims,
                 "cases": {}, "errors": {}}
    adapter = vllm_faults.for_testing(aiter)
    out["availability"] = adapter.availability(None).reason or "yes"  # type: ignore[arg-type]
    steps = [("gate", lambda: check_gate(vmod))]
    raw = raw_aiter() if out["availability"] == "yes" else None
    for cid in cases:
        steps.append((f"case:{cid}", lambda cid=cid: check_case(adapter, ws, aiter, cid, cid == REPEAT_CASE, raw)))
    for cid in PLAN_CASES:
        def plan(cid=cid):
            from mla_fp8_bench.measure.devices import platform_info

            case = parse_case_id(cid)
            if not adapter.supports(case, None):
                return {"supported": False}
            st = adapter.plan_stats(case, platform_info("cpu"), repeats=3)
            st["reset"] = not ws.is_workspace_manager_initialized()
            info = aiter.get_ps_metadata_info_v1(batch_size=case.batch_size, num_head_k=st["num_head_k"],
                                                 max_qlen=case.max_seq_len, qlen_granularity=256)
            st["formula_bytes"] = vllm_reserved(  # what `plan` predicts vLLM reserves
                budget_sizing=feats.budget_sizing, pads_heads=feats.pads_heads, info_partial_slots=info[5][0],
                max_num_batched_tokens=case.total_tokens, max_num_reqs=case.batch_size, num_compute_units=CU_NUM,
                num_heads=case.num_heads, num_head_k=st["num_head_k"])[1].total
            return st
        steps.append((f"plan:{cid}", plan))
    steps.append(("raising", lambda: check_raising(ws, vllm_faults)))
    if feats.budget_sizing:
        steps.append(("locked_growth", lambda: check_locked_growth(adapter, vmod)))
    for name, fn in steps:
        try:
            res = fn()
            if name.startswith("case:"):
                out["cases"][name[5:]] = res
            else:
                out[name] = res
        except Exception as exc:  # noqa: BLE001 - reported per check; pytest fails the matching test
            out["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
        if ws.is_workspace_manager_initialized():  # never leak state into the next check
            out["errors"].setdefault(name, "the workspace manager was left initialised")
            ws.reset_workspace_manager()
    out["aiter_is_standin"] = sys.modules.get("aiter") is aiter
    out["fp8_path"] = vllm_aiter.fp8_path_condition(vmod.AiterMLAMetadataBuilder)
    out["wall_s"] = time.perf_counter() - t_start
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
