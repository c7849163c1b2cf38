"""Faithful PyTorch emulation of AITER's persistent-scheduled FP8 MLA prefill (kernel + reduce).

What is emulated (``docs/aiter-ps-prefill-contract.md`` §5, §7, §8, §10; AITER main ``e4048607a535``):

* :func:`emulate_mla_prefill_ps_asm_fwd` - the ASM kernel ``mla_prefill_ps_asm_fwd`` (objects
  ``hsa/gfx950/mla/mla_pfl_qh192_vh128_m32x8_n128x1_causal{0,1}.co``): it walks the planner's
  ``work_indptr`` / ``work_info`` exactly like the hardware (workgroup by workgroup, works in order,
  128-key tiles), keeps a base-2 online softmax on the *raw* fp8 scores starting from ``-FLT_MAX``,
  rounds P to ``float8_e4m3fn`` before ``P @ V`` while ``l`` sums the fp32 P, and writes either bf16
  rows (unsplit tiles, ``partial_o_loc == -1``) or fp32 partials plus a natural-log LSE (split tiles).
* :func:`emulate_mla_reduce_v1` - ``mla_reduce_v1``: merges groups of >= 2 partials with natural
  exp/log; groups with fewer partials are skipped (``final_lse`` is therefore defined only for rows of
  split tiles - the pre-#3606 gap of §8).
* :func:`run_emulated_prefill` - plans with the pure-Python planner port
  (:mod:`mla_fp8_bench.aiter_ps.planner`), sizes the partials from the live partial count and runs
  kernel + reduce.

Arithmetic model (choices where the hardware is not observable, §10 "What cannot be bit-exact"):

* ``Q8 @ K8^T`` and ``P8 @ V8`` are evaluated *exactly* (in float64: every product of two e4m3
  values is a multiple of 2^-18 below 2^18, and sums of <= 192 of them fit in 53 bits) and rounded
  once to fp32; the ``P8 @ V8`` product is added to the rescaled accumulator ``alpha * O`` with a single
  rounding. This is the order-independent model of an fp32-accumulating MFMA; it makes the result
  independent of how heads/works are batched here.
* ``p = exp2(s*c2 - m_new*c2)`` uses a fused multiply-add (``m_new*c2`` is rounded to fp32 first, as a
  separate multiply); ``l`` sums the fp32 ``p`` of a tile in float64 and rounds once.
* ``exp2`` / ``log2`` are torch's fp32 functions, not the hardware ``v_exp_f32``/``v_log_f32``.

The same code runs on CPU and CUDA tensors (all work stays on the input device; the metadata is read
to the host once). Results on different devices may differ in the last ulp of exp2/log2 only.

Injectable faults (``faults=``) are named bugs used to prove that the suite's accuracy checks catch
regressions; see :data:`FAULT_DESCRIPTIONS`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = [
    "KERNEL_FAULTS",
    "REDUCE_FAULTS",
    "ALL_FAULTS",
    "FAULT_DESCRIPTIONS",
    "AITER_COMMIT",
    "KERNEL_OBJECTS",
    "QO_TILE",
    "KV_TILE",
    "normalize_faults",
    "emulate_mla_prefill_ps_asm_fwd",
    "emulate_mla_reduce_v1",
    "run_emulated_prefill",
]

#: AITER commit the emulated behaviour was reconstructed from (contract doc §1).
AITER_COMMIT = "e4048607a535"
#: Kernel code objects whose behaviour is emulated (unchanged since v0.1.10.post1).
KERNEL_OBJECTS = (
    "hsa/gfx950/mla/mla_pfl_qh192_vh128_m32x8_n128x1_causal0.co",
    "hsa/gfx950/mla/mla_pfl_qh192_vh128_m32x8_n128x1_causal1.co",
)
#: Rows of one q-tile (the planner's ``qlen_granularity``; partial locations are multiples of it).
QO_TILE = 256
#: Keys per inner KV tile of the kernel.
KV_TILE = 128

_FLT_MAX = float(torch.finfo(torch.float32).max)
_LOG2E = math.log2(math.e)

#: Every fault class, with what it breaks. Kernel faults act in :func:`emulate_mla_prefill_ps_asm_fwd`,
#: reduce faults in :func:`emulate_mla_reduce_v1`; each function ignores the other stage's names.
FAULT_DESCRIPTIONS: dict[str, str] = {
    "drop_v_descale": "kernel: v_scale ignored in the epilogue (inv = 1/l instead of v_scale/l)",
    "double_qk_descale": "kernel: q_scale*k_scale applied twice in c = softmax_scale*q_scale*k_scale",
    "no_causal_mask": "kernel: causal mask not applied (row limit = end of the work's KV range)",
    "top_left_causal": (
        "kernel: causal mask aligned top-left (key j <= i) instead of bottom-right "
        "(j <= kv_len - q_len + i); identical whenever q_len == kv_len"
    ),
    "lse_base2_mix": "kernel: split LSE written in base 2 (m*c2 + log2 l) while the reduce assumes natural log",
    "kv_tile_off_by_one": "kernel: the last KV tile of every work drops its last key (limit k1 - 1)",
    "head_swap": "kernel: heads 0 and 1 swap their output/partial slots (no effect when H == 1)",
    "lse_no_max_subtraction": (
        "reduce: exp() of the raw partial LSEs without subtracting their max "
        "(overflows to inf for LSE > ~88.7 in fp32)"
    ),
    "skip_split_tile": "reduce: the first group with >= 2 partials is skipped (its rows are never written)",
}
#: Faults injected into the kernel emulation.
KERNEL_FAULTS = frozenset(
    {
        "drop_v_descale",
        "double_qk_descale",
        "no_causal_mask",
        "top_left_causal",
        "lse_base2_mix",
        "kv_tile_off_by_one",
        "head_swap",
    }
)
#: Faults injected into the reduce emulation.
REDUCE_FAULTS = frozenset({"lse_no_max_subtraction", "skip_split_tile"})
#: All injectable fault names.
ALL_FAULTS = KERNEL_FAULTS | REDUCE_FAULTS
assert set(FAULT_DESCRIPTIONS) == set(ALL_FAULTS)


def normalize_faults(faults: Iterable[str] | str | None) -> frozenset[str]:
    """Validate a fault selection.

    Args:
        faults: ``None`` (healthy), one fault name, or an iterable of names from :data:`ALL_FAULTS`.

    Returns:
        A frozenset of fault names (empty when healthy).

    Raises:
        ValueError: a name that is not in :data:`ALL_FAULTS` (the message lists the allowed names), or
            a non-string entry.
    """
    if faults is None:
        return frozenset()
    if isinstance(faults, str):
        faults = (faults,)
    out = frozenset(faults)
    bad = sorted(repr(f) for f in out if not isinstance(f, str) or f not in ALL_FAULTS)
    if bad:
        raise ValueError(
            f"unknown fault name(s) {', '.join(bad)}: allowed {', '.join(sorted(ALL_FAULTS))}"
        )
    return out


# ----------------------------------------------------------------------------------------------
# helpers


def _scalar_f32(x: torch.Tensor | float, name: str, device: torch.device) -> torch.Tensor:
    """A 0-dim fp32 tensor on ``device`` from a one-element scale tensor (or a Python float)."""
    if x is None:
        raise ValueError(f"{name} is None: the kernel always reads the scale (a null dereference on hardware)")
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"{name} must have exactly one element, got shape {tuple(x.shape)}")
        return x.detach().reshape(()).to(device=device, dtype=torch.float32)
    return torch.tensor(float(x), dtype=torch.float32, device=device)


def _fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``a*b + c`` with one rounding (emulated in float64; exact product, near-exact sum)."""
    return (a.double() * b.double() + c.double()).float()


