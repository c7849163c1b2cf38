"""Injected faults that the accuracy check must catch (docs/regressions.md, "Injected faults").

* **Emulator faults** (:data:`support.emulator_faults.ALL_FAULTS`): bugs inside the kernel or
  the reduce (dropped/doubled scale, missing causal mask, wrong LSE merge, off-by-one tile, ...).
* **Input-side faults** (:data:`INPUT_FAULTS`, one line each), implemented here around the emulated
  backend: quantisation, planning (``stale_plan``: the stream-ordering race of vLLM #58886, run on the
  emulator's kernel and reduce directly, as hardware would run it, since the strict stand-in ``aiter``
  would reject the call) and the prefix-cached prefill (``ctx`` / ``prefix`` cases only, tried on
  :data:`PREFIX_FAULT_CASES`).

:class:`FaultyEmulated` is the ``aiter-emulated`` backend with faults. It keeps the name
``aiter-emulated`` on purpose: a regressed AITER build still reports as ``aiter``, and its records are
checked against the healthy backend's calibrated tolerances. The two emulator faults no case of the suite
can show (``top_left_causal``, ``lse_no_max_subtraction``) are checked on the probes of
:mod:`mla_fp8_bench.analysis.probes`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from mla_fp8_bench.analysis.probes import PROBES, make_probe, probe_record, probe_reference
from mla_fp8_bench.backends.aiter_emulated import AiterEmulated
from mla_fp8_bench.backends.aiter_real import lse_rows
from mla_fp8_bench.backends.base import Backend, Prepared, Verdict, compose_prefix
from mla_fp8_bench.config import DEFAULT_EMU_CU_NUM
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.fp8 import Quantized, fp8_max
from mla_fp8_bench.problem.inputs import CaseInputs
from mla_fp8_bench.problem.shapes import cu_seqlens_of

from .emulator_faults import ALL_FAULTS, FAULT_DESCRIPTIONS, FaultyEmulator

#: Faults of the steps around the kernel (quantisation, planning, the prefix composition; implemented here).
INPUT_FAULTS: dict[str, str] = {
    "unsaturated_cast": "quantisation: fp8 cast without saturation; |x| beyond the rounding boundary -> NaN "
                        "(PyTorch <= 2.11 eager casts; cast mode only)",
    "stale_plan": "planning: kernel + reduce run with the plan of the previous step's batch "
                  "(stream-ordering race, vLLM #58886)",
    "stale_unsplit_lse": "reduce: final_lse of unsplit tiles never written (pre-#3606), zeroed memory (0.0) merged",
    "omit_need_lse": "planning: need_lse left out of the v0.1.22 get_ps_metadata_v1 for context chunks and the "
                     "new-token chunk (default False): unsplit tiles' final_lse never written",
    "drop_context_merge": "prefix merge: the context chunk's term is dropped (out = new-token piece)",
    "causal_context_chunk": "context chunk run causally (bottom-right) instead of non-causally",
    "prefix_top_left": "prefix as one causal call over context + new keys with a top-left aligned mask",
}
#: Faults that show only on context-chunk / prefix cases, and the cases they are tried on (cheapest first).
PREFIX_FAULT_CASES: dict[str, tuple[str, ...]] = {
    "stale_unsplit_lse": ("ctx100-q64", "prefix256-q100"),
    "omit_need_lse": ("ctx100-q64", "prefix256-q100"),
    "drop_context_merge": ("prefix256-q100", "prefix1024-q300"),
    "causal_context_chunk": ("ctx100-q64", "ctx1024-q256", "prefix1024-q300"),
    "prefix_top_left": ("prefix256-q100", "prefix1024-q300"),
}
#: Every fault the suite can inject: the emulator's plus the input-side ones.
SUITE_FAULTS: dict[str, str] = {**FAULT_DESCRIPTIONS, **INPUT_FAULTS}
#: Faults that cannot show on q_len == kv_len prefill cases with randn-like inputs; checked on probes.
PROBE_ONLY_FAULTS = {"top_left_causal": "probe-chunked", "lse_no_max_subtraction": "probe-hot-lse"}


def normalize_suite_faults(faults: Iterable[str] | str | None) -> frozenset[str]:
    """Validate fault names against :data:`SUITE_FAULTS`.

    Raises:
        ValueError: naming the unknown fault(s) and the allowed ones.
    """
    if faults is None:
        return frozenset()
    if isinstance(faults, str):
        faults = (faults,)
    out = frozenset(faults)
    bad = sorted(repr(f) for f in out if f not in SUITE_FAULTS)
    if bad:
        raise ValueError(f"unknown fault name(s) {', '.join(bad)}: allowed {', '.join(sorted(SUITE_FAULTS))}")
    return out


# ------------------------------------------------------------------------------------------ faults
def unsaturated_fp8_cast(x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """``x.to(fp8)`` as PyTorch <= 2.11 did it: values past the rounding boundary become NaN.

    The boundary is ``fp8_max + ulp/2`` (464 for e4m3fn: 448 + 32/2; a tie rounds to the even 448).
    """
    fmax = fp8_max(fp8_dtype)
    ulp = 2.0 ** (math.floor(math.log2(fmax)) - 3)
    boundary = fmax + ulp / 2
    xf = x.contiguous().float()
    data = xf.to(fp8_dtype)
    bad = xf.abs() > boundary
    if bool(bad.any()):
        data = torch.where(bad, torch.full_like(xf, float("nan")), data.float()).to(fp8_dtype)
    return data.contiguous()


def _requantize_unsaturated(inputs: CaseInputs) -> CaseInputs:
    if inputs.case.quant != "cast":
        return inputs  # per_tensor scales by amax/448 first: nothing exceeds the range

    def q(x: torch.Tensor, old: Quantized) -> Quantized:
        return Quantized(unsaturated_fp8_cast(x, inputs.fp8_dtype), old.descale, old.mode)

    return replace(inputs, q8=q(inputs.q, inputs.q8), k8=q(inputs.k, inputs.k8), v8=q(inputs.v, inputs.v8))


def previous_step_lens(seq_lens: tuple[int, ...]) -> tuple[int, ...]:
    """The previous step's batch used by ``stale_plan``: for >= 2 sequences ``min(64, l1-1)`` tokens moved
    from sequence 1 to sequence 0 (same total, silently wrong attention); for one sequence the length
    ``T - max(1, T//4)`` (the tail rows are never written)."""
    lens = list(seq_lens)
    if len(lens) >= 2 and lens[1] > 1:
        d = min(64, lens[1] - 1)
        lens[0] += d
        lens[1] -= d
        return tuple(lens)
    if len(lens) >= 2:  # second sequence of length 1: shorten the first instead
        lens[0] = max(1, lens[0] - max(1, lens[0] // 4))
        return tuple(lens)
    t = lens[0]
    return (max(1, t - max(1, t // 4)),)


def _prepare_stale(inputs: CaseInputs, emu_faults: frozenset[str], cu_num: int) -> Prepared:
    """Kernel + reduce of the emulator with the previous step's plan (hardware semantics)."""
    from mla_fp8_bench.aiter_ps.planner import plan_ps_prefill

    dev = inputs.device
    prev = previous_step_lens(inputs.case.seq_lens)
    cu_prev = torch.tensor(cu_seqlens_of(prev), dtype=torch.int32)
    h = inputs.case.num_heads
    emulator = FaultyEmulator(emu_faults)
    plan = plan_ps_prefill(cu_prev, cu_prev, torch.tensor(prev, dtype=torch.int32), num_heads_k=h, cu_num=cu_num,
                           qlen_granularity=256, kvlen_granularity=128, block_size=1, is_causal=True)
    q8, k8, v8 = (x.data.contiguous() for x in (inputs.q8, inputs.k8, inputs.v8))
    scales = [x.descale.reshape(1).to(device=dev, dtype=torch.float32) for x in (inputs.q8, inputs.k8, inputs.v8)]
    t, dv = q8.shape[0], v8.shape[-1]
    cu = inputs.cu_seqlens.to(device=dev, dtype=torch.int32)
    pages = torch.arange(t, dtype=torch.int32, device=dev)
    rows = max(1, plan.num_partials) * 256
    split_data = torch.full((rows, h, dv), float("nan"), dtype=torch.float32, device=dev)
    split_lse = torch.full((rows, h), float("nan"), dtype=torch.float32, device=dev)
    output = torch.full((t, h, dv), float("nan"), dtype=torch.bfloat16, device=dev)
    final_lse = torch.full((t, h), float("nan"), dtype=torch.float32, device=dev)

    def run() -> torch.Tensor:
        emulator.mla_prefill_ps_asm_fwd(q8, k8, v8, cu, cu, pages, plan.work_indptr, plan.work_info,
                                        inputs.max_seqlen, inputs.softmax_scale, True, split_data, split_lse, output,
                                        scales[0], scales[1], scales[2])
        emulator.mla_reduce_v1(split_data, split_lse, plan.reduce_indptr, plan.reduce_final_map,
                               plan.reduce_partial_map, output, final_lse)
        return output

    return Prepared(run=run, graph_capturable=False, timing_scope="emulation",
                    extras={"stale_plan_lens": list(prev), "num_partials": plan.num_partials})


def unsplit_rows(inputs: CaseInputs, cu_num: int) -> torch.Tensor:
    """bool ``[T_q]``: rows of the one call of a ``prefill``/``ctx`` input whose tiles are not split, so the
    pre-#3606 reduce writes no ``final_lse`` for them (reduce groups of < 2 partials; the planner port)."""
    from mla_fp8_bench.aiter_ps.planner import plan_ps_prefill

    case = inputs.case
    plan = plan_ps_prefill(inputs.cu_seqlens_q_cpu, inputs.cu_seqlens_kv_cpu, torch.tensor(case.kv_lens),
                           num_heads_k=case.num_heads, cu_num=cu_num, qlen_granularity=256, kvlen_granularity=128,
                           block_size=1, is_causal=bool(inputs.causal))
    used = {"reduce_indptr": plan.used_reduce_indptr, "reduce_final_map": plan.used_reduce_final_map}
    return ~lse_rows(used, case.total_tokens, reduces_singles=False)


def _with_stale_lse(p: Prepared, rows: torch.Tensor) -> Prepared:
    """``p`` whose LSE holds 0.0 (zeroed, never written) on ``rows``."""
    orig = p.lse
    if orig is None or not bool(rows.any()):
        return p

    def lse() -> tuple[torch.Tensor, torch.Tensor]:
        values, valid = orig()
        values = values.clone()
        values[rows.to(values.device)] = 0.0
        return values, valid & ~rows

    p.lse = lse
    return p


def prepare_one_call_prefix(inputs: CaseInputs, emu_faults: Iterable[str], cu_num: int) -> Prepared:
    """A ``prefix`` case as ONE causal call of the emulated AITER path over all C + Q keys of each
    sequence (q_len < kv_len, bottom-right causal), instead of vLLM's two pieces and merge."""
    case = inputs.case
    one_call = Case(case.seq_lens, case.num_heads, case.quant, case.dist, case.seed,
                    context_lens=case.kv_lens, family="ctx")  # kv_lens = C + Q in one call
    inner = AiterEmulated(cu_num=cu_num, emulator=FaultyEmulator(emu_faults))
    return inner.prepare(replace(inputs, case=one_call, causal=True))


def _drop_context(ctx_out: torch.Tensor, ctx_lse: torch.Tensor, new_out: torch.Tensor,
                  new_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``drop_context_merge`` merge: the new-token piece alone."""
    return new_out, new_lse.float()


class FaultyEmulated(Backend):
    """``aiter-emulated`` with injected faults (emulator faults and :data:`INPUT_FAULTS`).

    Args:
        faults: names from :data:`SUITE_FAULTS` (None or empty: the healthy backend, bit for bit).
        cu_num: CU count of the emulated plan (default :data:`~mla_fp8_bench.config.DEFAULT_EMU_CU_NUM`, 256).

    Raises:
        ValueError: an unknown fault name.
    """

    name = "aiter-emulated"
    description = "aiter-emulated with injected faults (regression-detection experiments)"
    fp8 = True
    emulation = True
    context_chunks = Verdict.yes()

    def __init__(self, faults: Iterable[str] | str | None = None, cu_num: int | None = None):
        self.faults = normalize_suite_faults(faults)
        self.cu_num = cu_num or DEFAULT_EMU_CU_NUM
        self.emu_faults = frozenset(self.faults & ALL_FAULTS)
        self._inner = AiterEmulated(cu_num=self.cu_num, emulator=FaultyEmulator(self.emu_faults))
        if "omit_need_lse" in self.faults:
            self._inner.driver().pass_need_lse = False

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        return self._inner.supports(case, platform)

    def prepare_case(self, inputs: CaseInputs) -> Prepared:
        """As the healthy backend, with the prefix faults: ``prefix_top_left`` runs a prefix case as one
        causal call (q_len < kv_len) with a top-left mask, ``drop_context_merge`` drops the context term."""
        if inputs.case.kind.composed and "prefix_top_left" in self.faults:
            return prepare_one_call_prefix(inputs, self.emu_faults | {"top_left_causal"}, self.cu_num)
        if inputs.case.kind.composed and "drop_context_merge" in self.faults:
            return compose_prefix(self, inputs, merge=_drop_context)
        return super().prepare_case(inputs)

    def prepare(self, inputs: CaseInputs) -> Prepared:
        if "unsaturated_cast" in self.faults:
            inputs = _requantize_unsaturated(inputs)
        if "stale_plan" in self.faults:
            return _prepare_stale(inputs, self.emu_faults, self.cu_num)
        if "causal_context_chunk" in self.faults and inputs.case.kind.context and not inputs.case.kind.new_keys:
            inputs = replace(inputs, causal=True)
        p = self._inner.prepare(inputs)
        if "stale_unsplit_lse" in self.faults:
            p = _with_stale_lse(p, unsplit_rows(inputs, self.cu_num))
        return p


# ------------------------------------------------------------------------------------------ report
#: Cases each fault is tried on (cheapest first): the default calibration shapes, the cast-outlier
#: case (for ``unsaturated_cast``), then the probes (for the probe-only faults).
REPORT_CASES = ("s128", "s257", "ragged-255-257", "s512-h8", "s512", "s257-cast-outlier")


def fault_report(tolerances, seeds: Iterable[int] = (0,), faults: Iterable[str] | None = None,
                 cases: Iterable[str] = REPORT_CASES, stop_at_first: bool = False) -> list[dict[str, Any]]:
    """Run every fault on every case/probe and seed; return one row per (fault, case, seed).

    Each row: ``fault``, ``case``, ``seed``, ``flagged`` (bool), ``violations`` (strings), ``worst_metric``,
    ``worst_value``, ``worst_tolerance``, ``worst_ratio`` (value / tolerance; inf for non-finite or
    error records). ``stop_at_first`` stops a fault at its first flagged (case, seed).
    """
    from mla_fp8_bench.analysis.tolerances import check, tolerance_key
    from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    pinfo = platform_info("cpu")
    opts = RunOptions(timing=False, determinism=False)
    names = sorted(faults) if faults is not None else sorted(SUITE_FAULTS)
    case_data: dict[str, Any] = {}
    probe_refs: dict[tuple[str, int], Any] = {}
    rows: list[dict[str, Any]] = []
    for f in names:
        targets = [PROBE_ONLY_FAULTS[f]] if f in PROBE_ONLY_FAULTS else list(PREFIX_FAULT_CASES.get(f, cases))
        for s, cid in itertools.product(seeds, targets):
            if f == "unsaturated_cast" and "-cast" not in cid:
                continue
            if cid in PROBES:
                if (cid, s) not in probe_refs:
                    p = make_probe(cid, s)
                    probe_refs[(cid, s)] = (probe_reference(p), probe_reference(p, dequantized=False))
                rec = probe_record(cid, s, FaultyEmulator(normalize_suite_faults(f) & ALL_FAULTS),
                                   probe_refs[(cid, s)])
            else:
                key = replace(parse_case_id(cid), seed=s).id
                if key not in case_data:
                    case_data[key] = CaseData(parse_case_id(key), pinfo, None)
                rec = evaluate_one(FaultyEmulated(faults=f), case_data[key], pinfo, opts).as_dict()
            viol = check(rec, tolerances)
            lim, _how = tolerances.lookup("aiter-emulated", tolerance_key(rec))
            worst = (None, None, None, 0.0)
            for v in viol:
                if v.ratio >= worst[3]:
                    worst = (v.metric, v.value, v.tolerance, v.ratio)
            if not viol and lim:
                for m, t in lim.items():
                    val = rec.get(m)
                    if val is not None and t > 0 and float(val) / t >= worst[3]:
                        worst = (m, float(val), t, float(val) / t)
            rows.append({"fault": f, "case": cid, "seed": s, "flagged": bool(viol),
                         "violations": [str(v) for v in viol], "status": rec.get("status"),
                         "worst_metric": worst[0], "worst_value": worst[1], "worst_tolerance": worst[2],
                         "worst_ratio": worst[3]})
            if viol and stop_at_first:
                break
    return rows


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from mla_fp8_bench.analysis.tolerances import load_tolerances

    ap = argparse.ArgumentParser(prog="python -m tests.support.faults",
                                 description="run every injected fault on the report cases; print the fault table")
    ap.add_argument("--tolerances", default="tolerances/cpu-emulated-v1.json")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--faults", default=None, help="comma-separated subset (default: all)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    a = ap.parse_args(argv)
    tol = load_tolerances(a.tolerances)
    rows = fault_report(tol, [int(x) for x in a.seeds.split(",")],
                        a.faults.split(",") if a.faults else None)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    print("| fault | case | seeds flagged | worst metric | measured | tolerance | ratio |")
    print("|---|---|---|---|---|---|---|")
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["fault"], r["case"]), []).append(r)
    for (f, c), rs in by.items():
        w = max(rs, key=lambda r: r["worst_ratio"])
        val = "error" if w["status"] != "ok" else (
            "-" if w["worst_value"] is None else f"{w['worst_value']:.4g}")
        tol_s = "-" if w["worst_tolerance"] is None else f"{w['worst_tolerance']:.4g}"
        ratio = "inf" if w["worst_ratio"] == float("inf") else f"{w['worst_ratio']:.3g}"
        print(f"| {f} | {c} | {sum(r['flagged'] for r in rs)}/{len(rs)} | {w['worst_metric'] or '-'} | {val} | "
              f"{tol_s} | {ratio} |")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main())
