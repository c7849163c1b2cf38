"""MLA prefill shapes after ``kv_b_proj``: the DeepSeek-V3 config (``qk_nope_head_dim=128``,
``qk_rope_head_dim=64``, ``v_head_dim=128``) and vLLM's ``AiterMLAImpl`` (``self.scale = qk_head_dim ** -0.5``)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

QK_NOPE_HEAD_DIM = 128
QK_ROPE_HEAD_DIM = 64
QK_HEAD_DIM = QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM  # 192
V_HEAD_DIM = 128
DEFAULT_NUM_HEADS = 16  # DeepSeek-V3 (128 heads) at TP8
#: Softmax scale 1/sqrt(192) (no YaRN mscale), as vLLM's ``AiterMLAImpl.scale``.
DEFAULT_SOFTMAX_SCALE = 1.0 / math.sqrt(QK_HEAD_DIM)


def cu_seqlens_of(lens: Iterable[int]) -> list[int]:
    """Cumulative offsets ``[0, l0, l0+l1, ...]`` of sequence lengths (``cu_seqlens`` / ``qo_indptr`` form)."""
    return [0, *itertools.accumulate(lens)]
