"""Pure-Python port of AITER's persistent-scheduling (PS) prefill planner at the three
:data:`~mla_fp8_bench.aiter_ps.facts.PLANNER_REVISIONS`: ``get_ps_metadata_info_v1`` (``aiter/ops/attention.py``)
is :func:`ps_metadata_info`; ``get_ps_metadata_v1`` (``csrc/kernels/mla/metadata/v1_2_host.cuh``) is
:func:`plan_ps_prefill` and :func:`fill_aiter_buffers`. See ``docs/aiter-contract.md`` ``#planner-io``,
``#planner-algorithm``, ``#info-sizes``, ``#pr-3606``.
"""

from __future__ import annotations

import math
import operator
from collections import namedtuple
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mla_fp8_bench.aiter_ps.facts import (
    BUFFER_NAMES,
    INT32_MAX,
    KV_TILE,
    MAX_HEADS,
    PLANNER_PR_3606_REF,
    PLANNER_PRE_3606,
    PLANNER_REVISIONS,
    PLANNER_V0_1_22,
    Q_TILE,
    WORK_INFO_COLS,
    pack_q_head_range,
)

#: Keys of a buffer-length dict (as in the golden files' ``outputs.buffer_lengths``).
BUFFER_LENGTH_KEYS = ("work_metadata_ptrs", "work_indptr", "work_info_rows", "reduce_indptr", "reduce_final_map_rows",
                      "reduce_partial_map")
_LENGTH_KEY = dict(zip(BUFFER_NAMES, BUFFER_LENGTH_KEYS))  # buffer name -> its key (also an accepted alias)


