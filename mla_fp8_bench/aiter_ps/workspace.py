"""Workspace bytes of the PS FP8 prefill (docs/aiter-contract.md#workspace), one definition for ``plan``, the
``aiter`` driver and its ``workspace_bytes`` track: **workspace bytes used** by one call are the fp32 scratch it
allocates from its plan: ``splitData`` and ``splitLse`` for ``max(1, reduce_indptr[-1])`` 256-row partial slots
(at least one, also when nothing is split) plus ``final_lse`` for every query row, at the call's head count.
What a caller reserves ahead of the plan (the info bound, vLLM's builder) is counted apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mla_fp8_bench.aiter_ps.facts import Q_TILE
from mla_fp8_bench.problem.shapes import V_HEAD_DIM

FP32_BYTES = 4
VLLM_WORKSPACE_ALIGN = 256  # vLLM's WorkspaceManager.get_simultaneous rounds every slice up to 256 bytes


@dataclass(frozen=True)
class WorkspaceBytes:
    """Bytes of the fp32 ``splitData``, ``splitLse`` and ``final_lse`` of one call; ``extra``: vLLM's output scratch."""

    partial_output: int
    partial_lse: int
    final_lse: int
    extra: int = 0

    @property
    def total(self) -> int:
        return self.partial_output + self.partial_lse + self.final_lse + self.extra


def workspace_bytes(partial_slots: int, final_lse_rows: int, num_heads: int, v_head_dim: int = V_HEAD_DIM, *,
                    align: int = 1, extra: int = 0) -> WorkspaceBytes:
    """fp32 scratch for ``partial_slots`` 256-row slots and ``final_lse_rows`` q rows of ``num_heads`` heads,
    plus ``extra`` bytes, each buffer rounded up to ``align`` bytes: ``partial_output = slots*256*H*dv*4``,
    ``partial_lse = slots*256*H*4``, ``final_lse = rows*H*4``."""
    rows = partial_slots * Q_TILE
    sizes = (rows * num_heads * v_head_dim * FP32_BYTES, rows * num_heads * FP32_BYTES,
             final_lse_rows * num_heads * FP32_BYTES, extra)
    return WorkspaceBytes(*(-(-n // align) * align for n in sizes))


def used_partial_slots(live_partials: int) -> int:
    """Partial slots a call allocates for a plan with ``live_partials`` (``reduce_indptr[-1]``): at least one."""
    return max(1, live_partials)


def used_workspace_bytes(live_partials: int, q_rows: int, num_heads: int,
                         v_head_dim: int = V_HEAD_DIM) -> WorkspaceBytes:
    """Workspace bytes used by one call (the module's definition)."""
    return workspace_bytes(used_partial_slots(live_partials), q_rows, num_heads, v_head_dim)


def vllm_padded_heads(num_heads: int) -> int:
    """Heads vLLM (>= 0.29) runs the FP8 prefill with: ``ceil(num_heads / 16) * 16``."""
    return math.ceil(num_heads / 16) * 16


def vllm_reserved(*, budget_sizing: bool, pads_heads: bool, info_partial_slots: int, max_num_batched_tokens: int,
                  max_num_reqs: int, num_compute_units: int, num_heads: int, num_head_k: int,
                  v_head_dim: int = V_HEAD_DIM, out_itemsize: int = 2) -> tuple[int, WorkspaceBytes]:
    """What vLLM's ``_init_fp8_prefill_ps_buffers`` reserves: ``(partial slots, bytes)``. The slots: up to vLLM
    0.30 (``budget_sizing=False``) AITER's ``reduce_partial_map`` size ``info_partial_slots``, from 0.31
    ``ceil(max_num_batched_tokens / 256) + max_num_reqs - 1 + num_compute_units``, at the padded head count
    ``num_head_k``, each buffer rounded to 256 bytes; plus (``pads_heads``: vLLM >= 0.29, when ``num_heads <
    num_head_k``) the output scratch of ``max_num_batched_tokens * num_head_k * v_head_dim * out_itemsize`` bytes."""
    p = math.ceil(max_num_batched_tokens / Q_TILE) + max_num_reqs - 1 + num_compute_units if budget_sizing \
        else info_partial_slots
    extra = max_num_batched_tokens * num_head_k * v_head_dim * out_itemsize if pads_heads and num_heads < num_head_k \
        else 0
    return p, workspace_bytes(p, max_num_batched_tokens, num_head_k, v_head_dim, align=VLLM_WORKSPACE_ALIGN,
                              extra=extra)