def _work_list(work_indptr: torch.Tensor, work_info_set: torch.Tensor) -> list[tuple[int, ...]]:
    """The works in execution order: workgroup 0's works, then workgroup 1's, ..."""
    wi = [int(v) for v in work_indptr.reshape(-1).tolist()]
    nrows = int(work_info_set.shape[0]) if work_info_set.dim() == 2 else 0
    if work_info_set.dim() != 2 or (nrows and work_info_set.shape[1] != 8):
        raise ValueError(f"work_info_set must be [max_works, 8] int32, got shape {tuple(work_info_set.shape)}")
    hi = max([0] + [wi[g + 1] for g in range(len(wi) - 1) if wi[g + 1] > wi[g]])
    if hi > nrows:
        raise ValueError(f"work_indptr reaches work {hi} but work_info_set has only {nrows} rows")
    rows = work_info_set[:hi].tolist() if hi else []
    works = []
    for g in range(len(wi) - 1):
        for w in range(max(wi[g], 0), wi[g + 1]):
            works.append(tuple(int(v) for v in rows[w]))
    return works


# ----------------------------------------------------------------------------------------------
# kernel


def emulate_mla_prefill_ps_asm_fwd(
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_page_indices: torch.Tensor,
    work_indptr: torch.Tensor,
    work_info_set: torch.Tensor,
    max_seqlen_q: int,
    softmax_scale: float,
    is_causal: bool,
    splitData: torch.Tensor,
    splitLse: torch.Tensor,
    output: torch.Tensor,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    *,
    faults: Iterable[str] | str | None = None,
) -> None:
    """Emulate ``aiter.mla_prefill_ps_asm_fwd`` (same argument order, same in-place writes).

    Source: contract doc §3.3 (arguments), §5 (metadata), §7 (numerics); AITER ``e4048607a535``,
    kernel objects ``mla_pfl_qh192_vh128_m32x8_n128x1_causal{0,1}.co``.

    For each workgroup ``g`` and each work ``(b, loc, q0, q1, k0, k1, kv_off, heads)`` of
    ``work_info_set[work_indptr[g]:work_indptr[g+1]]`` in order, and for each 128-key tile of
    ``[k0, k1)``: ``s = Q8 @ K8^T`` (raw fp8 values, fp32), keys at or past the row limit
    (bottom-right causal ``kv_len - q_len + i + 1``, capped at the work's end) get ``-inf``; base-2
    online softmax with ``c = softmax_scale*q_scale*k_scale``, ``c2 = c*log2(e)``, running max ``m`` on
    the raw scores from ``-FLT_MAX``, ``p = exp2(s*c2 - m_new*c2)``, ``l += sum(p)`` (fp32 p),
    ``O = alpha*O + e4m3fn(p) @ V8`` (RNE, unscaled). Epilogue: ``O *= v_scale/l`` (0 if ``l == 0``);
    ``loc == -1`` writes ``bf16(O)`` to ``output[q0:q1, h]`` (no LSE); otherwise ``splitData[loc+t, h]``
    (fp32) and ``splitLse[loc+t, h] = m*c + ln(l)`` for all 256 tile rows ``t`` (rows past ``q1`` are
    junk computed from whatever Q rows follow, zeros past the end of Q, as on hardware).

    K/V rows are read through ``kv_page_indices``; tile keys past ``len(kv_page_indices)`` read page 0,
    page indices outside ``[0, num_page)`` read zeros (buffer-descriptor semantics). Works that share
    ``(b, loc, q0, q1, k0, k1)`` are batched across heads (all heads get identical splits, §5); if any
    (row, head) destination is written twice the works run strictly one by one in order instead.

    Args:
        Q: ``[total_q, H, Dqk]`` float8_e4m3fn (Dqk = 192 on hardware), contiguous or not.
        K: ``[num_page, H, Dqk]`` float8_e4m3fn, one token per page.
        V: ``[num_page, H, Dv]`` float8_e4m3fn (Dv = 128 on hardware).
        qo_indptr: ``[B+1]`` integer cumulative q lengths (token rows of Q/output).
        kv_indptr: ``[B+1]`` integer cumulative KV lengths, indexing ``kv_page_indices``.
        kv_page_indices: ``[num_used_page]`` integer, position -> K/V row.
        work_indptr: ``[num_wg+1]`` integer (planner output; one workgroup per entry).
        work_info_set: ``[max_works, 8]`` integer (planner output; ``WorkInfo`` rows).
        max_seqlen_q: ignored (as by the host and kernel).
        softmax_scale: softmax scale in natural-log units (``1/sqrt(192)`` for MLA), Python float.
        is_causal: bottom-right causal masking.
        splitData: ``[R, H, Dv]`` fp32, written for split works (rows ``[loc, loc+256)`` that fit).
        splitLse: ``[R, H]`` fp32, natural-log LSE of the partials.
        output: ``[total_q, H, Dv]`` (bf16 on hardware), written for unsplit works.
        q_scale, k_scale, v_scale: one-element fp32 dequant multipliers (real = fp8 * scale).
        faults: optional fault names (:data:`KERNEL_FAULTS` act here; :data:`REDUCE_FAULTS` are
            accepted and ignored).

    Returns:
        None; ``output``, ``splitData`` and ``splitLse`` are written in place.

    Raises:
        ValueError: a scale is None or not one element; head/row/dim mismatch between tensors; a work
            references a sequence, head or rows outside the buffers (the hardware would corrupt
            memory); an unknown fault name.
    """
    fs = normalize_faults(faults)
    dev = Q.device
    if Q.dim() != 3 or K.dim() != 3 or V.dim() != 3:
        raise ValueError(
            f"Q/K/V must be 3-D [tokens, H, D], got {tuple(Q.shape)}, {tuple(K.shape)}, {tuple(V.shape)}"
        )
    total_q, H, dqk = (int(v) for v in Q.shape)
    num_page = int(K.shape[0])
    dv = int(V.shape[-1])
    if K.shape[1] != H or V.shape[1] != H or K.shape[2] != dqk or V.shape[0] != num_page:
        raise ValueError(
            f"inconsistent shapes: Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} "
            "(need K [P, H, Dqk] and V [P, H, Dv] with Q's H and Dqk)"
        )
    if tuple(output.shape[1:]) != (H, dv):
        raise ValueError(f"output must be [total_q, {H}, {dv}], got {tuple(output.shape)}")
    c_sm = torch.tensor(float(softmax_scale), dtype=torch.float32, device=dev)
    qs = _scalar_f32(q_scale, "q_scale", dev)
    ks = _scalar_f32(k_scale, "k_scale", dev)
    vs = _scalar_f32(v_scale, "v_scale", dev)
    c = c_sm * qs * ks
    if "double_qk_descale" in fs:
        c = c * qs * ks
    c2 = c * torch.tensor(_LOG2E, dtype=torch.float32, device=dev)
    lse_mul = c2 if "lse_base2_mix" in fs else c

    qo = [int(v) for v in qo_indptr.reshape(-1).tolist()]
    kvp = [int(v) for v in kv_indptr.reshape(-1).tolist()]
    if len(qo) != len(kvp):
        raise ValueError(f"qo_indptr has {len(qo)} entries but kv_indptr has {len(kvp)}")
    n_used = int(kv_page_indices.numel())
    pages = kv_page_indices.reshape(-1).to(device=dev, dtype=torch.long)
    works = _work_list(work_indptr, work_info_set)
    if not works:
        return
    n_split_rows = int(splitData.shape[0]) if splitData is not None else 0

    # decode and validate all works; destination head map (head_swap fault)
    dest_head = list(range(H))
    if "head_swap" in fs and H >= 2:
        dest_head[0], dest_head[1] = 1, 0
    decoded = []
    for w in works:
        b, loc, q0, q1, k0, k1, _kv_off, hr = w
        hr &= 0xFFFFFFFF
        h_lo, h_hi = hr & 0xFFFF, (hr >> 16) & 0xFFFF
        if not 0 <= b < len(qo) - 1:
            raise ValueError(f"work {w}: batch index {b} outside [0, {len(qo) - 1})")
        if not (0 <= h_lo < h_hi <= H):
            if h_hi <= h_lo:
                continue  # empty head range: nothing to compute
            raise ValueError(f"work {w}: head range [{h_lo}, {h_hi}) outside [0, {H})")
        if not (0 <= q0 <= q1 <= total_q):
            raise ValueError(f"work {w}: q rows [{q0}, {q1}) outside [0, {total_q})")
        if loc == -1:
            if q1 > output.shape[0]:
                raise ValueError(f"work {w}: output has {output.shape[0]} rows, needs {q1}")
        elif loc < 0 or loc + (q1 - q0) > n_split_rows:
            raise ValueError(
                f"work {w}: partial rows [{loc}, {loc + q1 - q0}) outside splitData/splitLse "
                f"({n_split_rows} rows; size them as 256 * number of partial slots)"
            )
        decoded.append((b, loc, q0, q1, k0, k1, h_lo, h_hi))

    # Batch identical (b, loc, q0, q1, k0, k1) across heads unless a destination is written twice.
    out_cnt = torch.zeros((max(total_q, 1), H), dtype=torch.int32)
    split_cnt = torch.zeros((max(n_split_rows, 1), H), dtype=torch.int32)
    for b, loc, q0, q1, k0, k1, h_lo, h_hi in decoded:
        if loc == -1:
            out_cnt[q0:q1, h_lo:h_hi] += 1
        else:
            split_cnt[loc : loc + QO_TILE, h_lo:h_hi] += 1
    sequential = bool((out_cnt > 1).any()) or bool((split_cnt > 1).any())
    groups: dict[tuple, list[int]] = {}
    order: list[tuple[tuple, list[int]]] = []
    for b, loc, q0, q1, k0, k1, h_lo, h_hi in decoded:
        key = (b, loc, q0, q1, k0, k1)
        heads = list(range(h_lo, h_hi))
        if sequential:
            order.append((key, heads))
        elif key in groups:
            groups[key].extend(heads)
        else:
            groups[key] = heads
            order.append((key, heads))

    causal = bool(is_causal) and "no_causal_mask" not in fs
    top_left = "top_left_causal" in fs
    off_by_one = "kv_tile_off_by_one" in fs
    neg_flt_max = torch.tensor(-_FLT_MAX, dtype=torch.float32, device=dev)
    ninf = torch.tensor(float("-inf"), dtype=torch.float32, device=dev)
    zero_f = torch.zeros((), dtype=torch.float32, device=dev)
    key_ar = torch.arange(KV_TILE, device=dev)

    for (b, loc, q0, q1, k0, k1), heads in order:
        hs = torch.tensor(heads, dtype=torch.long, device=dev)
        dst = torch.tensor([dest_head[h] for h in heads], dtype=torch.long, device=dev)
        nh = len(heads)
        q_len = qo[b + 1] - qo[b]
        kv_len = kvp[b + 1] - kvp[b]
        k0l, k1l = k0 - kvp[b], k1 - kvp[b]
        k_lim = k1l - 1 if off_by_one else k1l
        nrows = (q1 - q0) if loc == -1 else QO_TILE
        rows = torch.arange(q0, q0 + nrows, device=dev)
        row_ok = rows < total_q
        qt = Q[rows.clamp(max=max(total_q - 1, 0))[:, None], hs[None, :]]  # [nr, nh, Dqk] fp8
        qt = torch.where(row_ok[:, None, None], qt.double(), 0.0).permute(1, 0, 2)  # [nh, nr, Dqk]
        i_loc = rows - qo[b]
        if causal:
            diag = (kv_len - q_len) if not top_left else 0
            lim = torch.clamp(i_loc + diag + 1, max=k_lim)
        else:
            lim = torch.full_like(rows, k_lim)

        m = neg_flt_max.expand(nh, nrows).clone()
        l = torch.zeros((nh, nrows), dtype=torch.float32, device=dev)
        acc = torch.zeros((nh, nrows, dv), dtype=torch.float32, device=dev)
        for j0 in range(k0l, k1l, KV_TILE):
            j = j0 + key_ar  # local key positions
            pos = kvp[b] + j
            pos_ok = (pos >= 0) & (pos < n_used)
            if n_used:
                page = torch.where(pos_ok, pages[pos.clamp(0, n_used - 1)], 0)
            else:
                page = torch.zeros_like(pos)
            page_ok = (page >= 0) & (page < num_page)
            pidx = page.clamp(0, max(num_page - 1, 0))
            kt = torch.where(page_ok[:, None, None], K[pidx[:, None], hs[None, :]].double(), 0.0)
            vt = torch.where(page_ok[:, None, None], V[pidx[:, None], hs[None, :]].double(), 0.0)
            s = torch.matmul(qt, kt.permute(1, 2, 0)).float()  # [nh, nr, 128], exact then fp32
            s = torch.where((j[None, :] >= lim[:, None])[None], ninf, s)
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp2((m - m_new) * c2)
            mc2 = m_new * c2
            p = torch.exp2(_fma_f32(s, c2, -mc2[..., None]))
            l = alpha * l + p.double().sum(dim=-1).float()
            p8 = p.to(torch.float8_e4m3fn)
            pv = torch.matmul(p8.double(), vt.permute(1, 0, 2))  # [nh, nr, Dv], exact
            acc = ((alpha[..., None] * acc).double() + pv).float()
            m = m_new

        scale = vs if "drop_v_descale" not in fs else torch.ones_like(vs)
        inv = torch.where(l == 0, zero_f, scale / l)
        o = acc * inv[..., None]  # [nh, nr, Dv] fp32
        if loc == -1:
            output[q0:q1, dst] = o.permute(1, 0, 2).to(output.dtype)
        else:
            if "lse_base2_mix" in fs:
                lse = m * lse_mul + torch.log2(l)  # base 2: the fault
            else:
                lse = m * lse_mul + torch.log2(l) / _LOG2E  # ln(l) computed as log2(l)/log2(e)
            nfit = min(QO_TILE, n_split_rows - loc)
            splitData[loc : loc + nfit, dst] = o[:, :nfit].permute(1, 0, 2).to(splitData.dtype)
            splitLse[loc : loc + nfit, dst] = lse[:, :nfit].T.to(splitLse.dtype)


