"""Tests for the pure-Python port of AITER's PS planner (``mla_fp8_bench.aiter_ps.planner``).

* Golden vectors: every record of the three files in ``tests/data`` (AITER's own
  ``get_ps_metadata_v1`` / ``get_ps_metadata_info_v1`` outputs; ``tests/data/README.md``) must be
  reproduced element by element: v1 and v2 pre-#3606 (AITER e4048607a535) and v2 post-#3606
  (ROCm/aiter#3606, AITER v0.1.22 semantics), including the info shapes.
* Properties: ~200 seeded random configurations per revision are checked by an independent coverage
  checker (written from the contract's semantics, not from the planner's algorithm), plus brute-force
  counting on small configurations.
* Validation: every bad input raises ``ValueError`` naming the bad value.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from mla_fp8_bench.aiter_ps.facts import BUFFER_NAMES, total_qlen_violations
from mla_fp8_bench.aiter_ps.planner import (
    BUFFER_LENGTH_KEYS,
    PsPlan,
    buffer_lengths_from_info,
    fill_aiter_buffers,
    plan_ps_prefill,
    ps_metadata_info,
)

DATA = Path(__file__).resolve().parent / "data"
#: golden file -> (planner keywords, number of records): revision and need_lse of the AITER build that made it
GOLDEN_FILES = {
    "ps_planner_golden.json.gz": (dict(revision="pre-3606"), 192),
    "ps_planner_golden_v2_pre3606.json.gz": (dict(revision="pre-3606"), 326),
    "ps_planner_golden_v2_post3606.json.gz": (dict(revision="pr3606-ref"), 326),
    "ps_planner_golden_v3_final3606_nolse.json.gz": (dict(revision="v0.1.22", need_lse=False), 326),
    "ps_planner_golden_v3_final3606_lse.json.gz": (dict(revision="v0.1.22", need_lse=True), 326),
}
_TAGS = {"ps_planner_golden.json.gz": "v1", "ps_planner_golden_v2_pre3606.json.gz": "v2pre3606",
         "ps_planner_golden_v2_post3606.json.gz": "v2pr3606ref",
         "ps_planner_golden_v3_final3606_nolse.json.gz": "v3nolse",
         "ps_planner_golden_v3_final3606_lse.json.gz": "v3lse"}
#: property-test modes: the pre-#3606 plan (= v0.1.22 need_lse=False) and v0.1.22 with need_lse=True
MODES = {"pre3606": dict(revision="pre-3606"), "v0122lse": dict(revision="v0.1.22", need_lse=True)}
BIG_ROWS = 32_768  # work_info rows above which test_golden sizes work_info to its use (keeps it fast)
WORK_INFO_FIELDS = ("batch_idx", "partial_o_loc", "qo_start", "qo_end", "kv_start", "kv_end", "kv_offset",
                    "q_head_range")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread: these tests make many small tensors, and on a loaded 2-core machine
    torch's thread hand-offs cost ~8x the work (measured). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------
# golden vectors
# ------------------------------------------------------------------------------------------------


@functools.cache
def golden(name: str) -> dict:
    """The parsed golden file ``tests/data/<name>`` (cached: each file is read once per session)."""
    with gzip.open(DATA / name, "rt") as f:
        return json.load(f)


def _golden_params():
    out = []
    for name, (_kw, n) in GOLDEN_FILES.items():
        out += [pytest.param(name, i, id=f"{_TAGS[name]}-{i:03d}") for i in range(n)]
    return out


def _first_mismatch(got: list, want: list) -> str:
    if len(got) != len(want):
        return f"length {len(got)} != {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"first difference at [{i}]: got {g}, want {w}"
    return "equal"


def _assert_same(name: str, got, want) -> None:
    assert got == want, f"{name}: {_first_mismatch(got, want) if isinstance(got, list) else f'{got} != {want}'}"


def _plan_config(cfg: dict, **extra) -> PsPlan:
    return plan_ps_prefill(
        cfg["seqlens_qo_indptr"],
        cfg["pages_kv_indptr"],
        cfg["context_lens"],
        num_heads_k=cfg["num_heads_k"],
        cu_num=cfg["cu_num"],
        gqa_ratio=cfg["gqa_ratio"],
        qhead_granularity=cfg["qhead_granularity"],
        qlen_granularity=cfg["qlen_granularity"],
        kvlen_granularity=cfg["kvlen_granularity"],
        block_size=cfg["block_size"],
        is_causal=cfg["is_causal"],
        **extra,
    )


def _shapes(info) -> dict:
    return {k: {"shape": list(shape), "dtype": dt} for k, (shape, dt) in info.items()}


def _buffer_lengths(plan: PsPlan) -> dict[str, int]:
    """Leading dims of the plan's buffers, keyed as in BUFFER_LENGTH_KEYS."""
    tensors = (plan.work_indptr, plan.work_info, plan.reduce_indptr, plan.reduce_final_map, plan.reduce_partial_map)
    return {"work_metadata_ptrs": 2, **{k: int(t.shape[0]) for k, t in zip(BUFFER_LENGTH_KEYS[1:], tensors)}}


@pytest.mark.parametrize("name", list(GOLDEN_FILES))
def test_golden_file_meta(name):
    kw, n = GOLDEN_FILES[name]
    data = golden(name)
    assert data["meta"]["num_records"] == len(data["records"]) == n
    assert tuple(data["meta"]["work_info_fields"]) == WORK_INFO_FIELDS
    if "v3" in name:
        assert data["meta"]["need_lse"] is kw["need_lse"]
        assert all(r["config"]["need_lse"] is kw["need_lse"] for r in data["records"])
        assert data["meta"]["info_function"]["parameters"] == ["batch_size", "num_head_k", "max_qlen",
                                                                "qlen_granularity=256"]
    elif kw["revision"] == "pr3606-ref":
        assert data["meta"]["aiter_revision"]["sha"].startswith("b97d239d1a8c")
        assert data["meta"]["semantics"].startswith("post-3606")
    else:
        assert data["meta"]["aiter_commit"].startswith("e4048607a535")
    if "v2" in name:
        fams = Counter(r["config"]["family"] for r in data["records"])
        assert set(fams) == {"causal-prefill", "context-chunk"}
        assert any(r["config"]["seq_lens_q"] != r["config"]["seq_lens_kv"] for r in data["records"])


