"""Core library tests against independent references (CPU)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mla_fp8_bench.measure.metrics import error_metrics, lse_error
from mla_fp8_bench.measure.reference import causal_attention, reference_bf16, reference_fp8_dequant
from mla_fp8_bench.problem.cases import Case, CaseError, default_sweep, parse_case_id, resolve_cases
from mla_fp8_bench.problem.flops import case_flops, case_min_bytes, tflops
from mla_fp8_bench.problem.fp8 import QuantError, fp8_max, quantize
from mla_fp8_bench.problem.inputs import make_inputs


# ----------------------------------------------------------------------------- cases
@pytest.mark.parametrize("cid,lens,heads,quant,dist,seed", [
    ("s4096", (4096,), 16, "per_tensor", "normal", 0),
    ("s4096-h128", (4096,), 128, "per_tensor", "normal", 0),
    ("ragged-6992-6896-2495", (6992, 6896, 2495), 16, "per_tensor", "normal", 0),
    ("ragged-4096x4", (4096,) * 4, 16, "per_tensor", "normal", 0),
    ("ragged-1x120-8000", (1,) * 120 + (8000,), 16, "per_tensor", "normal", 0),
    ("s512-h24-cast-mla-seed3", (512,), 24, "cast", "mla", 3),
])
def test_case_ids_parse_and_round_trip(cid, lens, heads, quant, dist, seed):
    c = parse_case_id(cid)
    assert (c.seq_lens, c.num_heads, c.quant, c.dist, c.seed) == (lens, heads, quant, dist, seed)
    assert c.id == cid
    assert c.cu_seqlens()[-1] == sum(lens)


@pytest.mark.parametrize("bad,needle", [
    ("s0", "seq_len 0"),
    ("s-5", "is invalid"),
    ("ragged", "empty batch"),
    ("x4096", "is invalid"),
    ("s4096-h0", "num_heads 0"),
    ("s4096-fp16", "'fp16' is not recognised"),
    ("s4096-h16", "not canonical"),
    ("ragged-4096x0", "repeat count"),
])
def test_bad_case_ids_name_the_value(bad, needle):
    with pytest.raises(CaseError, match=needle):
        parse_case_id(bad)


def test_bad_case_fields():
    with pytest.raises(CaseError, match="empty batch"):
        Case(())
    with pytest.raises(CaseError, match="quant mode 'int8' is unknown: allowed per_tensor, cast"):
        Case((8,), quant="int8")
    with pytest.raises(CaseError, match="distribution 'uniform'"):
        Case((8,), dist="uniform")
    with pytest.raises(CaseError, match="num_heads -1"):
        Case((8,), num_heads=-1)


def test_suites_and_sweep_cap():
    ids, note = default_sweep("cpu")
    assert ids[-1] == "s2048" and "2048" in note
    assert default_sweep("cuda")[0][-1] == "s32768"
    cases = resolve_cases(["tile-edges", "s256", "ragged"])
    assert [c.id for c in cases][:3] == ["s255", "s256", "s257"]
    assert len({c.id for c in cases}) == len(cases)
    with pytest.raises(CaseError, match="suite name"):
        resolve_cases(["nonsense"])


# ----------------------------------------------------------------------------- fp8
def test_per_tensor_round_trip_and_saturation():
    x = torch.tensor([0.0, 1.0, -2.5, 1000.0, -3000.0])
    q = quantize(x, "per_tensor")
    assert q.data.dtype == torch.float8_e4m3fn and q.descale.shape == (1,)
    assert math.isclose(q.descale.item(), 3000.0 / 448.0, rel_tol=1e-6)
    deq = q.dequantize()
    assert deq[-1].item() == pytest.approx(-3000.0, rel=1e-6)  # amax maps exactly to -448
    # e4m3 has 3 mantissa bits: relative rounding error <= 2^-4 for normal values
    assert torch.all((deq[1:] - x[1:]).abs() <= x[1:].abs() * 2 ** -4 + 1e-6)


def test_per_tensor_clamps_explicitly_not_nan():
    # amax-based scale never exceeds the range, but the clamp must also hold for values that round up
    x = torch.linspace(-1, 1, 1001) * 448.0
    q = quantize(x, "per_tensor")
    assert torch.isfinite(q.data.float()).all()
    assert q.data.float().abs().max().item() == 448.0


def test_cast_mode_is_unit_scale_and_matches_torch():
    x = torch.randn(64) * 3
    q = quantize(x, "cast")
    assert q.descale.item() == 1.0
    assert torch.equal(q.data.float(), x.to(torch.float8_e4m3fn).float())


def test_fnuz_max_and_bad_quant_inputs():
    assert fp8_max(torch.float8_e4m3fnuz) == 240.0
    assert fp8_max(torch.float8_e4m3fn) == 448.0
    with pytest.raises(QuantError, match="'int8' is unknown"):
        quantize(torch.ones(2), "int8")
    with pytest.raises(QuantError, match="not finite"):
        quantize(torch.tensor([1.0, float("nan")]), "per_tensor")
    with pytest.raises(QuantError, match="dtype torch.int32"):
        quantize(torch.ones(2, dtype=torch.int32))


# ----------------------------------------------------------------------------- reference
def _naive(q, k, v, cu, scale):
    """Scalar-loop float64 attention, bottom-right causal (independent of the vectorised reference)."""
    t, h, _ = q.shape
    out = torch.zeros(t, h, v.shape[-1], dtype=torch.float64)
    lse = torch.zeros(t, h, dtype=torch.float64)
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        n = s1 - s0
        for hh in range(h):
            for i in range(n):
                scores = [float(q[s0 + i, hh].double() @ k[s0 + j, hh].double()) * scale for j in range(n)
                          if j <= n - n + i]
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                z = sum(w)
                lse[s0 + i, hh] = m + math.log(z)
                acc = torch.zeros(v.shape[-1], dtype=torch.float64)
                for j, wj in enumerate(w):
                    acc += wj / z * v[s0 + j, hh].double()
                out[s0 + i, hh] = acc
    return out, lse


def test_reference_matches_naive_loop_on_ragged_batch():
    g = torch.Generator().manual_seed(1)
    lens = [1, 5, 9]
    cu = [0, 1, 6, 15]
    q = torch.randn(15, 2, 12, generator=g)
    k = torch.randn(15, 2, 12, generator=g)
    v = torch.randn(15, 2, 7, generator=g)
    out, lse = causal_attention(q, k, v, cu, 0.3, dtype=torch.float64, chunk_elements=20)  # force chunking
    nout, nlse = _naive(q, k, v, cu, 0.3)
    torch.testing.assert_close(out, nout, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, nlse, rtol=1e-12, atol=1e-12)
    assert sum(lens) == 15


def test_reference_rejects_bad_cu_seqlens():
    q = torch.randn(4, 1, 8)
    with pytest.raises(ValueError, match="must start at 0"):
        causal_attention(q, q, q, [1, 4], 1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        causal_attention(q, q, q, [0, 3, 2, 4], 1.0)


def test_fp8_reference_uses_dequantised_inputs():
    inp = make_inputs(parse_case_id("s64-h2"))
    out, lse = reference_fp8_dequant(inp)
    q, k, v = inp.dequantized(torch.float64)
    o2, l2 = causal_attention(q, k, v, [0, 64], inp.softmax_scale, dtype=torch.float64)
    torch.testing.assert_close(out, o2)
    ob, _ = reference_bf16(inp)
    # fp8 input rounding moves the output by a few percent of |v| ~ 1 but not more
    d = (ob - out).abs().max().item()
    assert 1e-3 < d < 0.5


def test_const_inputs_give_the_known_answer():
    inp = make_inputs(parse_case_id("ragged-3-5-const"))
    out, _ = reference_bf16(inp)
    expect = inp.v.double()  # all scores tie -> mean of identical v rows = the row itself
    torch.testing.assert_close(out, expect)


def test_inputs_are_deterministic_and_mla_v_is_strided():
    a = make_inputs(parse_case_id("s32-h4-mla"))
    b = make_inputs(parse_case_id("s32-h4-mla"))
    assert torch.equal(a.q, b.q) and torch.equal(a.v, b.v)
    assert not a.v.is_contiguous() and a.v.stride(-2) == 256
    # the 64-dim rope part of k is shared by all heads
    assert torch.equal(a.k[:, 0, 128:], a.k[:, 3, 128:])
    c = make_inputs(parse_case_id("s32-h4-mla-seed1"))
    assert not torch.equal(a.q, c.q)


def test_outlier_inputs_exceed_fp8_range_in_cast_mode():
    inp = make_inputs(parse_case_id("s256-cast-outlier"))
    assert inp.k.float().abs().max().item() > 448.0 and inp.v.float().abs().max().item() > 448.0
    # torch >= 2.12 saturates
    assert torch.isfinite(inp.k8.data.float()).all() and inp.k8.data.float().abs().max().item() == 448.0


# ----------------------------------------------------------------------------- metrics
def test_metrics_hand_computed():
    ref = torch.tensor([1.0, -2.0, 0.0, 4.0], dtype=torch.float64)
    out = torch.tensor([1.05, -2.0, 0.001, 3.0], dtype=torch.float64)
    m = error_metrics(out, ref)
    assert m.max_abs_error == pytest.approx(1.0)
    assert m.mean_abs_error == pytest.approx((0.05 + 0 + 0.001 + 1.0) / 4, rel=1e-9)
    assert m.rel_l2_error == pytest.approx(math.sqrt(0.0025 + 1e-6 + 1.0) / math.sqrt(1 + 4 + 16), rel=1e-9)
    assert m.max_rel_error == pytest.approx(max(0.05 / 1, 0.001 / 1e-2, 1.0 / 4), rel=1e-9)
    # isclose: |d| <= 0.05 + 0.05|ref|: 0.05 <= 0.1 ok, 0 ok, 0.001 <= 0.05 ok, 1.0 > 0.25 fails
    assert m.mismatch_fraction == pytest.approx(0.25)
    assert m.nonfinite_count == 0


def test_metrics_nonfinite_and_shape_errors():
    m = error_metrics(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]))
    assert m.nonfinite_count == 1 and m.max_abs_error == math.inf and m.mismatch_fraction == 0.5
    with pytest.raises(ValueError, match="differs from reference shape"):
        error_metrics(torch.zeros(2), torch.zeros(3))
    assert lse_error(torch.tensor([1.0, 5.0]), torch.tensor([1.0, 4.0]), torch.tensor([True, False])) == 0.0
    assert lse_error(torch.tensor([1.0, 5.0]), torch.tensor([1.0, 4.0])) == pytest.approx(0.25)


# ----------------------------------------------------------------------------- flops
def causal_flops(seq_lens, num_heads, *, exact=False):
    """FLOPs of causal attention over a ragged prefill batch: ``2 * H * (192 + 128) * sum(pairs_i)``, pairs
    ``S^2/2`` (the field's convention) or ``S(S+1)/2`` (exact)."""
    if not seq_lens:
        raise ValueError("seq_lens is empty: a batch needs at least one sequence")
    return 2.0 * num_heads * (192 + 128) * sum(s * (s + 1) / 2 if exact else s * s / 2 for s in seq_lens)


@pytest.mark.parametrize("lens,heads", [([1], 1), ([7, 3], 2), ([256, 257, 1], 16)])
def test_flops_match_brute_force_pair_count(lens, heads):
    pairs = sum(1 for s in lens for i, j in itertools.product(range(s), range(s)) if j <= i)
    exact = causal_flops(lens, heads, exact=True)
    assert exact == 2 * heads * (192 + 128) * pairs
    conv = causal_flops(lens, heads)
    assert conv == sum(heads * s * s * 320 for s in lens)  # the field's H*S^2*(Dqk+Dv)
    assert case_flops(Case(tuple(lens), num_heads=heads)) == conv  # the runner's count on prefill cases


def test_flops_bytes_and_tflops():
    assert causal_flops([4096], 16) == pytest.approx(8.59e10, rel=1e-3)  # docs/methodology.md#flops
    assert case_min_bytes(Case((100,), num_heads=16)) == 768 * 16 * 100
    assert tflops(1e12, 0.5) == 2.0
    assert math.isnan(tflops(1.0, 0.0))
    with pytest.raises(ValueError, match="empty"):
        causal_flops([], 16)