# ----------------------------------------------------------------------------------------------
# reduce


def emulate_mla_reduce_v1(
    partial_output: torch.Tensor,
    partial_lse: torch.Tensor,
    reduce_indptr: torch.Tensor,
    reduce_final_map: torch.Tensor,
    reduce_partial_map: torch.Tensor,
    final_output: torch.Tensor,
    final_lse: torch.Tensor | None = None,
    *,
    faults: Iterable[str] | str | None = None,
) -> None:
    """Emulate ``aiter.mla_reduce_v1`` (the maths of every 7/8/9-argument form; no int arguments).

    Source: contract doc §5 (maps), §8 (maths); AITER ``e4048607a535`` ``csrc/kernels/mla/reduce.cu``.

    For each group ``g`` with ``n = reduce_indptr[g+1] - reduce_indptr[g] >= 2`` partials at
    locations ``reduce_partial_map[reduce_indptr[g]:reduce_indptr[g+1]]`` and rows
    ``[qo_start, qo_end) = reduce_final_map[g]``, for every head and row ``s`` (``t = s - qo_start``):
    ``M = max_i lse_i``, ``S = sum_i exp(lse_i - M)``, ``lse* = M + ln S`` (``+inf`` if S is 0 or NaN),
    ``final_output[s, h] = cast(sum_i exp(lse_i - lse*) * O_i)``, ``final_lse[s, h] = lse*``. All in
    fp32, natural exp/log, partials accumulated in map order. Groups with 0 or 1 partials are skipped:
    neither output nor LSE is written.

    Args:
        partial_output: ``[R, H, Dv]`` fp32 partials (``splitData``).
        partial_lse: ``[R, H]`` fp32 natural-log LSE (``splitLse``).
        reduce_indptr: ``[tiles+1]`` integer group pointers into ``reduce_partial_map``.
        reduce_final_map: ``[tiles, 2]`` integer ``[qo_start, qo_end)`` per group.
        reduce_partial_map: ``[slots]`` integer partial row offsets.
        final_output: ``[total_q, H, Dv]`` bf16/fp16 (any strides), written for split rows only.
        final_lse: optional ``[total_q, H]`` fp32, written for split rows only.
        faults: optional fault names (:data:`REDUCE_FAULTS` act here; kernel faults are ignored).

    Returns:
        None (in-place).

    Raises:
        ValueError: a group references partial rows or output rows outside the buffers; an unknown
            fault name.
    """
    fs = normalize_faults(faults)
    ri = [int(v) for v in reduce_indptr.reshape(-1).tolist()]
    if len(ri) < 2:
        return
    fmap = reduce_final_map.reshape(-1, 2).tolist() if reduce_final_map.numel() else []
    pmap = [int(v) for v in reduce_partial_map.reshape(-1).tolist()]
    n_rows = int(partial_output.shape[0])
    no_max = "lse_no_max_subtraction" in fs
    skip_first = "skip_split_tile" in fs
    inf = float("inf")
    for g in range(len(ri) - 1):
        lo, hi = ri[g], ri[g + 1]
        if hi - lo < 2:
            continue
        if skip_first:
            skip_first = False
            continue
        if g >= len(fmap) or hi > len(pmap):
            raise ValueError(f"reduce group {g}: maps too short (final_map {len(fmap)} rows, partial_map {len(pmap)})")
        q0, q1 = (int(v) for v in fmap[g])
        nr = q1 - q0
        if nr <= 0:
            continue
        if q1 > final_output.shape[0]:
            raise ValueError(f"reduce group {g}: rows [{q0}, {q1}) outside final_output ({final_output.shape[0]} rows)")
        locs = pmap[lo:hi]
        for p in locs:
            if p < 0 or p + nr > n_rows:
                raise ValueError(
                    f"reduce group {g}: partial rows [{p}, {p + nr}) outside partial buffers ({n_rows} rows)"
                )
        lses = [partial_lse[p : p + nr].float() for p in locs]  # each [nr, H]
        if no_max:
            ssum = torch.zeros_like(lses[0])
            for x in lses:
                ssum = ssum + torch.exp(x)
            lse_star = torch.log(ssum)
        else:
            mx = lses[0]
            for x in lses[1:]:
                mx = torch.maximum(mx, x)
            ssum = torch.zeros_like(mx)
            for x in lses:
                ssum = ssum + torch.exp(x - mx)
            lse_star = mx + torch.log(ssum)
        lse_star = torch.where((ssum == 0) | torch.isnan(ssum), inf, lse_star)
        acc = torch.zeros((nr,) + tuple(partial_output.shape[1:]), dtype=torch.float32, device=partial_output.device)
        for p, x in zip(locs, lses):
            acc = acc + torch.exp(x - lse_star)[..., None] * partial_output[p : p + nr].float()
        final_output[q0:q1] = acc.to(final_output.dtype)
        if final_lse is not None:
            final_lse[q0:q1] = lse_star.to(final_lse.dtype)


