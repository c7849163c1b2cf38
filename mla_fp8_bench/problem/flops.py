"""FLOPs and bytes of MLA prefill cases, and achieved throughput. Convention (FA3, FlashInfer, AITER's op
test; docs/methodology.md#flops): two GEMMs of ``2 * rows * cols * D``, halved for the causal
triangle (``320 * H * sum S_i^2`` for q_len == kv_len at 192/128); softmax work is not counted."""

from __future__ import annotations

from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.shapes import QK_HEAD_DIM, V_HEAD_DIM


def case_flops(case: Case, qk_head_dim: int = QK_HEAD_DIM, v_head_dim: int = V_HEAD_DIM) -> float:
    """FLOPs of a case of any family: ``2 * H * (D_qk + D_v) * sum(pairs_i)`` with pairs per sequence
    ``q*kv`` (``ctx``, non-causal) or ``q*(kv - q) + q^2/2`` (``prefill``/``prefix``, bottom-right causal)."""
    pairs = sum(q * (kv - q) + q * q / 2 if case.causal else q * kv for q, kv in zip(case.seq_lens, case.kv_lens))
    return 2.0 * case.num_heads * (qk_head_dim + v_head_dim) * pairs


def case_min_bytes(case: Case, qk_head_dim: int = QK_HEAD_DIM, v_head_dim: int = V_HEAD_DIM, in_bytes: int = 1,
                   out_bytes: int = 2) -> int:
    """Fewest bytes for a case of any family: fp8 q read once, fp8 k and v (T_kv rows) read once, bf16
    output written once: ``H * (T_q * (D_qk*in + D_v*out) + T_kv * (D_qk + D_v) * in)``."""
    return case.num_heads * (case.total_tokens * (qk_head_dim * in_bytes + v_head_dim * out_bytes)
                             + case.total_kv_tokens * (qk_head_dim + v_head_dim) * in_bytes)


def tflops(flops: float, seconds: float) -> float:
    """Achieved TFLOP/s = flops / seconds / 1e12 (nan when seconds is not positive)."""
    return flops / seconds / 1e12 if seconds and seconds > 0 else float("nan")


#: Dense datasheet peaks in TFLOP/s (docs/methodology.md#peaks).
DATASHEET_PEAKS_TFLOPS = {
    "NVIDIA H200": {"fp8": 1979.0, "bf16": 989.5, "hbm_tb_s": 4.8},
    "NVIDIA H100 80GB HBM3": {"fp8": 1979.0, "bf16": 989.5, "hbm_tb_s": 3.35},
    "gfx950": {"fp8": 5000.0, "bf16": 2500.0, "hbm_tb_s": 8.0},  # MI355X
}


def datasheet_peak(device_name: str, arch: str) -> dict[str, float] | None:
    return DATASHEET_PEAKS_TFLOPS.get(device_name) or DATASHEET_PEAKS_TFLOPS.get(arch)
