"""Prefix-cached prefill the way vLLM computes it (docs/aiter-contract.md#context-chunks): a causal
new-vs-new piece and a non-causal new-vs-context piece, cut without re-quantising and merged by LSE."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.fp8 import Quantized
from mla_fp8_bench.problem.inputs import CaseInputs


def merge_attn_states(prefix_out: torch.Tensor, prefix_lse: torch.Tensor, suffix_out: torch.Tensor,
                      suffix_lse: torch.Tensor,
                      out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions over disjoint key sets by their LSE (vLLM's ``merge_attn_states``):
    ``lse = logaddexp(lse_p, lse_s)``, ``out = out_p*exp(lse_p - lse) + out_s*exp(lse_s - lse)`` in float32
    (float64 when an LSE is). As vLLM's kernel: an LSE of +-inf (a piece that saw no key) counts as -inf; both
    -inf: the prefix piece's row; a NaN LSE: a NaN row. ``prefix_*``: the context chunk, ``suffix_*``: the new
    tokens (``[T, H, Dv]``, ``[T, H]``). ``(out in out_dtype (default prefix_out's), lse)``; ValueError: shapes."""
    if prefix_out.shape != suffix_out.shape or prefix_lse.shape != suffix_lse.shape \
            or prefix_out.shape[:-1] != prefix_lse.shape:
        raise ValueError(f"merge_attn_states shapes disagree: out {tuple(prefix_out.shape)} / "
                         f"{tuple(suffix_out.shape)}, lse {tuple(prefix_lse.shape)} / {tuple(suffix_lse.shape)}")
    dt = torch.promote_types(torch.promote_types(prefix_lse.dtype, suffix_lse.dtype), torch.float32)
    p, s = (x.to(device=prefix_lse.device, dtype=dt) for x in (prefix_lse, suffix_lse))
    p, s = (torch.where(torch.isinf(x), -math.inf, x) for x in (p, s))
    m = torch.maximum(p, s)
    both_empty = torch.isneginf(m)
    m = torch.where(both_empty, torch.zeros_like(m), m)
    pe, se = torch.exp(p - m), torch.exp(s - m)
    total = pe + se
    lse = torch.where(both_empty, p, torch.log(total) + m)
    total = torch.where(both_empty, torch.ones_like(total), total)
    po, so = prefix_out.to(dt), suffix_out.to(device=p.device, dtype=dt)
    out = po * (pe / total).unsqueeze(-1) + so * (se / total).unsqueeze(-1)
    out = torch.where(both_empty.unsqueeze(-1), po, out)
    return out.to(out_dtype or prefix_out.dtype), lse


def _take(x: torch.Tensor, idx: torch.Tensor | slice) -> torch.Tensor:
    """Rows ``idx`` of ``x`` (a slice keeps strided views; fp8 is gathered as bytes)."""
    if isinstance(idx, slice):
        return x[idx]
    if x.dtype.is_floating_point and x.dtype.itemsize == 1:  # float8: index_select may lack a kernel
        return x.contiguous().view(torch.uint8).index_select(0, idx).view(x.dtype)
    return x.index_select(0, idx)


def _take_q(x: Quantized, idx: torch.Tensor | slice) -> Quantized:
    return Quantized(_take(x.data, idx).contiguous(), x.descale, x.mode)


def _rows(starts: list[int], offsets: list[int], lens: list[int], device: torch.device) -> torch.Tensor | slice:
    """Key rows ``[starts[b] + offsets[b], + lens[b])`` of every sequence, as one slice when B == 1."""
    if len(starts) == 1:
        return slice(starts[0] + offsets[0], starts[0] + offsets[0] + lens[0])
    parts = [torch.arange(s + o, s + o + n, dtype=torch.long) for s, o, n in zip(starts, offsets, lens)]
    return torch.cat(parts).to(device)


def _piece(inputs: CaseInputs, case: Case, rows: torch.Tensor | slice) -> CaseInputs:
    cu_kv = torch.tensor(case.cu_seqlens_kv(), dtype=torch.int32)
    return replace(inputs, case=case, k=_take(inputs.k, rows), v=_take(inputs.v, rows), k8=_take_q(inputs.k8, rows),
                   v8=_take_q(inputs.v8, rows), cu_seqlens_kv=cu_kv.to(inputs.device), cu_seqlens_kv_cpu=cu_kv,
                   max_seqlen_kv=case.max_kv_len, causal=case.causal)


def prefix_pieces(case: Case) -> tuple[Case, Case]:
    """A ``prefix`` case's two calls: ``new`` (a ``prefill`` case on its new tokens, causal) and ``ctx`` (a
    ``ctx`` case: its queries over the cached context, non-causal); ValueError for another kind."""
    if not case.kind.composed:
        raise ValueError(f"prefix_pieces needs a prefix case, got {case.family} case {case.id}")
    common = dict(num_heads=case.num_heads, quant=case.quant, dist=case.dist, seed=case.seed)
    return Case(case.seq_lens, **common), Case(case.seq_lens, context_lens=case.context_lens, family="ctx", **common)


def split_prefix_inputs(inputs: CaseInputs) -> tuple[CaseInputs, CaseInputs]:
    """Cut a ``prefix`` case's inputs into the :func:`prefix_pieces` ``(new, ctx)``: ``new`` on the new
    tokens' keys, ``has_context`` set; ``ctx`` on the context keys. Both keep q, q8 and the descales; k/v
    and their fp8 data are the matching rows (views for one sequence). ValueError for another kind."""
    case = inputs.case
    new_case, ctx_case = prefix_pieces(case)
    q_lens, c_lens = list(case.seq_lens), list(case.context_lens)
    starts = case.cu_seqlens_kv()[:-1]
    new = replace(_piece(inputs, new_case, _rows(starts, c_lens, q_lens, inputs.k.device)),
                  has_context=True)
    ctx = _piece(inputs, ctx_case, _rows(starts, [0] * len(c_lens), c_lens, inputs.k.device))
    return new, ctx
