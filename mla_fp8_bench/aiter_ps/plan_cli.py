"""``mla-fp8-bench plan``: AITER's PS prefill plan for a batch, no GPU needed: the ``--aiter`` release's planner,
its works, reduce groups, and the workspace used against that reserved by the info bound (with or without a
``total_qlen`` budget) and by vLLM's builder; ``--json`` writes it in the planner golden files' layout.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from mla_fp8_bench.aiter_ps import facts
from mla_fp8_bench.aiter_ps import workspace as ws
from mla_fp8_bench.aiter_ps.planner import PsPlan, buffer_lengths_from_info, plan_ps_prefill, ps_metadata_info
from mla_fp8_bench.argtypes import parse_int, parse_int_list
from mla_fp8_bench.problem.shapes import cu_seqlens_of

EXIT_USAGE = 2
MAX_SEQUENCES = 65536
MAX_TILES = 1_000_000  # 256-row q-tiles: 256M query tokens
MAX_WORKS = 10_000_000  # work_info rows held in memory (320 MB of int32)


@dataclass(frozen=True)
class PlanRequest:
    """Validated inputs of ``plan`` (see :func:`plan_request`); ``total_qlen`` None: no budget."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    num_heads: int
    cu_num: int
    aiter_version: tuple[int, int, int]
    is_causal: bool
    json_path: str | None
    limit: int
    vllm_max_num_seqs: int
    vllm_max_num_batched_tokens: int
    vllm_max_model_len: int
    need_lse: bool | None  # for the v0.1.22 planners (default not is_causal); None for older ones
    total_qlen: int | None = None

    revision = property(lambda self: facts.PLANNER_TOTAL_QLEN if self.total_qlen is not None else
                        facts.planner_revision_for(self.aiter_version))


def _tiles(q_lens: tuple[int, ...]) -> int:
    return sum(math.ceil(x / facts.Q_TILE) for x in q_lens)


def _check_batch(q: tuple[int, ...], kv: tuple[int, ...], heads: int, cu_num: int) -> None:
    if len(q) != len(kv):
        raise ValueError(f"--qo-lens has {len(q)} sequences but --kv-lens has {len(kv)}: they must match")
    if (b := next((b for b in range(len(q)) if q[b] > kv[b]), None)) is not None:
        raise ValueError(f"sequence {b}: q_len={q[b]} > kv_len={kv[b]}: allowed q_len <= kv_len (new queries attend"
                         " to themselves and any cached context)")
    if sum(kv) > facts.INT32_MAX:
        raise ValueError(f"total kv tokens {sum(kv)} do not fit int32 indptrs: allowed <= {facts.INT32_MAX}")
    tiles, tgs = _tiles(q), cu_num // math.gcd(heads, cu_num)
    if tiles > MAX_TILES or heads * (tiles + tgs) > MAX_WORKS:
        raise ValueError(f"{tiles} q-tiles of {facts.Q_TILE} rows, up to {heads * (tiles + tgs)} works: too large to"
                         f" plan here (allowed <= {MAX_TILES} tiles and {MAX_WORKS} works)")


def _vllm_settings(q: tuple[int, ...], kv: tuple[int, ...], seqs: int | None, tokens: int | None,
                   model_len: int | None) -> tuple[int, int, int]:
    """vLLM's builder inputs ``(max_num_seqs, max_num_batched_tokens, max_model_len)``: those given (ValueError
    where vLLM would never run this batch), the others the smallest vLLM accepts for it."""
    b = len(q)
    if seqs is not None and b > seqs:
        raise ValueError(f"the batch has {b} sequences but --vllm-max-num-seqs={seqs}: vLLM never schedules "
                         f"more than max_num_seqs in one step (allowed >= {b})")
    seqs, seqs_of = (b, f"max_num_seqs={b} (B, the default of --vllm-max-num-seqs)") if seqs is None else (
        seqs, f"--vllm-max-num-seqs={seqs}")
    if tokens is None:
        tokens = max(1, sum(q), seqs)
    elif tokens < seqs:
        raise ValueError(f"--vllm-max-num-batched-tokens={tokens} < {seqs_of}: vLLM refuses it "
                         f"(max_num_batched_tokens must be >= max_num_seqs; allowed >= {seqs})")
    elif sum(q) > tokens:
        raise ValueError(f"the batch has {sum(q)} new tokens but --vllm-max-num-batched-tokens={tokens}: one step of "
                         f"vLLM holds at most max_num_batched_tokens (allowed >= {sum(q)})")
    if model_len is not None and max(kv) > model_len:
        raise ValueError(f"a kv_len of {max(kv)} exceeds --vllm-max-model-len={model_len}: vLLM rejects such a "
                         f"sequence (allowed >= {max(kv)})")
    return seqs, tokens, max(1, max(kv)) if model_len is None else model_len


