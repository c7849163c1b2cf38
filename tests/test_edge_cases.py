"""The ``edge`` suite (mla_fp8_bench.problem.cases.SUITES["edge"]) as tests with known right answers (CPU).

Each test runs ``aiter-emulated`` (the AITER PS driver over the stand-in: planner port, emulated
kernel and reduce) and ``torch-fp8-ref`` on one edge case and checks a value against an expectation
that does not come from the code under test: a dense float64 attention written here (not
``mla_fp8_bench.measure.reference``), an exact answer (one key, all-equal scores), or plan arithmetic.

CPU budget (2 cores): the emulator is O(S^2 * H) Python-level work, so cases run at two heads where
the head count is not the point (``s257-h2`` for the suite's ``s257``); the head-count cases run at
S=257 (>= 2 q-tiles, so split partials reach ``mla_reduce_v1``); ``ragged-1x120-8000`` runs as
``ragged-1x120-600-h2`` (the suite keeps the long id; the 8000 one is planned, not emulated); the
65536+ token batch is planned and checked, not emulated. The suite ids stay as they are (asserted).
"""

from __future__ import annotations

import math

import pytest
import torch

from mla_fp8_bench.aiter_ps.facts import Q_TILE as TILE_Q
from mla_fp8_bench.aiter_ps.workspace import workspace_bytes
from mla_fp8_bench.backends import get_backend
from mla_fp8_bench.harness.runner import RunOptions, evaluate
from mla_fp8_bench.measure.devices import platform_info
from mla_fp8_bench.problem.cases import SUITES, parse_case_id
from mla_fp8_bench.problem.fp8 import cast_saturates, fp8_max
from mla_fp8_bench.problem.inputs import make_inputs

PINFO = platform_info("cpu")
#: max |out - ref| bound of the emulated FP8 kernel against exact attention on the same fp8 inputs
#: (per channel, in units of max(1, max |v| of the channel)): P is rounded to e4m3 (3 mantissa bits)
#: before P@V, so errors of a few 1e-2 are the kernel's own.
EMU_TOL_ABS = 0.15
EMU_TOL_REL_L2 = 0.05
#: torch-fp8-ref is fp32 SDPA on the same dequantised inputs, rounded to bf16 once.
REF_TOL_ABS = 0.02


