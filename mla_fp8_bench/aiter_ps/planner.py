"""Pure-Python port of AITER's PS prefill planner at every ``facts.PLANNER_REVISIONS``: ``get_ps_metadata_info_v1``
is :func:`ps_metadata_info`, ``get_ps_metadata_v1`` :func:`plan_ps_prefill` and :func:`fill_aiter_buffers`
(docs/aiter-contract.md#planner-io, #planner-algorithm, #info-sizes, #pr-3606).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mla_fp8_bench.aiter_ps import facts

#: Keys of a buffer-length dict (as in the golden files' ``outputs.buffer_lengths``), in :data:`BUFFER_NAMES` order.
BUFFER_LENGTH_KEYS = ("work_metadata_ptrs", "work_indptr", "work_info_rows", "reduce_indptr", "reduce_final_map_rows",
                      "reduce_partial_map")


class PsPlanError(ValueError):
    """Invalid planner input, or a buffer too small for a plan (a ``ValueError``)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _int(name: str, v: Any, lo: int | None = None, why: str = "") -> int:
    """``v`` as an int (bools refused), at least ``lo``; PsPlanError naming ``name`` otherwise."""
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise PsPlanError(f"{name}={v!r} is not an integer")
    v = operator.index(v)
    if lo is not None and v < lo:
        raise PsPlanError(f"{name}={v} is invalid: {why or f'must be >= {lo}'}")
    return v


def _check_revision(revision: Any) -> None:
    if revision not in facts.PLANNER_REVISIONS:
        raise PsPlanError(f"revision={revision!r} is unknown: allowed {', '.join(facts.PLANNER_REVISIONS)}")


