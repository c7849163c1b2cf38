"""Pure-Python port of AITER's persistent-scheduling (PS) prefill planner.

Ports two AITER functions so that the suite can plan, inspect and emulate the FP8 MLA prefill
without ROCm:

* ``get_ps_metadata_info_v1`` (``aiter/ops/attention.py``) -> :func:`ps_metadata_info`, the six
  buffer ``(shape, dtype)`` pairs used to pre-allocate the planner's outputs;
* ``get_ps_metadata_v1`` (``csrc/kernels/mla/metadata.cu`` ->
  ``get_ps_metadata_v1_2_host`` / ``kn_generate_ps_metadata`` / ``generate_reduce_info`` in
  ``csrc/kernels/mla/metadata/v1_2_host.cuh``, ``WorkInfo`` in ``csrc/include/ps.h``) ->
  :func:`plan_ps_prefill` (returns a :class:`PsPlan`) and :func:`fill_aiter_buffers` (writes a plan
  into caller-provided buffers, as the real host function does).

Reference: AITER commit ``e4048607a535`` (2026-08-22). Written from the suite's contract
``shared/docs/aiter-ps-prefill-contract.md`` sections 3.1, 3.2, 5 and 6 (the algorithm's
pseudo-code is section 6) and checked element by element against the golden vectors of AITER's
real host planner in ``shared/data/ps_planner_golden.json.gz`` (``tests/test_planner.py``).

Algorithm summary (contract section 6). The ``cu_num`` workgroups ("TGs") are split into
``C = gcd(num_heads_k, cu_num)`` clusters of ``T = cu_num // C`` TGs; cluster ``c`` serves the
``num_heads_k // C`` contiguous heads ``[c*hpc, (c+1)*hpc)``. Every sequence is cut into 256-row
q-tiles, visited in ping-pong order (0, n-1, 1, n-2, ...); each tile costs
``ceil(eff_kv / kvlen_granularity)`` units, where ``eff_kv`` is the causally visible KV length of
its last row. The units are dealt out evenly to the ``T`` TGs of a cluster (the first
``units % T`` TGs get one more); a tile that does not fit into a TG's remaining capacity is split
at the capacity, and the pieces of a split tile get 256-row partial slots ``256*p`` (``p`` counts
per cluster), which the reduce merges. Every cluster and every head of a cluster receive the
identical tiling, so all heads share the same partial rows.

Block sizes above 1 (not used by the PS kernel, which runs at page size 1, and not covered by the
golden vectors): the contract's pseudo-code compares the remaining KV *tokens* with the capacity in
*blocks*, leaves a split piece's ``kv_end`` unclipped and computes ``kv_offset`` in pages. Those
three expressions coincide with AITER's at ``block_size=1``; for larger blocks this port follows
AITER's host source (capacity compared in tokens, ``kv_end`` clipped to the sequence's pages,
``kv_offset`` in tokens), which keeps every KV range inside its sequence.

Everything here is plain Python integers (truncating, C-style division where AITER divides signed
ints) with one ``torch.tensor`` build per buffer at the end, so planning is cheap even for
``B=16 x 16k`` tokens at 128 heads.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "AITER_COMMIT",
    "AITER_PLANNER_SOURCE",
    "BUFFER_NAMES",
    "BUFFER_LENGTH_KEYS",
    "Q_TILE",
    "WORK_INFO_FIELDS",
    "PsPlan",
    "PsPlanError",
    "buffer_lengths_from_info",
    "fill_aiter_buffers",
    "plan_ps_prefill",
    "ps_metadata_info",
]

AITER_COMMIT = "e4048607a535"
"""AITER commit the port follows (``e4048607a535ace3a2b51ded31b1c8c2d45c0879``, 2026-08-22)."""

AITER_PLANNER_SOURCE = "csrc/kernels/mla/metadata/v1_2_host.cuh"
"""AITER file holding the host planner that :func:`plan_ps_prefill` ports."""

Q_TILE = 256
"""Rows per q-tile (``qlen_granularity``); also the row stride of one partial slot."""

WORK_INFO_FIELDS = (
    "batch_idx",
    "partial_o_loc",
    "qo_start",
    "qo_end",
    "kv_start",
    "kv_end",
    "kv_offset",
    "q_head_range",
)
"""Column names of a ``work_info`` row (AITER ``WorkInfo`` in ``csrc/include/ps.h``)."""

BUFFER_NAMES = (
    "work_metadata_ptrs",
    "work_indptr",
    "work_info",
    "reduce_indptr",
    "reduce_final_map",
    "reduce_partial_map",
)
"""The six planner buffers, in AITER's order (also the keys of :func:`ps_metadata_info`)."""

BUFFER_LENGTH_KEYS = (
    "work_metadata_ptrs",
    "work_indptr",
    "work_info_rows",
    "reduce_indptr",
    "reduce_final_map_rows",
    "reduce_partial_map",
)
"""Keys of a buffer-length dict (as in the golden file's ``outputs.buffer_lengths``)."""

