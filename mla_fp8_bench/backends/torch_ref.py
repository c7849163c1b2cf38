"""PyTorch SDPA backends: the bf16 baseline and the fp8-dequantised reference path.

* ``torch-sdpa-bf16`` - ``F.scaled_dot_product_attention`` per sequence on the bf16 inputs: what a
  non-FP8 prefill costs and how accurate it is.
* ``torch-fp8-ref`` - the same SDPA on the dequantised fp8 inputs (``fp8 * descale`` in bf16 on GPU,
  fp32 on CPU): input rounding of FP8 without an FP8 kernel.

Both loop over sequences in Python (a ragged batch is a list of dense ``[1, H, S, D]`` problems), so
their timings include per-sequence launch overhead; they are baselines, not peers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.inputs import CaseInputs


def _sdpa_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int], scale: float,
                 out: torch.Tensor) -> torch.Tensor:
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        qb = q[s0:s1].transpose(0, 1).unsqueeze(0)
        kb = k[s0:s1].transpose(0, 1).unsqueeze(0)
        vb = v[s0:s1].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
        out[s0:s1] = o.squeeze(0).transpose(0, 1)
    return out


class TorchSdpaBf16(Backend):
    name = "torch-sdpa-bf16"
    description = "torch SDPA on the bf16 inputs (non-FP8 baseline)"
    fp8 = False

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()

    def prepare(self, inputs: CaseInputs) -> Prepared:
        cu = inputs.cu_seqlens_cpu.tolist()
        q, k, v = inputs.q, inputs.k, inputs.v.contiguous()
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.bfloat16, device=q.device)
        return Prepared(run=lambda: _sdpa_ragged(q, k, v, cu, inputs.softmax_scale, out),
                        graph_capturable=inputs.device.type == "cuda",
                        timing_scope="kernel" if inputs.device.type == "cuda" else "call")


class TorchFp8Ref(Backend):
    name = "torch-fp8-ref"
    description = "torch SDPA on the dequantised fp8 inputs (input rounding only, no fp8 kernel)"
    fp8 = True

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()

    def prepare(self, inputs: CaseInputs) -> Prepared:
        cu = inputs.cu_seqlens_cpu.tolist()
        dt = torch.float32 if inputs.device.type == "cpu" else torch.bfloat16
        q, k, v = inputs.dequantized(dt)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.bfloat16, device=q.device)
        return Prepared(run=lambda: _sdpa_ragged(q, k, v, cu, inputs.softmax_scale, out),
                        graph_capturable=inputs.device.type == "cuda",
                        timing_scope="kernel" if inputs.device.type == "cuda" else "call")
