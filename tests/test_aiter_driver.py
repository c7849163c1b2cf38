"""Contract tests of the AITER driver (``backends/aiter_real.py``) over the stand-in ``aiter``, on CPU.

Both AITER revisions (before / from ROCm/aiter#3606, v0.1.22), context chunks and prefix-cached
prefill cases, the #3606 marker, the reserved-workspace figure, the emulated-version switch and the
opt-in that lets the ``aiter`` backend drive a non-gfx950 ``aiter``. The float64 reference below is
written here (independent of the suite's reference module): exact softmax attention per sequence on the
dequantised fp8 inputs, bottom-right causal, natural-log LSE.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os

import pytest
import torch

from mla_fp8_bench.aiter_ps.standin import make_standin_aiter
from mla_fp8_bench.backends import aiter_real, get_backend
from mla_fp8_bench.backends.aiter_emulated import AiterEmulated
from mla_fp8_bench.backends.aiter_real import AiterPsDriver, AiterReal
from mla_fp8_bench.cli import main
from mla_fp8_bench.config import RunConfig
from mla_fp8_bench.measure.devices import platform_info
from mla_fp8_bench.problem.cases import parse_case_id
from mla_fp8_bench.problem.inputs import make_inputs

EMU_AITER_VERSION_ENV = "MLA_FP8_BENCH_EMU_AITER_VERSION"
ANY_DEVICE_ENV = "MLA_FP8_BENCH_AITER_ANY_DEVICE"

CPU = platform_info("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _ref64(inp) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 attention of a case's dequantised inputs: (out [T, H, 128], lse [T, H])."""
    q, k, v = (x.dequantize(torch.float64) for x in (inp.q8, inp.k8, inp.v8))
    cq, ck = inp.cu_seqlens_q_cpu.tolist(), inp.cu_seqlens_kv_cpu.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qq, kk, vv = q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]]
        s = torch.einsum("qhd,khd->hqk", qq, kk) * inp.softmax_scale
        if inp.causal:
            sq, sk = qq.shape[0], kk.shape[0]
            s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq), -math.inf)
        lse = torch.logsumexp(s, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]), vv))
        lses.append(lse.T)
    return torch.cat(outs), torch.cat(lses)


def _run(cid: str, version: str, cu_num: int):
    inp = make_inputs(parse_case_id(cid), "cpu")
    prep = AiterEmulated(cu_num=cu_num, aiter_version=version).prepare_case(inp)
    out = prep.run().clone()
    lse, rows = prep.lse()
    return inp, out, lse.clone(), rows.clone(), prep


# ----------------------------------------------------------------------------------------------
# revisions, context chunks, prefix cases


@pytest.mark.parametrize("cu_num", [2, 8])
def test_prefix_merge_breaks_at_0_1_20_and_is_exact_at_0_1_22(cu_num):
    """A prefix-cached prefill merges a causal and a non-causal call by LSE. Before #3606 the rows of
    unsplit tiles have no final LSE (NaN-poisoned here), so the merge is non-finite there; from 0.1.22
    every row is right. cu_num 2 (H=2: one TG per cluster) splits nothing; 8 splits some tiles."""
    inp, out, lse, rows, _ = _run("prefix200-q300-h2", "0.1.22", cu_num)
    ref_o, ref_l = _ref64(inp)
    assert bool(torch.isfinite(out).all()) and bool(rows.all())
    err = float((out.double() - ref_o).abs().max())
    assert 0.001 < err < 0.1, err
    assert float(((lse.double() - ref_l).abs() / ref_l.abs()).max()) < 1e-5
    _, old, old_lse, old_rows, _ = _run("prefix200-q300-h2", "0.1.20", cu_num)
    bad = ~torch.isfinite(old.float()).all(dim=-1).all(dim=-1)
    assert bool(bad.any()), "the pre-#3606 merge must break on unsplit rows"
    assert torch.equal(bad, ~torch.isfinite(old_lse).all(dim=-1))  # exactly the rows without a merged LSE
    if cu_num == 2:
        assert bool(bad.all())  # nothing split: no row has a final LSE
    else:
        assert not bool(bad.all())
        assert torch.equal(old[~bad], out[~bad])  # split rows: the same arithmetic in both revisions


