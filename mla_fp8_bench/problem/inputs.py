"""Deterministic inputs for a case: bf16 q/k/v drawn on the CPU from a seeded ``torch.Generator`` (the same
values on every machine), moved to the device, their fp8 quantisations and descales. Distributions: ``normal``
(``randn``, the vLLM seed test, PR #51457); ``outlier`` (2 of 192 k channels and 2 of 128 v channels x150, |x|
up to ~700: beyond e4m3fn's +-448 in ``cast`` mode, squeezing the other channels into fp8's subnormals in
``per_tensor`` mode); ``mla`` (``k = cat(k_nope, k_pe)`` with the 64-dim rope part shared by all heads, ``v`` a
strided view into a ``[T, H, 256]`` ``kv_b_proj``-like output, vLLM's ``forward_mha`` split); ``const``
(all-equal q/k, constant-per-channel v: known answer)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mla_fp8_bench.problem import shapes
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.fp8 import Quantized, quantize


@dataclass
class CaseInputs:
    """Everything a backend and the references need for one case. ``cu_seqlens`` / ``cu_seqlens_cpu`` /
    ``max_seqlen`` exist for ``prefill`` cases only."""

    case: Case
    q: torch.Tensor  # [T_q, H, 192] bf16
    k: torch.Tensor  # [T_kv, H, 192] bf16: per sequence its context keys, then its new tokens' keys
    v: torch.Tensor  # [T_kv, H, 128] bf16 (a strided view for ``mla`` inputs)
    q8: Quantized  # contiguous fp8 data and fp32 [1] descale, as k8 and v8
    k8: Quantized
    v8: Quantized
    cu_seqlens_q: torch.Tensor  # [B+1] int32 query starts on the device
    cu_seqlens_q_cpu: torch.Tensor
    cu_seqlens_kv: torch.Tensor  # [B+1] int32 key starts on the device
    cu_seqlens_kv_cpu: torch.Tensor
    max_seqlen_q: int
    max_seqlen_kv: int
    causal: bool  # bottom-right causal; False for context chunks
    softmax_scale: float  # 1/sqrt(192)
    fp8_dtype: torch.dtype
    device: torch.device
    has_context: bool = False  # the new-token piece of a prefix case with context: the planner gets need_lse

    def _same_q_kv(self, name: str, value):
        """``value`` (the ``_q`` field) when queries and keys share starts, else AttributeError."""
        if not self.case.kind.same_q_kv:
            raise AttributeError(f"CaseInputs.{name} is defined for prefill cases (q_len == kv_len), not for "
                                 f"{self.case.family} case {self.case.id}: use {name}_q / {name}_kv")
        return value

    cu_seqlens = property(lambda self: self._same_q_kv("cu_seqlens", self.cu_seqlens_q))
    cu_seqlens_cpu = property(lambda self: self._same_q_kv("cu_seqlens", self.cu_seqlens_q_cpu))
    max_seqlen = property(lambda self: self._same_q_kv("max_seqlen", self.max_seqlen_q))

    def dequantized(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) as the fp8 kernel sees them: ``fp8 * descale`` in ``dtype``."""
        return self.q8.dequantize(dtype), self.k8.dequantize(dtype), self.v8.dequantize(dtype)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def make_bf16_qkv(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The case's bf16 q ``[T_q,H,192]``, k ``[T_kv,H,192]``, v ``[T_kv,H,128]``, drawn seeded on the CPU in
    the order q, k, v (``mla``: q, kv, k_pe)."""
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    t, tk, h = case.total_tokens, case.total_kv_tokens, case.num_heads
    dqk, dv, dn, dr = shapes.QK_HEAD_DIM, shapes.V_HEAD_DIM, shapes.QK_NOPE_HEAD_DIM, shapes.QK_ROPE_HEAD_DIM
    if case.dist == "const":
        q = torch.full((t, h, dqk), 0.5)
        k = torch.full((tk, h, dqk), 0.25)
        # v[token, head, c] = c/128 - 0.5: every output row is the mean of visible v rows = v row itself
        v = (torch.arange(dv, dtype=torch.float32) / dv - 0.5).expand(tk, h, dv).clone()
        return q.bfloat16(), k.bfloat16(), v.bfloat16()
    q = _randn(gen, t, h, dqk)
    if case.dist == "mla":
        kv = _randn(gen, tk, h, dn + dv).bfloat16()
        k_pe = _randn(gen, tk, 1, dr).bfloat16()
        k_nope, v = kv[..., :dn], kv[..., dn:]
        k = torch.cat([k_nope, k_pe.expand(tk, h, dr)], dim=-1)
        return q.bfloat16(), k, v  # v: strided view of kv (stride(-2) == 256)
    k = _randn(gen, tk, h, dqk)
    v = _randn(gen, tk, h, dv)
    if case.dist == "outlier":
        k[..., [7, 133]] *= 150.0
        v[..., [5, 77]] *= 150.0
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def make_inputs(case: Case, device: torch.device | str = "cpu",
                fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> CaseInputs:
    """Build the deterministic inputs of ``case`` on ``device``; raises ``QuantError`` if quantisation
    fails and ``torch.OutOfMemoryError`` if the device cannot hold them (callers record it as a skip)."""
    device = torch.device(device)
    q, k, v = make_bf16_qkv(case)
    if device.type != "cpu":
        q, k = q.to(device), k.to(device)
        # mla: the whole kv_b_proj-like output moves, so v stays a strided view of it on the device too
        v = v._base.to(device)[..., shapes.QK_NOPE_HEAD_DIM:] if case.dist == "mla" else v.to(device)
    cu_q = torch.tensor(case.cu_seqlens_q(), dtype=torch.int32)
    cu_kv = torch.tensor(case.cu_seqlens_kv(), dtype=torch.int32)
    q8, k8, v8 = (quantize(x, case.quant, fp8_dtype) for x in (q, k, v))
    return CaseInputs(case, q, k, v, q8, k8, v8, cu_q.to(device), cu_q, cu_kv.to(device), cu_kv, case.max_seq_len,
                      case.max_kv_len, case.causal, shapes.DEFAULT_SOFTMAX_SCALE, fp8_dtype, device)