def plan_request(args: argparse.Namespace) -> PlanRequest:
    """``plan``'s arguments, each option's own value checked first, then how they fit; ValueError naming one."""
    q = parse_int_list(args.qo_lens, "--qo-lens", 0, facts.INT32_MAX, MAX_SEQUENCES)
    kv = parse_int_list(args.kv_lens, "--kv-lens", 0, facts.INT32_MAX, MAX_SEQUENCES)
    heads = parse_int(args.heads, "--heads", 1, facts.MAX_HEADS)
    cu_num = parse_int(args.cu_num, "--cu-num", 1, facts.MAX_CU_NUM)
    version = facts.modelled_version(str(args.aiter), "--aiter")
    limit = parse_int(args.limit, "--limit", 0, MAX_WORKS)
    given = [None if text is None else parse_int(text, name, 1, hi) for name, text, hi in (
        ("--vllm-max-num-seqs", args.vllm_max_num_seqs, MAX_SEQUENCES),
        ("--vllm-max-num-batched-tokens", args.vllm_max_num_batched_tokens, facts.INT32_MAX),
        ("--vllm-max-model-len", args.vllm_max_model_len, facts.INT32_MAX),
        ("--total-qlen", args.total_qlen, facts.INT32_MAX))]
    total_qlen = given.pop()
    if args.need_lse is not None and str(args.need_lse) not in ("0", "1"):
        raise ValueError(f"--need-lse={args.need_lse!r} is invalid: allowed 0 or 1")
    _check_batch(q, kv, heads, cu_num)
    seqs, tokens, model_len = _vllm_settings(q, kv, *given)
    new_planner = facts.planner_revision_for(version) == facts.PLANNER_V0_1_22
    for opt, val in (("--need-lse", args.need_lse), ("--total-qlen", total_qlen)):
        if val is not None and not new_planner:
            raise ValueError(f"{opt}: the planner of AITER {facts.format_version(version)} has no"
                             f" {opt[2:].replace('-', '_')} (allowed from 0.1.22)")
    if total_qlen is not None and sum(q) > total_qlen:
        raise ValueError(f"the batch has {sum(q)} new tokens but --total-qlen={total_qlen}: a budget holds the"
                         f" batch's tokens (allowed >= {sum(q)})")
    need_lse = (bool(args.non_causal) if args.need_lse is None else args.need_lse == "1") if new_planner else None
    json_path = None
    if args.json is not None:
        from mla_fp8_bench.jsonio import check_output_path

        json_path = str(check_output_path(args.json, "--json"))
    return PlanRequest(q, kv, heads, cu_num, version, not args.non_causal, json_path, limit, seqs, tokens, model_len,
                       need_lse, total_qlen)


def _info_args(req: PlanRequest) -> dict[str, Any]:
    budget = {} if req.total_qlen is None else {"total_qlen": req.total_qlen}
    return {"batch_size": len(req.q_lens), "num_head_k": req.num_heads, "max_qlen": max(req.q_lens),
            "qlen_granularity": facts.Q_TILE, **budget}


def run_plan(req: PlanRequest) -> tuple[PsPlan, dict]:
    """``(plan, info)`` of ``req``, with room for every work (the info bound can be smaller than the use for inputs
    AITER never sees)."""
    args = _info_args(req)
    info = ps_metadata_info(*list(args.values())[:4], cu_num=req.cu_num, revision=req.revision,
                            total_qlen=args.get("total_qlen"))
    lengths = buffer_lengths_from_info(info)
    tiles, tgs = _tiles(req.q_lens), req.cu_num // math.gcd(req.num_heads, req.cu_num)
    roomy = dict(lengths, work_info_rows=max(lengths["work_info_rows"], req.num_heads * (tiles + tgs)),
                 reduce_partial_map=max(lengths["reduce_partial_map"], tiles + tgs))
    plan = plan_ps_prefill(cu_seqlens_of(req.q_lens), cu_seqlens_of(req.kv_lens), list(req.kv_lens),
                           num_heads_k=req.num_heads, cu_num=req.cu_num, kvlen_granularity=facts.KVLEN_GRANULARITY,
                           is_causal=req.is_causal, buffer_lengths=roomy, revision=req.revision,
                           need_lse=req.need_lse)
    return plan, info