@pytest.mark.parametrize("cid", ["ctx300-q200-h2", "ctx-ragged-0q40-700q260-h2"])
def test_context_chunk_vs_float64_and_lse_rows_by_revision(cid):
    """Non-causal q_len < kv_len (and a sequence with no context: output 0, LSE -inf): output matches the
    float64 reference in both revisions; LSE on every row post-#3606, only on split rows before (cu_num 2,
    H=2: nothing is split)."""
    inp, out, lse, rows, prep = _run(cid, "0.1.22", 2)
    ref_o, ref_l = _ref64(inp)
    assert float((out.double() - ref_o).abs().max()) < 0.1
    assert bool(rows.all())
    fin = torch.isfinite(ref_l)
    assert torch.equal(torch.isfinite(lse), fin) and bool((lse[~fin] == -math.inf).all())
    assert float(((lse.double() - ref_l).abs() / ref_l.abs())[fin].max()) < 1e-5
    assert prep.extras["aiter_post_3606"] is True
    _, old, old_lse, old_rows, old_prep = _run(cid, "0.1.20", 2)
    assert torch.equal(old, out)  # the schedule and the arithmetic are the same; only the LSE differs
    assert not bool(old_rows.all()) and bool(torch.isnan(old_lse[~old_rows]).all())
    assert torch.equal(old_lse[old_rows], lse[old_rows])
    assert old_prep.extras["aiter_post_3606"] is False


def test_prefix_with_a_zero_context_sequence_is_exact_post_3606():
    """A sequence without cached context gets no work in the context call (its rows stay untouched on
    hardware): the driver takes it as attention over nothing (output 0, LSE -inf), so the merge keeps
    the causal part for those rows."""
    inp, out, lse, rows, _ = _run("prefix-ragged-300q100-0q50-h2", "0.1.22", 16)
    ref_o, ref_l = _ref64(inp)
    assert bool(torch.isfinite(out).all()) and bool(rows.all())
    assert float((out.double() - ref_o).abs().max()) < 0.1
    assert float(((lse.double() - ref_l).abs() / ref_l.abs()).max()) < 1e-5


# ----------------------------------------------------------------------------------------------
# detection, need_lse and the info call


def test_driver_detects_forms_from_op_schemas_of_opaque_wrappers():
    """AITER's ops are (*args, **kwargs) wrappers; the driver reads the registered schemas (a signature
    reading would take them for the 7-argument reduce and refuse)."""
    for version, rev in (((0, 1, 20), "pre-3606"), ((0, 1, 22), "v0.1.22")):
        mod = make_standin_aiter(aiter_version=version)
        assert str(inspect.signature(mod.get_ps_metadata_v1)) == "(*args, **kwargs)"
        drv = AiterPsDriver(mod, (0, 1, 0))  # a source build without git metadata reports 0.1.0
        assert (drv.reduce_arity, drv.planner_revision) == (9, rev)
        assert drv.reduce_source.startswith("op schema aiter_standin_")
        assert drv.supports_heads(32)  # 32 heads need >= 0.1.11: the library says so, not the 0.1.0
    ref = AiterPsDriver(make_standin_aiter(aiter_version=(0, 1, 20), planner_revision="pr3606-ref"), (0, 1, 20))
    assert ref.planner_revision == "pr3606-ref" and ref.post_3606
    assert "9-argument form (op schema" in AiterPsDriver(make_standin_aiter(), None).detection()["mla_reduce_v1"]


# head counts of mla_reduce_v1 at v_head_dim 128 by release, read in AITER's reduce dispatch (independent of
# the stand-in's table): 1, 2, 4, 8, 10, 16, 128; 32 and 64 from v0.1.11; 40 from v0.1.12; 48 and 96 from v0.1.20
REDUCE_HEADS = {(0, 1, 10): [1, 2, 4, 8, 10, 16, 128], (0, 1, 20): [1, 2, 4, 8, 10, 16, 32, 40, 48, 64, 96, 128]}


@pytest.mark.parametrize("version", list(REDUCE_HEADS))
def test_head_support_is_probed_on_the_installed_reduce(version):
    drv = AiterPsDriver(make_standin_aiter(aiter_version=version), (0, 1, 0))  # the version says nothing
    ok = REDUCE_HEADS[version]
    for h in (8, 12, 16, 24, 32, 64):
        assert bool(drv.supports_heads(h)) is (h in ok), h
    why = drv.supports_heads(12).reason
    assert f"mla_reduce_v1 of aiter 0.1.0 dispatches num_heads in {ok} for v_head_dim 128 (probed); got 12" in why
    assert "doesn't support the specified settings" in why
    serving = [h for h in (8, 12, 16, 24, 32, 64) if h in ok]
    assert drv.detection()["reduce heads"].startswith(f"{serving} of the serving counts [8, 12, 16, 24, 32, 64]")


