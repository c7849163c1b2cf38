"""Bad-input catalogue (docs/robustness.md): every bad input gives a clear error or a clean skip that
names the problem, and none loses results already measured (CPU).

Sections: A stand-in aiter contract (StandinContractError), B AITER driver and versions, C shapes,
dtypes, devices and cu_seqlens, D NaN/Inf, E missing optional packages, F corrupt files, G unknown
names, H environment variables, I partial writes. Sections J to T are in ``test_bad_inputs_asv.py`` and
``test_bad_inputs_run.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mla_fp8_bench.aiter_ps.facts import Q_TILE as TILE_Q
from mla_fp8_bench.aiter_ps.standin import StandinContractError, make_standin_aiter
from mla_fp8_bench.backends import BackendUnavailable, CaseUnsupported, UnknownBackendError, aiter_real, get_backend
from mla_fp8_bench.backends.aiter_real import AiterPsDriver, AiterReal
from mla_fp8_bench.cli import main
from mla_fp8_bench.config import RunConfig
from mla_fp8_bench.harness import asv_support
from mla_fp8_bench.harness.runner import RunOptions, evaluate
from mla_fp8_bench.jsonio import write_json_atomic
from mla_fp8_bench.measure.devices import DeviceError, platform_info
from mla_fp8_bench.measure.metrics import error_metrics
from mla_fp8_bench.measure.reference import causal_attention
from mla_fp8_bench.problem.cases import Case, CaseError, parse_case_id, resolve_cases
from mla_fp8_bench.problem.fp8 import QuantError, quantize
from mla_fp8_bench.problem.inputs import make_inputs

CPU = platform_info("cpu")
HOPPER = dataclasses.replace(CPU, vendor="cuda", arch="sm_90", name="NVIDIA H200")
GFX950 = dataclasses.replace(CPU, vendor="rocm", arch="gfx950", name="AMD Instinct MI355X")
FAST = RunOptions(timing=False, determinism=False)


def _out(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


# ============================================================================ A. stand-in aiter contract
def _valid_call(cid: str = "s16-h2", module=None):
    """A stand-in module and keyword args of a valid ``mla_prefill_ps_asm_fwd`` call (plan included)."""
    mod = module or make_standin_aiter()
    inp = make_inputs(parse_case_id(cid), "cpu")
    plan = AiterPsDriver(mod, (0, 1, 20)).plan(inp.cu_seqlens_cpu, inp.case.num_heads, torch.device("cpu"))
    t, h = inp.q.shape[:2]
    rows = max(1, plan["num_partials"]) * TILE_Q
    kw = dict(
        Q=inp.q8.data, K=inp.k8.data, V=inp.v8.data, qo_indptr=inp.cu_seqlens, kv_indptr=inp.cu_seqlens.clone(),
        kv_page_indices=torch.arange(t, dtype=torch.int32), work_indptr=plan["work_indptr"],
        work_info_set=plan["work_info"], max_seqlen_q=inp.max_seqlen, softmax_scale=inp.softmax_scale,
        is_causal=True, splitData=torch.empty(rows, h, 128), splitLse=torch.empty(rows, h),
        output=torch.empty(t, h, 128, dtype=torch.bfloat16), q_scale=inp.q8.descale, k_scale=inp.k8.descale,
        v_scale=inp.v8.descale,
    )
    return mod, kw, plan, inp


def test_valid_standin_call_runs():  # the baseline the bad calls below differ from by one argument
    mod, kw, _plan, _inp = _valid_call()
    mod.mla_prefill_ps_asm_fwd(**kw)
    assert mod.calls[-1]["ok"] is True


@pytest.mark.parametrize("change,needle", [
    (lambda kw: kw.update(Q=kw["Q"].to(torch.bfloat16)), "Q has dtype bfloat16: must be float8_e4m3fn"),
    (lambda kw: kw.update(Q=kw["Q"].float().to(torch.float8_e4m3fnuz)), "Q is float8_e4m3fnuz (the gfx942 format"),
    (lambda kw: kw.update(V=torch.cat([kw["V"].view(torch.uint8)] * 2, -1).view(torch.float8_e4m3fn)[..., :128]),
     "V is not contiguous"),
    (lambda kw: kw.update(K=kw["K"][..., :128].contiguous()), "K head dim is 128: must be 192"),
    (lambda kw: kw.update(Q=kw["Q"].flatten(1)), "must be [tokens, H, 192]"),
    (lambda kw: kw.update(q_scale=None), "q_scale is None: the kernel always reads the scale"),
    (lambda kw: kw.update(output=torch.empty(kw["output"].shape, dtype=torch.bfloat16, device="meta")),
     "output is on meta: every tensor must be on Q's device cpu"),
    (lambda kw: kw.update(v_scale=torch.ones(2)), "v_scale has shape (2,): must be [1] or []"),
    (lambda kw: kw.update(output=kw["output"].half()), "output has dtype float16: must be bfloat16"),
    (lambda kw: kw.update(qo_indptr=kw["qo_indptr"].long()), "qo_indptr has dtype int64: must be int32"),
    (lambda kw: kw.update(qo_indptr=kw["qo_indptr"] + 1), "qo_indptr must start at 0 and be non-decreasing"),
    (lambda kw: kw.update(work_indptr=None), "work_indptr is None"),
], ids=["Q-bf16", "Q-fnuz", "V-noncontiguous", "K-headdim-128", "Q-2d", "q_scale-None", "output-other-device",
        "v_scale-2-elements", "output-fp16", "qo_indptr-int64", "qo_indptr-not-from-0", "work_indptr-None"])
def test_standin_kernel_refuses_bad_arguments(change, needle):
    mod, kw, _plan, _inp = _valid_call()
    change(kw)
    with pytest.raises(StandinContractError) as ei:
        mod.mla_prefill_ps_asm_fwd(**kw)
    assert needle in str(ei.value) and str(ei.value).startswith("mla_prefill_ps_asm_fwd:")
    assert mod.calls[-1]["ok"] is False and needle in mod.calls[-1]["error"]


def test_standin_kernel_names_a_scale_on_the_wrong_device():
    mod, kw, _plan, _inp = _valid_call()
    kw.update(k_scale=torch.ones(1, device="meta"))
    with pytest.raises(StandinContractError, match="k_scale is on meta: must be a device tensor on cpu"):
        mod.mla_prefill_ps_asm_fwd(**kw)


def test_standin_kernel_refuses_undersized_partial_buffers():
    mod, kw, plan, _inp = _valid_call("s257-h2")
    assert plan["num_partials"] > 1
    kw.update(splitData=kw["splitData"][:TILE_Q].contiguous(), splitLse=kw["splitLse"][:TILE_Q].contiguous())
    with pytest.raises(StandinContractError, match=r"have 256 rows but the plan's partial slots need \d+"):
        mod.mla_prefill_ps_asm_fwd(**kw)


def _planner_args(cid="s300-h2", cu_num=256):
    mod = make_standin_aiter(cu_num=cu_num)
    case = parse_case_id(cid)
    cu = torch.tensor(case.cu_seqlens(), dtype=torch.int32)
    info = mod.get_ps_metadata_info_v1(batch_size=1, num_head_k=case.num_heads, max_qlen=case.max_seq_len)
    bufs = [torch.zeros(shape, dtype=dt) for shape, dt in info]
    return mod, cu, case, bufs


def test_planner_refuses_the_binding_default_kvlen_granularity():
    mod, cu, case, bufs = _planner_args()
    with pytest.raises(StandinContractError, match="kvlen_granularity=1: must be max\\(128, block_size\\)=128"):
        mod.get_ps_metadata_v1(cu, cu.clone(), cu[1:] - cu[:-1], 1, case.num_heads, *bufs, qhead_granularity=1,
                               qlen_granularity=256, block_size=1, is_causal=True)  # kvlen_granularity left out


def test_planner_refuses_buffers_sized_for_another_device():
    mod, cu, case, _ = _planner_args()
    _, _, _, bufs_80 = _planner_args(cu_num=80)  # sized on an 80-CU part, planned for 256 CUs
    with pytest.raises(StandinContractError, match="work_indptr has 81 entries: must be cu_num\\+1 = 257"):
        mod.get_ps_metadata_v1(cu, cu.clone(), cu[1:] - cu[:-1], 1, case.num_heads, *bufs_80, qhead_granularity=1,
                               qlen_granularity=256, kvlen_granularity=128, block_size=1, is_causal=True)


def test_planner_refuses_decreasing_cu_seqlens():
    mod, _cu, case, bufs = _planner_args()
    bad = torch.tensor([0, 200, 100, 300], dtype=torch.int32)
    with pytest.raises(StandinContractError, match="must start at 0 and be non-decreasing"):
        mod.get_ps_metadata_v1(bad, bad.clone(), torch.tensor([200, -100, 200], dtype=torch.int32), 1,
                               case.num_heads, *bufs, qhead_granularity=1, qlen_granularity=256,
                               kvlen_granularity=128, block_size=1, is_causal=True)


def _reduce_args(heads: int):
    po = torch.zeros(2 * TILE_Q, heads, 128)
    pl = torch.zeros(2 * TILE_Q, heads)
    ri = torch.tensor([0, 2], dtype=torch.int32)
    fm = torch.tensor([[0, 256]], dtype=torch.int32)
    pm = torch.tensor([0, 256], dtype=torch.int32)
    return po, pl, ri, fm, pm, torch.empty(256, heads, 128, dtype=torch.bfloat16), torch.empty(256, heads)


def test_reduce_refuses_head_count_outside_dispatch_set():
    mod = make_standin_aiter()
    po, pl, ri, fm, pm, out, lse = _reduce_args(12)
    with pytest.raises(StandinContractError, match="doesn't support the specified settings: H=12"):
        mod.mla_reduce_v1(po, pl, ri, fm, pm, 256, 0, out, lse)


def test_reduce_called_in_the_old_8_argument_form_on_a_9_argument_aiter():
    mod = make_standin_aiter()  # v0.1.20: 9 arguments
    po, pl, ri, fm, pm, out, lse = _reduce_args(16)
    with pytest.raises(StandinContractError, match=r"num_kv_splits got a Tensor .*vLLM #46760"):
        mod.mla_reduce_v1(po, pl, ri, fm, pm, 256, out, lse)


# ============================================================================ B. AITER driver and versions
def test_old_aiter_with_7_argument_reduce_is_unavailable(monkeypatch):
    old = make_standin_aiter(aiter_version=(0, 1, 10), reduce_variant=7)
    with pytest.raises(BackendUnavailable, match="7-argument .* too old for the PS prefill"):
        AiterPsDriver(old, (0, 1, 10))
    # through the real backend on a (faked) gfx950: a skip with the reason, no crash
    monkeypatch.setattr(aiter_real, "import_aiter", lambda: old)
    v = AiterReal().availability(GFX950)
    assert not v and "7-argument" in v.reason


def test_aiter_without_the_ps_primitives_is_unavailable():
    older = make_standin_aiter(aiter_version=(0, 1, 9))
    with pytest.raises(BackendUnavailable, match="aiter lacks get_ps_metadata_info_v1, get_ps_metadata_v1, "
                                                 "mla_prefill_ps_asm_fwd"):
        AiterPsDriver(older, (0, 1, 9))


def test_8_argument_reduce_works_through_the_driver_and_matches_9():
    """v0.1.12 (8-argument ``mla_reduce_v1``): the driver feature-detects it and gets the same output."""
    inp = make_inputs(parse_case_id("s257-h1"), "cpu")
    outs = {}
    for ver in ((0, 1, 12), (0, 1, 20)):
        drv = AiterPsDriver(make_standin_aiter(aiter_version=ver), ver)
        assert drv.reduce_arity == (8 if ver == (0, 1, 12) else 9)
        p = drv.prepare(inp)
        assert p.extras["num_partials"] > 1  # split tiles: the reduce really runs
        outs[ver] = p.run().clone()
    assert torch.isfinite(outs[(0, 1, 12)].float()).all()
    assert torch.equal(outs[(0, 1, 12)], outs[(0, 1, 20)])


def test_fnuz_inputs_are_a_skip_for_the_ps_kernel():
    """gfx942's float8_e4m3fnuz handed to the gfx950-only kernel: CaseUnsupported, recorded as a skip."""
    inp = make_inputs(parse_case_id("s16-h2"), "cpu", fp8_dtype=torch.float8_e4m3fnuz)
    with pytest.raises(CaseUnsupported, match="float8_e4m3fn only, not torch.float8_e4m3fnuz"):
        get_backend("aiter-emulated").prepare(inp)


