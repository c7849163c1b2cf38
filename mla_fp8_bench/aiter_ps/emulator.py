"""PyTorch emulation of AITER's PS FP8 MLA prefill kernel ``mla_prefill_ps_asm_fwd``, ``mla_reduce_v1`` and the
whole path (docs/aiter-contract.md#kernel, #reduce, #emulation). Where the hardware is not observable:
``Q8 @ K8^T`` and ``P8 @ V8`` are exact in float64, rounded once to fp32 (an order-independent fp32 MFMA, so
batching heads cannot change a result); ``p = exp2(s*c2 - m_new*c2)`` is one FMA; ``l`` sums a tile's fp32
``p`` rounded once; ``exp2``/``log2`` are torch's. Each step a bug would change is a method of
:class:`Emulator`; :data:`EMULATOR` is the faithful one.
"""

from __future__ import annotations

import math
from collections import namedtuple

import torch

from mla_fp8_bench.aiter_ps.facts import KV_TILE, PLANNER_V0_1_22, Q_TILE, unpack_q_head_range
from mla_fp8_bench.aiter_ps.planner import plan_ps_prefill

_FLT_MAX = float(torch.finfo(torch.float32).max)
_LOG2E = math.log2(math.e)


def _fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``a*b + c`` with one rounding (via float64)."""
    return (a.double() * b.double() + c.double()).float()


#: Per-call constants of the kernel: ``c = softmax_scale*q_scale*k_scale`` (natural-log units per raw score),
#: ``c2 = c*log2(e)`` (base 2) and the epilogue's ``v_scale``.
SoftmaxConsts = namedtuple("SoftmaxConsts", "c c2 v_scale")


#: One decoded ``work_info`` row: sequence ``b``, slot ``loc`` (-1 = write ``output``), global q rows ``[q0, q1)``,
#: KV positions ``[k0, k1)``, heads ``[h_lo, h_hi)``; ``[:6]`` is shared by works differing only in heads.
_Work = namedtuple("_Work", "b loc q0 q1 k0 k1 h_lo h_hi")


def _decode_works(work_indptr: torch.Tensor, work_info_set: torch.Tensor) -> list[_Work]:
    """The works in execution order (workgroup by workgroup); works with an empty head range are dropped."""
    wi = work_indptr.reshape(-1).tolist()
    rows = work_info_set[: max(wi)].tolist() if max(wi) > 0 else []
    decoded = []
    for g in range(len(wi) - 1):
        for b, loc, q0, q1, k0, k1, _kv_off, hr in rows[max(wi[g], 0) : wi[g + 1]]:
            h_lo, h_hi = unpack_q_head_range(hr & 0xFFFFFFFF)
            if h_lo < h_hi:
                decoded.append(_Work(b, loc, q0, q1, k0, k1, h_lo, h_hi))
    return decoded


def _batch_across_heads(decoded: list[_Work], total_q: int, H: int, n_split_rows: int) -> list[tuple[_Work, list[int]]]:
    """Works that differ only in their heads, batched in first-seen order; all on their own, in execution order,
    when a (row, head) is written twice (later writes win, as on hardware)."""
    out_cnt = torch.zeros((max(total_q, 1), H), dtype=torch.int32)
    split_cnt = torch.zeros((max(n_split_rows, 1), H), dtype=torch.int32)
    for w in decoded:
        if w.loc == -1:
            out_cnt[w.q0 : w.q1, w.h_lo : w.h_hi] += 1
        else:
            split_cnt[w.loc : w.loc + Q_TILE, w.h_lo : w.h_hi] += 1
    sequential = bool((out_cnt > 1).any()) or bool((split_cnt > 1).any())
    groups: dict[tuple, list[int]] = {}
    order: list[tuple[_Work, list[int]]] = []
    for w in decoded:
        heads = list(range(w.h_lo, w.h_hi))
        if sequential or w[:6] not in groups:
            groups[w[:6]] = heads
            order.append((w, heads))
        else:
            groups[w[:6]].extend(heads)
    return order


def _online_softmax(qt: torch.Tensor, K: torch.Tensor, V: torch.Tensor, pages: torch.Tensor, hs: torch.Tensor,
                    kv_base: int, k0l: int, k1l: int, lim: torch.Tensor,
                    cs: SoftmaxConsts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Base-2 online softmax over the 128-key tiles of local keys ``[k0l, k1l)`` (keys past ``len(pages)`` read
    page 0) for ``qt`` ``[nh, nr, Dqk]`` (raw fp8 values as float64): fp32 ``(m, l, acc)``, the running max of raw
    scores from ``-FLT_MAX``, the sum of p and ``sum e4m3fn(p) @ V8``."""
    dev = qt.device
    nh, nrows = int(qt.shape[0]), int(qt.shape[1])
    ninf = torch.tensor(float("-inf"), dtype=torch.float32, device=dev)
    m = torch.full((nh, nrows), -_FLT_MAX, dtype=torch.float32, device=dev)
    l_sum = torch.zeros((nh, nrows), dtype=torch.float32, device=dev)
    acc = torch.zeros((nh, nrows, int(V.shape[-1])), dtype=torch.float32, device=dev)
    key_ar, n_used = torch.arange(KV_TILE, device=dev), int(pages.numel())
    for j0 in range(k0l, k1l, KV_TILE):
        j = j0 + key_ar  # local key positions
        pos = kv_base + j
        page = torch.where(pos < n_used, pages[pos.clamp(max=n_used - 1)], 0)[:, None]
        kt, vt = K[page, hs[None, :]].double(), V[page, hs[None, :]].double()  # [128, nh, D]
        s = torch.matmul(qt, kt.permute(1, 2, 0)).float()  # [nh, nr, 128], exact then fp32
        s = torch.where((j[None, :] >= lim[:, None])[None], ninf, s)
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp2((m - m_new) * cs.c2)
        mc2 = m_new * cs.c2
        p = torch.exp2(_fma_f32(s, cs.c2, -mc2[..., None]))
        l_sum = alpha * l_sum + p.double().sum(dim=-1).float()
        pv = torch.matmul(p.to(torch.float8_e4m3fn).double(), vt.permute(1, 0, 2))  # [nh, nr, Dv], exact
        acc = ((alpha[..., None] * acc).double() + pv).float()
        m = m_new
    return m, l_sum, acc


