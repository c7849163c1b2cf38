"""Exact causal attention for ragged prefill batches: output and natural-log LSE.

Two references serve two questions:

* :func:`reference_fp8_dequant` - on the dequantised fp8 inputs (``fp8 * descale``): the input
  rounding cancels, so the error against it is the kernel's own (fp8 P, accumulation, bf16 output).
* :func:`reference_bf16` - on the original bf16 inputs: the end-to-end error of going FP8.

Computed in float64 on the CPU and float32 on GPUs, one sequence at a time and in query chunks, so
memory stays ``O(H * chunk * seq_len)``. Masking is bottom-right causal: local query ``i`` sees key
``j`` iff ``j <= kv_len - q_len + i`` (AITER contract §4; equal to top-left when q_len == kv_len).
"""

from __future__ import annotations

import math

import torch

from mla_fp8_bench.problem.inputs import CaseInputs

#: Elements of the [H, chunk, S] score block per chunk (about 64 MiB in float64).
_CHUNK_ELEMENTS = 1 << 23


def default_ref_dtype(device: torch.device) -> torch.dtype:
    """float64 on CPU, float32 on GPUs (fp64 throughput there is low on consumer parts)."""
    return torch.float64 if device.type == "cpu" else torch.float32


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int] | torch.Tensor,
                     softmax_scale: float, *, causal: bool = True, dtype: torch.dtype | None = None,
                     chunk_elements: int = _CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (optionally causal) softmax attention over a ragged batch.

    Args:
        q: ``[T, H, Dqk]`` any float dtype.
        k: ``[T, H, Dqk]``.
        v: ``[T, H, Dv]``.
        cu_seqlens: ``[B+1]`` sequence starts (q_len == kv_len per sequence).
        softmax_scale: multiplier of ``q.k`` (``1/sqrt(192)`` for MLA).
        causal: bottom-right causal mask when True.
        dtype: compute dtype (default: float64 on CPU, float32 on GPU).
        chunk_elements: score elements per query chunk (memory bound).

    Returns:
        ``(out, lse)``: out ``[T, H, Dv]`` and natural-log LSE ``[T, H]`` of the scaled scores, both
        in ``dtype``.

    Raises:
        ValueError: on inconsistent shapes or cu_seqlens.
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q/k/v must be 3-D [T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q/k/v shapes disagree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    cu = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens {cu} must start at 0, be non-decreasing and end at T={q.shape[0]}")
    dtype = dtype or default_ref_dtype(q.device)
    t, h, _ = q.shape
    dv = v.shape[-1]
    out = torch.empty(t, h, dv, dtype=dtype, device=q.device)
    lse = torch.empty(t, h, dtype=dtype, device=q.device)
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        n = s1 - s0
        if n == 0:
            continue
        kb = k[s0:s1].to(dtype).transpose(0, 1)  # [H, S, D]
        vb = v[s0:s1].to(dtype).transpose(0, 1)  # [H, S, Dv]
        chunk = max(1, min(n, chunk_elements // max(1, h * n)))
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            qc = q[s0 + c0:s0 + c1].to(dtype).transpose(0, 1)  # [H, c, D]
            kv_end = c1 if causal else n  # keys beyond the chunk's last row are all masked
            s = torch.matmul(qc, kb[:, :kv_end].transpose(1, 2)) * softmax_scale  # [H, c, kv_end]
            if causal:
                rows = torch.arange(c0, c1, device=q.device).unsqueeze(1)
                cols = torch.arange(kv_end, device=q.device).unsqueeze(0)
                s.masked_fill_((cols > rows).unsqueeze(0), -math.inf)
            m = s.amax(dim=-1, keepdim=True)
            p = torch.exp(s - m)
            l = p.sum(dim=-1, keepdim=True)
            o = torch.matmul(p, vb[:, :kv_end]) / l
            out[s0 + c0:s0 + c1] = o.transpose(0, 1)
            lse[s0 + c0:s0 + c1] = (m + torch.log(l)).squeeze(-1).transpose(0, 1)
    return out, lse


def reference_fp8_dequant(inputs: CaseInputs, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference on the dequantised fp8 inputs: ``(out [T,H,128], lse [T,H])``; isolates kernel error."""
    dtype = dtype or default_ref_dtype(inputs.device)
    q, k, v = inputs.dequantized(dtype)
    return causal_attention(q, k, v, inputs.cu_seqlens_cpu, inputs.softmax_scale, dtype=dtype)


def reference_bf16(inputs: CaseInputs, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference on the original bf16 inputs: ``(out [T,H,128], lse [T,H])``; end-to-end FP8 error."""
    return causal_attention(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_cpu, inputs.softmax_scale, dtype=dtype)