# ============================================================================ C. shapes, devices, cu_seqlens
def _qkv(t=8, h=2):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(t, h, 192, generator=g), torch.randn(t, h, 192, generator=g),
            torch.randn(t, h, 128, generator=g))


@pytest.mark.parametrize("cu,needle", [
    ([1, 4, 8], "must start at 0"),
    ([0, 6, 4, 8], "non-decreasing"),
    ([0, 4, 7], "end at T=8"),
], ids=["not-from-0", "decreasing", "wrong-end"])
def test_reference_refuses_bad_cu_seqlens(cu, needle):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=needle):
        causal_attention(q, k, v, cu, 0.1)


def test_reference_refuses_mis_shaped_tensors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="must be 3-D"):
        causal_attention(q.flatten(1), k, v, [0, 8], 0.1)
    with pytest.raises(ValueError, match="shapes disagree"):
        causal_attention(q, k[:, :1], v, [0, 8], 0.1)
    with pytest.raises(ValueError, match="differs from reference shape"):
        error_metrics(v, v[:, :1])


@pytest.mark.parametrize("spec,needle", [
    ("ragged-128-0", "seq_len 0"),
    ("s0-h2", "seq_len 0"),
])
def test_seq_len_zero_is_refused(spec, needle, capsys):
    with pytest.raises(CaseError, match=needle):
        parse_case_id(spec)
    with pytest.raises(CaseError, match="seq_len 0"):
        Case((128, 0))
    assert main(["run", "-b", "torch-sdpa-bf16", "-c", spec, "--no-timing"]) == 2
    assert needle in _out(capsys)


