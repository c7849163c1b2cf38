"""Probes: two inputs outside the case grammar on which emulator faults no prefill case can show become
visible (tolerance keys ``probe-chunked`` and ``probe-hot-lse``, calibrated like cases).

``top_left_causal`` equals the correct bottom-right mask whenever ``q_len == kv_len``, and
``lse_no_max_subtraction`` differs only when a partial LSE exceeds ~88.7 (fp32 ``exp`` overflow), which
randn-like inputs never reach; hence a chunked-context batch (``q_len < kv_len``) and a "hot LSE" batch
(q ~ k, scores ~ 200), run through the emulator's kernel + reduce directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mla_fp8_bench.aiter_ps.emulator import EMULATOR, Emulator
from mla_fp8_bench.config import DEFAULT_EMU_CU_NUM
from mla_fp8_bench.measure.metrics import error_metrics
from mla_fp8_bench.measure.reference import causal_attention
from mla_fp8_bench.problem.fp8 import Quantized, quantize
from mla_fp8_bench.problem.shapes import DEFAULT_SOFTMAX_SCALE, cu_seqlens_of

#: Probe name -> (q_lens, kv_lens, num_heads, kind).
PROBES: dict[str, tuple[tuple[int, ...], tuple[int, ...], int, str]] = {
    "probe-chunked": ((200, 64), (600, 64), 16, "randn"),
    "probe-hot-lse": ((600,), (600,), 2, "hot"),
}


@dataclass
class ProbeInputs:
    """A batch with separate q and kv lengths (bottom-right causal), quantised per tensor."""

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q8: Quantized
    k8: Quantized
    v8: Quantized
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]


def make_probe(name: str, seed: int) -> ProbeInputs:
    """Deterministic probe inputs (``per_tensor`` quantisation). ``probe-chunked``: randn q/k/v, q_lens (200,
    64) against kv_lens (600, 64), 16 heads. ``probe-hot-lse``: q = k = a shared direction (4 +- 0.1 per
    channel) plus 0.05 noise, so the scaled scores are ~200 and every LSE exceeds fp32's exp range; 2 heads,
    one sequence of 600. ValueError: an unknown probe name."""
    if name not in PROBES:
        raise ValueError(f"probe {name!r} is unknown: allowed {', '.join(PROBES)}")
    q_lens, kv_lens, h, kind = PROBES[name]
    g = torch.Generator().manual_seed(seed)
    if kind == "hot":
        q = 4.0 + 0.1 * torch.randn(1, h, 192, generator=g) + 0.05 * torch.randn(sum(q_lens), h, 192, generator=g)
        k = q.clone()
    else:
        q, k = torch.randn(sum(q_lens), h, 192, generator=g), torch.randn(sum(kv_lens), h, 192, generator=g)
    q, k, v = q.bfloat16(), k.bfloat16(), torch.randn(sum(kv_lens), h, 128, generator=g).bfloat16()
    return ProbeInputs(name, q, k, v, quantize(q), quantize(k), quantize(v), q_lens, kv_lens)


def probe_reference(p: ProbeInputs, *, dequantized: bool = True) -> torch.Tensor:
    """Float64 bottom-right causal attention ``[T, H, 128]`` on the dequantised (or bf16) inputs."""
    qkv = (x.dequantize(torch.float64) for x in (p.q8, p.k8, p.v8)) if dequantized else (p.q, p.k, p.v)
    return causal_attention(*qkv, cu_seqlens_of(p.q_lens), DEFAULT_SOFTMAX_SCALE, dtype=torch.float64,
                            cu_seqlens_kv=cu_seqlens_of(p.kv_lens))[0]


def run_probe(p: ProbeInputs, emulator: Emulator = EMULATOR, cu_num: int | None = None) -> torch.Tensor:
    """The emulated AITER PS path on a probe (``emulator.run_prefill``: the planner port as AITER <= v0.1.21
    plans, kernel + reduce)."""
    return emulator.run_prefill(p.q8.data, p.k8.data, p.v8.data, p.q8.descale, p.k8.descale, p.v8.descale,
                                torch.tensor(cu_seqlens_of(p.q_lens), dtype=torch.int32),
                                cu_seqlens_kv=torch.tensor(cu_seqlens_of(p.kv_lens), dtype=torch.int32),
                                softmax_scale=DEFAULT_SOFTMAX_SCALE, cu_num=cu_num or DEFAULT_EMU_CU_NUM,
                                post_3606=False)


def probe_record(name: str, seed: int, emulator: Emulator = EMULATOR,
                 refs: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, Any]:
    """A runner-like record (``backend="aiter-emulated"``, ``case=<probe>-seed<n>``) of one probe run; ``refs``
    (fp8-dequant ref, bf16 ref) may be passed to reuse references across faults."""
    p = make_probe(name, seed)
    refs = refs or (probe_reference(p), probe_reference(p, dequantized=False))
    rec: dict[str, Any] = {"backend": "aiter-emulated", "case": f"{name}-seed{seed}" if seed else name,
                           "tolerance_key": name, "status": "ok", "reason": ""}
    try:
        out = run_probe(p, emulator)
    except Exception as exc:  # noqa: BLE001 - a crashing fault is an "error" record, like the runner's
        return {**rec, "status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    bm = error_metrics(out, refs[1])
    return {**rec, **error_metrics(out, refs[0]).as_dict("_fp8_ref"), **bm.as_dict("_bf16_ref"),
            "mismatch_fraction": bm.mismatch_fraction}