def _check_info(rec: dict, revision: str) -> None:
    cfg = rec["config"]
    post = revision == "pr3606-ref"
    extra = dict(max_kvlen=max(cfg["context_lens"]), kvlen_granularity=128) if post else {}
    info = ps_metadata_info(cfg["batch_size"], cfg["num_heads_k"], cfg["max_qlen"], 256, cu_num=cfg["cu_num"],
                            revision=revision, **extra)
    assert list(info) == list(BUFFER_NAMES)
    assert _shapes(info) == rec["info_shapes"]
    assert buffer_lengths_from_info(info) == rec["outputs"]["buffer_lengths"]
    if post:
        assert rec["info_args"]["max_kvlen"] == max(cfg["context_lens"])
        none = ps_metadata_info(cfg["batch_size"], cfg["num_heads_k"], cfg["max_qlen"], 256, cu_num=cfg["cu_num"],
                                revision=revision)
        assert _shapes(none) == rec["info_shapes_max_kvlen_none"]


def _check_outputs(plan: PsPlan, out: dict, lengths: dict) -> None:
    _assert_same("work_indptr", plan.work_indptr.tolist(), out["work_indptr"])
    _assert_same("num_works", plan.num_works, out["num_works"])
    _assert_same("work_info", plan.used_work_info.tolist(), out["work_info"])
    _assert_same("reduce_indptr", plan.reduce_indptr.tolist(), out["reduce_indptr"])
    _assert_same("num_reduce_groups", plan.num_reduce_groups, out["num_reduce_groups"])
    _assert_same("reduce_final_map", plan.used_reduce_final_map.tolist(), out["reduce_final_map"])
    _assert_same("num_partials", plan.num_partials, out["num_partials"])
    _assert_same("reduce_partial_map", plan.used_reduce_partial_map.tolist(), out["reduce_partial_map"])
    # whole buffers: exact lengths, tails as the real planner leaves them
    bl = lengths
    assert _buffer_lengths(plan) == bl
    for t in (plan.work_indptr, plan.work_info, plan.reduce_indptr, plan.reduce_final_map, plan.reduce_partial_map):
        assert t.dtype == torch.int32 and t.device.type == "cpu" and t.is_contiguous()
    assert plan.work_info.shape == (bl["work_info_rows"], 8)
    assert plan.reduce_final_map.shape == (bl["reduce_final_map_rows"], 2)
    assert not plan.work_info[plan.num_works :].any()
    assert not plan.reduce_final_map[plan.num_reduce_groups :].any()
    assert not plan.reduce_partial_map[plan.num_partials :].any()
    assert plan.reduce_indptr[plan.num_reduce_groups + 1 :].eq(plan.num_partials).all()


@pytest.mark.parametrize("name, idx", _golden_params())
def test_golden(name, idx):
    kw = GOLDEN_FILES[name][0]
    rec = golden(name)["records"][idx]
    cfg, out = rec["config"], rec["outputs"]
    _check_info(rec, kw["revision"])

    # Info bounds reach 5.4M work_info rows (170 MB, post-#3606); above BIG_ROWS the plan is made with
    # work_info sized to its use (the bound itself is checked by _check_info, the used rows here).
    lengths = dict(out["buffer_lengths"])
    big = lengths["work_info_rows"] > BIG_ROWS
    if big:
        lengths["work_info_rows"] = out["num_works"]
    plan = _plan_config(cfg, buffer_lengths=lengths, **kw)
    assert plan.revision == kw["revision"] and plan.need_lse is (kw["revision"] == "pr3606-ref" or
                                                                  kw.get("need_lse") is True)
    _check_outputs(plan, out, lengths)
    if plan.need_lse:
        assert -1 not in plan.used_work_info[:, 1].tolist()
    if big:
        return

    # the default sizing is the revision's info sizing, so the plan is the same without buffer_lengths
    plan2 = _plan_config(cfg, **kw)
    assert _buffer_lengths(plan2) == out["buffer_lengths"]
    assert torch.equal(plan2.work_info, plan.work_info)

    # fill_aiter_buffers writes whole buffers (garbage-initialised) exactly like the golden output
    bufs = {
        n: torch.full(shape["shape"], -7, dtype=getattr(torch, "int64" if shape["dtype"] == "uint64" else "int32"))
        for n, shape in rec["info_shapes"].items()
    }
    fill_aiter_buffers(plan, *(bufs[n] for n in BUFFER_NAMES))
    assert bufs["work_metadata_ptrs"].eq(-7).all()  # never written
    _assert_same("filled work_indptr", bufs["work_indptr"].tolist(), out["work_indptr"])
    _assert_same("filled reduce_indptr", bufs["reduce_indptr"].tolist(), out["reduce_indptr"])
    assert torch.equal(bufs["work_info"], plan.work_info)
    assert torch.equal(bufs["reduce_final_map"], plan.reduce_final_map)
    assert torch.equal(bufs["reduce_partial_map"], plan.reduce_partial_map)


def test_revisions_share_the_schedule():
    """AITER's data: both revisions give the same work_indptr and works except partial_o_loc."""
    pre, post = (golden(n)["records"] for n in ("ps_planner_golden_v2_pre3606.json.gz",
                                                 "ps_planner_golden_v2_post3606.json.gz"))
    for a, b in zip(pre, post):
        assert a["config"]["id"] == b["config"]["id"]
        cfg, used = a["config"], {"work_info_rows": b["outputs"]["num_works"]}
        p0 = _plan_config(cfg, buffer_lengths=used)
        p1 = _plan_config(cfg, buffer_lengths=used, revision="pr3606-ref")
        assert torch.equal(p0.work_indptr, p1.work_indptr)
        w0, w1 = p0.used_work_info.clone(), p1.used_work_info.clone()
        w0[:, 1] = w1[:, 1] = 0
        assert torch.equal(w0, w1)
        assert p1.num_partials >= p0.num_partials


def test_pr3606_numbers_from_aiter_data():
    """Numbers measured from AITER's planner at both revisions (s = q_len = kv_len, H=16, cu_num=256)."""
    def plan(s, post, b=1):
        qo = [i * s for i in range(b + 1)]
        kw = dict(revision="v0.1.22", need_lse=True) if post else {}
        return plan_ps_prefill(qo, qo, [s] * b, num_heads_k=16, cu_num=256, **kw)

    assert (plan(4096, False).num_partials, plan(4096, False).num_reduce_groups) == (16, 8)
    assert (plan(4096, True).num_partials, plan(4096, True).num_reduce_groups) == (24, 16)
    assert plan(16384, False).num_partials == 0 and plan(16384, True).num_partials == 64
    # info bounds (partial slots): s16384 1,024 -> 9,216; B=16 x 16384 1,920 -> 147,456
    def slots(b, post):
        extra = dict(revision="pr3606-ref", max_kvlen=16384) if post else {}
        return ps_metadata_info(b, 16, 16384, cu_num=256, **extra)["reduce_partial_map"][0][0]

    assert (slots(1, False), slots(1, True)) == (1024, 9216)
    assert (slots(16, False), slots(16, True)) == (1920, 147456)