def test_a_reduce_that_gained_a_head_count_is_followed_whatever_its_version():
    """A library whose reduce takes 12 heads (as a later AITER may) runs them; one that takes only 16 refuses 8."""
    mod = make_standin_aiter(aiter_version=(0, 1, 20))
    real = mod.mla_reduce_v1
    calls = []

    def reduce_16_and_12(po, *args):
        calls.append(po.shape[-2])
        if po.shape[-2] not in (12, 16):
            raise RuntimeError("doesn't support the specified settings")
        if po.shape[-2] == 12:  # the stand-in's dispatch refuses 12: stand for a kernel that runs it
            return None
        return real(po, *args)

    mod.mla_reduce_v1 = reduce_16_and_12
    drv = AiterPsDriver(mod, (0, 1, 20))
    assert drv.supports_heads(12) and drv.supports_heads(16) and not drv.supports_heads(8)
    assert "dispatches num_heads in [12, 16]" in drv.supports_heads(8).reason
    n = len(calls)
    drv.supports_heads(8), drv.supports_heads(12)
    assert len(calls) == n  # probed once per head count


def test_env_prints_what_was_detected_and_where(capsys):
    assert main(["env"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "detected on the installed library" in text
    assert "9-argument form (op schema aiter_standin_" in text and "v0.1.22 planner (op schema" in text


def _planner_args(mod):
    return [c["args"] for c in mod.calls if c["name"] == "get_ps_metadata_v1"]


def _prepare_case(drv: AiterPsDriver, cid: str):
    backend = AiterEmulated()
    backend._driver = drv
    return backend.prepare_case(make_inputs(parse_case_id(cid), "cpu"))


@pytest.mark.parametrize("version", [(0, 1, 20), (0, 1, 22)])
def test_need_lse_is_passed_as_the_imitated_caller_does(version):
    """v0.1.22: causal prefill False (vLLM's path), context chunk True, prefix: new-token chunk has_context
    (True) and context chunk True; an older planner takes no need_lse."""
    mod = make_standin_aiter(aiter_version=version, cu_num=8)
    drv = AiterPsDriver(mod, version)
    for cid, want in (("s300-h2", [False]), ("ctx700-q100-h2", [True]), ("prefix500-q100-h2", [True, True])):
        mod.calls.clear()
        prep = _prepare_case(drv, cid)
        got = [a.get("need_lse", "absent") for a in _planner_args(mod)]
        assert got == (want if version >= (0, 1, 22) else ["absent"] * len(want)), cid
        assert prep.extras["need_lse"] == (want[-1:] if version >= (0, 1, 22) else [None])  # a prefix: its new call


def test_max_kvlen_is_passed_only_to_the_pr_ref_info_function_for_context_chunks():
    mod = make_standin_aiter(aiter_version=(0, 1, 20), cu_num=8, planner_revision="pr3606-ref")
    drv = AiterPsDriver(mod, (0, 1, 20))
    for cid, kvs in (("s300-h2", [None]), ("ctx700-q100-h2", [700]), ("prefix500-q100-h2", [500, None])):
        mod.calls.clear()
        _prepare_case(drv, cid)  # a prefix: the context call, then the new one
        infos = [c["args"] for c in mod.calls if c["name"] == "get_ps_metadata_info_v1"]
        assert [a.get("max_kvlen") for a in infos] == kvs
    for version in ((0, 1, 20), (0, 1, 22)):
        mod = make_standin_aiter(aiter_version=version, cu_num=8)
        AiterPsDriver(mod, version).prepare(make_inputs(parse_case_id("ctx700-q100-h2"), "cpu"))
        assert all("max_kvlen" not in c["args"] for c in mod.calls if c["name"] == "get_ps_metadata_info_v1")


def _info_slots(version, batch, heads, max_q, cu_num):
    """reduce_partial_map bound of get_ps_metadata_info_v1, written from the formulas of both releases."""
    cpc = cu_num // math.gcd(heads, cu_num)
    mqs = -(-max_q // 256)
    if version < (0, 1, 22):
        return min(batch + cpc - 1, 2 * (cpc - 1)) * mqs
    return batch * mqs + cpc - 1


@pytest.mark.parametrize("version", [(0, 1, 20), (0, 1, 22)])
def test_reserved_workspace_bytes_follow_the_info_bounds(version):
    """Reserved = fp32 partials + partial LSE for every slot the info bound allows, + final LSE [T, H]."""
    cu_num, h = 16, 2
    for cid, max_q in (("ragged-300-700-h2", 700), ("ctx1000-q300-h2", 300)):
        case = parse_case_id(cid)
        stats = AiterEmulated(cu_num=cu_num, aiter_version=version).plan_stats(case, CPU)
        slots = _info_slots(version, case.batch_size, h, max_q, cu_num)
        t = case.total_tokens
        assert stats["reserved_workspace_bytes"] == slots * 256 * h * 129 * 4 + t * h * 4
        live = max(1, stats["num_partials"])
        assert stats["workspace_bytes"] == live * 256 * h * 129 * 4 + t * h * 4
        assert stats["reserved_workspace_bytes"] >= stats["workspace_bytes"]
        assert len(stats["planner_samples_s"]) == 7


def test_need_lse_uses_more_partial_slots_for_the_same_schedule():
    """At cu_num 2, H=2 (one TG per cluster, nothing split) a context chunk's tile gets a slot only with
    need_lse (0.1.22); a causal
    prefill (need_lse=False) plans the same slots at 0.1.20 and 0.1.22."""
    for cid, more in (("ctx300-q200-h2", True), ("s300-h2", False)):
        case = parse_case_id(cid)
        old = AiterEmulated(cu_num=2, aiter_version="0.1.20").plan_stats(case, CPU)
        new = AiterEmulated(cu_num=2, aiter_version="0.1.22").plan_stats(case, CPU)
        assert (new["num_partials"] > old["num_partials"]) is more
        assert (new["num_partials"] == old["num_partials"]) is not more


# ----------------------------------------------------------------------------------------------
# the emulated version switch


def test_emulated_aiter_version_env():
    assert RunConfig.from_env({}).emu_aiter_version is None
    assert AiterEmulated().driver().version == (0, 1, 22)  # unset: the newest modelled
    for raw, want in (("0.1.20", (0, 1, 20)), ("0.1.20.post1", (0, 1, 20)), ("v0.1.22", (0, 1, 22))):
        assert RunConfig.from_env({EMU_AITER_VERSION_ENV: raw}).emu_aiter_version == want
    for raw in ("latest", "0.1.23", "0.1.9", "1"):
        with pytest.raises(ValueError, match=rf"{EMU_AITER_VERSION_ENV}='{raw}' is invalid: .*0\.1\.10 to 0\.1\.22"):
            RunConfig.from_env({EMU_AITER_VERSION_ENV: raw})
    cfg = RunConfig.from_env({EMU_AITER_VERSION_ENV: "0.1.20"})
    assert get_backend("aiter-emulated", cfg).driver().post_3606 is False
    assert get_backend("aiter-emulated").driver().post_3606 is True  # the config travels, not the process


def test_run_flag_sets_the_emulated_version_for_one_run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(EMU_AITER_VERSION_ENV, raising=False)
    out = tmp_path / "r.json"
    rc = main(["run", "-b", "aiter-emulated", "-c", "s40-h2", "--no-timing", "--emu-aiter-version", "0.1.20",
               "--json", str(out)])
    assert rc == 0 and EMU_AITER_VERSION_ENV not in os.environ
    rec = json.loads(out.read_text())["records"][0]
    assert rec["status"] == "ok" and rec["emulated_aiter_version"] == "0.1.20" and rec["aiter_post_3606"] is False
    capsys.readouterr()
    assert main(["run", "-b", "aiter-emulated", "-c", "s40-h2", "--emu-aiter-version", "newest"]) != 0
    msg = " ".join(capsys.readouterr().out.split())
    assert "--emu-aiter-version='newest' is invalid" in msg and "0.1.20" in msg


# ----------------------------------------------------------------------------------------------
# the aiter backend on a non-gfx950 aiter (explicit opt-in)


def test_any_device_opt_in_drives_a_non_gfx950_aiter_labelled_as_emulation(monkeypatch):
    monkeypatch.setattr(aiter_real, "import_aiter", lambda: make_standin_aiter(cu_num=8))
    b = get_backend("aiter", RunConfig.from_env({}))
    v = b.availability(CPU)
    assert not v and "gfx950" in v.reason
    b = get_backend("aiter", RunConfig.from_env({ANY_DEVICE_ENV: "1"}))
    assert b.availability(CPU) and b.emulation is True
    prep = b.prepare(make_inputs(parse_case_id("s40-h2"), "cpu"))
    assert prep.timing_scope == "emulation" and prep.extras["aiter_off_device"] is True
    assert not prep.graph_capturable and bool(torch.isfinite(prep.run()).all())
    gfx950 = dataclasses.replace(CPU, vendor="rocm", arch="gfx950")
    real = AiterReal()
    assert real.availability(gfx950) and real.emulation is False  # on gfx950 it is the real path
    with pytest.raises(ValueError, match=rf"{ANY_DEVICE_ENV}='yes' is invalid"):
        RunConfig.from_env({ANY_DEVICE_ENV: "yes"})