def test_bad_device_is_refused_before_any_work():
    with pytest.raises(DeviceError, match="device 'tpu' is invalid: allowed auto, cpu, cuda or cuda:N"):
        evaluate(["torch-sdpa-bf16"], resolve_cases(["s16-h2"]), device="tpu")


def test_quantize_refuses_wrong_dtypes():
    with pytest.raises(QuantError, match="input dtype torch.int32 is not"):
        quantize(torch.ones(4, dtype=torch.int32))
    with pytest.raises(QuantError, match="fp8 dtype torch.bfloat16 is not supported"):
        quantize(torch.ones(4), fp8_dtype=torch.bfloat16)
    with pytest.raises(QuantError, match="quantisation mode 'int8' is unknown"):
        quantize(torch.ones(4), "int8")


# ============================================================================ D. NaN / Inf
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_per_tensor_quantisation_refuses_non_finite(bad):
    x = torch.ones(16)
    x[3] = bad
    with pytest.raises(QuantError, match="needs finite inputs: amax is not finite"):
        quantize(x, "per_tensor")


def test_runner_records_an_error_for_nan_inputs_and_keeps_the_rest(monkeypatch, poison_inputs):
    poison_inputs("s32-h2")
    data = evaluate(["torch-sdpa-bf16", "torch-fp8-ref"], resolve_cases(["s16-h2", "s32-h2", "s48-h2"]),
                    device="cpu", options=FAST)
    recs = {(r["backend"], r["case"]): r for r in data["records"]}
    assert len(recs) == 6
    for b in ("torch-sdpa-bf16", "torch-fp8-ref"):
        bad = recs[(b, "s32-h2")]
        assert bad["status"] == "error"
        assert "inputs for s32-h2 failed: QuantError" in bad["reason"] and "not finite" in bad["reason"]
        own_ref = "max_abs_error_bf16_ref" if b == "torch-sdpa-bf16" else "max_abs_error_fp8_ref"
        for cid in ("s16-h2", "s48-h2"):  # measured before and after: both survive, with real values
            assert recs[(b, cid)]["status"] == "ok" and 0 < recs[(b, cid)][own_ref] < 0.02