def test_v0122_info_sizes():
    """v0.1.22 sizes (AITER's _legacy_info; data README v3): reduce_partial_map = B*T + cpc - 1, work_info
    (B + cpc - 1)*T*H rows, reduce_indptr B*T + 1, reduce_final_map B*T; worked by hand here."""
    # s16384 H16 cu256: cpc = 256/16 = 16, T = 64 -> 64 + 15 = 79 slots (pre-#3606: min(16, 30)*64 = 1024)
    info = ps_metadata_info(1, 16, 16384, cu_num=256, revision="v0.1.22")
    assert info["reduce_partial_map"] == ((79,), "int32") and info["work_info"] == ((16 * 64 * 16, 8), "int32")
    assert info["reduce_indptr"] == ((65,), "int32") and info["reduce_final_map"] == ((64, 2), "int32")
    # vLLM's builder: max_num_seqs 1024, max_prefill_qlen 8192, 16 heads: 1024*32 + 15 = 32783 slots
    assert ps_metadata_info(1024, 16, 8192, cu_num=256, revision="v0.1.22")["reduce_partial_map"][0][0] == 32783
    assert ps_metadata_info(1024, 16, 8192, cu_num=256)["reduce_partial_map"][0][0] == 30 * 32
    with pytest.raises(ValueError, match="need_lse=True: the pre-3606 get_ps_metadata_v1 has no need_lse"):
        plan_ps_prefill([0, 10], [0, 10], [10], num_heads_k=16, cu_num=256, need_lse=True)
    with pytest.raises(ValueError, match="need_lse=1 is invalid: must be a bool"):
        plan_ps_prefill([0, 10], [0, 10], [10], num_heads_k=16, cu_num=256, revision="v0.1.22", need_lse=1)


def test_post3606_info_validation():
    with pytest.raises(ValueError, match="max_kvlen=100.*the v0.1.22 get_ps_metadata_info_v1 has no such"):
        ps_metadata_info(1, 16, 10, cu_num=256, revision="v0.1.22", max_kvlen=100)
    with pytest.raises(ValueError, match="revision='v0.1.21' is unknown: allowed pre-3606, pr3606-ref, v0.1.22"):
        ps_metadata_info(1, 16, 10, cu_num=256, revision="v0.1.21")
    with pytest.raises(ValueError, match="max_kvlen=100.*the pre-3606"):
        ps_metadata_info(1, 16, 10, cu_num=256, max_kvlen=100)
    with pytest.raises(ValueError, match="max_kvlen=-1"):
        ps_metadata_info(1, 16, 10, cu_num=256, revision="pr3606-ref", max_kvlen=-1)
    with pytest.raises(ValueError, match="kvlen_granularity=0"):
        ps_metadata_info(1, 16, 10, cu_num=256, revision="pr3606-ref", kvlen_granularity=0)
    # max_kvlen=None and 0 fall back to max_qlen (AITER: ``max_kvlen or max_qlen``)
    a = ps_metadata_info(2, 16, 1000, cu_num=256, revision="pr3606-ref")
    assert a == ps_metadata_info(2, 16, 1000, cu_num=256, revision="pr3606-ref", max_kvlen=0)
    # tiles = 2*4 = 8, kv_splits = ceil(1000/128) = 8, cpc = 16: 8 * (8 + 16) = 192 slots, x16 heads works
    assert a["reduce_partial_map"] == ((192,), "int32") and a["work_info"] == ((192 * 16, 8), "int32")


# ------------------------------------------------------------------------------------------------
# independent invariant checker
# ------------------------------------------------------------------------------------------------