# ----------------------------------------------------------------------------- independent helpers
def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int],
                           scale: float) -> torch.Tensor:
    """Textbook float64 softmax(QK^T*scale + causal mask) V per sequence (independent of the library)."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    for s0, s1 in zip(cu, cu[1:]):
        n = s1 - s0
        scores = torch.einsum("qhd,khd->hqk", q[s0:s1], k[s0:s1]) * scale
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        out[s0:s1] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v[s0:s1])
    return out


def run_backend(name: str, inputs) -> torch.Tensor:
    b = get_backend(name)
    ok = b.supports(inputs.case, PINFO)
    assert ok, ok.reason
    prepared = b.prepare(inputs)
    try:
        return prepared.run().detach().clone()
    finally:
        if prepared.cleanup is not None:
            prepared.cleanup()


def check_against_dense(cid: str) -> dict:
    """Run both backends on ``cid``; compare with the dense float64 attention on the fp8 inputs."""
    case = parse_case_id(cid)
    inp = make_inputs(case, "cpu")
    q, k, v = inp.dequantized(torch.float64)
    ref = dense_causal_attention(q, k, v, case.cu_seqlens(), inp.softmax_scale)
    res = {"inputs": inp, "ref": ref}
    for name, tol in (("aiter-emulated", EMU_TOL_ABS), ("torch-fp8-ref", REF_TOL_ABS)):
        out = run_backend(name, inp)
        assert out.shape == ref.shape and out.dtype == torch.bfloat16
        # the AITER driver pre-fills the output with NaN: a row no work wrote would show up here
        assert torch.isfinite(out.float()).all(), f"{name} on {cid}: rows not written or non-finite"
        # errors scale with |v| (out is a convex combination of v rows): normalise per channel by
        # max(1, max |v| of that channel), which is the identity for randn inputs and fair to outliers
        err = (out.double() - ref).abs() / v.abs().amax(dim=(0, 1)).clamp_min(1.0)
        rel_l2 = float(torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref))
        assert float(err.max()) < tol, f"{name} on {cid}: max abs error {float(err.max()):.4g} >= {tol}"
        if name == "aiter-emulated":
            assert rel_l2 < EMU_TOL_REL_L2, f"{name} on {cid}: rel L2 {rel_l2:.4g}"
        res[name] = out
        res[f"{name}_rowerr"] = err.amax(dim=(1, 2))
    return res


def test_edge_suite_ids_are_kept():
    """The ids below are what the tests stand for; the suite must keep them (ids are never edited)."""
    for cid in ("s1", "s255", "s256", "s257", "ragged-1x120-8000", "ragged-16384x4-4096", "s512-h1", "s512-h8",
                "s512-h12", "s512-h24", "s512-h32", "s512-h64", "s512-h128", "s512-cast-outlier", "s512-const"):
        assert cid in SUITES["edge"], cid
    assert {"s511", "s512", "s513"} <= set(SUITES["tile-edges"])


# ----------------------------------------------------------------------------- seq_len 1
def test_s1_single_token_output_is_its_own_v_row():
    """One token sees one key: softmax weight exactly 1, so out == v (dequantised) up to bf16 rounding."""
    inp = make_inputs(parse_case_id("s1"), "cpu")
    v_deq = inp.v8.dequantize(torch.float64)
    for name in ("aiter-emulated", "torch-fp8-ref"):
        out = run_backend(name, inp).double()
        assert torch.allclose(out, v_deq, rtol=2.0 ** -8, atol=1e-6), name
    # and through the runner: a record with the error against the bf16 reference = fp8 rounding of v only
    data = evaluate(["aiter-emulated"], [inp.case], device="cpu", options=RunOptions(timing=False))
    rec = data["records"][0]
    assert rec["status"] == "ok", rec["reason"]
    expect = float((v_deq - inp.v.double()).abs().max())
    assert rec["max_abs_error_bf16_ref"] == pytest.approx(expect, rel=0.02, abs=2e-3)
    assert rec["max_abs_error_fp8_ref"] < 2e-3  # bf16 output rounding only
    assert rec["nondeterminism_max_abs"] == 0.0


# ----------------------------------------------------------------------------- q-tile edges (256 rows)
@pytest.mark.parametrize("seq_len", [255, 256, 257, 511, 512, 513])
def test_tile_edges_every_row_written_and_accurate(seq_len):
    cid = f"s{seq_len}-h2"
    res = check_against_dense(cid)
    rowerr = res["aiter-emulated_rowerr"]
    # the rows on both sides of each q-tile boundary are as accurate as the rest
    for r in (255, 256, 511, 512):
        if r < seq_len:
            assert float(rowerr[r]) < EMU_TOL_ABS, (cid, r, float(rowerr[r]))
    # the last row (the one that spills into a new q-tile at 257 and 513) is attended correctly
    assert float(rowerr[-1]) < EMU_TOL_ABS


def test_s257_plan_splits_the_spill_tile():
    """257 rows = one full q-tile + a 1-row tile; KV is split across CUs, so the reduce must merge."""
    case = parse_case_id("s257-h2")
    plan = get_backend("aiter-emulated").driver().plan(torch.tensor(case.cu_seqlens(), dtype=torch.int32), 2,
                                                      torch.device("cpu"))
    works = plan["work_info"][: int(plan["work_indptr"][-1])].tolist()
    q_tiles = sorted({(w[2], w[3]) for w in works})
    assert q_tiles == [(0, 256), (256, 257)]
    assert plan["num_partials"] > 0  # split tiles exist: mla_reduce_v1 really merges something


# ----------------------------------------------------------------------------- ragged: 120 x 1 + long
def test_ragged_120_single_tokens_plus_one_long():
    """``ragged-1x120-8000`` at a CPU-sized long sequence: each length-1 sequence attends only to itself."""
    res = check_against_dense("ragged-1x120-600-h2")
    inp = res["inputs"]
    v_deq = inp.v8.dequantize(torch.float64)
    for name in ("aiter-emulated", "torch-fp8-ref"):
        out = res[name].double()
        assert torch.allclose(out[:120], v_deq[:120], rtol=2.0 ** -8, atol=1e-6), name
    # the long sequence does not see the 120 short ones (its first row == its own first v row)
    assert torch.allclose(res["aiter-emulated"][120].double(), v_deq[120], rtol=2.0 ** -8, atol=1e-6)


def _plan_coverage(plan: dict, cu: list[int], num_heads: int) -> None:
    """Every (sequence, head, query row) is in exactly one q-tile, and each tile's KV works cover
    exactly the causal range [start, start + (q1 - start)) without overlap."""
    n = int(plan["work_indptr"][-1])
    works = plan["work_info"][:n].tolist()
    tiles: dict[tuple[int, int, int, int], list[tuple[int, int, int]]] = {}
    for b, loc, q0, q1, k0, k1, _off, hr in works:
        hr &= 0xFFFFFFFF
        for h in range(hr & 0xFFFF, hr >> 16):
            tiles.setdefault((b, h, q0, q1), []).append((k0, k1, loc))
    for b in range(len(cu) - 1):
        for h in range(num_heads):
            mine = sorted((q0, q1) for (bb, hh, q0, q1) in tiles if bb == b and hh == h)
            assert mine and mine[0][0] == cu[b] and mine[-1][1] == cu[b + 1], (b, h, mine[:3])
            assert all(a[1] == c[0] for a, c in zip(mine, mine[1:])), f"q-tiles of seq {b} head {h} not contiguous"
    for (b, h, q0, q1), kvs in tiles.items():
        kvs.sort()
        assert kvs[0][0] == cu[b] and kvs[-1][1] == cu[b] + (q1 - cu[b]), (b, h, q0, q1, kvs[:3])
        assert all(a[1] == c[0] for a, c in zip(kvs, kvs[1:])), "KV splits overlap or leave a gap"
        locs = [loc for _, _, loc in kvs]
        # an unsplit tile writes output directly (-1) unless every tile was given a slot (need_lse)
        every_slot = plan["need_lse"] is True  # a causal prefill plans with need_lse=False
        one = locs == [-1] if not every_slot else locs[0] >= 0 and locs[0] % TILE_Q == 0
        assert (len(kvs) == 1 and one) or (len(kvs) > 1 and all(loc >= 0 and loc % TILE_Q == 0
                                                                for loc in locs))


def test_batch_past_65536_tokens_plan_covers_all_and_stays_in_bounds():
    """``ragged-16384x4-4096`` (69632 tokens): planning and metadata only on CPU."""
    case = parse_case_id("ragged-16384x4-4096")
    assert case.total_tokens == 69632 > 65536
    drv = get_backend("aiter-emulated").driver()
    cu = case.cu_seqlens()
    plan = drv.plan(torch.tensor(cu, dtype=torch.int32), case.num_heads, torch.device("cpu"))
    _plan_coverage(plan, cu, case.num_heads)
    # partial slots: distinct, 256-row aligned, inside the buffer the driver would allocate
    ri = plan["reduce_indptr"].tolist()
    live = plan["num_partials"]
    assert live == ri[-1] and 0 < live <= plan["reduce_partial_map"].numel()
    locs = plan["reduce_partial_map"][:live].tolist()
    assert len(set(locs)) == live and all(x % TILE_Q == 0 and 0 <= x < live * TILE_Q for x in locs)
    # 32-bit buffer-descriptor limits of the real kernel (docs/aiter-contract.md#limits)
    t, h = case.total_tokens, case.num_heads
    assert t * h * 192 < 2 ** 32 and t * h * 256 < 2 ** 32
    assert live * TILE_Q * h * 512 < 2 ** 31
    ws = workspace_bytes(live, t, h).total
    assert ws == 4 * (live * TILE_Q * h * 128 + live * TILE_Q * h + t * h)
    assert ws < 1 << 30  # a 69632-token prefill's scratch stays well under a GiB


def test_120_single_tokens_plus_8000_plan():
    """The suite's own ``ragged-1x120-8000`` id, planned (the emulation runs at 600 above)."""
    case = parse_case_id("ragged-1x120-8000")
    plan = get_backend("aiter-emulated").driver().plan(torch.tensor(case.cu_seqlens(), dtype=torch.int32),
                                                      case.num_heads, torch.device("cpu"))
    _plan_coverage(plan, case.cu_seqlens(), case.num_heads)