def test_cast_mode_nan_is_measured_as_non_finite_output(monkeypatch, poison_inputs):
    """cast mode does not refuse NaN (vLLM does not either); the record is an error that keeps the values:
    inf error, NaN count (a failure in asv, never a skip)."""
    poison_inputs("s16-h2-cast")
    data = evaluate(["torch-fp8-ref"], resolve_cases(["s16-h2-cast"]), device="cpu", options=FAST)
    rec = data["records"][0]
    assert rec["status"] == "error" and rec["reason"].startswith("non-finite result")
    assert rec["nonfinite_count_fp8_ref"] > 0 and rec["max_abs_error_fp8_ref"] == float("inf")


# ============================================================================ E. missing optional packages
@pytest.mark.parametrize("name,platform,needle", [
    ("fa3-fp8", HOPPER, "fa3-fwd is not installed: pip install fa3-fwd==0.0.3"),
    ("fa3-bf16", HOPPER, "fa3-fwd is not installed"),
    ("aiter", GFX950, "cannot import aiter: ModuleNotFoundError"),
    ("vllm-aiter", GFX950, "vllm is not importable"),
], ids=["fa3-fp8", "fa3-bf16", "aiter", "vllm-aiter"])
def test_missing_packages_are_unavailable_with_the_reason(name, platform, needle):
    v = get_backend(name).availability(platform)
    assert not v and needle in v.reason