def ps_metadata_info(
    batch_size: int, num_heads_k: int, max_qlen: int, qlen_granularity: int = facts.Q_TILE, *, cu_num: int,
    revision: str = facts.PLANNER_PRE_3606, max_kvlen: int | None = None, kvlen_granularity: int = facts.KV_TILE,
    total_qlen: int | None = None,
) -> dict[str, tuple[tuple[int, ...], str]]:
    """``get_ps_metadata_info_v1``: ``{name: (shape, dtype_name)}`` for the six buffers on a device of ``cu_num``
    CUs (``docs/aiter-contract.md#info-sizes``). Only ``pr3606-ref`` takes ``max_kvlen``/``kvlen_granularity``;
    only ``total-qlen`` takes ``total_qlen`` (None: v0.1.22's sizes; <= 0: AssertionError, as AITER asserts).
    PsPlanError for a bad argument or one the revision does not have.

    AITER's ``total_qlen`` formula is not known: the budget is modelled by the invariants its
    ``op_tests/test_ps_metadata_sizing.py`` pins. ``reduce_partial_map`` gets the largest length the pinned
    bound allows, ``(max(total_qlen, max_qlen) + qlen_granularity*(batch_size + cu_num)) // qlen_granularity``,
    never above the unbudgeted one; the other buffers keep their unbudgeted sizes. AITER's can be smaller."""
    batch_size, max_qlen = _int("batch_size", batch_size, 0), _int("max_qlen", max_qlen, 0)
    num_heads_k, cu_num = _int("num_heads_k", num_heads_k, 1), _int("cu_num", cu_num, 1, "the device CU count, >= 1")
    qlen_granularity = _int("qlen_granularity", qlen_granularity, 1)
    _check_revision(revision)
    given = {"max_kvlen": max_kvlen, "kvlen_granularity": None if kvlen_granularity == facts.KV_TILE else
             kvlen_granularity, "total_qlen": total_qlen}
    own = {facts.PLANNER_PR_3606_REF: ("max_kvlen", "kvlen_granularity"), facts.PLANNER_TOTAL_QLEN: ("total_qlen",)}
    if extra := [f"{k}={v!r}" for k, v in given.items() if v is not None and k not in own.get(revision, ())]:
        raise PsPlanError(f"{', '.join(extra)}: the {revision} get_ps_metadata_info_v1 has no such parameter")
    cpc = cu_num // math.gcd(num_heads_k, cu_num)
    mqs = _ceil_div(max_qlen, qlen_granularity)
    tiles = batch_size * mqs
    max_works = (batch_size + cpc - 1) * mqs * num_heads_k
    if revision == facts.PLANNER_PR_3606_REF:
        max_kvlen = None if max_kvlen is None else _int("max_kvlen", max_kvlen, 0)
        kv_gran = _int("kvlen_granularity", kvlen_granularity, 1)
        max_partials = tiles * (max(1, _ceil_div(max_kvlen or max_qlen, kv_gran)) + cpc)
        max_works = num_heads_k * max_partials
    elif revision in facts.NEED_LSE_REVISIONS:
        max_partials = tiles + cpc - 1
        if total_qlen is not None:
            assert _int("total_qlen", total_qlen) > 0, f"total_qlen must be positive, got {total_qlen}"
            pool = max(total_qlen, max_qlen) + qlen_granularity * (batch_size + cu_num)
            max_partials = min(max_partials, pool // qlen_granularity)
    else:
        max_partials = min(batch_size + cpc - 1, 2 * (cpc - 1)) * mqs
    shapes = ((2,), (cu_num + 1,), (max_works, facts.WORK_INFO_COLS), (tiles + 1,), (tiles, 2), (max_partials,))
    return {n: (shape, "int32" if i else "uint64") for i, (n, shape) in enumerate(zip(facts.BUFFER_NAMES, shapes))}


def buffer_lengths_from_info(info: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, int]:
    """Leading dims of :func:`ps_metadata_info`'s shapes, keyed as in :data:`BUFFER_LENGTH_KEYS`."""
    return {key: info[name][0][0] for key, name in zip(BUFFER_LENGTH_KEYS, facts.BUFFER_NAMES)}


@dataclass(frozen=True, eq=False, repr=False)
class PsPlan:
    """AITER's PS metadata of :func:`plan_ps_prefill` as int32 CPU tensors of the full buffer lengths, tails as the
    real planner leaves them; ``num_partials`` counts the distinct slots. Not to be modified in place."""

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
    revision: str = facts.PLANNER_PRE_3606
    need_lse: bool = False

    used_work_info = property(lambda self: self.work_info[: self.num_works])
    used_reduce_indptr = property(lambda self: self.reduce_indptr[: self.num_reduce_groups + 1])
    used_reduce_final_map = property(lambda self: self.reduce_final_map[: self.num_reduce_groups])
    used_reduce_partial_map = property(lambda self: self.reduce_partial_map[: self.num_partials])
    #: Rows ``splitData``/``splitLse`` need: ``256 * num_partials`` (all heads share them).
    partial_rows = property(lambda self: facts.Q_TILE * self.num_partials)


def _int_list(name: str, x: Any) -> list[int]:
    """A 1-D int tensor's or an int sequence's values."""
    if isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.dtype == torch.bool or x.dim() != 1):
        raise PsPlanError(f"{name} has dtype {x.dtype}, shape {tuple(x.shape)}: a 1-D integer tensor is required")
    return x.tolist() if isinstance(x, torch.Tensor) else [_int(f"{name}[{i}]", v) for i, v in enumerate(x)]


def _indptr(name: str, x: Any, length: int | None) -> list[int]:
    p = _int_list(name, x)
    if len(p) < 2 or (length is not None and len(p) != length) or p[0] != 0 or p != sorted(p) \
            or p[-1] > facts.INT32_MAX:
        raise PsPlanError(f"{name}={p[:8]}{'...' if len(p) > 8 else ''} is invalid: an int32 indptr from 0,"
                          " non-decreasing, of B+1 >= 2 entries as qo_indptr")
    return p


def _check_scalars(num_heads_k, cu_num, gqa_ratio, qhead_granularity, qlen_granularity, kvlen_granularity,
                   block_size) -> None:
    _int("num_heads_k", num_heads_k, 1)
    if num_heads_k > facts.MAX_HEADS:
        raise PsPlanError(f"num_heads_k={num_heads_k} is invalid: must be <= {facts.MAX_HEADS} (16-bit q_head_range)")
    _int("cu_num", cu_num, 1, "the device CU count, >= 1")
    for name, val, want in (("gqa_ratio", gqa_ratio, 1), ("qhead_granularity", qhead_granularity, 1),
                            ("qlen_granularity", qlen_granularity, facts.Q_TILE)):
        if _int(name, val) != want:
            raise PsPlanError(f"{name}={val} is not supported: only {name}={want} is (the PS prefill kernel is MHA,"
                              f" one head per work, {facts.Q_TILE}-row q-tiles)")
    bs, kg = _int("block_size", block_size, 1), _int("kvlen_granularity", kvlen_granularity)
    if kg < 1 or kg & (kg - 1) or kg < bs or kg % bs:
        raise PsPlanError(f"kvlen_granularity={kg} is invalid: must be a power of two, >= block_size={bs} and a"
                          " multiple of it (use max(128, block_size))")