_INT32_MAX = 2**31 - 1
_MAX_HEADS = 0xFFFF  # q_head_range packs first/end head as two 16-bit fields


class PsPlanError(ValueError):
    """Invalid planner input, or a buffer too small for a plan (a ``ValueError``)."""


# ----------------------------------------------------------------------------------------------
# small integer helpers
# ----------------------------------------------------------------------------------------------


def _c_div(a: int, b: int) -> int:
    """C/C++ signed integer division: truncates toward zero (unlike Python's ``//``)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ``a >= 0, b > 0`` in exact integer arithmetic."""
    return -(-a // b)


def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and hasattr(type(v), "__index__")


def _as_int(name: str, v: Any, *, minimum: int | None = None, allowed: str = "") -> int:
    if not _is_int(v):
        raise PsPlanError(f"{name}={v!r} is not an integer{': ' + allowed if allowed else ''}")
    v = operator.index(v)
    if minimum is not None and v < minimum:
        raise PsPlanError(f"{name}={v} is invalid: {allowed or f'must be >= {minimum}'}")
    return v


def _as_int_list(name: str, x: Any) -> list[int]:
    """A 1-D list of Python ints from a list/tuple/int tensor/array; ``PsPlanError`` otherwise."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise PsPlanError(f"{name} has dtype {x.dtype}: an integer tensor (e.g. torch.int32) is required")
        if x.dim() != 1:
            raise PsPlanError(f"{name} has shape {tuple(x.shape)}: a 1-D tensor is required")
        return [int(v) for v in x.detach().cpu().tolist()]
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise PsPlanError(f"{name}={x!r} is not a 1-D sequence of integers (list, tuple or int tensor)")
    out = []
    for i, v in enumerate(x):
        if not _is_int(v):
            raise PsPlanError(f"{name}[{i}]={v!r} is not an integer")
        out.append(operator.index(v))
    return out


def _check_indptr(name: str, p: list[int], expect_len: int | None) -> None:
    if expect_len is None and len(p) < 2:
        raise PsPlanError(f"{name} has length {len(p)}: need B+1 >= 2 entries (at least one sequence)")
    if expect_len is not None and len(p) != expect_len:
        raise PsPlanError(
            f"{name} has length {len(p)} but seqlens_qo_indptr has {expect_len}: both must have B+1 entries"
        )
    if p[0] != 0:
        raise PsPlanError(f"{name}[0]={p[0]} is invalid: an indptr must start at 0")
    for i in range(len(p) - 1):
        if p[i + 1] < p[i]:
            raise PsPlanError(
                f"{name}[{i + 1}]={p[i + 1]} < {name}[{i}]={p[i]}: an indptr must be non-decreasing"
            )
    if p[-1] > _INT32_MAX:
        raise PsPlanError(f"{name}[-1]={p[-1]} does not fit in int32 (max {_INT32_MAX})")


# ----------------------------------------------------------------------------------------------
# get_ps_metadata_info_v1
# ----------------------------------------------------------------------------------------------


def ps_metadata_info(
    batch_size: int,
    num_heads_k: int,
    max_qlen: int,
    qlen_granularity: int = 256,
    *,
    cu_num: int,
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Buffer shapes and dtypes for the PS planner (port of AITER ``get_ps_metadata_info_v1``).

    AITER reads ``cu_num`` from the current device's ``multi_processor_count`` (256 on MI355X);
    here it is an explicit keyword so layouts for any device can be computed on a CPU.

    With ``C = gcd(num_heads_k, cu_num)``, ``cpc = cu_num // C`` (TGs per cluster),
    ``mqs = ceil(max_qlen / qlen_granularity)`` and ``tiles = batch_size * mqs``
    (contract section 3.1):

    ======================  ===================================================  ========
    buffer                  shape                                                dtype
    ======================  ===================================================  ========
    ``work_metadata_ptrs``  ``(2,)``  (unused by PS, but must be passed)          uint64
    ``work_indptr``         ``(cu_num + 1,)``                                    int32
    ``work_info``           ``((batch_size + cpc - 1) * mqs * num_heads_k, 8)``  int32
    ``reduce_indptr``       ``(tiles + 1,)``                                     int32
    ``reduce_final_map``    ``(tiles, 2)``                                       int32
    ``reduce_partial_map``  ``(min(batch_size + cpc - 1, 2*(cpc - 1)) * mqs,)``  int32
    ======================  ===================================================  ========

    These are upper bounds and can be very loose; a plan's live sizes are
    :attr:`PsPlan.num_works`, :attr:`PsPlan.num_reduce_groups` and :attr:`PsPlan.num_partials`.

    Args:
        batch_size: number of sequences B (>= 0).
        num_heads_k: KV heads (>= 1).
        max_qlen: longest q length (>= 0).
        qlen_granularity: q-tile rows (>= 1; the PS kernel uses 256).
        cu_num: device CU count (>= 1).

    Returns:
        ``{name: (shape, dtype_name)}`` for the six names of :data:`BUFFER_NAMES`, in that order;
        dtype names are ``"uint64"`` / ``"int32"`` (``getattr(torch, name)`` gives the dtype).

    Raises:
        PsPlanError (a ValueError): a non-integer or out-of-range argument.

    Source: AITER ``e4048607a535``, ``aiter/ops/attention.py``; contract section 3.1.
    """
    batch_size = _as_int("batch_size", batch_size, minimum=0, allowed="must be an integer >= 0")
    num_heads_k = _as_int("num_heads_k", num_heads_k, minimum=1, allowed="must be an integer >= 1")
    max_qlen = _as_int("max_qlen", max_qlen, minimum=0, allowed="must be an integer >= 0")
    qlen_granularity = _as_int(
        "qlen_granularity", qlen_granularity, minimum=1, allowed="must be an integer >= 1 (256 for the PS kernel)"
    )
    cu_num = _as_int("cu_num", cu_num, minimum=1, allowed="must be an integer >= 1 (the device CU count)")

    cpc = cu_num // math.gcd(num_heads_k, cu_num)
    mqs = _ceil_div(max_qlen, qlen_granularity)
    tiles = batch_size * mqs
    return {
        "work_metadata_ptrs": ((2,), "uint64"),
        "work_indptr": ((cu_num + 1,), "int32"),
        "work_info": (((batch_size + cpc - 1) * mqs * num_heads_k, 8), "int32"),
        "reduce_indptr": ((tiles + 1,), "int32"),
        "reduce_final_map": ((tiles, 2), "int32"),
        "reduce_partial_map": ((min(batch_size + cpc - 1, 2 * (cpc - 1)) * mqs,), "int32"),
    }


def buffer_lengths_from_info(info: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, int]:
    """Leading dims of :func:`ps_metadata_info`'s shapes, keyed as in :data:`BUFFER_LENGTH_KEYS`."""
    return {
        "work_metadata_ptrs": info["work_metadata_ptrs"][0][0],
        "work_indptr": info["work_indptr"][0][0],
        "work_info_rows": info["work_info"][0][0],
        "reduce_indptr": info["reduce_indptr"][0][0],
        "reduce_final_map_rows": info["reduce_final_map"][0][0],
        "reduce_partial_map": info["reduce_partial_map"][0][0],
    }


_LENGTH_ALIASES = {"work_info": "work_info_rows", "reduce_final_map": "reduce_final_map_rows"}


def _normalise_buffer_lengths(given: Mapping[str, Any], default: dict[str, int]) -> dict[str, int]:
    out = dict(default)
    for key, val in given.items():
        canon = _LENGTH_ALIASES.get(key, key)
        if canon not in out:
            raise PsPlanError(
                f"buffer_lengths has unknown key {key!r}: allowed {', '.join(BUFFER_LENGTH_KEYS)}"
                f" (or the buffer names {', '.join(BUFFER_NAMES)})"
            )
        if isinstance(val, tuple) and len(val) == 2 and isinstance(val[0], (tuple, list)):
            val = val[0]  # a (shape, dtype) pair from ps_metadata_info
        if isinstance(val, (tuple, list, torch.Size)):
            if len(val) == 0:
                raise PsPlanError(f"buffer_lengths[{key!r}]={val!r} is an empty shape")
            val = val[0]
        out[canon] = _as_int(f"buffer_lengths[{key!r}]", val, minimum=0, allowed="must be an integer >= 0")
    return out


# ----------------------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class PsPlan:
    """Output of :func:`plan_ps_prefill`: AITER's PS metadata, as int32 CPU tensors.

    Every tensor has the full length of the buffer the real planner would fill (by default the
    :func:`ps_metadata_info` sizes, else the ``buffer_lengths`` given to :func:`plan_ps_prefill`),
    with the tails exactly as the real planner leaves them (it zero-fills its host vectors and
    copies the whole buffers back):

    * ``work_indptr`` ``[cu_num + 1]`` int32: workgroup ``g`` runs
      ``work_info[work_indptr[g]:work_indptr[g + 1]]`` in order; ``work_indptr[-1] == num_works``
      (entries past ``cu_num`` in a longer buffer are 0).
    * ``work_info`` ``[max_works, 8]`` int32; rows past ``num_works`` are 0. Columns
      (:data:`WORK_INFO_FIELDS`, AITER ``WorkInfo``):

      0. ``batch_idx`` - sequence index b;
      1. ``partial_o_loc`` - -1: the tile is not split, the kernel writes bf16 to ``output``;
         otherwise a row offset (multiple of 256) into ``splitData``/``splitLse``;
      2. ``qo_start``, 3. ``qo_end`` - global q-token rows of the tile, end exclusive;
      4. ``kv_start``, 5. ``kv_end`` - global indices into ``kv_page_indices`` (pages; tokens at
         ``block_size=1``), end exclusive; ``kv_start`` is a multiple of ``kvlen_granularity``
         tokens (``kvlen_granularity // block_size`` pages) from the sequence start;
      6. ``kv_offset`` - KV tokens of the sequence left after ``kv_end`` for a split piece, else 0
         (ignored by the kernel);
      7. ``q_head_range`` - ``first_head | (end_head << 16)``, one head per work.

    * ``reduce_indptr`` ``[tiles + 1]`` int32: reduce group ``g`` merges the partial slots
      ``reduce_partial_map[reduce_indptr[g]:reduce_indptr[g + 1]]``; entries after
      ``num_reduce_groups`` all equal ``num_partials`` (= ``reduce_indptr[-1]``).
    * ``reduce_final_map`` ``[tiles, 2]`` int32: group ``g``'s ``[qo_start, qo_end)``; unused rows 0.
    * ``reduce_partial_map`` ``[n]`` int32: each group's partial row offsets (multiples of 256),
      ascending; entries past ``num_partials`` are 0.

    Scalars: ``num_works`` (used ``work_info`` rows), ``num_reduce_groups`` (split tiles),
    ``num_partials`` (distinct partial slots; ``splitData``/``splitLse`` need
    ``256 * num_partials`` rows, see :attr:`partial_rows`), ``cu_num`` and ``num_heads_k``.

    The dataclass is frozen, but the tensors are ordinary tensors: do not modify them in place.

    Source: AITER ``e4048607a535``, ``csrc/kernels/mla/metadata/v1_2_host.cuh`` and
    ``csrc/include/ps.h``; contract sections 3.2 and 5.
    """

    work_indptr: torch.Tensor
    work_info: torch.Tensor
    reduce_indptr: torch.Tensor
    reduce_final_map: torch.Tensor
    reduce_partial_map: torch.Tensor
    num_works: int
    num_reduce_groups: int
    num_partials: int
    cu_num: int
    num_heads_k: int

    def __repr__(self) -> str:
        return (
            f"PsPlan(cu_num={self.cu_num}, num_heads_k={self.num_heads_k}, num_works={self.num_works},"
            f" num_reduce_groups={self.num_reduce_groups}, num_partials={self.num_partials},"
            f" buffer_lengths={self.buffer_lengths})"
        )

    @property
    def num_clusters(self) -> int:
        """``gcd(num_heads_k, cu_num)``: clusters of TGs, each serving ``num_heads_k // C`` heads."""
        return math.gcd(self.num_heads_k, self.cu_num)

    @property
    def tgs_per_cluster(self) -> int:
        """``cu_num // num_clusters``: workgroups (TGs) per cluster."""
        return self.cu_num // self.num_clusters

    @property
    def used_work_info(self) -> torch.Tensor:
        """``work_info[:num_works]`` (a view), shape ``[num_works, 8]``."""
        return self.work_info[: self.num_works]

    @property
    def used_reduce_indptr(self) -> torch.Tensor:
        """``reduce_indptr[:num_reduce_groups + 1]`` (a view)."""
        return self.reduce_indptr[: self.num_reduce_groups + 1]

    @property
    def used_reduce_final_map(self) -> torch.Tensor:
        """``reduce_final_map[:num_reduce_groups]`` (a view), shape ``[num_reduce_groups, 2]``."""
        return self.reduce_final_map[: self.num_reduce_groups]

    @property
    def used_reduce_partial_map(self) -> torch.Tensor:
        """``reduce_partial_map[:num_partials]`` (a view)."""
        return self.reduce_partial_map[: self.num_partials]

    @property
    def partial_rows(self) -> int:
        """Rows ``splitData``/``splitLse`` need: ``256 * num_partials`` (all heads share them)."""
        return Q_TILE * self.num_partials

    @property
    def buffer_lengths(self) -> dict[str, int]:
        """Leading dims of the buffers, keyed as in :data:`BUFFER_LENGTH_KEYS`."""
        return {
            "work_metadata_ptrs": 2,
            "work_indptr": int(self.work_indptr.shape[0]),
            "work_info_rows": int(self.work_info.shape[0]),
            "reduce_indptr": int(self.reduce_indptr.shape[0]),
            "reduce_final_map_rows": int(self.reduce_final_map.shape[0]),
            "reduce_partial_map": int(self.reduce_partial_map.shape[0]),
        }

    def works_of(self, tg: int) -> torch.Tensor:
        """The ``work_info`` rows workgroup ``tg`` (0 <= tg < cu_num) runs, in order (a view)."""
        tg = _as_int("tg", tg)
        if not 0 <= tg < self.cu_num:
            raise PsPlanError(f"tg={tg} is out of range: 0 <= tg < cu_num={self.cu_num}")
        lo, hi = int(self.work_indptr[tg]), int(self.work_indptr[tg + 1])
        return self.work_info[lo:hi]


# ----------------------------------------------------------------------------------------------
# get_ps_metadata_v1
# ----------------------------------------------------------------------------------------------


def _ping_pong(n: int) -> list[int]:
    """Tile visiting order 0, n-1, 1, n-2, ... (pairs heavy and light causal tiles)."""
    order = []
    lo, hi = 0, n - 1
    while lo <= hi:
        order.append(lo)
        if hi != lo:
            order.append(hi)
        lo += 1
        hi -= 1
    return order


def plan_ps_prefill(
    qo_indptr: Sequence[int] | torch.Tensor,
    kv_indptr: Sequence[int] | torch.Tensor,
    context_lens: Sequence[int] | torch.Tensor,
    *,
    num_heads_k: int,
    cu_num: int,
    gqa_ratio: int = 1,
    qhead_granularity: int = 1,
    qlen_granularity: int = 256,
    kvlen_granularity: int = 128,
    block_size: int = 1,
    is_causal: bool = True,
    buffer_lengths: Mapping[str, Any] | None = None,
) -> PsPlan:
    """Plan a PS prefill exactly as AITER's host ``get_ps_metadata_v1`` does.

    Args:
        qo_indptr: ``seqlens_qo_indptr`` ``[B+1]``: cumulative q lengths (starts at 0,
            non-decreasing). A list/tuple of ints or a 1-D integer tensor (any device).
        kv_indptr: ``pages_kv_indptr`` ``[B+1]``: cumulative KV pages (tokens at ``block_size=1``).
        context_lens: ``[B]`` KV tokens per sequence; at ``block_size=1`` it must equal
            ``kv_indptr[b+1] - kv_indptr[b]``, otherwise at most ``pages * block_size``.
        num_heads_k: KV heads (1 .. 65535; H_q == H_kv for the PS kernel).
        cu_num: device CU count (``multiProcessorCount``; 256 on MI355X).
        gqa_ratio, qhead_granularity: only 1 is supported (the only PS prefill configuration:
            MHA, one head per work).
        qlen_granularity: q-tile rows; only 256 is supported (the kernel's tile).
        kvlen_granularity: KV split granularity in tokens, a power of two >= ``block_size`` and a
            multiple of it (AITER asserts ``kvlen_granularity % block_size == 0``); use
            ``max(128, block_size)`` = 128 (AITER's binding default is 1).
        block_size: tokens per KV page (>= 1); the PS kernel runs at 1.
        is_causal: bottom-right causal (local query i sees key j iff ``j <= kv_len - q_len + i``);
            requires ``q_len <= kv_len`` for every sequence.
        buffer_lengths: leading dims of the buffers the real planner would fill, keyed as in
            :data:`BUFFER_LENGTH_KEYS` (``work_info``/``reduce_final_map`` are accepted as
            aliases of the ``*_rows`` keys; values may be ints or ``(shape, dtype)`` pairs, so a
            :func:`ps_metadata_info` dict works). Missing keys default to
            ``ps_metadata_info(B, num_heads_k, max_qlen, 256, cu_num=cu_num)``.

    Returns:
        A :class:`PsPlan` with buffers of exactly the requested lengths.

    Raises:
        PsPlanError (a ValueError) naming the bad value, for: a non-integer or wrongly shaped
        input; indptrs not starting at 0, decreasing, of different lengths, or with fewer than 2
        entries; ``len(context_lens) != B``; negative or inconsistent ``context_lens``;
        ``num_heads_k`` outside 1..65535; ``cu_num < 1``; ``gqa_ratio``/``qhead_granularity`` != 1;
        ``qlen_granularity != 256``; ``kvlen_granularity`` not a power of two, below
        ``block_size`` or not a multiple of it; ``block_size < 1``; causal with
        ``q_len > kv_len`` (AITER's unit count goes negative there: undefined behaviour); values
        beyond int32; a ``buffer_lengths`` entry too small for the plan (the real planner would
        overrun host memory there).

    Source: AITER ``e4048607a535``, ``csrc/kernels/mla/metadata/v1_2_host.cuh``
    (``get_ps_metadata_v1_2_host``, ``kn_generate_ps_metadata``, ``generate_reduce_info``);
    contract sections 3.2, 5 and 6.
    """
    # ---- validation ---------------------------------------------------------------------------
    num_heads_k = _as_int("num_heads_k", num_heads_k)
    if not 1 <= num_heads_k <= _MAX_HEADS:
        raise PsPlanError(
            f"num_heads_k={num_heads_k} is invalid: must be in 1..{_MAX_HEADS}"
            " (q_head_range packs head indices into 16 bits)"
        )
    cu_num = _as_int("cu_num", cu_num, minimum=1, allowed="must be an integer >= 1 (the device CU count)")
    for name, val in (("gqa_ratio", gqa_ratio), ("qhead_granularity", qhead_granularity)):
        v = _as_int(name, val)
        if v != 1:
            raise PsPlanError(
                f"{name}={v} is not supported: only {name}=1 is (the PS prefill is MHA, H_q == H_kv,"
                " one head per work)"
            )
    qlen_granularity = _as_int("qlen_granularity", qlen_granularity)
    if qlen_granularity != Q_TILE:
        raise PsPlanError(
            f"qlen_granularity={qlen_granularity} is not supported: only {Q_TILE} is (the PS kernel's q-tile)"
        )
    block_size = _as_int("block_size", block_size, minimum=1, allowed="must be an integer >= 1")
    kvlen_granularity = _as_int("kvlen_granularity", kvlen_granularity)
    if kvlen_granularity < 1 or kvlen_granularity & (kvlen_granularity - 1):
        raise PsPlanError(
            f"kvlen_granularity={kvlen_granularity} is invalid: must be a power of two (use 128)"
        )
    if kvlen_granularity < block_size or kvlen_granularity % block_size:
        raise PsPlanError(
            f"kvlen_granularity={kvlen_granularity} is invalid: must be >= block_size={block_size} and a"
            " multiple of it (use max(128, block_size))"
        )
    if not isinstance(is_causal, bool):
        if _is_int(is_causal) and operator.index(is_causal) in (0, 1):
            is_causal = bool(operator.index(is_causal))
        else:
            raise PsPlanError(f"is_causal={is_causal!r} is invalid: must be a bool")

    qo = _as_int_list("qo_indptr", qo_indptr)
    kv = _as_int_list("kv_indptr", kv_indptr)
    ctx = _as_int_list("context_lens", context_lens)
    _check_indptr("qo_indptr", qo, None)
    _check_indptr("kv_indptr", kv, len(qo))
    nb = len(qo) - 1
    if len(ctx) != nb:
        raise PsPlanError(f"context_lens has length {len(ctx)}: must have B={nb} entries (len(qo_indptr) - 1)")
    for b in range(nb):
        c, pages, qlen = ctx[b], kv[b + 1] - kv[b], qo[b + 1] - qo[b]
        if c < 0:
            raise PsPlanError(f"context_lens[{b}]={c} is invalid: must be >= 0")
        if block_size == 1 and c != pages:
            raise PsPlanError(
                f"context_lens[{b}]={c} != kv_indptr[{b + 1}] - kv_indptr[{b}] = {pages}:"
                " at block_size=1 they must be equal (one token per page)"
            )
        if c > pages * block_size:
            raise PsPlanError(
                f"context_lens[{b}]={c} exceeds the sequence's {pages} pages x block_size={block_size}"
            )
        if is_causal and qlen > c:
            raise PsPlanError(
                f"sequence {b}: q_len={qlen} > kv_len={c} with is_causal=True is not supported:"
                " AITER's planner is undefined there (negative unit count); causal needs q_len <= kv_len"
            )

    max_qlen = max(qo[b + 1] - qo[b] for b in range(nb))
    lengths = buffer_lengths_from_info(ps_metadata_info(nb, num_heads_k, max_qlen, Q_TILE, cu_num=cu_num))
    if buffer_lengths is not None:
        if not isinstance(buffer_lengths, Mapping):
            raise PsPlanError(f"buffer_lengths={buffer_lengths!r} must be a dict or None")
        lengths = _normalise_buffer_lengths(buffer_lengths, lengths)

    # ---- q-tiles in ping-pong order and their cost ---------------------------------------------
    blocks_per_unit = kvlen_granularity // block_size  # G
    tiles: list[tuple[int, int, int, int, int]] = []  # (batch, qs, qe, eff_kv, blocks), local rows
    total_units = 0
    for b in range(nb):
        qlen, kvlen = qo[b + 1] - qo[b], ctx[b]
        for i in _ping_pong(_ceil_div(qlen, Q_TILE)):
            qs = Q_TILE * i
            qe = min(qs + Q_TILE, qlen)
            eff = min(kvlen - qlen + qe, kvlen) if is_causal else kvlen
            units = _c_div(eff + kvlen_granularity - 1, kvlen_granularity)
            total_units += units
            tiles.append((b, qs, qe, eff, units * blocks_per_unit))

    num_clusters = math.gcd(num_heads_k, cu_num)  # C
    tgs = cu_num // num_clusters  # T
    heads_per_cluster = num_heads_k // num_clusters
    avg, rem = divmod(total_units, tgs)

    # ---- the tiling of one cluster -------------------------------------------------------------
    # Capacities and cursors count blocks (pages); eff/remaining KV count tokens. At block_size=1
    # the two coincide (the contract's pseudo-code); for larger blocks the comparison, the split
    # piece's clipping and kv_offset follow AITER's host source (see the module docstring).
    # AITER runs this loop per cluster and, inside a TG, once per head of the cluster, restoring
    # (cur_tile, cur_blk, p) before each head. Every head of a TG therefore emits the same rows and
    # leaves the same state, and every cluster (partial counter restarted) repeats the same tiling.
    # So one pass over the TGs gives the per-head rows of every TG; heads and clusters are stamped
    # on below. The golden test checks the result against AITER's output element by element.
    rows: list[tuple[int, int, int, int, int, int, int]] = []
    tg_bounds: list[int] = [0]
    cur_tile, cur_blk, p = 0, 0, 0
    ntiles = len(tiles)
    for t in range(tgs):
        cap = (avg + (1 if t < rem else 0)) * blocks_per_unit  # in blocks (pages)
        while cur_tile < ntiles and cap > 0:
            b, qs, qe, eff, blocks = tiles[cur_tile]
            kv_start = kv[b] + cur_blk
            if eff - cur_blk * block_size <= cap * block_size:  # the rest of the tile fits
                if cur_blk == 0:
                    loc = -1
                else:
                    loc = Q_TILE * p
                    p += 1
                kv_end = min(kv_start + blocks - cur_blk, kv[b + 1])
                kv_off = 0
                cap -= blocks - cur_blk
                cur_tile += 1
                cur_blk = 0
            else:  # split the tile at the capacity
                loc = Q_TILE * p
                p += 1
                kv_end = min(kv_start + cap, kv[b + 1])
                kv_off = ctx[b] - (kv_end - kv[b]) * block_size
                cur_blk += cap
                cap = 0
            rows.append((b, loc, qo[b] + qs, qo[b] + qe, kv_start, kv_end, kv_off))
        tg_bounds.append(len(rows))

    works_per_cluster = heads_per_cluster * len(rows)
    num_works = num_clusters * works_per_cluster

    # ---- reduce info: split tiles grouped by (qo_start, qo_end), lexicographic ------------------
    groups: dict[tuple[int, int], set[int]] = {}
    for r in rows:
        if r[1] != -1:
            groups.setdefault((r[2], r[3]), set()).add(r[1])
    keys = sorted(groups)
    partial_map: list[int] = []
    indptr = [0]
    for k in keys:
        partial_map.extend(sorted(groups[k]))
        indptr.append(len(partial_map))
    num_groups = len(keys)
    num_partials = len(partial_map)

    # ---- size checks (the real planner writes without bounds checks) ---------------------------
    for key, need in (
        ("work_indptr", cu_num + 1),
        ("work_info_rows", num_works),
        ("reduce_indptr", num_groups + 1),
        ("reduce_final_map_rows", num_groups),
        ("reduce_partial_map", num_partials),
    ):
        if lengths[key] < need:
            raise PsPlanError(
                f"buffer_lengths[{key!r}]={lengths[key]} is too small: this plan needs {need}"
                " (AITER would write past the buffer)"
            )
    if num_works > _INT32_MAX:
        raise PsPlanError(f"num_works={num_works} does not fit in int32")

    # ---- work_indptr ---------------------------------------------------------------------------
    wind = [0] * lengths["work_indptr"]
    for c in range(num_clusters):
        base = c * works_per_cluster
        for t in range(tgs):
            wind[c * tgs + t + 1] = base + heads_per_cluster * tg_bounds[t + 1]

    # ---- work_info: rows of one cluster, then stamped per cluster ------------------------------
    work_info = torch.zeros((lengths["work_info_rows"], 8), dtype=torch.int32)
    if num_works:
        template = torch.tensor(rows, dtype=torch.int64)  # [R, 7]
        idx: list[int] = []
        head_local: list[int] = []
        for t in range(tgs):
            lo, hi = tg_bounds[t], tg_bounds[t + 1]
            for j in range(heads_per_cluster):
                idx.extend(range(lo, hi))
                head_local.extend([j] * (hi - lo))
        block = template[torch.tensor(idx, dtype=torch.int64)]  # [works_per_cluster, 7]
        heads = torch.tensor(head_local, dtype=torch.int64)[None, :] + (
            torch.arange(num_clusters, dtype=torch.int64) * heads_per_cluster
        )[:, None]  # [C, works_per_cluster]
        q_head_range = heads | ((heads + 1) << 16)
        if num_heads_k >= 2**15:  # end head >= 32768: int32 two's complement, as in C++
            q_head_range = (q_head_range + 2**31) % 2**32 - 2**31
        used = work_info[:num_works].view(num_clusters, works_per_cluster, 8)
        used[:, :, :7] = block.to(torch.int32).unsqueeze(0)  # broadcast over clusters
        used[:, :, 7] = q_head_range.to(torch.int32)

    # ---- reduce buffers --------------------------------------------------------------------------
    rind = indptr + [num_partials] * (lengths["reduce_indptr"] - len(indptr))
    rfm = torch.zeros((lengths["reduce_final_map_rows"], 2), dtype=torch.int32)
    if num_groups:
        rfm[:num_groups] = torch.tensor(keys, dtype=torch.int32)
    rpm = partial_map + [0] * (lengths["reduce_partial_map"] - num_partials)

    return PsPlan(
        work_indptr=torch.tensor(wind, dtype=torch.int32),
        work_info=work_info,
        reduce_indptr=torch.tensor(rind, dtype=torch.int32),
        reduce_final_map=rfm,
        reduce_partial_map=torch.tensor(rpm, dtype=torch.int32),
        num_works=num_works,
        num_reduce_groups=num_groups,
        num_partials=num_partials,
        cu_num=cu_num,
        num_heads_k=num_heads_k,
    )


# ----------------------------------------------------------------------------------------------
# writing a plan into AITER-style buffers
# ----------------------------------------------------------------------------------------------


def _check_buffer(name: str, buf: Any, ndim: int, last: int | None, need: int) -> None:
    if not isinstance(buf, torch.Tensor):
        raise PsPlanError(f"{name} must be a torch.Tensor, got {type(buf).__name__}")
    if buf.dtype != torch.int32:
        raise PsPlanError(f"{name} has dtype {buf.dtype}: must be torch.int32")
    if buf.dim() != ndim or (last is not None and buf.shape[-1] != last):
        want = "[n]" if ndim == 1 else f"[n, {last}]"
        raise PsPlanError(f"{name} has shape {tuple(buf.shape)}: must be {want}")
    if not buf.is_contiguous():
        raise PsPlanError(f"{name} is not contiguous: AITER writes it as raw contiguous memory")
    if buf.shape[0] < need:
        raise PsPlanError(
            f"{name} has {buf.shape[0]} {'entries' if ndim == 1 else 'rows'} but the plan needs {need}"
            " (AITER's planner would write past it and corrupt memory)"
        )


def fill_aiter_buffers(
    plan: PsPlan,
    work_metadata_ptrs: torch.Tensor,
    work_indptr: torch.Tensor,
    work_info: torch.Tensor,
    reduce_indptr: torch.Tensor,
    reduce_final_map: torch.Tensor,
    reduce_partial_map: torch.Tensor,
) -> None:
    """Write ``plan`` into caller-provided buffers in place, like AITER's ``get_ps_metadata_v1``.

    The buffers are the six of :func:`ps_metadata_info` (any device; typically allocated from
    those shapes). As the real planner does, the *whole* of each buffer is written: the used part
    from the plan and the tail as AITER leaves it (0, except ``reduce_indptr``, whose tail holds
    ``num_partials``). The plan's content does not depend on the buffer sizes, so buffers of other
    lengths than the plan's are fine as long as the used parts fit. ``work_metadata_ptrs`` (uint64
    ``[2]``, unused by PS) is only size-checked, never written.

    Args:
        plan: from :func:`plan_ps_prefill`.
        work_metadata_ptrs: >= 2 elements, any dtype.
        work_indptr: int32 ``[>= cu_num + 1]``.
        work_info: int32 ``[>= num_works, 8]``.
        reduce_indptr: int32 ``[>= num_reduce_groups + 1]``.
        reduce_final_map: int32 ``[>= num_reduce_groups, 2]``.
        reduce_partial_map: int32 ``[>= num_partials]``.

    Raises:
        PsPlanError (a ValueError): a buffer that is not a contiguous int32 tensor of the right rank,
        or too small for the plan (AITER does not check and silently corrupts host memory; this
        port rejects instead). Nothing is written when an error is raised.

    Source: AITER ``e4048607a535``, ``csrc/kernels/mla/metadata.cu`` /
    ``csrc/kernels/mla/metadata/v1_2_host.cuh``; contract sections 3.2 and 5.
    """
    if not isinstance(plan, PsPlan):
        raise PsPlanError(f"plan must be a PsPlan, got {type(plan).__name__}")
    if not isinstance(work_metadata_ptrs, torch.Tensor):
        raise PsPlanError(f"work_metadata_ptrs must be a torch.Tensor, got {type(work_metadata_ptrs).__name__}")
    if work_metadata_ptrs.numel() < 2:
        raise PsPlanError(f"work_metadata_ptrs has {work_metadata_ptrs.numel()} elements: needs 2 (uint64 [2])")
    nw, ng, npart = plan.num_works, plan.num_reduce_groups, plan.num_partials
    _check_buffer("work_indptr", work_indptr, 1, None, plan.cu_num + 1)
    _check_buffer("work_info", work_info, 2, 8, nw)
    _check_buffer("reduce_indptr", reduce_indptr, 1, None, ng + 1)
    _check_buffer("reduce_final_map", reduce_final_map, 2, 2, ng)
    _check_buffer("reduce_partial_map", reduce_partial_map, 1, None, npart)

    def _write(dst: torch.Tensor, src_used: torch.Tensor, n: int, fill: int = 0) -> None:
        tmp = torch.full(tuple(dst.shape), fill, dtype=torch.int32)
        tmp[:n] = src_used[:n]
        dst.copy_(tmp)

    _write(work_indptr, plan.work_indptr, plan.cu_num + 1)
    _write(work_info, plan.work_info, nw)
    _write(reduce_indptr, plan.reduce_indptr, ng + 1, fill=npart)
    _write(reduce_final_map, plan.reduce_final_map, ng)
    _write(reduce_partial_map, plan.reduce_partial_map, npart)