def test_missing_backends_are_skips_in_a_run_and_lose_nothing():
    data = evaluate(["fa3-fp8", "aiter", "vllm-aiter", "torch-sdpa-bf16"], resolve_cases(["s16-h2"]), device="cpu",
                    options=FAST)
    recs = {r["backend"]: r for r in data["records"]}
    assert recs["fa3-fp8"]["status"] == "skipped" and "Hopper (sm_90)" in recs["fa3-fp8"]["reason"]
    assert recs["aiter"]["status"] == "skipped" and "gfx950" in recs["aiter"]["reason"]
    assert recs["vllm-aiter"]["status"] == "skipped" and "gfx950" in recs["vllm-aiter"]["reason"]
    assert recs["torch-sdpa-bf16"]["status"] == "ok"


# ============================================================================ F. corrupt files
def test_corrupt_tolerance_file(tmp_path):
    from mla_fp8_bench.analysis.tolerances import ToleranceFileError, load_tolerances

    p = tmp_path / "tol.json"
    p.write_text('{"schema": "mla_fp8_bench.tolerances", "version": 1, "toler')
    with pytest.raises(ToleranceFileError, match=r"tol.json: is not valid JSON \(line 1"):
        load_tolerances(p)
    p.write_text('{"schema": "something-else"}')
    with pytest.raises(ToleranceFileError, match="schema is 'something-else'"):
        load_tolerances(p)


def _run_json(tmp_path: Path) -> Path:
    p = tmp_path / "run.json"
    rec = {"backend": "torch-fp8-ref", "case": "s128", "status": "ok", "reason": "", "latency_s": 1e-3,
           "latency_samples_s": [1e-3, 1.1e-3], "max_abs_error_fp8_ref": 0.007, "max_abs_error_bf16_ref": 0.2,
           "rel_l2_error_fp8_ref": 0.001, "mismatch_fraction": 0.0, "tflops": 0.01, "timing_scope": "kernel"}
    p.write_text(json.dumps({"env": {"device_name": "x86_64", "arch": "cpu", "vendor": "cpu"}, "records": [rec]}))
    return p


def test_corrupt_results_file_fed_to_gate(tmp_path, capsys):
    good = _run_json(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text()[:40])  # truncated mid-write
    assert main(["gate", str(bad), str(good)]) == 2
    out = _out(capsys)
    assert "not valid JSON" in out and "bad.json" in out and "Traceback" not in out


# ============================================================================ G. unknown names
def _asv_results(tmp_path: Path) -> Path:
    m = tmp_path / "results" / "cpu-2core"
    m.mkdir(parents=True)
    (m / "machine.json").write_text(json.dumps({"machine": "cpu-2core", "version": 1}))
    res = {"commit_hash": "a" * 40, "env_name": "e", "date": 1, "params": {"machine": "cpu-2core"}, "python": "3.11",
           "requirements": {}, "env_vars": {}, "result_columns": ["result", "params", "version", "started_at"],
           "results": {"bench_mla_prefill.MLAPrefill.track_latency": [[1e-3], [["'torch-fp8-ref'"], ["'s128'"]],
                                                                      "v1", 1]},
           "durations": {}, "version": 2}
    (m / "aaaaaaaa-e.json").write_text(json.dumps(res))
    return tmp_path / "results"