def _run_work(w: _Work, heads: list[int], dest: list[int], Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
              pages: torch.Tensor, qo: list[int], kvp: list[int], causal: bool, cs: SoftmaxConsts,
              em: Emulator, bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    """One work over ``heads``: bf16 rows ``[q0, q1)`` of ``output`` (``loc == -1``), else all 256 rows of slot ``loc``
    (rows past ``q1`` from the Q rows that follow, zeros past the end of Q, as on hardware)."""
    split_data, split_lse, output = bufs
    dev, total_q = Q.device, int(Q.shape[0])
    hs = torch.tensor(heads, dtype=torch.long, device=dev)
    dst = torch.tensor(dest, dtype=torch.long, device=dev)
    k0l, k1l = w.k0 - kvp[w.b], w.k1 - kvp[w.b]
    k_lim = em.kv_limit(k1l)
    nrows = (w.q1 - w.q0) if w.loc == -1 else Q_TILE
    rows = torch.arange(w.q0, w.q0 + nrows, device=dev)
    src = Q if total_q else Q.new_zeros((1, *Q.shape[1:]))  # an empty Q reads as zeros too
    qt = src[rows.clamp(max=max(total_q - 1, 0))[:, None], hs[None, :]]  # [nr, nh, Dqk] fp8
    qt = torch.where((rows < total_q)[:, None, None], qt.double(), 0.0).permute(1, 0, 2)  # [nh, nr, Dqk]
    lim = em.row_limits(rows, qo[w.b], qo[w.b + 1] - qo[w.b], kvp[w.b + 1] - kvp[w.b], k_lim, causal)
    m, l_sum, acc = _online_softmax(qt, K, V, pages, hs, kvp[w.b], k0l, k1l, lim, cs)
    inv = torch.where(l_sum == 0, torch.zeros((), dtype=torch.float32, device=dev), cs.v_scale / l_sum)
    o, lse = acc * inv[..., None], em.partial_lse(m, l_sum, cs)  # epilogue: O * v_scale/l (0 where l == 0)
    if w.loc == -1:
        output[w.q0 : w.q1, dst] = o.permute(1, 0, 2).to(output.dtype)
        return
    nfit = min(Q_TILE, int(split_data.shape[0]) - w.loc)
    split_data[w.loc : w.loc + nfit, dst] = o[:, :nfit].permute(1, 0, 2).to(split_data.dtype)
    split_lse[w.loc : w.loc + nfit, dst] = lse[:, :nfit].T.to(split_lse.dtype)


def _check_args(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, scales: tuple, cus: dict) -> None:
    """ValueError unless q8/k8/v8 are 3-D float8_e4m3fn, the scales one-element fp32 and each ``cus`` entry
    ``name: (cu, total)`` a 1-D int32 tensor rising from 0 to ``total``."""
    for name, t in (("q8", q8), ("k8", k8), ("v8", v8), *zip(("q_scale", "k_scale", "v_scale"), scales)):
        want = (torch.float8_e4m3fn, 3) if name.endswith("8") else (torch.float32, None)
        if not isinstance(t, torch.Tensor) or t.dtype != want[0] or t.dim() != (want[1] or t.dim()) or \
                (want[1] is None and t.numel() != 1):
            raise ValueError(f"{name} must be a {'3-D float8_e4m3fn' if want[1] else 'one-element fp32'} tensor,"
                             f" got {t!r:.80}")
    for name, (cu, total) in cus.items():
        vals = cu.tolist() if isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1 else None
        if vals is None or not vals or vals[0] != 0 or vals[-1] != total or vals != sorted(vals):
            raise ValueError(f"{name} must be a 1-D int32 tensor rising from 0 to {total}, got {cu!r:.80}")


class Emulator:
    """AITER's PS FP8 prefill kernel, reduce and whole path; a subclass overriding one step models that bug."""

    def softmax_consts(self, softmax_scale: float, q_scale: torch.Tensor, k_scale: torch.Tensor,
                       v_scale: torch.Tensor) -> SoftmaxConsts:
        """``c = softmax_scale*q_scale*k_scale``, ``c2 = c*log2(e)`` in fp32 (0-dim scales on the kernel's device)."""
        c = torch.tensor(float(softmax_scale), dtype=torch.float32, device=q_scale.device) * q_scale * k_scale
        return SoftmaxConsts(c=c, c2=c * torch.tensor(_LOG2E, dtype=torch.float32, device=c.device), v_scale=v_scale)

    def kv_limit(self, k1l: int) -> int:
        """Exclusive local key limit of a work whose KV range ends at local position ``k1l``."""
        return k1l

    def row_limits(self, rows: torch.Tensor, q_start: int, q_len: int, kv_len: int, k_lim: int,
                   causal: bool) -> torch.Tensor:
        """Exclusive local key limit per global q row: ``k_lim``, causal capped at ``kv_len - q_len + i + 1``."""
        if not causal:
            return torch.full_like(rows, k_lim)
        return torch.clamp(rows - q_start + (kv_len - q_len) + 1, max=k_lim)

    def partial_lse(self, m: torch.Tensor, l_sum: torch.Tensor, cs: SoftmaxConsts) -> torch.Tensor:
        """Natural-log partial LSE ``m*c + ln(l)``, ``ln`` as ``log2(l)/log2(e)`` (-inf where ``l == 0``)."""
        return m * cs.c + torch.log2(l_sum) / _LOG2E

    def dest_heads(self, num_heads: int) -> list[int]:
        """The output / partial head slot each head is written to."""
        return list(range(num_heads))

    def reduced_groups(self, groups: list[int]) -> list[int]:
        """The reduce groups (indices, in order) run among those with enough partials."""
        return groups

    def merged_lse(self, lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lse*, S)``: ``M = max lse_i``, ``S = sum exp(lse_i - M)``, ``lse* = M + ln S`` (fp32)."""
        mx = torch.stack(lses).amax(dim=0)
        ssum = torch.zeros_like(mx)
        for x in lses:
            ssum = ssum + torch.exp(x - mx)
        return mx + torch.log(ssum), ssum

    def mla_prefill_ps_asm_fwd(
        self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
        kv_page_indices: torch.Tensor, work_indptr: torch.Tensor, work_info_set: torch.Tensor, max_seqlen_q: int,
        softmax_scale: float, is_causal: bool, splitData: torch.Tensor, splitLse: torch.Tensor, output: torch.Tensor,
        q_scale: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
    ) -> None:
        """``aiter.mla_prefill_ps_asm_fwd`` in place, same arguments (docs/aiter-contract.md#kernel-args, #kernel),
        trusted (the stand-in validates them); ``kv_offset`` and ``max_seqlen_q`` are ignored, as by the kernel."""
        total_q, H = int(Q.shape[0]), int(Q.shape[1])
        cs = self.softmax_consts(softmax_scale, *(x.detach().reshape(()).to(Q.device, torch.float32)
                                                  for x in (q_scale, k_scale, v_scale)))
        qo, kvp = (t.reshape(-1).tolist() for t in (qo_indptr, kv_indptr))
        n_split_rows = int(splitData.shape[0])
        decoded = _decode_works(work_indptr, work_info_set)
        if not decoded:
            return
        dest_head = self.dest_heads(H)
        pages = kv_page_indices.reshape(-1).to(device=Q.device, dtype=torch.long)
        for w, heads in _batch_across_heads(decoded, total_q, H, n_split_rows):
            _run_work(w, heads, [dest_head[h] for h in heads], Q, K, V, pages, qo, kvp, bool(is_causal), cs, self,
                      (splitData, splitLse, output))

    def mla_reduce_v1(
        self, partial_output: torch.Tensor, partial_lse: torch.Tensor, reduce_indptr: torch.Tensor,
        reduce_final_map: torch.Tensor, reduce_partial_map: torch.Tensor, final_output: torch.Tensor,
        final_lse: torch.Tensor | None = None, *, post_3606: bool = False,
    ) -> None:
        """``aiter.mla_reduce_v1`` (any form; trusted arguments; docs/aiter-contract.md#reduce): per group with >= 2
        partials (``post_3606``: >= 1 real slot), in fp32, partials in map order: ``lse*`` of :meth:`merged_lse`
        (``+inf`` if S is 0 or NaN), ``final_output = cast(sum exp(lse_i - lse*) * O_i)``, ``final_lse = lse*``."""
        ri, fmap, pmap = reduce_indptr.reshape(-1).tolist(), reduce_final_map.tolist(), reduce_partial_map.tolist()
        min_partials = 1 if post_3606 else 2
        groups = [(fmap[g], pmap[ri[g] : ri[g + 1]])  # a group of one runs only with a real slot
                  for g in self.reduced_groups([g for g in range(len(ri) - 1) if ri[g + 1] - ri[g] >= min_partials])
                  if fmap[g][1] > fmap[g][0] and (ri[g + 1] - ri[g] > 1 or pmap[ri[g]] != -1)]
        for (q0, q1), locs in groups:
            nr = q1 - q0
            lses = [partial_lse[p : p + nr].float() for p in locs]
            lse_star, ssum = self.merged_lse(lses)
            lse_star = torch.where((ssum == 0) | torch.isnan(ssum), float("inf"), lse_star)
            acc = partial_output.new_zeros((nr, *partial_output.shape[1:]), dtype=torch.float32)
            for x, p in zip(lses, locs):
                acc = acc + torch.exp(x - lse_star)[..., None] * partial_output[p : p + nr].float()
            final_output[q0:q1] = acc.to(final_output.dtype)
            if final_lse is not None:
                final_lse[q0:q1] = lse_star.to(final_lse.dtype)

    def run_prefill(
        self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor,
        v_scale: torch.Tensor, cu_seqlens: torch.Tensor, *, softmax_scale: float, causal: bool = True,
        cu_num: int = 256, return_lse: bool = False, poison: bool = True, cu_seqlens_kv: torch.Tensor | None = None,
        post_3606: bool = True,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The emulated path: plan with the v0.1.22 planner port (``need_lse=post_3606``; False plans as AITER
        <= v0.1.21, with the pre-#3606 reduce), then the kernel and the reduce with ``splitData``/``splitLse``
        sized from the live partial count. ``q8``/``k8``/``v8``: ``[T, H, 192]`` / ``[P, H, 192]`` / ``[P, H, 128]``
        float8_e4m3fn, real = fp8 * the one-element fp32 scales; ``cu_seqlens``/``cu_seqlens_kv``: int32 ``[B+1]``
        ending at T / P (keys default to the queries); ``poison``: NaN-fill outputs and partials first. Returns
        ``output`` ``[T, H, 128]`` bf16, and with ``return_lse`` the natural-log final LSE ``[T, H]``."""
        T, H = int(q8.shape[0]), int(q8.shape[1])
        cus = {"cu_seqlens": (cu_seqlens, T)}
        if cu_seqlens_kv is not None:
            cus["cu_seqlens_kv"] = (cu_seqlens_kv, int(k8.shape[0]))
        _check_args(q8, k8, v8, (q_scale, k_scale, v_scale), cus)
        cu_q = cu_seqlens.detach().cpu()
        cu_kv = cu_q if cu_seqlens_kv is None else cu_seqlens_kv.detach().cpu()
        dev, dv = q8.device, int(v8.shape[-1])
        fill = float("nan") if poison else 0.0
        output = torch.full((T, H, dv), fill, dtype=torch.bfloat16, device=dev)
        final_lse = torch.full((T, H), fill, dtype=torch.float32, device=dev)
        if cu_q.numel() < 2 or T == 0:
            return (output, final_lse) if return_lse else output
        plan = plan_ps_prefill(cu_q, cu_kv, cu_kv.diff(), num_heads_k=H,
                               cu_num=int(cu_num), kvlen_granularity=KV_TILE, block_size=1, is_causal=bool(causal),
                               revision=PLANNER_V0_1_22, need_lse=bool(post_3606))
        split_data = torch.full((plan.partial_rows, H, dv), fill, dtype=torch.float32, device=dev)
        split_lse = torch.full((plan.partial_rows, H), fill, dtype=torch.float32, device=dev)
        pages = torch.arange(int(k8.shape[0]), dtype=torch.int32, device=dev)
        max_q = int(cu_q.diff().max())
        self.mla_prefill_ps_asm_fwd(q8, k8, v8, cu_q.to(dev), cu_kv.to(dev), pages, plan.work_indptr, plan.work_info,
                                    max_q, float(softmax_scale), bool(causal), split_data, split_lse, output, q_scale,
                                    k_scale, v_scale)
        self.mla_reduce_v1(split_data, split_lse, plan.reduce_indptr, plan.reduce_final_map, plan.reduce_partial_map,
                           output, final_lse, post_3606=post_3606)
        return (output, final_lse) if return_lse else output


#: The faithful emulator.
EMULATOR = Emulator()