def plan_record(req: PlanRequest, plan: PsPlan, info: dict) -> dict[str, Any]:
    """The plan as a record of the planner golden files: ``config``, ``info_args``, ``info_shapes``, ``outputs``."""
    config = {"cu_num": req.cu_num, "num_heads_k": req.num_heads, "gqa_ratio": 1, "qhead_granularity": 1,
              "qlen_granularity": facts.Q_TILE, "kvlen_granularity": facts.KVLEN_GRANULARITY, "block_size": 1,
              "is_causal": req.is_causal, "batch_size": len(req.q_lens), "seq_lens_q": list(req.q_lens),
              "seq_lens_kv": list(req.kv_lens), "max_qlen": max(req.q_lens), "max_kvlen": max(req.kv_lens),
              "seqlens_qo_indptr": cu_seqlens_of(req.q_lens), "pages_kv_indptr": cu_seqlens_of(req.kv_lens),
              "context_lens": list(req.kv_lens), "aiter_version": facts.format_version(req.aiter_version),
              "planner_revision": req.revision}
    if req.need_lse is not None:
        config["need_lse"] = req.need_lse
    lengths = buffer_lengths_from_info(info)
    outputs = {"work_indptr": plan.work_indptr[: lengths["work_indptr"]].tolist(), "num_works": plan.num_works,
               "work_info": plan.used_work_info.tolist(),
               "reduce_indptr": plan.reduce_indptr[: lengths["reduce_indptr"]].tolist(),
               "num_reduce_groups": plan.num_reduce_groups, "reduce_final_map": plan.used_reduce_final_map.tolist(),
               "num_partials": plan.num_partials, "reduce_partial_map": plan.used_reduce_partial_map.tolist(),
               "buffer_lengths": lengths}
    shapes = {k: {"shape": list(shape), "dtype": dt} for k, (shape, dt) in info.items()}
    return {"config": config, "info_args": _info_args(req), "info_shapes": shapes, "outputs": outputs}


def size_rows(req: PlanRequest, plan: PsPlan, info: dict) -> list[tuple[str, int, ws.WorkspaceBytes]]:
    """``(what, partial slots, bytes)`` rows: used (``aiter_ps.workspace``'s definition), reserved by the info bound
    and by vLLM's builder (up to 0.30 its info call at ``min(max_model_len, max_num_batched_tokens)``)."""
    h, tokens, hp = req.num_heads, sum(req.q_lens), ws.vllm_padded_heads(req.num_heads)
    bound = info["reduce_partial_map"][0][0]
    rows = [(f"used (live reduce_indptr[-1] = {plan.num_partials}, >= 1)", ws.used_partial_slots(plan.num_partials),
             ws.used_workspace_bytes(plan.num_partials, tokens, h)),
            ("reserved: info bound", bound, ws.workspace_bytes(bound, tokens, h))]
    vllm_qlen = min(req.vllm_max_model_len, req.vllm_max_num_batched_tokens)
    vllm_info = ps_metadata_info(req.vllm_max_num_seqs, hp, vllm_qlen, cu_num=req.cu_num,
                                 revision=facts.planner_revision_for(req.aiter_version))["reduce_partial_map"][0][0]
    for label, budget in (("vLLM <= 0.30 builder (info bound)", False), ("vLLM >= 0.31 builder (budget)", True)):
        p, wb = ws.vllm_reserved(budget_sizing=budget, pads_heads=True, info_partial_slots=vllm_info,
                                 max_num_batched_tokens=req.vllm_max_num_batched_tokens, num_head_k=hp,
                                 max_num_reqs=req.vllm_max_num_seqs, num_compute_units=req.cu_num, num_heads=h)
        rows.append((f"reserved: {label}, H={hp}", p, wb))
    return rows