def _check_sequences(qo_indptr, kv_indptr, context_lens, block_size: int, is_causal: bool):
    qo = _indptr("qo_indptr", qo_indptr, None)
    kv = _indptr("kv_indptr", kv_indptr, len(qo))
    ctx = _int_list("context_lens", context_lens)
    if len(ctx) != len(qo) - 1:
        raise PsPlanError(f"context_lens has length {len(ctx)}: must have B={len(qo) - 1} entries")
    for b, c in enumerate(ctx):
        pages, qlen = kv[b + 1] - kv[b], qo[b + 1] - qo[b]
        if c < 0 or c > pages * block_size or (block_size == 1 and c != pages):
            raise PsPlanError(f"context_lens[{b}]={c} is invalid: must be >= 0 and fit the sequence's {pages} pages"
                              f" x block_size={block_size} (equal to them at block_size=1)")
        if is_causal and qlen > c:
            raise PsPlanError(f"sequence {b}: q_len={qlen} > kv_len={c} with is_causal=True is not supported:"
                              " AITER's planner is undefined there (negative unit count); causal needs q_len <= kv_len")
    return qo, kv, ctx


def _ping_pong(n: int) -> list[int]:
    """Tile visiting order 0, n-1, 1, n-2, ... (pairs heavy and light causal tiles)."""
    return [x for i in range(n // 2) for x in (i, n - 1 - i)] + ([n // 2] if n % 2 else [])


def _q_tiles(qo, ctx, kv_gran: int, bs: int, causal: bool) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """``(tiles, total_units)``; a tile is ``(batch, qs, qe, eff_kv, blocks)``: rows, KV its last row sees, pages."""
    tiles, total_units = [], 0
    for b in range(len(qo) - 1):
        qlen, kvlen = qo[b + 1] - qo[b], ctx[b]
        for i in _ping_pong(_ceil_div(qlen, facts.Q_TILE)):
            qs, qe = facts.Q_TILE * i, min(facts.Q_TILE * i + facts.Q_TILE, qlen)
            eff = min(kvlen - qlen + qe, kvlen) if causal else kvlen
            units = _ceil_div(eff, kv_gran)  # eff >= 0: C's truncating division agrees
            total_units += units
            tiles.append((b, qs, qe, eff, units * (kv_gran // bs)))
    return tiles, total_units


def _tile_one_cluster(qo, kv, ctx, tiles, total_units: int, tgs: int, blocks_per_unit: int, bs: int,
                      need_lse: bool, revision: str):
    """The units dealt to the ``tgs`` TGs of one cluster (every head and cluster repeats it), tiles split at the
    capacity: rows ``(b, loc, qo_start, qo_end, kv_start, kv_end, kv_offset)`` and ``tg_bounds``. A tile never
    split gets ``loc = -1`` unless ``need_lse`` (v0.1.22: also one reading no KV); every other piece a new slot."""
    avg, rem = divmod(total_units, tgs)
    rows: list[tuple[int, ...]] = []
    tg_bounds = [0]
    cur_tile, cur_blk, p = 0, 0, 0
    for t in range(tgs):
        cap = (avg + (t < rem)) * blocks_per_unit
        while cur_tile < len(tiles) and cap > 0:
            b, qs, qe, eff, blocks = tiles[cur_tile]
            kv_start = kv[b] + cur_blk
            if eff - cur_blk * bs <= cap * bs:  # the rest of the tile fits
                if (cur_blk == 0 and not need_lse) or (blocks == 0 and revision in facts.NEED_LSE_REVISIONS):
                    loc = -1
                else:
                    loc, p = facts.Q_TILE * p, p + 1
                kv_end, kv_off = min(kv_start + blocks - cur_blk, kv[b + 1]), 0
                cap -= blocks - cur_blk
                cur_tile, cur_blk = cur_tile + 1, 0
            else:  # split the tile at the capacity
                loc, p = facts.Q_TILE * p, p + 1
                kv_end = min(kv_start + cap, kv[b + 1])
                kv_off = ctx[b] - (kv_end - kv[b]) * bs
                cur_blk, cap = cur_blk + cap, 0
            rows.append((b, loc, qo[b] + qs, qo[b] + qe, kv_start, kv_end, kv_off))
        tg_bounds.append(len(rows))
    return rows, tg_bounds


def _reduce_info(rows) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """``(keys, indptr, partial_map)``: slots grouped by sorted ``(qo_start, qo_end)``, ascending in a group."""
    groups: dict[tuple[int, int], set[int]] = {}
    for r in rows:
        if r[1] != -1:
            groups.setdefault((r[2], r[3]), set()).add(r[1])
    keys = sorted(groups)
    partial_map = [loc for k in keys for loc in sorted(groups[k])]
    indptr = [0]
    for k in keys:
        indptr.append(indptr[-1] + len(groups[k]))
    return keys, indptr, partial_map


def _work_buffers(rows, tg_bounds, num_heads_k: int, cu_num: int, lengths: dict[str, int]):
    """``work_indptr``, ``work_info``: workgroup ``c*T + t`` runs TG ``t``'s rows once per head of cluster ``c``."""
    num_clusters = math.gcd(num_heads_k, cu_num)
    tgs, hpc = cu_num // num_clusters, num_heads_k // num_clusters
    per_cluster = hpc * len(rows)
    num_works = num_clusters * per_cluster
    wind = [0] * lengths["work_indptr"]
    for c in range(num_clusters):
        for t in range(tgs):
            wind[c * tgs + t + 1] = c * per_cluster + hpc * tg_bounds[t + 1]
    work_info = torch.zeros((lengths["work_info_rows"], facts.WORK_INFO_COLS), dtype=torch.int32)
    if num_works:
        spans = [(j, tg_bounds[t], tg_bounds[t + 1]) for t in range(tgs) for j in range(hpc)]
        idx = torch.tensor([i for _j, lo, hi in spans for i in range(lo, hi)], dtype=torch.int64)
        head_local = torch.tensor([j for j, lo, hi in spans for _ in range(lo, hi)], dtype=torch.int64)
        heads = head_local[None, :] + (torch.arange(num_clusters, dtype=torch.int64) * hpc)[:, None]
        q_head_range = facts.pack_q_head_range(heads, heads + 1)
        q_head_range = (q_head_range + 2**31) % 2**32 - 2**31  # int32 two's complement, as in C++
        used = work_info[:num_works].view(num_clusters, per_cluster, facts.WORK_INFO_COLS)
        used[:, :, :7] = torch.tensor(rows, dtype=torch.int64)[idx].to(torch.int32).unsqueeze(0)
        used[:, :, 7] = q_head_range.to(torch.int32)
    return torch.tensor(wind, dtype=torch.int32), work_info


def _default_lengths(qo, ctx, heads: int, cu_num: int, revision: str, given: Mapping[str, Any] | None):
    """Buffer lengths from the revision's info function, overridden by ``given``."""
    extra = {"max_kvlen": max(ctx)} if revision == facts.PLANNER_PR_3606_REF else {}
    max_qlen = max(b - a for a, b in zip(qo, qo[1:]))
    lengths = buffer_lengths_from_info(ps_metadata_info(len(ctx), heads, max_qlen, cu_num=cu_num, revision=revision,
                                                        **extra))
    if not set(given or ()) <= set(BUFFER_LENGTH_KEYS):
        raise PsPlanError(f"buffer_lengths={given!r} must be keyed by {', '.join(BUFFER_LENGTH_KEYS)}")
    return {**lengths, **(given or {})}


def plan_ps_prefill(
    qo_indptr: Sequence[int] | torch.Tensor, kv_indptr: Sequence[int] | torch.Tensor,
    context_lens: Sequence[int] | torch.Tensor, *, num_heads_k: int, cu_num: int, gqa_ratio: int = 1,
    qhead_granularity: int = 1, qlen_granularity: int = facts.Q_TILE, kvlen_granularity: int = facts.KV_TILE,
    block_size: int = 1, is_causal: bool = True, buffer_lengths: Mapping[str, int] | None = None,
    revision: str = facts.PLANNER_PRE_3606, need_lse: bool | None = None,
) -> PsPlan:
    """Plan a PS prefill as AITER's host ``get_ps_metadata_v1`` does (``docs/aiter-contract.md#planner-algorithm``):
    a :class:`PsPlan` with buffers of the lengths ``buffer_lengths`` (keyed as :data:`BUFFER_LENGTH_KEYS`; missing
    ones from the revision's :func:`ps_metadata_info`). ``qo_indptr``/``kv_indptr``: ``[B+1]`` q lengths / KV
    pages from 0; ``context_lens``: ``[B]`` KV tokens (int lists or 1-D int tensors); ``num_heads_k`` = H_q;
    ``gqa_ratio``/``qhead_granularity``/``qlen_granularity`` only 1/1/256; ``kvlen_granularity`` a power-of-two
    multiple of ``block_size`` (use 128); ``is_causal``: bottom-right; ``need_lse``: v0.1.22 planners only.
    PsPlanError naming a bad value, or a buffer too small for the plan."""
    _check_scalars(num_heads_k, cu_num, gqa_ratio, qhead_granularity, qlen_granularity, kvlen_granularity,
                   block_size)
    qo, kv, ctx = _check_sequences(qo_indptr, kv_indptr, context_lens, block_size, is_causal)
    _check_revision(revision)
    if revision not in facts.NEED_LSE_REVISIONS and need_lse is not None:
        raise PsPlanError(f"need_lse={need_lse!r}: the {revision} get_ps_metadata_v1 has no need_lse parameter"
                          " (added by the v0.1.22 planner)")
    if need_lse is not None and not isinstance(need_lse, bool):
        raise PsPlanError(f"need_lse={need_lse!r} is invalid: must be a bool")
    need_lse = revision == facts.PLANNER_PR_3606_REF or bool(need_lse)
    lengths = _default_lengths(qo, ctx, num_heads_k, cu_num, revision, buffer_lengths)

    tiles, total_units = _q_tiles(qo, ctx, kvlen_granularity, block_size, is_causal)
    tgs = cu_num // math.gcd(num_heads_k, cu_num)
    rows, tg_bounds = _tile_one_cluster(qo, kv, ctx, tiles, total_units, tgs, kvlen_granularity // block_size,
                                        block_size, need_lse, revision)
    keys, indptr, partial_map = _reduce_info(rows)
    num_works, ng, npart = num_heads_k * len(rows), len(keys), len(partial_map)
    for key, need in (("work_indptr", cu_num + 1), ("work_info_rows", num_works), ("reduce_indptr", ng + 1),
                      ("reduce_final_map_rows", ng), ("reduce_partial_map", npart)):
        if lengths[key] < need:
            raise PsPlanError(f"buffer_lengths[{key!r}]={lengths[key]} is too small: this plan needs {need}"
                              " (AITER would write past the buffer)")
    work_indptr, work_info = _work_buffers(rows, tg_bounds, num_heads_k, cu_num, lengths)
    rind = torch.tensor(indptr + [npart] * (lengths["reduce_indptr"] - ng - 1), dtype=torch.int32)
    rfm = torch.tensor(keys + [(0, 0)] * (lengths["reduce_final_map_rows"] - ng), dtype=torch.int32).reshape(-1, 2)
    rpm = torch.tensor(partial_map + [0] * (lengths["reduce_partial_map"] - npart), dtype=torch.int32)
    return PsPlan(work_indptr, work_info, rind, rfm, rpm, num_works=num_works, num_reduce_groups=ng,
                  num_partials=npart, cu_num=cu_num, num_heads_k=num_heads_k, revision=revision, need_lse=need_lse)


def fill_aiter_buffers(plan: PsPlan, work_metadata_ptrs: torch.Tensor, work_indptr: torch.Tensor,
                       work_info: torch.Tensor, reduce_indptr: torch.Tensor, reduce_final_map: torch.Tensor,
                       reduce_partial_map: torch.Tensor) -> None:
    """Write ``plan`` into the whole of each buffer (the caller checks them) as the real planner does: the used part,
    then the tail AITER leaves (0; ``num_partials`` in ``reduce_indptr``). ``work_metadata_ptrs`` is not written."""
    ng, npart = plan.num_reduce_groups, plan.num_partials
    for dst, src, n, tail in ((work_indptr, plan.work_indptr, plan.cu_num + 1, 0),
                              (work_info, plan.work_info, plan.num_works, 0),
                              (reduce_indptr, plan.reduce_indptr, ng + 1, npart),
                              (reduce_final_map, plan.reduce_final_map, ng, 0),
                              (reduce_partial_map, plan.reduce_partial_map, npart, 0)):
        tmp = torch.full(tuple(dst.shape), tail, dtype=torch.int32)
        tmp[:n] = src[:n]
        dst.copy_(tmp)