# ----------------------------------------------------------------------------- head counts
@pytest.mark.parametrize("cid", ["s512-h1", "s257-h8", "s257-h32", "s257-h64", "s257-h128"])
def test_supported_head_counts(cid):
    """Heads in mla_reduce_v1's dispatch set run and are accurate (h32+ at S=257 for CPU time)."""
    res = check_against_dense(cid)
    assert res["aiter-emulated"].shape[1] == parse_case_id(cid).num_heads


@pytest.mark.parametrize("heads", [12, 24])
def test_unsupported_head_counts_are_skips_with_the_reason(heads):
    """v0.1.20's reduce dispatches {1,2,4,8,10,16,32,40,48,64,96,128} at dv=128: 12 and 24 are skips."""
    case = parse_case_id(f"s512-h{heads}")
    data = evaluate(["aiter-emulated", "torch-fp8-ref"], [case], device="cpu",
                    options=RunOptions(timing=False, determinism=False))
    recs = {r["backend"]: r for r in data["records"]}
    emu = recs["aiter-emulated"]
    assert emu["status"] == "skipped"
    assert "mla_reduce_v1" in emu["reason"] and f"got {heads}" in emu["reason"]
    assert "[1, 2, 4, 8, 10, 16, 32, 40, 48, 64, 96, 128]" in emu["reason"]
    # the other backend on the same case is measured (a skip loses nothing)
    ok = recs["torch-fp8-ref"]
    assert ok["status"] == "ok" and ok["max_abs_error_fp8_ref"] < REF_TOL_ABS