# ----------------------------------------------------------------------------------------------
# driver


def run_emulated_prefill(
    q8: torch.Tensor,
    k8: torch.Tensor,
    v8: torch.Tensor,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    softmax_scale: float,
    causal: bool = True,
    cu_num: int = 256,
    faults: Iterable[str] | str | None = None,
    return_lse: bool = False,
    poison: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plan, run the emulated kernel and reduce: an emulated AITER PS FP8 MLA prefill.

    Source: contract doc §3 (call sequence), §5, §7, §8, §10, §11; AITER ``e4048607a535``.

    Plans with :func:`mla_fp8_bench.aiter_ps.planner.plan_ps_prefill` (``qlen_granularity=256``,
    ``kvlen_granularity=128``, ``block_size=1``, ``qhead_granularity=1``, ``gqa_ratio=1``,
    ``kv_indptr = cu_seqlens``, ``context_lens`` = sequence lengths, identity ``kv_page_indices``),
    allocates ``splitData``/``splitLse`` from the *live* partial count (``num_partials * 256`` rows),
    runs :func:`emulate_mla_prefill_ps_asm_fwd` then :func:`emulate_mla_reduce_v1`.

    Args:
        q8: ``[T, H, 192]`` float8_e4m3fn queries (real = q8 * q_scale).
        k8: ``[T, H, 192]`` float8_e4m3fn keys (q_len == kv_len per sequence).
        v8: ``[T, H, 128]`` float8_e4m3fn values.
        q_scale, k_scale, v_scale: fp32 one-element dequant scales (``[1]`` or ``[]``).
        cu_seqlens: int32 ``[B+1]`` cumulative sequence lengths (``cu_seqlens[-1] == T``).
        softmax_scale: natural-log softmax scale, e.g. ``1/sqrt(192)``.
        causal: bottom-right causal masking (== top-left here, since q_len == kv_len).
        cu_num: CU count the plan is made for (256 on MI355X). Small values with many heads give
            few splits; large values relative to the work force splits.
        faults: optional fault names from :data:`ALL_FAULTS`.
        return_lse: also return the ``[T, H]`` fp32 final LSE (natural log). Only rows of split tiles
            are defined (pre-#3606 gap, §8); other rows are NaN when ``poison`` (else undefined).
        poison: NaN-fill ``output``, ``final_lse`` and the partial buffers first, so unwritten rows show.

    Returns:
        ``output`` ``[T, H, 128]`` bf16, or ``(output, final_lse)`` when ``return_lse``.

    Raises:
        ValueError: wrong dtypes/shapes/devices, ``cu_seqlens`` inconsistent with ``T``, a scale that
            is None or not one element, or an unknown fault name.
        ImportError: the planner port :mod:`mla_fp8_bench.aiter_ps.planner` is unavailable.
    """
    fs = normalize_faults(faults)
    for name, t in (("q8", q8), ("k8", k8), ("v8", v8)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float8_e4m3fn or t.dim() != 3:
            raise ValueError(
                f"{name} must be a 3-D float8_e4m3fn tensor, got "
                f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}"
            )
    T, H, dqk = (int(v) for v in q8.shape)
    if tuple(k8.shape) != (T, H, dqk) or v8.shape[0] != T or v8.shape[1] != H:
        raise ValueError(
            f"k8 must match q8 {tuple(q8.shape)} and v8 must be [T, H, Dv]: got k8 {tuple(k8.shape)}, "
            f"v8 {tuple(v8.shape)}"
        )
    dev = q8.device
    if k8.device != dev or v8.device != dev:
        raise ValueError(f"q8/k8/v8 must share a device: {q8.device}, {k8.device}, {v8.device}")
    for name, sc in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(sc, torch.Tensor) or sc.dtype != torch.float32 or sc.numel() != 1:
            raise ValueError(f"{name} must be a one-element fp32 tensor, got {sc!r:.80}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        raise ValueError(f"cu_seqlens must be a 1-D int32 tensor, got {getattr(cu_seqlens, 'dtype', type(cu_seqlens))}")
    cu_cpu = cu_seqlens.detach().cpu().contiguous()
    cu_list = cu_cpu.tolist()
    if len(cu_list) < 1 or cu_list[0] != 0 or cu_list[-1] != T or any(
        a > b for a, b in zip(cu_list, cu_list[1:])
    ):
        raise ValueError(f"cu_seqlens must rise from 0 to T={T}, got {cu_list[:8]}{'...' if len(cu_list) > 8 else ''}")

    dv = int(v8.shape[-1])
    output = torch.full((T, H, dv), float("nan"), dtype=torch.bfloat16, device=dev) if poison else torch.empty(
        (T, H, dv), dtype=torch.bfloat16, device=dev
    )
    final_lse = torch.full((T, H), float("nan"), dtype=torch.float32, device=dev) if poison else torch.empty(
        (T, H), dtype=torch.float32, device=dev
    )
    B = len(cu_list) - 1
    if B == 0 or T == 0:
        return (output, final_lse) if return_lse else output

    from mla_fp8_bench.aiter_ps.planner import plan_ps_prefill  # lazy: the emulator itself does not need the planner

    seqlens = (cu_cpu[1:] - cu_cpu[:-1]).to(torch.int32).contiguous()
    plan = plan_ps_prefill(
        cu_cpu,
        cu_cpu,
        seqlens,
        num_heads_k=H,
        cu_num=int(cu_num),
        gqa_ratio=1,
        qhead_granularity=1,
        qlen_granularity=QO_TILE,
        kvlen_granularity=KV_TILE,
        block_size=1,
        is_causal=bool(causal),
    )
    n_rows = int(plan.num_partials) * QO_TILE
    fill = float("nan") if poison else 0.0
    split_data = torch.full((n_rows, H, dv), fill, dtype=torch.float32, device=dev)
    split_lse = torch.full((n_rows, H), fill, dtype=torch.float32, device=dev)
    cu_dev = cu_cpu.to(dev)
    kv_page_indices = torch.arange(T, dtype=torch.int32, device=dev)
    emulate_mla_prefill_ps_asm_fwd(
        q8,
        k8,
        v8,
        cu_dev,
        cu_dev,
        kv_page_indices,
        plan.work_indptr,
        plan.work_info,
        int(max(b - a for a, b in zip(cu_list, cu_list[1:]))),
        float(softmax_scale),
        bool(causal),
        split_data,
        split_lse,
        output,
        q_scale,
        k_scale,
        v_scale,
        faults=fs,
    )
    emulate_mla_reduce_v1(
        split_data,
        split_lse,
        plan.reduce_indptr,
        plan.reduce_final_map,
        plan.reduce_partial_map,
        output,
        final_lse,
        faults=fs,
    )
    return (output, final_lse) if return_lse else output
