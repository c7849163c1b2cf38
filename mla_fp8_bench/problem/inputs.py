"""Deterministic inputs for a case: bf16 q/k/v, their fp8 quantisations and descales.

Inputs are drawn on the CPU from a seeded ``torch.Generator`` (so every machine sees the same
values for a given case) and then moved to the target device.

Distributions:

* ``normal`` - ``randn`` q/k/v (the vLLM seed test, PR #51457).
* ``outlier`` - ``normal`` with a few channels scaled up, as LLM activations have: 2 of 192 k
  channels and 2 of 128 v channels x150 (|x| up to ~700). In ``cast`` mode these exceed e4m3fn's
  +-448 and so exercise saturation; in ``per_tensor`` mode they squeeze every other channel into
  fp8's subnormal range.
* ``mla`` - production layout: ``k = cat(k_nope, k_pe)`` with the 64-dim rope part shared by all
  heads, and ``v`` a *strided view* into a ``[T, H, 256]`` ``kv_b_proj``-like output whose first 128
  channels are ``k_nope`` (vLLM's ``forward_mha`` split).
* ``const`` - all-equal q/k (every score ties) and constant-per-channel v: the exact answer is known.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.fp8 import Quantized, quantize
from mla_fp8_bench.problem.shapes import MLA_DIMS, MLADims


@dataclass
class CaseInputs:
    """Everything a backend and the references need for one case.

    Attributes:
        case: the case.
        q: ``[T, H, 192]`` bf16.
        k: ``[T, H, 192]`` bf16.
        v: ``[T, H, 128]`` bf16 (a strided view for ``mla`` inputs).
        q8, k8, v8: :class:`~mla_fp8_bench.problem.fp8.Quantized` (fp8 data contiguous, fp32 ``[1]`` descale).
        cu_seqlens: ``[B+1]`` int32 on the device (qo_indptr == kv_indptr).
        cu_seqlens_cpu: the same on the CPU.
        max_seqlen: longest sequence.
        softmax_scale: ``1/sqrt(192)``.
        fp8_dtype: the fp8 dtype used.
        device: the torch device.
    """

    case: Case
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q8: Quantized
    k8: Quantized
    v8: Quantized
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    max_seqlen: int
    softmax_scale: float
    fp8_dtype: torch.dtype
    device: torch.device
    dims: MLADims = MLA_DIMS

    def dequantized(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) as the fp8 kernel sees them: ``fp8 * descale`` in ``dtype``."""
        return self.q8.dequantize(dtype), self.k8.dequantize(dtype), self.v8.dequantize(dtype)

    def nbytes(self) -> int:
        """Bytes held by the tensors (bf16 + fp8), for memory reporting."""
        ts = [self.q, self.k, self.v, self.q8.data, self.k8.data, self.v8.data]
        return sum(t.numel() * t.element_size() for t in ts)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def make_bf16_qkv(case: Case, dims: MLADims = MLA_DIMS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw the case's bf16 q ``[T,H,192]``, k ``[T,H,192]``, v ``[T,H,128]`` on the CPU (seeded)."""
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    t, h = case.total_tokens, case.num_heads
    dqk, dv, dn, dr = dims.qk_head_dim, dims.v_head_dim, dims.qk_nope_head_dim, dims.qk_rope_head_dim
    if case.dist == "const":
        q = torch.full((t, h, dqk), 0.5)
        k = torch.full((t, h, dqk), 0.25)
        # v[token, head, c] = c/128 - 0.5: every output row is the mean of visible v rows = v row itself
        v = (torch.arange(dv, dtype=torch.float32) / dv - 0.5).expand(t, h, dv).clone()
        return q.bfloat16(), k.bfloat16(), v.bfloat16()
    q = _randn(gen, t, h, dqk)
    if case.dist == "mla":
        kv = _randn(gen, t, h, dn + dv).bfloat16()
        k_pe = _randn(gen, t, 1, dr).bfloat16()
        k_nope, v = kv[..., :dn], kv[..., dn:]
        k = torch.cat([k_nope, k_pe.expand(t, h, dr)], dim=-1)
        return q.bfloat16(), k, v  # v: strided view of kv (stride(-2) == 256)
    k = _randn(gen, t, h, dqk)
    v = _randn(gen, t, h, dv)
    if case.dist == "outlier":
        k[..., [7, 133]] *= 150.0
        v[..., [5, 77]] *= 150.0
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def make_inputs(case: Case, device: torch.device | str = "cpu", fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                dims: MLADims = MLA_DIMS) -> CaseInputs:
    """Build the deterministic inputs of ``case`` on ``device``.

    Raises:
        mla_fp8_bench.problem.fp8.QuantError: if quantisation fails (e.g. non-finite inputs).
        torch.OutOfMemoryError: if the device cannot hold them (callers record it as a skip).
    """
    device = torch.device(device)
    q, k, v = make_bf16_qkv(case, dims)
    if device.type != "cpu":
        if case.dist == "mla":
            kv_base = v._base if v._base is not None else v
            q, k = q.to(device), k.to(device)
            # keep v a strided view on the device too
            kv_dev = kv_base.to(device)
            v = kv_dev[..., dims.qk_nope_head_dim:] if kv_dev.shape[-1] == dims.qk_nope_head_dim + dims.v_head_dim else v.to(device)
        else:
            q, k, v = q.to(device), k.to(device), v.to(device)
    cu = torch.tensor(case.cu_seqlens(), dtype=torch.int32)
    return CaseInputs(
        case=case, q=q, k=k, v=v,
        q8=quantize(q, case.quant, fp8_dtype), k8=quantize(k, case.quant, fp8_dtype), v8=quantize(v, case.quant, fp8_dtype),
        cu_seqlens=cu.to(device), cu_seqlens_cpu=cu, max_seqlen=case.max_seq_len,
        softmax_scale=dims.softmax_scale, fp8_dtype=fp8_dtype, device=device, dims=dims,
    )
