"""Exact attention for ragged batches (output and natural-log LSE), one sequence at a time in query chunks:
on the dequantised fp8 inputs (the kernel's own error) or the bf16 inputs (the end-to-end error)."""

from __future__ import annotations

import math

import torch

from mla_fp8_bench.problem.inputs import CaseInputs

#: Elements of the [H, chunk, S] score block per chunk (about 64 MiB in float64).
_CHUNK_ELEMENTS = 1 << 23


def default_ref_dtype(device: torch.device) -> torch.dtype:  # fp64 is slow on GPUs
    return torch.float64 if device.type == "cpu" else torch.float32


def _starts(cu: list[int] | torch.Tensor, total: int, name: str) -> list[int]:
    out = [int(x) for x in (cu.tolist() if isinstance(cu, torch.Tensor) else cu)]
    if not out or out[0] != 0 or any(b < a for a, b in zip(out, out[1:])) or out[-1] != total:
        raise ValueError(f"{name} {out} must start at 0, be non-decreasing and end at T={total}")
    return out


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int] | torch.Tensor,
                     softmax_scale: float, *, causal: bool = True, dtype: torch.dtype | None = None,
                     chunk_elements: int = _CHUNK_ELEMENTS,
                     cu_seqlens_kv: list[int] | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (bottom-right causal) attention of q ``[T_q, H, Dqk]``, k ``[T_kv, H, Dqk]``, v ``[T_kv, H, Dv]``
    over ``cu_seqlens`` (key starts too unless ``cu_seqlens_kv``): ``(out, lse)``, a row that sees no key gets
    out 0, LSE -inf. ValueError on bad shapes or starts."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q/k/v must be 3-D [T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if (cu_seqlens_kv is None and q.shape[0] != k.shape[0]) or q.shape[1:2] != k.shape[1:2] \
            or k.shape[:2] != v.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q/k/v shapes disagree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    cu = _starts(cu_seqlens, q.shape[0], "cu_seqlens")
    cu_kv = cu if cu_seqlens_kv is None else _starts(cu_seqlens_kv, k.shape[0], "cu_seqlens_kv")
    if len(cu_kv) != len(cu):
        raise ValueError(f"cu_seqlens_kv {cu_kv} and cu_seqlens {cu} hold different batch sizes")
    dtype = dtype or default_ref_dtype(q.device)
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=dtype, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=dtype, device=q.device)
    for b in range(len(cu) - 1):
        _attend_one(q[cu[b]:cu[b + 1]], k[cu_kv[b]:cu_kv[b + 1]], v[cu_kv[b]:cu_kv[b + 1]],
                    out[cu[b]:cu[b + 1]], lse[cu[b]:cu[b + 1]], softmax_scale, causal, dtype, chunk_elements)
    return out, lse


def _attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                softmax_scale: float, causal: bool, dtype: torch.dtype, chunk_elements: int) -> None:
    n, h, n_kv = q.shape[0], q.shape[1], k.shape[0]
    if n == 0 or n_kv == 0:
        return  # out 0, lse -inf
    offset = n_kv - n  # bottom-right alignment
    kb, vb = k.to(dtype).transpose(0, 1), v.to(dtype).transpose(0, 1)  # [H, S_kv, D]
    chunk = max(1, min(n, chunk_elements // max(1, h * n_kv)))
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        kv_end = max(0, min(n_kv, offset + c1)) if causal else n_kv  # keys past the chunk's last row are masked
        if kv_end == 0:
            continue
        s = torch.matmul(q[c0:c1].to(dtype).transpose(0, 1), kb[:, :kv_end].transpose(1, 2)) * softmax_scale
        if causal:
            rows = torch.arange(c0, c1, device=q.device).unsqueeze(1) + offset
            s.masked_fill_((torch.arange(kv_end, device=q.device).unsqueeze(0) > rows).unsqueeze(0), -math.inf)
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # rows that see no key (q_len > kv_len)
        p = torch.exp(s - m)
        denom = p.sum(dim=-1, keepdim=True)
        out[c0:c1] = (torch.matmul(p, vb[:, :kv_end]) / denom.clamp_min(torch.finfo(dtype).tiny)).transpose(0, 1)
        lse[c0:c1] = (m + torch.log(denom)).squeeze(-1).transpose(0, 1)


def case_attention(inputs: CaseInputs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention of ``inputs``' case (its starts and mask) on the given q/k/v: ``(out, lse)``."""
    return causal_attention(q, k, v, inputs.cu_seqlens_q_cpu, inputs.softmax_scale, causal=inputs.causal,
                            dtype=dtype, cu_seqlens_kv=inputs.cu_seqlens_kv_cpu)


def reference_fp8_dequant(inputs: CaseInputs, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = dtype or default_ref_dtype(inputs.device)
    return case_attention(inputs, *inputs.dequantized(dtype), dtype)


def reference_bf16(inputs: CaseInputs, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return case_attention(inputs, inputs.q, inputs.k, inputs.v, dtype)