def check_plan(qo: list[int], kvp: list[int], ctx: list[int], num_heads: int, cu_num: int, causal: bool,
               plan: PsPlan, revision: str = "pre-3606", need_lse: bool | None = None) -> dict:
    """Check a plan against the semantics in docs/aiter-contract.md (#work-info), independently of how the
    planner builds it. Returns a few statistics. Assumes block_size 1 and default buffer sizes.

    Coverage is checked per (tile, head) by interval arithmetic: the keys visible to a tile's last
    row are ``[0, kmax)`` with ``kmax = kv_len - q_len + tile_end`` (causal, bottom-right) or
    ``kv_len``; every other row of the tile sees a prefix of that. So the valid (row, head, key)
    triples are covered exactly once iff the tile-head's KV intervals, sorted, tile ``[0, >= kmax)``
    without gaps or overlaps and none starts at or after ``kmax`` (a work that could only touch
    masked keys). Ends are bounded by kv_len separately.

    Semantics: without need_lse (pre-#3606, or v0.1.22 with need_lse=False) a tile computed by one work
    has loc -1 and no reduce group, split tiles have >= 2 partials; with need_lse (v0.1.22 need_lse=True,
    or the pr3606-ref revision) every work that reads keys has a slot and every such tile a group.
    """
    nb = len(ctx)
    post_3606 = need_lse is True or revision == "pr3606-ref"
    extra = dict(max_kvlen=max(ctx)) if revision == "pr3606-ref" else {}
    info = ps_metadata_info(nb, num_heads, max(qo[b + 1] - qo[b] for b in range(nb)), 256, cu_num=cu_num,
                            revision=revision, **extra)
    assert _buffer_lengths(plan) == buffer_lengths_from_info(info)
    nw, ng, npart = plan.num_works, plan.num_reduce_groups, plan.num_partials
    assert nw <= info["work_info"][0][0]
    assert ng <= info["reduce_final_map"][0][0] and ng + 1 <= info["reduce_indptr"][0][0]
    assert npart <= info["reduce_partial_map"][0][0]

    wind = plan.work_indptr.tolist()
    assert len(wind) == cu_num + 1 and wind[0] == 0 and wind[-1] == nw
    assert all(wind[g] <= wind[g + 1] for g in range(cu_num))
    wi = plan.used_work_info.tolist()
    assert not plan.work_info[nw:].any(), "work_info tail must be zero"

    tgs = cu_num // math.gcd(num_heads, cu_num)
    n_tiles_of = [-(-(qo[b + 1] - qo[b]) // 256) for b in range(nb)]
    n_tiles = sum(n_tiles_of)

    cover: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    per_tg_head: Counter = Counter()
    for g in range(cu_num):
        for w in range(wind[g], wind[g + 1]):
            b, loc, qs, qe, ks, ke, _koff, hr = wi[w]
            assert 0 <= b < nb, f"work {w}: batch {b}"
            qlen, kvlen = qo[b + 1] - qo[b], ctx[b]
            lq = qs - qo[b]
            assert lq % 256 == 0 and 0 <= lq < qlen, f"work {w}: qo_start {qs} is not a tile start of seq {b}"
            assert qe == qo[b] + min(lq + 256, qlen), f"work {w}: qo_end {qe}"
            lk0, lk1 = ks - kvp[b], ke - kvp[b]
            assert 0 <= lk0 <= lk1 <= kvlen, f"work {w}: kv [{ks},{ke}) outside seq {b}"
            assert lk0 % 128 == 0, f"work {w}: kv_start {ks} is not 128-aligned from the seq start"
            h = hr & 0xFFFF
            assert h < num_heads and (hr >> 16) == h + 1, f"work {w}: q_head_range {hr:#x}"
            assert loc == -1 or (loc >= 0 and loc % 256 == 0), f"work {w}: loc {loc}"
            cover.setdefault((b, lq // 256, h), []).append((lk0, lk1, loc))
            per_tg_head[g, h] += 1
    assert all(n <= n_tiles + tgs - 1 for n in per_tg_head.values())

    split_tiles: dict[tuple[int, int], tuple[int, ...]] = {}
    for b in range(nb):
        qlen, kvlen = qo[b + 1] - qo[b], ctx[b]
        for i in range(n_tiles_of[b]):
            tile_end = min(256 * i + 256, qlen)
            kmax = kvlen - qlen + tile_end if causal else kvlen
            tile_locs = None
            for h in range(num_heads):
                ws = sorted(cover.pop((b, i, h), []))
                if kmax == 0:  # nothing visible: at most a zero-length work, unsplit
                    assert len(ws) <= 1 and all(a == e for a, e, _ in ws), (b, i, h, ws)
                else:
                    assert ws, f"seq {b} tile {i} head {h}: not covered"
                    pos = 0
                    for a, e, _ in ws:
                        assert a == pos, f"seq {b} tile {i} head {h}: gap/overlap at key {pos}: {ws}"
                        assert a < e and a < kmax, f"seq {b} tile {i} head {h}: useless work {ws}"
                        pos = e
                    assert pos >= kmax, f"seq {b} tile {i} head {h}: keys [{pos},{kmax}) not covered"
                if not ws:
                    continue
                locs = tuple(loc for _, _, loc in ws)
                if len(ws) == 1 and not post_3606:
                    assert locs == (-1,), f"seq {b} tile {i} head {h}: single work must have loc -1"
                elif len(ws) == 1 and ws[0][0] == ws[0][1] and revision == "v0.1.22":
                    assert locs == (-1,), f"seq {b} tile {i} head {h}: a work without keys gets no slot"
                elif len(ws) == 1:
                    assert locs[0] >= 0, f"seq {b} tile {i} head {h}: post-#3606 work without a partial slot"
                else:
                    assert -1 not in locs and len(set(locs)) == len(locs), (b, i, h, ws)
                    locs = tuple(sorted(locs))
                if tile_locs is None:
                    tile_locs = locs
                assert locs == tile_locs, f"seq {b} tile {i}: heads disagree on the split ({locs} vs {tile_locs})"
            if tile_locs is not None and tile_locs != (-1,):
                split_tiles[b, i] = tile_locs
    assert not cover, f"works for unknown (seq, tile, head): {list(cover)[:3]}"

    owner: dict[int, tuple[int, int]] = {}
    for tile, locs in split_tiles.items():
        for loc in locs:
            assert loc not in owner, f"partial loc {loc} used by tiles {owner[loc]} and {tile}"
            owner[loc] = tile
    assert set(owner) == {256 * k for k in range(npart)}, "partial rows must be 256*k, k < num_partials"

    rind = plan.reduce_indptr.tolist()
    rfm = plan.used_reduce_final_map.tolist()
    rpm = plan.used_reduce_partial_map.tolist()
    assert ng == len(split_tiles)
    assert rind[0] == 0 and all(x == npart for x in rind[ng:]), "reduce_indptr tail must equal num_partials"
    assert not plan.reduce_final_map[ng:].any() and not plan.reduce_partial_map[npart:].any()
    groups = {}
    for g in range(ng):
        key = tuple(rfm[g])
        assert key not in groups, f"two reduce groups for tile {key}"
        parts = rpm[rind[g] : rind[g + 1]]
        assert len(parts) >= (1 if post_3606 else 2) and parts == sorted(set(parts)), f"group {g}: {parts}"
        groups[key] = tuple(parts)
    expected = {
        (qo[b] + 256 * i, qo[b] + min(256 * i + 256, qo[b + 1] - qo[b])): locs for (b, i), locs in split_tiles.items()
    }
    assert groups == expected
    assert list(groups) == sorted(groups), "reduce groups must be in (qo_start, qo_end) order"
    return {"works": nw, "split_tiles": ng, "partials": npart}


def brute_force_coverage(qo, kvp, ctx, num_heads, causal, plan: PsPlan) -> None:
    """Count, for every (row, head, key), the works covering it; must equal the causal mask."""
    counts = []
    masks = []
    for b in range(len(ctx)):
        qlen, kvlen = qo[b + 1] - qo[b], ctx[b]
        i = torch.arange(qlen)[:, None]
        j = torch.arange(kvlen)[None, :]
        mask = (j <= kvlen - qlen + i) if causal else torch.ones(qlen, kvlen, dtype=torch.bool)
        masks.append(mask.to(torch.int32))
        counts.append(torch.zeros(qlen, num_heads, kvlen, dtype=torch.int32))
    for b, _loc, qs, qe, ks, ke, _off, hr in plan.used_work_info.tolist():
        r0, r1, k0, k1 = qs - qo[b], qe - qo[b], ks - kvp[b], ke - kvp[b]
        counts[b][r0:r1, hr & 0xFFFF, k0:k1] += masks[b][r0:r1, k0:k1]
    for b in range(len(ctx)):
        want = masks[b][:, None, :].expand_as(counts[b])
        assert torch.equal(counts[b], want), f"seq {b}: coverage counts differ from the mask"


# ------------------------------------------------------------------------------------------------
# property tests
# ------------------------------------------------------------------------------------------------

CU_NUMS = (80, 256, 304)
HEADS = (1, 8, 12, 16, 24, 32, 64, 128)
N_RANDOM = 200


def _rand_len(rng: random.Random, hi: int = 5000) -> int:
    if rng.random() < 0.4:  # log-uniform: many short sequences
        return max(1, min(hi, int(math.exp(rng.uniform(0, math.log(hi))))))
    return rng.randint(1, hi)


def _random_config(seed: int) -> dict:
    rng = random.Random(1000 + seed)
    causal = rng.random() < 0.65
    nb = rng.randint(1, 8)
    qlens, kvlens = [], []
    for _ in range(nb):
        a, b = _rand_len(rng), _rand_len(rng)
        if causal:
            q, k = (a, a) if rng.random() < 0.5 else (min(a, b), max(a, b))
        else:
            q, k = (a, a) if rng.random() < 0.3 else (a, b)
        qlens.append(q)
        kvlens.append(k)
    qo, kv = [0], [0]
    for q, k in zip(qlens, kvlens):
        qo.append(qo[-1] + q)
        kv.append(kv[-1] + k)
    return {
        "qo": qo, "kv": kv, "ctx": kvlens, "heads": rng.choice(HEADS), "cu": rng.choice(CU_NUMS), "causal": causal,
    }


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_random_config_invariants(seed, mode):
    c = _random_config(seed)
    plan = plan_ps_prefill(c["qo"], c["kv"], c["ctx"], num_heads_k=c["heads"], cu_num=c["cu"], is_causal=c["causal"],
                           **MODES[mode])
    check_plan(c["qo"], c["kv"], c["ctx"], c["heads"], c["cu"], c["causal"], plan, **MODES[mode])


def _mutated(plan: PsPlan, row: int, col: int, value: int) -> PsPlan:
    wi = plan.work_info.clone()
    wi[row, col] = value
    return dataclasses.replace(plan, work_info=wi)


def test_checker_detects_corruption():
    """The independent checker must reject plans with a single wrong field."""
    qo = [0, 1000, 1700]
    args = (qo, qo, [1000, 700], 2, 10, True)
    plan = plan_ps_prefill(qo, qo, [1000, 700], num_heads_k=2, cu_num=10, is_causal=True)
    check_plan(*args, plan)
    wi = plan.used_work_info
    split = [i for i in range(plan.num_works) if int(wi[i, 1]) != -1]
    whole = [i for i in range(plan.num_works) if int(wi[i, 1]) == -1]
    assert split and whole
    s0 = split[0]
    bad_plans = [
        _mutated(plan, s0, 5, int(wi[s0, 5]) - 1),  # gap in the KV coverage
        _mutated(plan, s0, 4, int(wi[s0, 4]) + 1),  # misaligned start
        _mutated(plan, s0, 1, -1),  # a piece of a split tile marked unsplit
        _mutated(plan, whole[0], 1, 256 * plan.num_partials),  # an unsplit tile with a partial loc
        _mutated(plan, s0, 7, 1 | (2 << 16)),  # piece moved to the other head
        _mutated(plan, s0, 1, int(wi[split[-1], 1])),  # partial loc shared by two pieces
    ]
    for i, bad in enumerate(bad_plans):
        with pytest.raises(AssertionError):
            check_plan(*args, bad)
            pytest.fail(f"mutation {i} not detected")  # pragma: no cover
    rpm = plan.reduce_partial_map.clone()
    rpm[0], rpm[1] = rpm[1].clone(), rpm[0].clone()
    with pytest.raises(AssertionError):
        check_plan(*args, dataclasses.replace(plan, reduce_partial_map=rpm))


def test_random_configs_exercise_splits():
    """The random sweep must actually contain split tiles, unsplit tiles and both mask modes."""
    split = unsplit = 0
    modes = set()
    for seed in range(0, N_RANDOM, 5):
        c = _random_config(seed)
        plan = plan_ps_prefill(c["qo"], c["kv"], c["ctx"], num_heads_k=c["heads"], cu_num=c["cu"],
                               is_causal=c["causal"])
        split += plan.num_reduce_groups
        unsplit += int((plan.used_work_info[:, 1] == -1).sum())
        modes.add(c["causal"])
    assert split > 20 and unsplit > 20 and modes == {True, False}


EDGE_CASES = {
    # (qlens, kvlens, heads, cu, causal)
    "chunked-ctx-zero-kv": ([1] * 16 + [1], [0] * 16 + [8000], 16, 256, False),
    "chunked-ctx-long-q": ([7893] + [1] * 119, [8000] + [0] * 119, 16, 256, False),
    "all-kv-zero": ([5, 300, 1], [0, 0, 0], 8, 80, False),
    "empty-q-seq": ([0, 300, 0, 17], [10, 300, 4, 17], 16, 256, True),
    "cu1": ([700, 33], [700, 900], 8, 1, True),
    "heads-eq-cu": ([4096, 1000], [4096, 1000], 256, 256, True),
    "heads-multiple-of-cu": ([2000], [2000], 160, 80, True),
    "odd-cu": ([3000, 1], [3000, 1], 3, 7, True),
    "q-much-shorter": ([8, 8], [16384, 9000], 16, 256, True),
    "non-causal-q-gt-kv": ([1000, 513], [10, 2000], 12, 304, False),
    "prime-units": ([1, 257, 4099], [1, 257, 4099], 1, 304, True),
}


def _build(qlens, kvlens):
    qo, kv = [0], [0]
    for q, k in zip(qlens, kvlens):
        qo.append(qo[-1] + q)
        kv.append(kv[-1] + k)
    return qo, kv, list(kvlens)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_case_invariants(name, mode):
    qlens, kvlens, heads, cu, causal = EDGE_CASES[name]
    qo, kv, ctx = _build(qlens, kvlens)
    plan = plan_ps_prefill(qo, kv, ctx, num_heads_k=heads, cu_num=cu, is_causal=causal, **MODES[mode])
    check_plan(qo, kv, ctx, heads, cu, causal, plan, **MODES[mode])
    post = plan.need_lse
    if name == "all-kv-zero":
        assert plan.num_works == 0  # no units: no TG has capacity (kv_len = 0)
    if name in ("cu1", "heads-eq-cu", "heads-multiple-of-cu"):
        # one TG per cluster never splits: no partials pre-#3606, one slot per tile post-#3606
        assert plan.num_partials == (plan.num_works // heads if post else 0)


BRUTE_CASES = [
    # (qlens, kvlens, heads, cu, causal)
    ([600], [600], 1, 80, True),
    ([512], [512], 16, 256, True),
    ([300, 17, 513], [300, 40, 700], 2, 80, True),
    ([300, 17, 513], [0, 700, 5], 3, 16, False),
    ([1, 255, 256, 257], [129, 255, 256, 600], 4, 7, True),
    ([700], [1000], 8, 304, True),
]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", range(len(BRUTE_CASES)))
def test_brute_force_coverage(case, mode):
    qlens, kvlens, heads, cu, causal = BRUTE_CASES[case]
    qo, kv, ctx = _build(qlens, kvlens)
    plan = plan_ps_prefill(qo, kv, ctx, num_heads_k=heads, cu_num=cu, is_causal=causal, **MODES[mode])
    brute_force_coverage(qo, kv, ctx, heads, causal, plan)
    check_plan(qo, kv, ctx, heads, cu, causal, plan, **MODES[mode])


def test_brute_force_random_small():
    rng = random.Random(7)
    for _ in range(12):
        nb = rng.randint(1, 4)
        causal = rng.random() < 0.6
        qlens = [rng.randint(1, 700) for _ in range(nb)]
        kvlens = [q + rng.randint(0, 300) if causal else rng.randint(0, 900) for q in qlens]
        heads, cu = rng.choice([1, 2, 4]), rng.choice([5, 16, 80])
        qo, kv, ctx = _build(qlens, kvlens)
        plan = plan_ps_prefill(qo, kv, ctx, num_heads_k=heads, cu_num=cu, is_causal=causal)
        brute_force_coverage(qo, kv, ctx, heads, causal, plan)


def test_contract_examples():
    # B=1, q=512, cu_num=256 -> partial-map bounds 32/16/64 at H=16/32/24, 6 used
    bounds = {h: ps_metadata_info(1, h, 512, cu_num=256)["reduce_partial_map"][0] for h in (16, 32, 24)}
    assert bounds == {16: (32,), 32: (16,), 24: (64,)}
    plan = plan_ps_prefill([0, 512], [0, 512], [512], num_heads_k=16, cu_num=256, is_causal=True)
    assert plan.num_partials == 6 and plan.partial_rows == 6 * 256
    # B=16, ctx=16384, H=16 -> 1920 partial slots
    assert ps_metadata_info(16, 16, 16384, cu_num=256)["reduce_partial_map"] == ((1920,), "int32")
    info = ps_metadata_info(3, 12, 1000, cu_num=80)
    assert info["work_metadata_ptrs"] == ((2,), "uint64") and info["work_indptr"] == ((81,), "int32")
    # cpc = 80 // gcd(12, 80) = 20, mqs = 4
    assert info["work_info"] == (((3 + 19) * 4 * 12, 8), "int32")
    assert info["reduce_indptr"] == ((13,), "int32") and info["reduce_final_map"] == ((12, 2), "int32")
    assert info["reduce_partial_map"] == ((min(3 + 19, 38) * 4,), "int32")


def _works_of(plan, tg):
    """The ``work_info`` rows workgroup ``tg`` runs, in order."""
    if not 0 <= tg < plan.cu_num:
        raise ValueError(f"tg={tg} is out of range: 0 <= tg < cu_num={plan.cu_num}")
    return plan.work_info[int(plan.work_indptr[tg]):int(plan.work_indptr[tg + 1])]


def test_plan_helpers():
    qo = [0, 700, 1000]
    plan = plan_ps_prefill(qo, qo, [700, 300], num_heads_k=12, cu_num=80)
    num_clusters = math.gcd(plan.num_heads_k, plan.cu_num)
    assert num_clusters == 4 and plan.cu_num // num_clusters == 20
    total = 0
    for g in range(80):
        w = _works_of(plan, g)
        assert w.shape[1] == 8
        total += w.shape[0]
    assert total == plan.num_works
    assert plan.used_reduce_indptr.tolist() == plan.reduce_indptr[: plan.num_reduce_groups + 1].tolist()
    with pytest.raises(ValueError, match="tg=80"):
        _works_of(plan, 80)


def test_tensor_inputs_match_lists():
    qo, kv, ctx = [0, 300, 1500, 1501], [0, 400, 1700, 1702], [400, 1300, 2]
    ref = plan_ps_prefill(qo, kv, ctx, num_heads_k=8, cu_num=80)
    for dt in (torch.int32, torch.int64):
        p = plan_ps_prefill(torch.tensor(qo, dtype=dt), torch.tensor(kv, dtype=dt), torch.tensor(ctx, dtype=dt),
                            num_heads_k=8, cu_num=80)
        assert torch.equal(p.work_info, ref.work_info) and torch.equal(p.work_indptr, ref.work_indptr)
        assert torch.equal(p.reduce_partial_map, ref.reduce_partial_map)
    lengths = buffer_lengths_from_info(ps_metadata_info(3, 8, 1200, cu_num=80))
    p = plan_ps_prefill(tuple(qo), tuple(kv), tuple(ctx), num_heads_k=8, cu_num=80, buffer_lengths=lengths)
    assert torch.equal(p.work_info, ref.work_info)


@pytest.mark.parametrize("causal", [True, False])
def test_block_size_gt_1_page_coverage(causal):
    """Not covered by the golden vectors (the PS kernel runs at page size 1): at block_size 16 each
    tile-head's page ranges must tile [0, ceil(kmax/16)) pages from the sequence start, start on
    multiples of G = 128/16 pages and stay inside the sequence's pages."""
    bs, gran = 16, 128
    qlens, kvlens = [1000, 40, 300], [1000, 77, 300]
    qo, kvp, ctx = [0], [0], list(kvlens)
    for q, k in zip(qlens, kvlens):
        qo.append(qo[-1] + q)
        kvp.append(kvp[-1] + -(-k // bs))
    for heads, cu in ((1, 80), (2, 7), (16, 256)):
        plan = plan_ps_prefill(qo, kvp, ctx, num_heads_k=heads, cu_num=cu, block_size=bs,
                               kvlen_granularity=gran, is_causal=causal)
        cover = {}
        for b, _loc, qs, _qe, ks, ke, koff, hr in plan.used_work_info.tolist():
            p0, p1 = ks - kvp[b], ke - kvp[b]
            assert 0 <= p0 <= p1 <= kvp[b + 1] - kvp[b] and p0 % (gran // bs) == 0
            assert koff in (0, ctx[b] - p1 * bs)
            cover.setdefault((b, qs, hr & 0xFFFF), []).append((p0, p1))
        for b in range(len(qlens)):
            for i in range(-(-qlens[b] // 256)):
                kmax = kvlens[b] - qlens[b] + min(256 * i + 256, qlens[b]) if causal else kvlens[b]
                for h in range(heads):
                    ws = sorted(cover[b, qo[b] + 256 * i, h])
                    pos = 0
                    for a, e in ws:
                        assert a == pos and a < e
                        pos = e
                    assert pos >= -(-kmax // bs)


def test_large_batch_plan():
    qo = [i * 16384 for i in range(17)]
    plan = plan_ps_prefill(qo, qo, [16384] * 16, num_heads_k=128, cu_num=256)
    assert plan.num_works == 128 * 1024 and plan.num_partials == 0  # 2 TGs per cluster: nothing split
    post = plan_ps_prefill(qo, qo, [16384] * 16, num_heads_k=128, cu_num=256, revision="v0.1.22", need_lse=True)
    assert post.num_works == plan.num_works
    assert post.num_partials == post.num_reduce_groups == 1024  # post-#3606: one slot per work of a head


# ------------------------------------------------------------------------------------------------
# fill_aiter_buffers
# ------------------------------------------------------------------------------------------------


def _alloc(info, **override_len):
    bufs = {}
    for name, (shape, dt) in info.items():
        shape = list(shape)
        if name in override_len:
            shape[0] = override_len[name]
        bufs[name] = torch.full(shape, -5, dtype=torch.int64 if dt == "uint64" else getattr(torch, dt))
    return bufs


def _split_plan():
    qo = [0, 3000, 3700]
    info = ps_metadata_info(2, 16, 3000, cu_num=80)
    plan = plan_ps_prefill(qo, qo, [3000, 700], num_heads_k=16, cu_num=80)
    assert plan.num_partials > 0 and plan.num_reduce_groups > 0
    return plan, info


def test_fill_larger_and_exact_buffers():
    plan, info = _split_plan()
    bufs = _alloc(info, work_indptr=90, work_info=plan.num_works + 3, reduce_indptr=50,
                  reduce_final_map=plan.num_reduce_groups, reduce_partial_map=plan.num_partials)
    fill_aiter_buffers(plan, *(bufs[n] for n in BUFFER_NAMES))
    assert bufs["work_indptr"][:81].tolist() == plan.work_indptr.tolist() and not bufs["work_indptr"][81:].any()
    assert torch.equal(bufs["work_info"][: plan.num_works], plan.used_work_info)
    assert not bufs["work_info"][plan.num_works :].any()
    ng, npart = plan.num_reduce_groups, plan.num_partials
    assert bufs["reduce_indptr"][: ng + 1].tolist() == plan.used_reduce_indptr.tolist()
    assert bufs["reduce_indptr"][ng + 1 :].eq(npart).all()
    assert torch.equal(bufs["reduce_final_map"], plan.used_reduce_final_map)
    assert torch.equal(bufs["reduce_partial_map"], plan.used_reduce_partial_map)


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------

_OK = dict(qo_indptr=[0, 10, 300], kv_indptr=[0, 20, 400], context_lens=[20, 380], num_heads_k=16, cu_num=256)

BAD_INPUTS = {
    "qo-not-from-0": (dict(qo_indptr=[1, 10, 300]), r"qo_indptr=\[1, 10, 300\] is invalid: an int32 indptr from 0"),
    "kv-not-from-0": (dict(kv_indptr=[3, 20, 400]), r"kv_indptr=\[3, 20, 400\] is invalid"),
    "qo-decreasing": (dict(qo_indptr=[0, 10, 5]), r"qo_indptr=\[0, 10, 5\] is invalid: .* non-decreasing"),
    "kv-decreasing": (dict(kv_indptr=[0, 20, 19], context_lens=[20, 0]), r"kv_indptr=\[0, 20, 19\] is invalid"),
    "qo-too-short": (dict(qo_indptr=[0], kv_indptr=[0], context_lens=[]), r"qo_indptr=\[0\] is invalid: .* B\+1 >= 2"),
    "kv-length-mismatch": (dict(kv_indptr=[0, 20]), r"kv_indptr=\[0, 20\] is invalid: .* as qo_indptr"),
    "ctx-length-mismatch": (dict(context_lens=[20, 380, 1]), r"context_lens has length 3: must have B=2"),
    "ctx-inconsistent": (dict(context_lens=[21, 380]), r"context_lens\[0\]=21 is invalid: .* 20 pages"),
    "ctx-negative": (dict(context_lens=[-1, 380], kv_indptr=[0, -1, 379]), r"(-1)"),
    "causal-q-gt-kv": (dict(qo_indptr=[0, 30, 300], kv_indptr=[0, 20, 400], context_lens=[20, 380]),
                       r"sequence 0: q_len=30 > kv_len=20"),
    "heads-zero": (dict(num_heads_k=0), r"num_heads_k=0"),
    "heads-too-many": (dict(num_heads_k=70000), r"num_heads_k=70000"),
    "heads-float": (dict(num_heads_k=16.0), r"num_heads_k=16\.0"),
    "cu-zero": (dict(cu_num=0), r"cu_num=0"),
    "gqa": (dict(gqa_ratio=2), r"gqa_ratio=2 is not supported: only gqa_ratio=1"),
    "qhead-gran": (dict(qhead_granularity=4), r"qhead_granularity=4 is not supported"),
    "qlen-gran": (dict(qlen_granularity=128), r"qlen_granularity=128 is not supported: only qlen_granularity=256"),
    "kv-gran-not-pow2": (dict(kvlen_granularity=96), r"kvlen_granularity=96 .* power of two"),
    "kv-gran-zero": (dict(kvlen_granularity=0), r"kvlen_granularity=0"),
    "kv-gran-lt-block": (dict(kvlen_granularity=64, block_size=128, kv_indptr=[0, 1, 4]),
                         r"kvlen_granularity=64 .* block_size=128"),
    "block-size-zero": (dict(block_size=0), r"block_size=0"),
    "kv-gran-not-multiple": (dict(kvlen_granularity=128, block_size=48, kv_indptr=[0, 1, 9]),
                             r"kvlen_granularity=128 .* block_size=48 and a multiple"),
    "ctx-exceeds-pages": (dict(block_size=16, kv_indptr=[0, 1, 2]), r"context_lens\[0\]=20 is invalid: .* 1 pages x"),
    "float-tensor": (dict(qo_indptr=torch.tensor([0.0, 10.0, 300.0])), r"qo_indptr has dtype torch.float32"),
    "2d-tensor": (dict(kv_indptr=torch.zeros(3, 1, dtype=torch.int32)), r"kv_indptr has .* shape \(3, 1\): a 1-D"),
    "float-element": (dict(qo_indptr=[0, 1.5, 300]), r"qo_indptr\[1\]=1\.5"),
    "int32-overflow": (dict(qo_indptr=[0, 10, 2**31], kv_indptr=[0, 20, 2**31 + 10], context_lens=[20, 2**31 - 10],
                            is_causal=False), r"qo_indptr=\[0, 10, 2147483648\] is invalid: an int32 indptr"),
    "buffer-too-small": (dict(buffer_lengths={"work_info_rows": 3}),
                         r"buffer_lengths\['work_info_rows'\]=3 is too small"),
    "buffer-indptr-small": (dict(buffer_lengths={"work_indptr": 256}), r"buffer_lengths\['work_indptr'\]=256"),
    "buffer-unknown-key": (dict(buffer_lengths={"work_infos": 3}), r"buffer_lengths=\{'work_infos': 3\} must be"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_validation_errors(name):
    change, pattern = BAD_INPUTS[name]
    kw = dict(_OK, **change)
    args = [kw.pop(k) for k in ("qo_indptr", "kv_indptr", "context_lens")]
    with pytest.raises(ValueError, match=pattern):
        plan_ps_prefill(*args, **kw)


def test_valid_baseline_plans():
    kw = dict(_OK)
    args = [kw.pop(k) for k in ("qo_indptr", "kv_indptr", "context_lens")]
    plan = plan_ps_prefill(*args, **kw)
    assert plan.num_works > 0
    assert set(_buffer_lengths(plan)) == set(BUFFER_LENGTH_KEYS)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(batch_size=-1, num_heads_k=16, max_qlen=10, cu_num=256), r"batch_size=-1"),
        (dict(batch_size=1, num_heads_k=0, max_qlen=10, cu_num=256), r"num_heads_k=0"),
        (dict(batch_size=1, num_heads_k=16, max_qlen=-3, cu_num=256), r"max_qlen=-3"),
        (dict(batch_size=1, num_heads_k=16, max_qlen=10, qlen_granularity=0, cu_num=256), r"qlen_granularity=0"),
        (dict(batch_size=1, num_heads_k=16, max_qlen=10, cu_num=0), r"cu_num=0"),
        (dict(batch_size=1.5, num_heads_k=16, max_qlen=10, cu_num=256), r"batch_size=1\.5"),
    ],
)
def test_info_validation(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ps_metadata_info(**kwargs)


def test_error_messages_are_readable():
    with pytest.raises(ValueError) as e:
        plan_ps_prefill([0, 5], [0, 3], [3], num_heads_k=1, cu_num=80)
    assert re.search(r"q_len=5 > kv_len=3", str(e.value)) and "undefined" in str(e.value)


# ------------------------------------------------------------------------------------------------
# the total_qlen budget (modelled by the invariants AITER's op_tests/test_ps_metadata_sizing.py pins)
# ------------------------------------------------------------------------------------------------


def _lengths(info) -> dict:
    return {name: shape[0] for name, (shape, _dt) in info.items()}


def test_total_qlen_info_by_hand():
    """B=256, H=16, max_qlen=16384, cu 256: unbudgeted partial map 256*64 + 16 - 1 = 16399 slots; at a budget of
    16639 tokens the largest the pinned bound allows, (16639 + 256*(256 + 256)) // 256 = 576; reduce_final_map keeps
    256*64 rows (>= ceil(16384/256) = 64); a budget above the bound's reach changes nothing; None gives v0.1.22's."""
    base = ps_metadata_info(256, 16, 16384, cu_num=256, revision="v0.1.22")
    assert ps_metadata_info(256, 16, 16384, cu_num=256, revision="total-qlen") == base
    got = _lengths(ps_metadata_info(256, 16, 16384, cu_num=256, revision="total-qlen", total_qlen=16639))
    assert got == dict(_lengths(base), reduce_partial_map=576) and _lengths(base)["reduce_partial_map"] == 16399
    assert got["reduce_final_map"] == 256 * 64 and got["work_info"] == (256 + 15) * 64 * 16
    big = ps_metadata_info(256, 16, 16384, cu_num=256, revision="total-qlen", total_qlen=10**9)
    assert big == base
    # DeepSeek-V3 TP8 at a 16k budget (B 256, 16 heads, v 512): 128 GiB of fp32 partials + LSE without the budget
    rows = 256 * ps_metadata_info(256, 16, 16384, cu_num=256, revision="total-qlen")["reduce_partial_map"][0][0]
    assert rows * 16 * 513 * 4 / 2**30 == pytest.approx(128.37, abs=0.01)  # 16399 * 256 * 16 * 513 * 4 B
    for bad in (0, -5):
        with pytest.raises(AssertionError):
            ps_metadata_info(1, 16, 100, cu_num=256, revision="total-qlen", total_qlen=bad)
    with pytest.raises(ValueError, match="total_qlen=100: the v0.1.22 get_ps_metadata_info_v1 has no such"):
        ps_metadata_info(1, 16, 100, cu_num=256, revision="v0.1.22", total_qlen=100)


def test_total_qlen_violations_name_each_invariant():
    """Hand-made buffer lengths breaking one pinned invariant each (B=2, max_qlen=1000, budget 600, cu 4):
    pool <= max(600, 1000) + 256*(2 + 4) = 2536 rows, i.e. 9 slots; reduce_final_map >= ceil(1000/256) = 4 rows."""
    plain = dict(work_metadata_ptrs=2, work_indptr=5, work_info=80, reduce_indptr=9, reduce_final_map=8,
                 reduce_partial_map=11)
    kw = dict(batch_size=2, max_qlen=1000, total_qlen=600, cu_num=4)
    assert total_qlen_violations(dict(plain, reduce_partial_map=9), plain, **kw) == []
    (msg,) = total_qlen_violations(dict(plain, reduce_partial_map=10), plain, **kw)
    assert "2560 partial rows" in msg and "= 2536" in msg
    (msg,) = total_qlen_violations(dict(plain, reduce_partial_map=9, reduce_final_map=3), plain, **kw)
    assert "reduce_final_map has 3 rows" in msg and ">= ceil(max_qlen / 256) = 4" in msg
    (msg,) = total_qlen_violations(dict(plain, reduce_partial_map=9, work_info=81), plain, **kw)
    assert msg.startswith("work_info has 81 with total_qlen=600 but 80 without")


#: AITER's sizing workloads (op test): one long request + single tokens, every request one token over a tile,
#: exactly one tile, ragged; batch 1 and 17 (the port plans at qlen_granularity 256 only).
BUDGET_WORKLOADS = {
    "long-plus-singles": [5000] + [1] * 16, "one-over-a-tile": [257] * 17, "one-tile": [256] * 17,
    "ragged": [700, 3, 1500, 256, 1, 90, 2048, 5, 300, 17, 1024, 1, 1, 600, 257, 33, 4000], "batch-1": [3000],
}


@pytest.mark.parametrize("need_lse", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(BUDGET_WORKLOADS))
def test_total_qlen_model_keeps_the_invariants_and_the_plan_fits(name, causal, need_lse):
    """At the batch's own token count as the budget, the modelled sizes break no pinned invariant and the
    planner's output fits them (the plan is v0.1.22's, element by element)."""
    q = BUDGET_WORKLOADS[name]
    qo, kv, ctx = _build(q, q)
    for cu, heads in ((256, 16), (80, 12)):
        args = (len(q), heads, max(q))
        budget = _lengths(ps_metadata_info(*args, cu_num=cu, revision="total-qlen", total_qlen=sum(q)))
        plain = _lengths(ps_metadata_info(*args, cu_num=cu, revision="v0.1.22"))
        assert total_qlen_violations(budget, plain, batch_size=len(q), max_qlen=max(q), total_qlen=sum(q),
                                     cu_num=cu) == []
        lengths = dict(zip(BUFFER_LENGTH_KEYS, budget.values()))
        got = plan_ps_prefill(qo, kv, ctx, num_heads_k=heads, cu_num=cu, is_causal=causal, revision="total-qlen",
                              need_lse=need_lse, buffer_lengths=lengths)
        want = plan_ps_prefill(qo, kv, ctx, num_heads_k=heads, cu_num=cu, is_causal=causal, revision="v0.1.22",
                               need_lse=need_lse)
        assert torch.equal(got.used_work_info, want.used_work_info) and got.num_partials == want.num_partials
        assert got.num_partials <= budget["reduce_partial_map"]