class PsPlanError(ValueError):
    """Invalid planner input, or a buffer too small for a plan (a ``ValueError``)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_revision(revision: Any) -> str:
    if revision not in PLANNER_REVISIONS:
        raise PsPlanError(f"revision={revision!r} is unknown: allowed {', '.join(PLANNER_REVISIONS)}")
    return revision


def _effective_need_lse(revision: str, need_lse: Any) -> bool:
    """Whether every tile gets a slot: ``pre-3606`` never, ``pr3606-ref`` always, ``v0.1.22`` as ``need_lse`` says."""
    if revision != PLANNER_V0_1_22:
        if need_lse is not None:
            raise PsPlanError(f"need_lse={need_lse!r}: the {revision} get_ps_metadata_v1 has no need_lse parameter"
                              " (added by the v0.1.22 planner)")
        return revision == PLANNER_PR_3606_REF
    if need_lse is not None and not isinstance(need_lse, bool):
        raise PsPlanError(f"need_lse={need_lse!r} is invalid: must be a bool")
    return bool(need_lse)


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
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise PsPlanError(f"{name} has dtype {x.dtype}: an integer tensor (e.g. torch.int32) is required")
        if x.dim() != 1:
            raise PsPlanError(f"{name} has shape {tuple(x.shape)}: a 1-D tensor is required")
        return x.detach().cpu().tolist()
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise PsPlanError(f"{name}={x!r} is not a 1-D sequence of integers (list, tuple or int tensor)")
    return [_as_int(f"{name}[{i}]", v) for i, v in enumerate(x)]


def _check_indptr(name: str, p: list[int], expect_len: int | None) -> None:
    if expect_len is None and len(p) < 2:
        raise PsPlanError(f"{name} has length {len(p)}: need B+1 >= 2 entries (at least one sequence)")
    if expect_len is not None and len(p) != expect_len:
        raise PsPlanError(f"{name} has length {len(p)} but seqlens_qo_indptr has {expect_len}: both must have B+1"
                          " entries")
    if p[0] != 0:
        raise PsPlanError(f"{name}[0]={p[0]} is invalid: an indptr must start at 0")
    i = next((i for i in range(len(p) - 1) if p[i + 1] < p[i]), None)
    if i is not None:
        raise PsPlanError(f"{name}[{i + 1}]={p[i + 1]} < {name}[{i}]={p[i]}: an indptr must be non-decreasing")
    if p[-1] > INT32_MAX:
        raise PsPlanError(f"{name}[-1]={p[-1]} does not fit in int32 (max {INT32_MAX})")


# get_ps_metadata_info_v1


def ps_metadata_info(
    batch_size: int, num_heads_k: int, max_qlen: int, qlen_granularity: int = Q_TILE, *, cu_num: int,
    revision: str = PLANNER_PRE_3606, max_kvlen: int | None = None, kvlen_granularity: int = KV_TILE,
) -> dict[str, tuple[tuple[int, ...], str]]:
    """``get_ps_metadata_info_v1``: ``{name: (shape, dtype_name)}`` for the six :data:`BUFFER_NAMES`, in order
    (``docs/aiter-contract.md#info-sizes``); ``cu_num``: the device's CU count; only ``pr3606-ref`` takes
    ``max_kvlen`` and ``kvlen_granularity``.

    Raises:
        PsPlanError (a ValueError): a non-integer or out-of-range argument, an unknown ``revision``, or
        ``max_kvlen`` / a non-default ``kvlen_granularity`` for another revision.
    """
    batch_size = _as_int("batch_size", batch_size, minimum=0, allowed="must be an integer >= 0")
    num_heads_k = _as_int("num_heads_k", num_heads_k, minimum=1, allowed="must be an integer >= 1")
    max_qlen = _as_int("max_qlen", max_qlen, minimum=0, allowed="must be an integer >= 0")
    qlen_granularity = _as_int("qlen_granularity", qlen_granularity, minimum=1,
                               allowed="must be an integer >= 1 (256 for the PS kernel)")
    cu_num = _as_int("cu_num", cu_num, minimum=1, allowed="must be an integer >= 1 (the device CU count)")
    revision = _check_revision(revision)
    if revision != PLANNER_PR_3606_REF and (max_kvlen is not None or kvlen_granularity != KV_TILE):
        raise PsPlanError(f"max_kvlen={max_kvlen!r}, kvlen_granularity={kvlen_granularity!r}: the {revision}"
                          " get_ps_metadata_info_v1 has no such parameters (only the pr3606-ref revision has them)")

    cpc = cu_num // math.gcd(num_heads_k, cu_num)
    mqs = _ceil_div(max_qlen, qlen_granularity)
    tiles = batch_size * mqs
    max_works = (batch_size + cpc - 1) * mqs * num_heads_k
    if revision == PLANNER_PR_3606_REF:
        if max_kvlen is not None:
            max_kvlen = _as_int("max_kvlen", max_kvlen, minimum=0, allowed="must be None or an integer >= 0")
        kvlen_granularity = _as_int("kvlen_granularity", kvlen_granularity, minimum=1,
                                    allowed="must be an integer >= 1 (128)")
        max_partials = tiles * (max(1, _ceil_div(max_kvlen or max_qlen, kvlen_granularity)) + cpc)
        max_works = num_heads_k * max_partials
    elif revision == PLANNER_V0_1_22:
        max_partials = tiles + cpc - 1
    else:
        max_partials = min(batch_size + cpc - 1, 2 * (cpc - 1)) * mqs
    shapes = ((2,), (cu_num + 1,), (max_works, WORK_INFO_COLS), (tiles + 1,), (tiles, 2), (max_partials,))
    return {name: (shape, "uint64" if i == 0 else "int32") for i, (name, shape) in enumerate(zip(BUFFER_NAMES, shapes))}


def buffer_lengths_from_info(info: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, int]:
    """Leading dims of :func:`ps_metadata_info`'s shapes, keyed as in :data:`BUFFER_LENGTH_KEYS`."""
    return {_LENGTH_KEY[name]: info[name][0][0] for name in BUFFER_NAMES}


def _normalise_buffer_lengths(given: Mapping[str, Any], default: dict[str, int]) -> dict[str, int]:
    out = dict(default)
    for key, val in given.items():
        canon = _LENGTH_KEY.get(key, key)
        if canon not in out:
            raise PsPlanError(f"buffer_lengths has unknown key {key!r}: allowed {', '.join(BUFFER_LENGTH_KEYS)}"
                              f" (or the buffer names {', '.join(BUFFER_NAMES)})")
        if isinstance(val, tuple) and len(val) == 2 and isinstance(val[0], (tuple, list)):
            val = val[0]  # a (shape, dtype) pair from ps_metadata_info
        if isinstance(val, (tuple, list, torch.Size)):
            if len(val) == 0:
                raise PsPlanError(f"buffer_lengths[{key!r}]={val!r} is an empty shape")
            val = val[0]
        out[canon] = _as_int(f"buffer_lengths[{key!r}]", val, minimum=0, allowed="must be an integer >= 0")
    return out


# the plan


@dataclass(frozen=True, eq=False, repr=False)
class PsPlan:
    """Output of :func:`plan_ps_prefill`: AITER's PS metadata as int32 CPU tensors of the full buffer
    lengths, tails as the real planner leaves them (``docs/aiter-contract.md#planner-io``, ``#work-info``);
    ``num_works`` is the used ``work_info`` rows, ``num_partials`` the distinct slots, ``need_lse`` whether
    every tile got a slot. Not to be modified in place.
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
    revision: str = PLANNER_PRE_3606
    need_lse: bool = False

    # the used parts of the buffers (views)
    used_work_info = property(lambda self: self.work_info[: self.num_works])
    used_reduce_indptr = property(lambda self: self.reduce_indptr[: self.num_reduce_groups + 1])
    used_reduce_final_map = property(lambda self: self.reduce_final_map[: self.num_reduce_groups])
    used_reduce_partial_map = property(lambda self: self.reduce_partial_map[: self.num_partials])
    #: Rows ``splitData``/``splitLse`` need: ``256 * num_partials`` (all heads share them).
    partial_rows = property(lambda self: Q_TILE * self.num_partials)


# get_ps_metadata_v1, step 0: validated inputs

#: ``qo`` / ``kv``: ``seqlens_qo_indptr`` / ``pages_kv_indptr`` ``[B+1]``, ``ctx``: ``context_lens`` ``[B]``.
_Inputs = namedtuple("_Inputs", "qo kv ctx num_heads_k cu_num kvlen_granularity block_size is_causal")


def _check_scalars(num_heads_k, cu_num, gqa_ratio, qhead_granularity, qlen_granularity, kvlen_granularity,
                   block_size, is_causal) -> tuple[int, int, int, int, bool]:
    """Validated ``(num_heads_k, cu_num, kvlen_granularity, block_size, is_causal)``; PsPlanError otherwise."""
    num_heads_k = _as_int("num_heads_k", num_heads_k)
    if not 1 <= num_heads_k <= MAX_HEADS:
        raise PsPlanError(f"num_heads_k={num_heads_k} is invalid: must be in 1..{MAX_HEADS}"
                          " (q_head_range packs head indices into 16 bits)")
    cu_num = _as_int("cu_num", cu_num, minimum=1, allowed="must be an integer >= 1 (the device CU count)")
    for name, val in (("gqa_ratio", gqa_ratio), ("qhead_granularity", qhead_granularity)):
        if _as_int(name, val) != 1:
            raise PsPlanError(f"{name}={val} is not supported: only {name}=1 is (the PS prefill is MHA, H_q == H_kv,"
                              " one head per work)")
    if _as_int("qlen_granularity", qlen_granularity) != Q_TILE:
        raise PsPlanError(f"qlen_granularity={qlen_granularity} is not supported: only {Q_TILE} is (the PS"
                          " kernel's q-tile)")
    block_size = _as_int("block_size", block_size, minimum=1, allowed="must be an integer >= 1")
    kvlen_granularity = _as_int("kvlen_granularity", kvlen_granularity)
    if kvlen_granularity < 1 or kvlen_granularity & (kvlen_granularity - 1):
        raise PsPlanError(f"kvlen_granularity={kvlen_granularity} is invalid: must be a power of two (use 128)")
    if kvlen_granularity < block_size or kvlen_granularity % block_size:
        raise PsPlanError(f"kvlen_granularity={kvlen_granularity} is invalid: must be >= block_size={block_size} and a"
                          " multiple of it (use max(128, block_size))")
    if not isinstance(is_causal, bool):
        if _is_int(is_causal) and operator.index(is_causal) in (0, 1):
            is_causal = bool(operator.index(is_causal))
        else:
            raise PsPlanError(f"is_causal={is_causal!r} is invalid: must be a bool")
    return num_heads_k, cu_num, kvlen_granularity, block_size, is_causal


def _check_sequences(qo_indptr, kv_indptr, context_lens, block_size: int, is_causal: bool):
    """Validated ``(qo, kv, ctx)`` int lists; PsPlanError naming the first bad entry otherwise."""
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
            raise PsPlanError(f"context_lens[{b}]={c} != kv_indptr[{b + 1}] - kv_indptr[{b}] = {pages}:"
                              " at block_size=1 they must be equal (one token per page)")
        if c > pages * block_size:
            raise PsPlanError(f"context_lens[{b}]={c} exceeds the sequence's {pages} pages x block_size={block_size}")
        if is_causal and qlen > c:
            raise PsPlanError(f"sequence {b}: q_len={qlen} > kv_len={c} with is_causal=True is not supported:"
                              " AITER's planner is undefined there (negative unit count); causal needs q_len <= kv_len")
    return qo, kv, ctx


# get_ps_metadata_v1, steps 1-3: q-tiles, the tiling of one cluster, reduce info


def _ping_pong(n: int) -> list[int]:
    """Tile visiting order 0, n-1, 1, n-2, ... (pairs heavy and light causal tiles)."""
    return [x for i in range(n // 2) for x in (i, n - 1 - i)] + ([n // 2] if n % 2 else [])


def _q_tiles(inp: _Inputs) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """Step 1: ``(tiles, total_units)``; a tile is ``(batch, qs, qe, eff_kv, blocks)``: local rows ``[qs, qe)``,
    the KV tokens its last row sees, and ``ceil(eff_kv / kvlen_granularity)`` units in pages."""
    g = inp.kvlen_granularity
    blocks_per_unit = g // inp.block_size
    tiles: list[tuple[int, int, int, int, int]] = []
    total_units = 0
    for b in range(len(inp.qo) - 1):
        qlen, kvlen = inp.qo[b + 1] - inp.qo[b], inp.ctx[b]
        for i in _ping_pong(_ceil_div(qlen, Q_TILE)):
            qs = Q_TILE * i
            qe = min(qs + Q_TILE, qlen)
            eff = min(kvlen - qlen + qe, kvlen) if inp.is_causal else kvlen
            units = _ceil_div(eff, g)  # eff >= 0: C's truncating division agrees
            total_units += units
            tiles.append((b, qs, qe, eff, units * blocks_per_unit))
    return tiles, total_units


def _tile_one_cluster(inp: _Inputs, tiles, total_units: int, tgs: int, need_lse: bool, revision: str):
    """Steps 2-3: the units dealt out to the ``tgs`` TGs of one cluster (repeated by every head and
    cluster), tiles split at the capacity. A finished tile gets ``partial_o_loc = -1`` if never split and
    not ``need_lse``, or at ``v0.1.22`` if it consumes no KV; every other piece a new slot ``256 * p``.
    Returns rows ``(b, loc, qo_start, qo_end, kv_start, kv_end, kv_offset)`` and ``tg_bounds`` (TG ``t``
    owns rows ``[tg_bounds[t], tg_bounds[t + 1])``).
    """
    qo, kv, ctx, bs = inp.qo, inp.kv, inp.ctx, inp.block_size
    blocks_per_unit = inp.kvlen_granularity // bs
    avg, rem = divmod(total_units, tgs)
    rows: list[tuple[int, int, int, int, int, int, int]] = []
    tg_bounds = [0]
    cur_tile, cur_blk, p = 0, 0, 0
    for t in range(tgs):
        cap = (avg + (t < rem)) * blocks_per_unit
        while cur_tile < len(tiles) and cap > 0:
            b, qs, qe, eff, blocks = tiles[cur_tile]
            kv_start = kv[b] + cur_blk
            if eff - cur_blk * bs <= cap * bs:  # the rest of the tile fits
                if (cur_blk == 0 and not need_lse) or (blocks == 0 and revision == PLANNER_V0_1_22):
                    loc = -1
                else:
                    loc, p = Q_TILE * p, p + 1
                kv_end, kv_off = min(kv_start + blocks - cur_blk, kv[b + 1]), 0
                cap -= blocks - cur_blk
                cur_tile, cur_blk = cur_tile + 1, 0
            else:  # split the tile at the capacity
                loc, p = Q_TILE * p, p + 1
                kv_end = min(kv_start + cap, kv[b + 1])
                kv_off = ctx[b] - (kv_end - kv[b]) * bs
                cur_blk, cap = cur_blk + cap, 0
            rows.append((b, loc, qo[b] + qs, qo[b] + qe, kv_start, kv_end, kv_off))
        tg_bounds.append(len(rows))
    return rows, tg_bounds


def _reduce_info(rows) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Step 4: ``(keys, indptr, partial_map)``: works with a slot grouped by sorted ``(qo_start, qo_end)``,
    each group's slots ascending."""
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
    return keys, indptr, partial_map


# get_ps_metadata_v1, step 4: the buffers


def _check_lengths(lengths: dict[str, int], cu_num: int, num_works: int, num_groups: int, num_partials: int) -> None:
    """Refuse a plan that would not fit (the real planner writes without bounds checks)."""
    for key, need in (("work_indptr", cu_num + 1), ("work_info_rows", num_works), ("reduce_indptr", num_groups + 1),
                      ("reduce_final_map_rows", num_groups), ("reduce_partial_map", num_partials)):
        if lengths[key] < need:
            raise PsPlanError(f"buffer_lengths[{key!r}]={lengths[key]} is too small: this plan needs {need}"
                              " (AITER would write past the buffer)")
    if num_works > INT32_MAX:
        raise PsPlanError(f"num_works={num_works} does not fit in int32")


def _work_buffers(rows, tg_bounds, num_heads_k: int, cu_num: int, lengths: dict[str, int]):
    """``work_indptr`` and ``work_info``: TG ``t`` of cluster ``c`` is workgroup ``c*T + t``; it runs its rows
    once per head of ``[c*hpc, (c+1)*hpc)``, head-major."""
    num_clusters = math.gcd(num_heads_k, cu_num)
    tgs = cu_num // num_clusters
    hpc = num_heads_k // num_clusters
    works_per_cluster = hpc * len(rows)
    num_works = num_clusters * works_per_cluster
    wind = [0] * lengths["work_indptr"]
    for c in range(num_clusters):
        for t in range(tgs):
            wind[c * tgs + t + 1] = c * works_per_cluster + hpc * tg_bounds[t + 1]
    work_info = torch.zeros((lengths["work_info_rows"], WORK_INFO_COLS), dtype=torch.int32)
    if num_works:
        spans = [(j, tg_bounds[t], tg_bounds[t + 1]) for t in range(tgs) for j in range(hpc)]
        idx = [i for _j, lo, hi in spans for i in range(lo, hi)]
        head_local = [j for j, lo, hi in spans for _ in range(lo, hi)]
        block = torch.tensor(rows, dtype=torch.int64)[torch.tensor(idx, dtype=torch.int64)]
        heads = torch.tensor(head_local, dtype=torch.int64)[None, :] + (
            torch.arange(num_clusters, dtype=torch.int64) * hpc
        )[:, None]  # [C, works_per_cluster]
        q_head_range = pack_q_head_range(heads, heads + 1)
        if num_heads_k >= 2**15:  # end head >= 32768: int32 two's complement, as in C++
            q_head_range = (q_head_range + 2**31) % 2**32 - 2**31
        used = work_info[:num_works].view(num_clusters, works_per_cluster, WORK_INFO_COLS)
        used[:, :, :7] = block.to(torch.int32).unsqueeze(0)
        used[:, :, 7] = q_head_range.to(torch.int32)
    return torch.tensor(wind, dtype=torch.int32), work_info


def _reduce_buffers(keys, indptr, partial_map, lengths: dict[str, int]):
    """``reduce_indptr`` (tail = num_partials), ``reduce_final_map`` and ``reduce_partial_map`` (tails 0)."""
    num_partials = len(partial_map)
    rind = indptr + [num_partials] * (lengths["reduce_indptr"] - len(indptr))
    rfm = keys + [(0, 0)] * (lengths["reduce_final_map_rows"] - len(keys))
    rpm = partial_map + [0] * (lengths["reduce_partial_map"] - num_partials)
    rind, rfm, rpm = (torch.tensor(x, dtype=torch.int32) for x in (rind, rfm, rpm))
    return rind, rfm.reshape(-1, 2), rpm


def _default_lengths(inp: _Inputs, revision: str, buffer_lengths: Mapping[str, Any] | None) -> dict[str, int]:
    """Buffer lengths from the revision's info function, overridden by ``buffer_lengths``."""
    nb = len(inp.qo) - 1
    max_qlen = max(inp.qo[b + 1] - inp.qo[b] for b in range(nb))
    extra = {"max_kvlen": max(inp.ctx), "kvlen_granularity": KV_TILE} if revision == PLANNER_PR_3606_REF else {}
    lengths = buffer_lengths_from_info(ps_metadata_info(nb, inp.num_heads_k, max_qlen, Q_TILE, cu_num=inp.cu_num,
                                                        revision=revision, **extra))
    if buffer_lengths is not None:
        if not isinstance(buffer_lengths, Mapping):
            raise PsPlanError(f"buffer_lengths={buffer_lengths!r} must be a dict or None")
        lengths = _normalise_buffer_lengths(buffer_lengths, lengths)
    return lengths


def plan_ps_prefill(
    qo_indptr: Sequence[int] | torch.Tensor, kv_indptr: Sequence[int] | torch.Tensor,
    context_lens: Sequence[int] | torch.Tensor, *, num_heads_k: int, cu_num: int, gqa_ratio: int = 1,
    qhead_granularity: int = 1, qlen_granularity: int = Q_TILE, kvlen_granularity: int = KV_TILE,
    block_size: int = 1, is_causal: bool = True, buffer_lengths: Mapping[str, Any] | None = None,
    revision: str = PLANNER_PRE_3606, need_lse: bool | None = None,
) -> PsPlan:
    """Plan a PS prefill as AITER's host ``get_ps_metadata_v1`` does (``docs/aiter-contract.md#planner-algorithm``).

    Args:
        qo_indptr, kv_indptr: ``[B+1]`` cumulative q lengths / KV pages from 0, non-decreasing (int lists or
            1-D int tensors). context_lens: ``[B]`` KV tokens per sequence (= pages at ``block_size=1``).
        num_heads_k: KV heads, 1 .. 65535 (H_q == H_kv). cu_num: device CU count (256 on MI355X).
        gqa_ratio, qhead_granularity, qlen_granularity: only 1, 1 and 256 are supported.
        kvlen_granularity: KV split granularity in tokens, a power-of-two multiple of ``block_size``; use 128.
        is_causal: bottom-right causal (query i sees key j iff ``j <= kv_len - q_len + i``).
        buffer_lengths: leading dims of the buffers, keyed as :data:`BUFFER_LENGTH_KEYS` or by buffer name,
            ints or ``(shape, dtype)`` pairs; missing keys from the revision's :func:`ps_metadata_info`
            (``pr3606-ref``: ``max_kvlen = max(context_lens)``).
        revision: one of :data:`PLANNER_REVISIONS`. need_lse: ``v0.1.22`` only (default False): every
            work that consumes KV gets a partial slot and every tile a reduce group.

    Returns a :class:`PsPlan` with buffers of exactly the requested lengths.

    Raises:
        PsPlanError (a ValueError) naming the bad value: an argument outside what is allowed above,
        malformed indptrs, values beyond int32, or a ``buffer_lengths`` entry too small for the plan.
    """
    heads, cus, kv_gran, bs, causal = _check_scalars(num_heads_k, cu_num, gqa_ratio, qhead_granularity,
                                                     qlen_granularity, kvlen_granularity, block_size, is_causal)
    qo, kv, ctx = _check_sequences(qo_indptr, kv_indptr, context_lens, bs, causal)
    inp = _Inputs(qo, kv, ctx, heads, cus, kv_gran, bs, causal)
    revision = _check_revision(revision)
    need_lse = _effective_need_lse(revision, need_lse)
    lengths = _default_lengths(inp, revision, buffer_lengths)

    tiles, total_units = _q_tiles(inp)
    tgs = cus // math.gcd(heads, cus)
    rows, tg_bounds = _tile_one_cluster(inp, tiles, total_units, tgs, need_lse, revision)
    keys, indptr, partial_map = _reduce_info(rows)
    num_works = heads * len(rows)  # every head of every cluster repeats the rows
    _check_lengths(lengths, cus, num_works, len(keys), len(partial_map))

    work_indptr, work_info = _work_buffers(rows, tg_bounds, heads, cus, lengths)
    return PsPlan(work_indptr, work_info, *_reduce_buffers(keys, indptr, partial_map, lengths), num_works=num_works,
                  num_reduce_groups=len(keys), num_partials=len(partial_map), cu_num=cus, num_heads_k=heads,
                  revision=revision, need_lse=need_lse)


# writing a plan into AITER-style buffers


def _check_buffer(name: str, buf: Any, last: int | None, need: int) -> None:
    """``buf`` a contiguous int32 ``[>= need]`` tensor, or ``[>= need, last]`` unless ``last`` is None."""
    if not isinstance(buf, torch.Tensor):
        raise PsPlanError(f"{name} must be a torch.Tensor, got {type(buf).__name__}")
    if buf.dtype != torch.int32:
        raise PsPlanError(f"{name} has dtype {buf.dtype}: must be torch.int32")
    if buf.dim() != (1 if last is None else 2) or (last is not None and buf.shape[-1] != last):
        raise PsPlanError(f"{name} has shape {tuple(buf.shape)}: must be {'[n]' if last is None else f'[n, {last}]'}")
    if not buf.is_contiguous():
        raise PsPlanError(f"{name} is not contiguous: AITER writes it as raw contiguous memory")
    if buf.shape[0] < need:
        raise PsPlanError(f"{name} has {buf.shape[0]} {'entries' if last is None else 'rows'} but the plan needs {need}"
                          " (AITER's planner would write past it and corrupt memory)")


def fill_aiter_buffers(
    plan: PsPlan, work_metadata_ptrs: torch.Tensor, work_indptr: torch.Tensor, work_info: torch.Tensor,
    reduce_indptr: torch.Tensor, reduce_final_map: torch.Tensor, reduce_partial_map: torch.Tensor,
) -> None:
    """Write ``plan`` into the six buffers of :func:`ps_metadata_info` in place (any device), the *whole*
    of each as the real planner does: the used part from the plan, the tail as AITER leaves it (0, except
    ``reduce_indptr``'s: ``num_partials``). ``work_metadata_ptrs`` (>= 2 elements) is only size-checked.

    Raises:
        PsPlanError (a ValueError): a buffer that is not a contiguous int32 tensor of the right rank, or
        too small for the plan. Nothing is written then.
    """
    if not isinstance(plan, PsPlan):
        raise PsPlanError(f"plan must be a PsPlan, got {type(plan).__name__}")
    if not isinstance(work_metadata_ptrs, torch.Tensor):
        raise PsPlanError(f"work_metadata_ptrs must be a torch.Tensor, got {type(work_metadata_ptrs).__name__}")
    if work_metadata_ptrs.numel() < 2:
        raise PsPlanError(f"work_metadata_ptrs has {work_metadata_ptrs.numel()} elements: needs 2 (uint64 [2])")
    ng, npart = plan.num_reduce_groups, plan.num_partials
    bufs = (("work_indptr", work_indptr, plan.work_indptr, None, plan.cu_num + 1, 0),
            ("work_info", work_info, plan.work_info, WORK_INFO_COLS, plan.num_works, 0),
            ("reduce_indptr", reduce_indptr, plan.reduce_indptr, None, ng + 1, npart),
            ("reduce_final_map", reduce_final_map, plan.reduce_final_map, 2, ng, 0),
            ("reduce_partial_map", reduce_partial_map, plan.reduce_partial_map, None, npart, 0))
    for name, dst, _src, last, n, _tail in bufs:
        _check_buffer(name, dst, last, n)
    for _name, dst, src, _last, n, tail in bufs:  # the used part, then the tail AITER leaves
        tmp = torch.full(tuple(dst.shape), tail, dtype=torch.int32)
        tmp[:n] = src[:n]
        dst.copy_(tmp)
