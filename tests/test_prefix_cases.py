"""Context-chunk (``ctx<C>-q<Q>``) and prefix-cached prefill (``prefix<C>-q<Q>``) cases, end to end.

References here are independent of the code under test: dense float64 softmax with an explicit
``tril(diagonal=kv_len - q_len)`` mask (AITER's op-test reference), key-set unions for the LSE merge,
brute-force pair counts for FLOPs, and ``torch.randn`` draws for the seeded inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from mla_fp8_bench.backends import CaseUnsupported, get_backend
from mla_fp8_bench.config import RunConfig
from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate, evaluate_one
from mla_fp8_bench.measure.devices import platform_info
from mla_fp8_bench.measure.metrics import lse_error, lse_metrics
from mla_fp8_bench.measure.reference import reference_fp8_dequant
from mla_fp8_bench.problem.cases import KINDS, MAX_TOTAL_TOKENS, SUITES, Case, CaseError, parse_case_id, resolve_cases
from mla_fp8_bench.problem.flops import case_flops, case_min_bytes
from mla_fp8_bench.problem.inputs import make_inputs
from mla_fp8_bench.problem.prefix import merge_attn_states, split_prefix_inputs

CPU = platform_info("cpu")
SCALE = 1.0 / math.sqrt(192)


def _dense(q, k, v, q_lens, kv_lens, causal):
    """float64 attention per sequence with an explicit bottom-right mask; rows with no key: out 0, lse -inf."""
    outs, lses, qs, ks = [], [], 0, 0
    for ql, kl in zip(q_lens, kv_lens):
        qq, kk, vv = (x.double() for x in (q[qs:qs + ql], k[ks:ks + kl], v[ks:ks + kl]))
        s = torch.einsum("qhd,khd->hqk", qq, kk) * SCALE
        if causal:
            allowed = torch.ones(ql, kl, dtype=torch.bool).tril(diagonal=kl - ql)
            s = s.masked_fill(~allowed, -math.inf)
        lse = torch.logsumexp(s, dim=-1)  # [H, q]
        p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
        outs.append(torch.einsum("hqk,khd->qhd", p, vv))
        lses.append(lse.transpose(0, 1))
        qs, ks = qs + ql, ks + kl
    return torch.cat(outs), torch.cat(lses)


# ------------------------------------------------------------------------------------------ grammar
@pytest.mark.parametrize("cid, family, q_lens, kv_lens", [
    ("ctx1024-q256", "ctx", (256,), (1024,)),
    ("prefix1024-q300", "prefix", (300,), (1324,)),
    ("ctx-ragged-1024q256x2-5q1", "ctx", (256, 256, 1), (1024, 1024, 5)),
    ("prefix-ragged-1024q256-0q300-h8-cast-mla-seed3", "prefix", (256, 300), (1280, 300)),
    ("s4096", "prefill", (4096,), (4096,)),
    ("ragged-1x2-8000", "prefill", (1, 1, 8000), (1, 1, 8000)),
])
def test_case_ids_round_trip_with_lengths(cid, family, q_lens, kv_lens):
    c = parse_case_id(cid)
    assert (c.family, c.seq_lens, c.kv_lens, c.id) == (family, q_lens, kv_lens, cid)
    assert c.causal is (family != "ctx")
    assert c.cu_seqlens_q() == [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    assert c.cu_seqlens_kv() == [0, *torch.tensor(kv_lens).cumsum(0).tolist()]
    assert c.total_kv_tokens == sum(kv_lens) and c.max_kv_len == max(kv_lens)


def test_prefill_keeps_its_old_meaning_and_ctx_refuses_cu_seqlens():
    assert parse_case_id("s512").cu_seqlens() == [0, 512]
    with pytest.raises(CaseError, match="cu_seqlens_q"):
        parse_case_id("ctx1024-q256").cu_seqlens()


@pytest.mark.parametrize("bad, match", [
    ("ctx0-q256", "at least one context_len >= 1"),
    ("prefix-ragged-0q3-0q5", "at least one context_len >= 1"),
    ("ctx1024", "must be followed by '-q<Q>'"),
    ("prefix1024-q0", "seq_len 0 is invalid"),
    ("ctx-ragged", "no '<C>q<Q>' sequences"),
    ("ctx-1024q256", "is invalid: expected"),
    ("ctx1024-q256-seed01", "not canonical"),
    ("prefix-ragged-1024q256-1024q256", "not canonical: write it as 'prefix-ragged-1024q256x2'"),
    ("ctx99999999999-q1", "too large"),
    ("prefix-ragged-1q1x99999999", "more than"),
    (f"ctx{MAX_TOTAL_TOKENS + 1}-q1", "total key tokens"),
    (f"prefix{MAX_TOTAL_TOKENS}-q1", "total key tokens"),
])
def test_bad_chunk_ids_are_refused_with_the_value(bad, match):
    with pytest.raises(CaseError, match=match):
        parse_case_id(bad)


def test_case_fields_are_checked():
    with pytest.raises(CaseError, match="context_lens .* given for a prefill case"):
        Case((5,), context_lens=(3,))
    with pytest.raises(CaseError, match="one length per sequence"):
        Case((5, 6), context_lens=(3,), family="ctx")
    with pytest.raises(CaseError, match="family 'decode' is unknown"):
        Case((5,), context_lens=(3,), family="decode")
    with pytest.raises(CaseError, match="context_len -1 is invalid"):
        Case((5,), context_lens=(-1,), family="prefix")


def test_suites_parse_and_lse_gap_holds_only_chunk_cases():
    for name in ("prefix", "lse-gap"):
        cases = resolve_cases([name])
        assert len(cases) == len(SUITES[name]) >= 5
        assert all(c.family in ("ctx", "prefix") for c in cases)


# ------------------------------------------------------------------------------------------ inputs
def test_inputs_of_a_prefix_case_have_separate_q_and_kv_starts():
    inp = make_inputs(parse_case_id("prefix-ragged-40q8-0q5-h2"))
    assert inp.q.shape == (13, 2, 192) and inp.k.shape == (53, 2, 192) and inp.v.shape == (53, 2, 128)
    assert inp.cu_seqlens_q_cpu.tolist() == [0, 8, 13] and inp.cu_seqlens_kv_cpu.tolist() == [0, 48, 53]
    assert (inp.max_seqlen_q, inp.max_seqlen_kv, inp.causal) == (8, 48, True)
    with pytest.raises(AttributeError, match="cu_seqlens_q / cu_seqlens_kv"):
        _ = inp.cu_seqlens
    gen = torch.Generator().manual_seed(0)  # draw order q, k, v
    q = torch.randn(13, 2, 192, generator=gen)
    k = torch.randn(53, 2, 192, generator=gen)
    assert inp.q.equal(q.bfloat16()) and inp.k.equal(k.bfloat16())


def test_prefill_inputs_are_the_same_draws_as_before():
    inp = make_inputs(parse_case_id("ragged-7-9-h2"))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(16, 2, d, generator=gen).bfloat16() for d in (192, 192, 128))
    assert inp.q.equal(q) and inp.k.equal(k) and inp.v.equal(v)
    assert inp.cu_seqlens is inp.cu_seqlens_q and inp.max_seqlen == 9 and inp.causal


# ------------------------------------------------------------------------------------------ reference
@pytest.mark.parametrize("cid", ["ctx-ragged-70q20-0q3-9q30-h2", "prefix-ragged-70q20-0q3-9q30-h2", "s33-h2"])
def test_reference_matches_dense_masked_attention(cid):
    c = parse_case_id(cid)
    inp = make_inputs(c)
    out, lse = reference_fp8_dequant(inp)
    q, k, v = inp.dequantized(torch.float64)
    ref_o, ref_l = _dense(q, k, v, c.seq_lens, c.kv_lens, c.causal)
    assert torch.allclose(out, ref_o, atol=1e-12, rtol=0)
    finite = torch.isfinite(ref_l)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite], ref_l[finite], atol=1e-12, rtol=0)
    if c.family == "ctx":  # the sequence without context: out 0, lse -inf
        assert torch.all(out[20:23] == 0) and torch.all(torch.isneginf(lse[20:23]))


# ------------------------------------------------------------------------------------------ merge
def test_merge_equals_attention_over_the_union_of_key_sets():
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(6, 3, 192, generator=g), torch.randn(50, 3, 192, generator=g)
    v = torch.randn(50, 3, 128, generator=g)
    full_o, full_l = _dense(q, k, v, (6,), (50,), causal=False)
    a_o, a_l = _dense(q, k[:17], v[:17], (6,), (17,), causal=False)
    b_o, b_l = _dense(q, k[17:], v[17:], (6,), (33,), causal=False)
    o, lse = merge_attn_states(a_o, a_l, b_o, b_l)
    assert o.dtype == torch.float64
    assert torch.allclose(o, full_o, atol=1e-12) and torch.allclose(lse, full_l, atol=1e-12)
    o32, lse32 = merge_attn_states(a_o.float(), a_l.float(), b_o.float(), b_l.float())
    assert o32.dtype == torch.float32 and torch.allclose(o32.double(), full_o, atol=1e-5)


def test_merge_edge_cases_follow_vllm():
    o1, o2 = torch.full((3, 1, 4), 1.0), torch.full((3, 1, 4), 2.0)
    inf = math.inf
    l1 = torch.tensor([[-inf], [inf], [-inf]])
    l2 = torch.tensor([[0.5], [0.5], [-inf]])
    o, lse = merge_attn_states(o1, l1, o2, l2)
    assert torch.all(o[0] == 2.0) and lse[0, 0] == 0.5  # empty context piece: the other piece alone
    assert torch.all(o[1] == 2.0) and lse[1, 0] == 0.5  # +inf (FA2's empty row) counts as -inf
    assert torch.all(o[2] == 1.0) and torch.isneginf(lse[2, 0])  # both empty: prefix piece unchanged
    o, lse = merge_attn_states(o1[:1], torch.tensor([[math.nan]]), o2[:1], torch.tensor([[0.5]]))
    assert torch.isnan(o).all() and torch.isnan(lse).all()  # an unwritten (NaN) LSE is never hidden
    with pytest.raises(ValueError, match="shapes disagree"):
        merge_attn_states(o1, l1, o2[:2], l2[:2])


def test_split_prefix_pieces_merge_to_the_exact_prefix_reference():
    c = parse_case_id("prefix-ragged-60q20-0q7-13q9-h2-mla")
    inp = make_inputs(c)
    new, ctx = split_prefix_inputs(inp)
    assert (new.case.family, ctx.case.family, new.causal, ctx.causal) == ("prefill", "ctx", True, False)
    assert new.cu_seqlens_kv_cpu.tolist() == [0, 20, 27, 36] and ctx.cu_seqlens_kv_cpu.tolist() == [0, 60, 60, 73]
    rows_ctx = list(range(0, 60)) + list(range(87, 100))
    rows_new = list(range(60, 80)) + list(range(80, 87)) + list(range(100, 109))
    assert ctx.k8.data.view(torch.uint8).equal(inp.k8.data.view(torch.uint8)[rows_ctx])
    assert new.v8.data.view(torch.uint8).equal(inp.v8.data.view(torch.uint8)[rows_new])
    assert new.k8.descale is inp.k8.descale and new.q8 is inp.q8
    full_o, full_l = reference_fp8_dequant(inp)
    o, lse = merge_attn_states(*reference_fp8_dequant(ctx), *reference_fp8_dequant(new))
    assert torch.allclose(o, full_o, atol=1e-12) and torch.allclose(lse, full_l, atol=1e-12)
    with pytest.raises(ValueError, match="needs a prefix case"):
        split_prefix_inputs(new)


# ------------------------------------------------------------------------------------------ metrics
def test_flops_and_bytes_count_bottom_right_pairs():
    for cid in ("ctx100-q30-h2", "prefix100-q30-h2", "prefix-ragged-10q4-0q3-h2"):
        c = parse_case_id(cid)
        pairs = 0.0
        for ql, kl in zip(c.seq_lens, c.kv_lens):
            m = torch.ones(ql, kl).tril(diagonal=kl - ql) if c.causal else torch.ones(ql, kl)
            pairs += float(m.sum()) - (ql / 2 if c.causal else 0)  # convention: q^2/2 for the diagonal block
        assert case_flops(c) == pytest.approx(2 * 2 * 320 * pairs)
    c = parse_case_id("ctx100-q30-h2")
    assert case_min_bytes(c) == 2 * (30 * (192 + 256) + 100 * 320)


def test_lse_metrics_check_every_row_of_chunk_cases():
    ref = torch.tensor([[1.0], [2.0], [-math.inf]])
    lse = torch.tensor([[1.0], [math.nan], [-math.inf]])
    rows = torch.tensor([True, False, True])
    assert lse_metrics(lse, rows, ref, KINDS["prefill"]) == {"lse_rel_error_fp8_ref": 0.0, "lse_rows_checked": 2,
                                                      "lse_nonfinite_count": 0}
    m = lse_metrics(lse, rows, ref, KINDS["ctx"])
    assert m["lse_rel_error_fp8_ref"] == math.inf and m["lse_rows_checked"] == 3 and m["lse_nonfinite_count"] == 1
    assert lse_error(torch.tensor([[1.1], [2.0], [math.inf]]), ref) == pytest.approx(0.1)  # +-inf ok on empty rows
    assert lse_error(torch.tensor([[1.0], [2.0], [3.0]]), ref) == math.inf  # a finite LSE on an empty row


# ------------------------------------------------------------------------------------------ backends
@pytest.mark.parametrize("backend", ["torch-fp8-ref", "torch-sdpa-bf16", "aiter-emulated"])
def test_backends_run_ctx_and_prefix_cases_with_lse_on_every_row(backend):
    opts = RunOptions(timing=False, determinism=False)
    for cid in ("ctx-ragged-300q40-0q9-h2", "prefix-ragged-300q40-0q9-h2"):
        case_data = CaseData(parse_case_id(cid), CPU, None)
        rec = evaluate_one(get_backend(backend), case_data, CPU, opts).as_dict()
        assert rec["status"] == "ok", rec["reason"]
        assert rec["lse_rows_checked"] == 49 and rec["lse_nonfinite_count"] == 0
        bound = 0.15 if backend == "torch-sdpa-bf16" else 0.05  # fp8-dequant reference; bf16 inputs differ
        assert rec["max_abs_error_fp8_ref"] < bound and rec["lse_rel_error_fp8_ref"] < bound
        if backend != "torch-sdpa-bf16":
            assert rec["lse_rel_error_fp8_ref"] < 1e-5
        assert rec["flops"] == case_flops(case_data.case)


def test_vllm_aiter_skips_chunk_cases_with_the_reason():
    inp = make_inputs(parse_case_id("ctx100-q64-h2"))
    with pytest.raises(CaseUnsupported, match="#52356"):
        get_backend("vllm-aiter").prepare_case(inp)


def test_run_command_on_ctx_and_prefix_cases(monkeypatch):
    monkeypatch.delenv("MLA_FP8_BENCH_EMU_AITER_VERSION", raising=False)
    data = evaluate(["aiter-emulated", "torch-fp8-ref"], resolve_cases(["ctx256-q64", "prefix256-q100"]),
                    device="cpu", options=RunOptions(timing=False, determinism=True))
    for r in data["records"]:
        assert r["status"] == "ok", r
        assert 0 < r["max_abs_error_fp8_ref"] < 0.05 and r["nondeterminism_max_abs"] == 0.0
        assert r["lse_rel_error_fp8_ref"] < 1e-5 and r["lse_rows_checked"] == (64 if "ctx" in r["case"] else 100)


@pytest.mark.parametrize("version, broken", [("0.1.20", True), ("0.1.22", False)])
def test_lse_gap_cases_break_before_3606_only(monkeypatch, version, broken):
    from support.faults import unsplit_rows

    monkeypatch.setenv("MLA_FP8_BENCH_EMU_AITER_VERSION", version)
    for cid in SUITES["lse-gap"]:  # every lse-gap case has an unsplit tile at 16 heads on 256 CUs
        inp = make_inputs(parse_case_id(cid))
        pieces = split_prefix_inputs(inp) if inp.case.family == "prefix" else (inp,)
        assert any(bool(unsplit_rows(p, 256).any()) for p in pieces), cid
    for cid in ("ctx100-q64", "prefix256-q100"):
        cfg = RunConfig.from_env()  # the asv boundary's configuration, from the variable set above
        rec = evaluate_one(get_backend("aiter-emulated", cfg), CaseData(parse_case_id(cid), CPU, None), CPU,
                           RunOptions(timing=False, determinism=False)).as_dict()
        assert rec["aiter_post_3606"] is (not broken)
        if broken:
            assert rec["lse_nonfinite_count"] > 0 and rec["lse_rel_error_fp8_ref"] == math.inf
            if cid.startswith("prefix"):  # the merge spreads the missing LSE into the output
                assert rec["status"] == "error" and rec["nonfinite_count_fp8_ref"] > 0
        else:
            assert rec["status"] == "ok" and rec["lse_nonfinite_count"] == 0 and rec["lse_rel_error_fp8_ref"] < 1e-5


def test_a_caller_forgetting_need_lse_at_0_1_22_reproduces_the_gap_and_is_caught(monkeypatch):
    """v0.1.22 fixes the gap only for callers that pass need_lse=True: the omit_need_lse fault (need_lse left
    at its default False) leaves the unsplit rows' final_lse unwritten again, and the record says so."""
    from support.faults import FaultyEmulated

    monkeypatch.setenv("MLA_FP8_BENCH_EMU_AITER_VERSION", "0.1.22")
    for cid in ("ctx100-q64", "prefix256-q100"):
        case_data = CaseData(parse_case_id(cid), CPU, None)
        opts = RunOptions(timing=False, determinism=False)
        healthy = evaluate_one(FaultyEmulated(), case_data, CPU, opts).as_dict()
        assert healthy["status"] == "ok" and healthy["lse_nonfinite_count"] == 0 and healthy["need_lse"][-1] is True
        rec = evaluate_one(FaultyEmulated(faults="omit_need_lse"), case_data, CPU, opts).as_dict()
        assert rec["need_lse"] == [None] * len(rec["need_lse"])  # not passed
        assert rec["lse_nonfinite_count"] > 0 and rec["lse_rel_error_fp8_ref"] == math.inf
        if cid.startswith("prefix"):
            assert rec["status"] == "error" and rec["nonfinite_count_fp8_ref"] > 0


def test_asv_grid_has_chunk_cases_and_caps_them_by_keys(monkeypatch):
    from mla_fp8_bench.harness import asv_support

    for cid in ("ctx1024-q256", "prefix1024-q300", "prefix8192-q1024"):
        assert cid in asv_support.ASV_CASES
    monkeypatch.setenv("MLA_FP8_BENCH_DEVICE", "cpu")
    monkeypatch.setenv("MLA_FP8_BENCH_CASES", "ctx1024-q256,prefix8192-q1024")
    monkeypatch.delenv("MLA_FP8_BENCH_MAX_TOKENS", raising=False)
    monkeypatch.delenv("ASV_COMMIT", raising=False)
    monkeypatch.delenv("MLA_FP8_BENCH_EXPECT_COMMIT", raising=False)
    _pinfo, _cap, _b, cases, skipped = asv_support._grid_setup(asv_support.check_knobs())
    assert [c.id for c in cases] == ["ctx1024-q256"]
    assert "9216 tokens exceed" in skipped["prefix8192-q1024"]