# ----------------------------------------------------------------------------- saturation (cast mode)
@pytest.mark.skipif(not cast_saturates(), reason="this torch's plain fp8 cast returns NaN beyond 448 (< 2.12)")
def test_cast_outlier_saturates_and_outputs_stay_finite():
    """``s512-cast-outlier`` as s257-h2 (two q-tiles, CPU time): k/v channels x150 exceed e4m3fn's 448
    and must saturate (finite fp8, finite outputs, accurate against attention on the saturated inputs)."""
    res = check_against_dense("s257-h2-cast-outlier")
    inp = res["inputs"]
    fmax = fp8_max(torch.float8_e4m3fn)
    assert float(inp.v.float().abs().max()) > fmax and float(inp.k.float().abs().max()) > fmax  # beyond range
    for q8 in (inp.k8, inp.v8):
        d = q8.data.float()
        assert torch.isfinite(d).all() and float(d.abs().max()) == fmax  # saturated, not NaN
        assert float(q8.descale) == 1.0  # cast mode: unit scale
    n_sat = int((inp.v.float().abs() >= fmax).sum())
    assert n_sat > 0 and int((inp.v8.data.float().abs() == fmax).sum()) >= n_sat


# ----------------------------------------------------------------------------- ties (all-equal inputs)
def test_const_inputs_give_the_v_row_exactly():
    """``s512-const`` as s257-h2 (two q-tiles, CPU time): every score ties, so each output row is the mean
    of identical v rows = the v row; the only error left is bf16 output rounding (|v| <= 0.5: half an
    ulp is <= 2^-10)."""
    case = parse_case_id("s257-h2-const")
    inp = make_inputs(case, "cpu")
    v_deq = inp.v8.dequantize(torch.float64)
    exact_v = (torch.arange(128, dtype=torch.float64) / 128 - 0.5).expand_as(v_deq)
    assert float((v_deq - exact_v).abs().max()) <= 0.5 * 2.0 ** -4  # fp8 rounding of the inputs only
    for name in ("aiter-emulated", "torch-fp8-ref"):
        out = run_backend(name, inp).double()
        assert float((out - v_deq).abs().max()) <= 2.0 ** -10, name