def _line(console, text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def print_report(console, req: PlanRequest, plan: PsPlan, info: dict) -> None:
    """Print the plan: header, works, reduce groups, partial slots and workspace bytes used vs reserved."""
    sem = f"{req.revision} planner" + ("" if req.need_lse is None else f", need_lse={req.need_lse}")
    mask = "causal (bottom-right)" if req.is_causal else "non-causal"
    _line(console, f"AITER {facts.format_version(req.aiter_version)} ({sem}), cu_num={req.cu_num},"
                   f" num_heads={req.num_heads}, {mask}, B={len(req.q_lens)}, q tokens={sum(req.q_lens)},"
                   f" kv tokens={sum(req.kv_lens)}")
    _line(console, "info sizing: no total_qlen budget" if req.total_qlen is None else f"info sizing: total_qlen="
          f"{req.total_qlen} budget (modelled by the bounds AITER's op test pins; AITER's can be smaller)")
    if req.num_heads not in (ok := facts.reduce_heads_for(req.aiter_version)):
        _line(console, f"note: mla_reduce_v1 of AITER {facts.format_version(req.aiter_version)} does not dispatch"
                       f" num_heads={req.num_heads} (allowed {sorted(ok)})")
    n = min(req.limit, plan.num_works)
    _line(console, f"works: {plan.num_works} ({plan.num_works // plan.num_heads_k} per head);"
                   f" first {n} (--limit), with their workgroup:")
    _line(console, "  " + " ".join(f"{c:>13}" for c in ("work", "wg", *facts.WORK_INFO_FIELDS[:-1], "head")))
    wind, g = plan.work_indptr[: plan.cu_num + 1].tolist(), 0
    for i, row in enumerate(plan.used_work_info[:n].tolist()):
        while wind[g + 1] <= i:
            g += 1
        first, end = facts.unpack_q_head_range(row[7] & 0xFFFFFFFF)
        head = str(first) if end == first + 1 else f"{first}..{end - 1}"
        _line(console, "  " + " ".join(f"{v:>13}" for v in (i, g, *row[:7], head)))
    ng = plan.num_reduce_groups
    _line(console, f"reduce groups: {ng} of {_tiles(req.q_lens)} q-tiles; first {min(req.limit, ng)}:"
                   " [qo_start, qo_end) <- partial slot row offsets")
    ind, fm, pm = plan.reduce_indptr.tolist(), plan.used_reduce_final_map.tolist(), plan.reduce_partial_map.tolist()
    for g in range(min(req.limit, ng)):
        _line(console, f"  {g:>6} [{fm[g][0]}, {fm[g][1]}) <- {' '.join(map(str, pm[ind[g]:ind[g + 1]]))}")
    _line(console, f"work_info rows: used {plan.num_works:,}, info bound {info['work_info'][0][0]:,}")
    _line(console, f"partial slots ({facts.Q_TILE} rows each); fp32 bytes of all buffers (partials + partial LSE +"
                   " final LSE [+ padded-head scratch]), then of the partials:")
    for label, slots, wb in size_rows(req, plan, info):
        short = "  (fewer slots than used: too small for this batch)" if slots < plan.num_partials else ""
        _line(console, f"  {label:<52} {slots:>12,} slots {wb.total:>18,} B ({wb.total / 2**30:>10,.3f} GiB)  partials"
                       f" {wb.partial_output / 2**30:>9,.3f} GiB{short}")
    _line(console, f"  (vLLM builder inputs: max_num_seqs={req.vllm_max_num_seqs}, max_num_batched_tokens="
                   f"{req.vllm_max_num_batched_tokens}, max_model_len={req.vllm_max_model_len}; set with --vllm-*)")


def cmd_plan(args: argparse.Namespace, console) -> int:
    """Handler of ``plan``: validate, plan, print, optionally write ``--json``; exit status."""
    try:
        req = plan_request(args)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return EXIT_USAGE
    plan, info = run_plan(req)
    print_report(console, req, plan, info)
    if req.json_path is not None:
        from mla_fp8_bench.jsonio import write_json_atomic

        write_json_atomic(plan_record(req, plan, info), req.json_path, indent=None)
        console.print(f"wrote {req.json_path}", highlight=False)
    return 0


def add_parser(subparsers) -> None:
    """Register ``plan`` on the CLI's sub-parsers."""
    p = subparsers.add_parser("plan", help="inspect AITER's PS prefill plan for a batch (works, reduce groups, "
                                           "partial slots and workspace used vs reserved), no GPU needed")
    p.add_argument("--qo-lens", required=True, help="new-query lengths per sequence, comma-separated (e.g. 256,300)")
    p.add_argument("--kv-lens", required=True, help="kv lengths per sequence (context + new tokens), comma-separated")
    p.add_argument("--heads", required=True, help="num_heads (= KV heads, MHA)")
    p.add_argument("--cu-num", default="256", help="device CU count (256 on MI355X)")
    p.add_argument("--aiter", default="0.1.22", help="AITER version whose planner to use (default 0.1.22)")
    p.add_argument("--need-lse", default=None, metavar="0|1",
                   help="need_lse for the 0.1.22 planner (default: 0 causal, 1 with --non-causal, as callers pass it)")
    p.add_argument("--total-qlen", default=None, metavar="TOKENS",
                   help="size the info bound with this total_qlen token budget (default: none)")
    p.add_argument("--non-causal", action="store_true", help="non-causal (a context chunk); default causal")
    p.add_argument("--json", metavar="PATH", help="write the plan in the planner golden files' layout")
    p.add_argument("--limit", default="16", help="works and reduce groups to print (default 16)")
    p.add_argument("--vllm-max-num-seqs", default=None, help="vLLM max_num_seqs for its reservation (default B)")
    p.add_argument("--vllm-max-num-batched-tokens", default=None, help="vLLM max_num_batched_tokens (default q tokens)")
    p.add_argument("--vllm-max-model-len", default=None, help="vLLM max_model_len (default: the largest kv_len)")
    p.set_defaults(handler=cmd_plan)
