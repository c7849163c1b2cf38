"""Emulator faults: named kernel and reduce bugs, injected by overriding one step of the emulator.

:class:`FaultyEmulator` is :class:`~mla_fp8_bench.aiter_ps.emulator.Emulator` with a set of the faults
of :data:`FAULT_DESCRIPTIONS`; with none it is the faithful emulator, bit for bit. Pass it where the
emulator is taken (``make_standin_aiter(emulator=...)``, ``AiterEmulated(emulator=...)``,
``run_probe(..., emulator=...)``) or call its methods directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from mla_fp8_bench.aiter_ps.emulator import Emulator, SoftmaxConsts

#: Every fault class, with what it breaks. Kernel faults act in the kernel, reduce faults in the reduce.
FAULT_DESCRIPTIONS: dict[str, str] = {
    "drop_v_descale": "kernel: v_scale ignored in the epilogue (inv = 1/l instead of v_scale/l)",
    "double_qk_descale": "kernel: q_scale*k_scale applied twice in c = softmax_scale*q_scale*k_scale",
    "no_causal_mask": "kernel: causal mask not applied (row limit = end of the work's KV range)",
    "top_left_causal": (
        "kernel: causal mask aligned top-left (key j <= i) instead of bottom-right "
        "(j <= kv_len - q_len + i); identical whenever q_len == kv_len"
    ),
    "lse_base2_mix": "kernel: split LSE written in base 2 (m*c2 + log2 l) while the reduce assumes natural log",
    "kv_tile_off_by_one": "kernel: the last KV tile of every work drops its last key (limit k1 - 1)",
    "head_swap": "kernel: heads 0 and 1 swap their output/partial slots (no effect when H == 1)",
    "lse_no_max_subtraction": (
        "reduce: exp() of the raw partial LSEs without subtracting their max "
        "(overflows to inf for LSE > ~88.7 in fp32)"
    ),
    "skip_split_tile": "reduce: the first group the reduce would run is skipped (its rows are never written)",
}
#: Faults injected into the kernel emulation.
KERNEL_FAULTS = frozenset(n for n in FAULT_DESCRIPTIONS if FAULT_DESCRIPTIONS[n].split(":")[0] == "kernel")
#: Faults injected into the reduce emulation.
REDUCE_FAULTS = frozenset(n for n in FAULT_DESCRIPTIONS if FAULT_DESCRIPTIONS[n].split(":")[0] == "reduce")
#: All injectable emulator fault names.
ALL_FAULTS = KERNEL_FAULTS | REDUCE_FAULTS


def normalize_faults(faults: Iterable[str] | str | None) -> frozenset[str]:
    """Validate a fault selection.

    Args:
        faults: ``None`` (healthy), one fault name, or an iterable of names from :data:`ALL_FAULTS`.

    Returns:
        A frozenset of fault names (empty when healthy).

    Raises:
        ValueError: a name that is not in :data:`ALL_FAULTS` (the message lists the allowed names), or
            a non-string entry.
    """
    if faults is None:
        return frozenset()
    if isinstance(faults, str):
        faults = (faults,)
    out = frozenset(faults)
    bad = sorted(repr(f) for f in out if not isinstance(f, str) or f not in ALL_FAULTS)
    if bad:
        raise ValueError(
            f"unknown fault name(s) {', '.join(bad)}: allowed {', '.join(sorted(ALL_FAULTS))}"
        )
    return out


class FaultyEmulator(Emulator):
    """The emulator with injected faults (names of :data:`ALL_FAULTS`; None or empty: healthy).

    Raises:
        ValueError: an unknown fault name.
    """

    def __init__(self, faults: Iterable[str] | str | None = None):
        self.faults = normalize_faults(faults)

    def softmax_consts(self, softmax_scale, q_scale, k_scale, v_scale) -> SoftmaxConsts:
        cs = super().softmax_consts(softmax_scale, q_scale, k_scale, v_scale)
        c, c2 = cs.c, cs.c2
        if "double_qk_descale" in self.faults:
            c = c * q_scale * k_scale
            c2 = c * torch.tensor(math.log2(math.e), dtype=torch.float32, device=c.device)
        vs = torch.ones_like(v_scale) if "drop_v_descale" in self.faults else v_scale
        return SoftmaxConsts(c=c, c2=c2, v_scale=vs)

    def kv_limit(self, k1l: int) -> int:
        return k1l - 1 if "kv_tile_off_by_one" in self.faults else k1l

    def row_limits(self, rows, q_start, q_len, kv_len, k_lim, causal) -> torch.Tensor:
        if "top_left_causal" in self.faults:
            kv_len = q_len  # diagonal at key i of row i
        return super().row_limits(rows, q_start, q_len, kv_len, k_lim, causal and "no_causal_mask" not in self.faults)

    def partial_lse(self, m, l_sum, cs) -> torch.Tensor:
        if "lse_base2_mix" in self.faults:
            return m * cs.c2 + torch.log2(l_sum)
        return super().partial_lse(m, l_sum, cs)

    def dest_heads(self, num_heads: int) -> list[int]:
        dest = super().dest_heads(num_heads)
        if "head_swap" in self.faults and num_heads >= 2:
            dest[0], dest[1] = 1, 0
        return dest

    def reduced_groups(self, groups: list[int]) -> list[int]:
        return groups[1:] if "skip_split_tile" in self.faults else groups

    def merged_lse(self, lses):
        if "lse_no_max_subtraction" not in self.faults:
            return super().merged_lse(lses)
        ssum = torch.zeros_like(lses[0])
        for x in lses:
            ssum = ssum + torch.exp(x)
        return torch.log(ssum), ssum