def test_unknown_backend_is_refused_before_any_work():
    with pytest.raises(UnknownBackendError, match="backend 'nope' is unknown: allowed aiter-emulated, aiter"):
        evaluate(["torch-sdpa-bf16", "nope"], resolve_cases(["s16-h2"]), device="cpu", options=FAST)


def test_unknown_case_or_suite_name(capsys):
    with pytest.raises(CaseError, match="or a suite name: sweep, tile-edges"):
        resolve_cases(["s128", "edgy"])
    assert main(["run", "-b", "torch-sdpa-bf16", "-c", "s128-fp16", "--no-timing"]) == 2
    assert "suffix 'fp16' is not recognised" in _out(capsys)


# ============================================================================ H. environment variables
@pytest.mark.parametrize("var,value,needle", [
    ("MLA_FP8_BENCH_MAX_TOKENS", "abc", "MLA_FP8_BENCH_MAX_TOKENS='abc' is not an integer: must be an integer >= 1"),
    ("MLA_FP8_BENCH_BACKENDS", "nope", "MLA_FP8_BENCH_BACKENDS names unknown backends ['nope']: allowed aiter"),
    ("MLA_FP8_BENCH_SAMPLES", "many", "MLA_FP8_BENCH_SAMPLES='many' is not an integer: must be an integer >= 1"),
    ("MLA_FP8_BENCH_MAX_TOKENS", "1048577", "MLA_FP8_BENCH_MAX_TOKENS='1048577' is invalid: at most 1048576"),
    ("MLA_FP8_BENCH_MAX_TOKENS", "9" * 5000, "MLA_FP8_BENCH_MAX_TOKENS='9999999999999999999999999999999999999999"),
    ("MLA_FP8_BENCH_SAMPLES", "x" * 5000, "MLA_FP8_BENCH_SAMPLES='xxxxxxxx"),
], ids=["MAX_TOKENS", "BACKENDS", "SAMPLES", "MAX_TOKENS-above-any-case", "MAX_TOKENS-past-int-digits",
        "SAMPLES-pasted-text"])
def test_bad_asv_env_vars_fail_before_measuring(monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    monkeypatch.delenv("MLA_FP8_BENCH_EXPECT_COMMIT", raising=False)
    calls = []
    monkeypatch.setattr("mla_fp8_bench.harness.runner.evaluate", lambda *a, **k: calls.append(a) or {})
    with pytest.raises(ValueError) as ei:
        asv_support.measure_grid()
    assert needle in str(ei.value) and len(str(ei.value)) < 300
    assert calls == []  # refused before any measurement: nothing to lose


def test_bad_emulated_cu_count_is_named():
    for raw in ("0", "-3", "lots"):
        with pytest.raises(ValueError, match=f"MLA_FP8_BENCH_EMU_CU_NUM='{raw}' is invalid: an integer from 1 to"):
            RunConfig.from_env({"MLA_FP8_BENCH_EMU_CU_NUM": raw})


def test_bad_emulated_cu_count_in_a_run_loses_no_records():
    """A configuration built in code (not through the checked environment) with a CU count the
    planner refuses: every aiter-emulated record says so and the other records are kept."""
    data = evaluate(["torch-sdpa-bf16", "aiter-emulated"], resolve_cases(["s16-h2", "s32-h2"]), device="cpu",
                    options=FAST, config=RunConfig(emu_cu_num=0))
    recs = {(r["backend"], r["case"]): r for r in data["records"]}
    assert recs[("torch-sdpa-bf16", "s16-h2")]["status"] == "ok"
    assert recs[("torch-sdpa-bf16", "s32-h2")]["status"] == "ok"
    emu = recs[("aiter-emulated", "s16-h2")]
    assert emu["status"] in ("skipped", "error") and "cu_num=0 is invalid" in emu["reason"]


# ============================================================================ I. partial writes
def test_interrupted_json_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    write_json_atomic({"records": [1]}, path)

    def boom(*a, **k):
        raise KeyboardInterrupt  # Ctrl-C in the middle of the dump

    monkeypatch.setattr("mla_fp8_bench.jsonio.json", SimpleNamespace(dump=boom))  # only the writer's json
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic({"records": [1, 2]}, path)
    assert json.loads(path.read_text()) == {"records": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temp file left behind


def test_atomic_json_write_honours_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "run.json"
        write_json_atomic({"a": 1}, path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    finally:
        os.umask(old)
