"""PyTorch SDPA baselines (a Python loop over sequences, so timings include per-sequence launches):
``torch-sdpa-bf16`` on the bf16 inputs and ``torch-fp8-ref`` on the dequantised fp8 inputs (``fp8 * descale``,
bf16 on GPU, fp32 on CPU: FP8's input rounding without an FP8 kernel). ``lse()`` is float32 attention on the
same inputs outside the timed call, so ``prefix`` cases run through :func:`~.base.compose_prefix`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.measure.reference import case_attention
from mla_fp8_bench.problem.inputs import CaseInputs


def _sdpa_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: list[int], cu_kv: list[int], scale: float,
                 causal: bool, out: torch.Tensor) -> torch.Tensor:
    """SDPA per sequence into ``out`` ``[T_q, H, Dv]``; causal only where q_len == kv_len (prefill)."""
    for b in range(len(cu_q) - 1):
        (s0, s1), (k0, k1) = cu_q[b : b + 2], cu_kv[b : b + 2]
        if k1 == k0:  # a sequence without context keys: out 0 (its LSE is -inf)
            out[s0:s1] = 0
            continue
        qb, kb, vb = (x.transpose(0, 1).unsqueeze(0) for x in (q[s0:s1], k[k0:k1], v[k0:k1]))  # [1, H, S, D]
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale)
        out[s0:s1] = o.squeeze(0).transpose(0, 1)
    return out


def _prepare_sdpa(inputs: CaseInputs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """The SDPA call on q/k/v (the backend's view of the inputs), with an untimed LSE of the same inputs."""
    if inputs.causal and not inputs.case.kind.same_q_kv:
        raise ValueError(f"torch SDPA backends run causal attention with q_len == kv_len only; {inputs.case.id} "
                         "is composed from its pieces (prepare_case)")
    cu_q, cu_kv = inputs.cu_seqlens_q_cpu.tolist(), inputs.cu_seqlens_kv_cpu.tolist()
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.bfloat16, device=q.device)
    state: dict[str, torch.Tensor] = {}

    def lse() -> tuple[torch.Tensor, torch.Tensor]:
        if "lse" not in state:
            state["lse"] = case_attention(inputs, q, k, v, torch.float32)[1]
        return state["lse"], torch.ones(q.shape[0], dtype=torch.bool)

    return Prepared(run=lambda: _sdpa_ragged(q, k, v, cu_q, cu_kv, inputs.softmax_scale, inputs.causal, out),
                    graph_capturable=inputs.device.type == "cuda",
                    timing_scope="kernel" if inputs.device.type == "cuda" else "call", lse=lse)


class _TorchSdpa(Backend):
    context_chunks = Verdict.yes()

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()


class TorchSdpaBf16(_TorchSdpa):
    name = "torch-sdpa-bf16"
    description = "torch SDPA on the bf16 inputs (non-FP8 baseline)"
    fp8 = False

    def prepare(self, inputs: CaseInputs) -> Prepared:
        return _prepare_sdpa(inputs, inputs.q, inputs.k, inputs.v.contiguous())


class TorchFp8Ref(_TorchSdpa):
    name = "torch-fp8-ref"
    description = "torch SDPA on the dequantised fp8 inputs (input rounding only, no fp8 kernel)"

    def prepare(self, inputs: CaseInputs) -> Prepared:
        dtype = torch.float32 if inputs.device.type == "cpu" else torch.bfloat16
        return _prepare_sdpa(inputs, *inputs.dequantized(dtype))
