"""Real-vLLM tier: the suite's ``vllm-aiter`` adapter against vLLM's REAL classes.

For each vLLM release with an environment from ``scripts/vllm_envs.sh`` (default 0.28.0 and 0.33.0
under ``$VLLM_ENVS_DIR``, default as ``scripts/vllm_envs.sh --print-dir`` says), ``drive_vllm.py`` runs in that env's
Python with the stand-in ``aiter`` and reports; these tests assert on the report:

* the adapter feature-detects each release as documented (attn_out_dtype, padding, sizing, staging,
  cached scale);
* vLLM's own gate ``_fp8_mla_prefill_supported()`` is False on CPU and True with gfx950 faked;
* on every tier case (the asv grid's sweep seq_lens up to the CPU cap and each serving head count 8, 12,
  16, 24, 32, 64, tile edges, a ragged batch with a 1-token sequence, a strided ``v``, outliers beyond
  +-448) the output of vLLM's real ``_mla_fp8_prefill_attn`` equals the suite's ``aiter`` backend BIT FOR
  BIT on the same work: the same inputs where vLLM runs the real head count, vLLM's padded inputs where it
  pads (whose pad heads are exact duplicates); 0.28 reports 8/12/24 heads unsupported naming its rule, and
  the raw driver refuses 12/24 naming the reduce's probed head set;
* the workspace is locked after setup and reset after cleanup, also when prepare or the call raises;
  from 0.31 a too-small reservation makes the forward an ``error`` record naming the plan's and the
  forward's head widths (also when the builder is sized 24 wide and the forward pads to 32);
* the workspace ``plan`` predicts (``vllm_reserved``) equals what vLLM really reserved;
* deliberately wrong adapters (8-argument reduce, missing ``attn_out_dtype``, missing
  ``_fp8_prefill_one_scale``, no lock) make the tier fail with a clear message.

Skipped unless requested (see ``conftest.py``); a missing env skips with the command that creates it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DRIVER = HERE / "drive_vllm.py"


def _vllm_envs_dir() -> Path:
    """Where ``scripts/vllm_envs.sh`` keeps the vLLM envs (it alone defines the default)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "vllm_envs.sh"), "--print-dir"], capture_output=True,
                         text=True, check=True).stdout.strip()
    return Path(out)


ENVS_DIR = _vllm_envs_dir()
VERSIONS = os.environ.get("VLLM_TIER_VERSIONS", "0.28.0 0.33.0").split()
TIMEOUT_S = 300

_spec = importlib.util.spec_from_file_location("_drive_vllm", DRIVER)
drive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(drive)  # only for its case lists: it imports no vllm at module level


def _v(ver: str) -> tuple[int, ...]:
    return tuple(int(x) for x in ver.split(".")[:2])


def expected_features(ver: str) -> dict[str, bool]:
    """Features by vLLM release (docs/aiter-contract.md#vllm-entry)."""
    v = _v(ver)
    return {"attn_out_dtype": v >= (0, 29), "pads_heads": v >= (0, 29), "budget_sizing": v >= (0, 31),
            "staging": v >= (0, 32), "one_scale_cache": v >= (0, 33)}


def env_python(ver: str) -> Path:
    env = ENVS_DIR / f"vllm-{ver}"
    py = env / "bin" / "python"
    if not py.exists() or not (env / ".vllm-tier-ok").exists():
        prefix = f"VLLM_ENVS_DIR={ENVS_DIR} " if "VLLM_ENVS_DIR" in os.environ else ""
        pytest.skip(f"no healthy vLLM {ver} env at {env}: create it with "
                    f"`{prefix}bash {REPO / 'scripts' / 'vllm_envs.sh'}`")
    return py


def run_driver(ver: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_TARGET_DEVICE="cpu")
    return subprocess.run([str(env_python(ver)), str(DRIVER), "--repo", str(REPO), *args], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


_REPORTS: dict[str, dict] = {}


@pytest.fixture(scope="module", params=VERSIONS)
def report(request, tmp_path_factory) -> dict:
    """The driver's full report for one vLLM release (run once per release)."""
    ver = request.param
    if ver not in _REPORTS:
        out = tmp_path_factory.mktemp(f"vllm-{ver}") / "report.json"
        proc = run_driver(ver, "--out", str(out))
        assert proc.returncode == 0 and out.exists(), (
            f"driver failed on vLLM {ver} (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
        _REPORTS[ver] = json.loads(out.read_text())
    rep = _REPORTS[ver]
    assert rep["vllm"] == ver, f"env vllm-{ver} holds vllm {rep['vllm']}"
    return rep


def _no_error(rep: dict, step: str) -> None:
    err = rep["errors"].get(step)
    assert err is None, f"vLLM {rep['vllm']}: check {step} raised:\n{err}"


def test_features_detected_as_documented(report):
    feats = {k: v for k, v in report["features"].items() if k != "version"}
    assert feats == expected_features(report["vllm"])
    assert report["availability"] == "yes"
    assert report["aiter_is_standin"]


def test_vllm_gate_false_on_cpu_true_with_gfx950_faked(report):
    _no_error(report, "gate")
    assert report["gate"] == {"cpu": False, "fake_gfx950": True}


def test_tier_runs_the_asv_grids_vllm_cases_up_to_the_cpu_cap():
    from mla_fp8_bench.harness.asv_support import ASV_CASES
    from mla_fp8_bench.problem.cases import SWEEP_CAPS, SWEEP_SEQ_LENS, parse_case_id

    grid = [parse_case_id(c) for c in drive.GRID_CASES]
    assert set(drive.GRID_CASES) <= set(drive.CASES) and set(drive.GRID_CASES) <= set(ASV_CASES)
    assert all(c.quant == "cast" for c in grid)
    assert {c.seq_lens[0] for c in grid if c.num_heads == 16} == {s for s in SWEEP_SEQ_LENS if s <= SWEEP_CAPS["cpu"]}
    assert {c.num_heads for c in grid} == {8, 12, 16, 24, 32, 64}


#: Head counts the stand-in's mla_reduce_v1 (AITER v0.1.22) dispatches, read in AITER's reduce
RAW_HEADS = {1, 2, 4, 8, 10, 16, 32, 40, 48, 64, 96, 128}


@pytest.mark.parametrize("cid", drive.CASES)
def test_case_equals_aiter_on_the_same_work(report, cid):
    from mla_fp8_bench.problem.cases import parse_case_id

    _no_error(report, f"case:{cid}")
    rec = report["cases"][cid]
    case = parse_case_id(cid)
    feats = report["features"]
    if not feats["pads_heads"] and case.num_heads % 16:
        assert not rec["supported"] and "num_heads % 16 == 0" in rec["reason"], rec
        assert f"vLLM {report['vllm']} (no head padding" in rec["reason"], rec
        return
    assert rec["supported"], rec["reason"]
    padded = -(-case.num_heads // 16) * 16 if feats["pads_heads"] else case.num_heads
    assert rec["equal_aiter"] and rec["same_work"] is (padded == case.num_heads), rec
    assert rec["aiter_real_heads"] is (case.num_heads in RAW_HEADS), rec
    if not rec["aiter_real_heads"]:  # 12, 24: the raw driver skips them, naming what the reduce takes
        assert "mla_reduce_v1 of aiter 0.1.22 dispatches num_heads in" in rec["aiter_reason"], rec
    assert rec["locked_after_setup"] and rec["reset_after_cleanup"]
    assert rec["timing_scope"] == "call"
    assert rec["num_head_k"] == padded
    assert rec["info_args"]["num_head_k"] == padded and rec["info_args"]["batch_size"] == case.batch_size
    assert rec["asm_q"]["shape"] == [case.total_tokens, padded, 192] and rec["asm_q"]["dtype"] == "float8_e4m3fn"
    assert rec["asm_v"]["contiguous"] and rec["asm_output"]["dtype"] == "bfloat16"
    assert rec["asm_scale"]["value"] == 1.0 and rec["asm_scale"]["shape"] == []
    assert abs(rec["asm_softmax_scale"] - 192 ** -0.5) < 1e-12
    assert rec["reduce_ints"] == [256, 0]  # max_seqlen_q = tile, num_kv_splits = 0 (vLLM #46760)
    assert rec["pad_heads_are_duplicates"] is (True if padded != case.num_heads else None)
    if cid == drive.REPEAT_CASE:
        assert rec["repeatable"]


def test_workspace_formula_equals_vllm_reservation(report):
    for cid in drive.PLAN_CASES:
        _no_error(report, f"plan:{cid}")
        st = report[f"plan:{cid}"]
        if st.get("supported") is False:
            assert not report["features"]["pads_heads"]
            continue
        assert st["workspace_bytes"] == st["reserved_workspace_bytes"] == st["formula_bytes"], (cid, st)
        assert st["reset"] and len(st["planner_samples_s"]) == 3


def test_global_state_reset_when_prepare_or_call_raises(report):
    _no_error(report, "raising")
    r = report["raising"]
    assert r["prepare_raised"] and r["prepare_reset"] and r["aiter_restored"], r
    assert r["call_status"] == "error" and "injected kernel failure" in r["call_reason"], r
    assert r["call_reset"], r


def test_growth_after_lock_is_an_error_record_naming_both_widths(report):
    if not report["features"]["budget_sizing"]:
        pytest.skip(f"vLLM {report['vllm']} sizes the scratch from AITER's loose bound: no small reservation to "
                    "provoke")
    _no_error(report, "locked_growth")
    g = report["locked_growth"]
    assert set(g) == {"s600-cast", "s300-h24-cast"}, g
    for cid, (planned, forward) in {"s600-cast": (16, 16), "s300-h24-cast": (24, 32)}.items():
        rec = g[cid]
        assert rec["status"] == "error", rec
        assert rec["reason"].startswith(f"WorkspaceGrewAfterLock: the workspace grew after lock_workspace(): the "
                                        f"builder planned and reserved {planned} heads, the forward runs {forward} "
                                        "(vLLM: Workspace is locked but allocation from"), rec
        assert "_mla_fp8_prefill_attn" in rec["reason"], rec


def test_no_check_errored(report):
    assert report["errors"] == {}, "\n\n".join(f"{k}: {v}" for k, v in report["errors"].items())


# ------------------------------------------------------------------------------------------------
# negative tests: a wrong adapter must make the tier fail, clearly

#: fault -> (predicate on the release: does the fault matter there?, phrases the failure must contain)
FAULTS = {
    "reduce-8-arg": (lambda f: True, ["num_kv_splits got a Tensor", "#46760"]),
    "omit-attn-out-dtype": (lambda f: f["attn_out_dtype"], ["missing a required argument: 'attn_out_dtype'"]),
    "skip-one-scale": (lambda f: f["one_scale_cache"], ["AttributeError", "_fp8_prefill_one_scale"]),
    "no-lock": (lambda f: True, ["workspace is not locked after setup"]),
}


@pytest.mark.parametrize("ver", VERSIONS)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_wrong_adapter_fails_the_tier_clearly(ver, fault):
    matters, phrases = FAULTS[fault]
    proc = run_driver(ver, "--fault", fault, "--cases", "s257-cast")
    feats = expected_features(ver)
    if not matters(feats):
        # e.g. 0.28 has no attn_out_dtype / no cached scale: the "fault" is the right call there
        assert proc.returncode == 0, (f"vLLM {ver}: fault {fault} is a no-op here, yet the tier failed:\n"
                                      f"{proc.stderr[-3000:]}")
        return
    assert proc.returncode == 1, (f"vLLM {ver}: the tier did not fail on adapter fault {fault} "
                                  f"(rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("VLLM TIER FAILURE")), "")
    assert line, f"no 'VLLM TIER FAILURE' line in stderr:\n{proc.stderr[-3000:]}"
    for ph in phrases:
        assert ph in line, f"failure line lacks {ph!r}: {line}"


def test_record_says_whether_vllm_takes_the_fp8_path(report):
    """Read from the builder's _fp8_prefill_enabled: 0.33 enables it only for an fp8 KV cache and a bf16
    model; 0.28 tests neither dtype (vLLM #52312). The imitated configuration takes it in both."""
    path = report["fp8_path"]
    assert path["taken"] is True and (path["kv_cache_dtype"], path["model_dtype"]) == ("fp8", "bfloat16")
    known = {"0.28.0": False, "0.33.0": True}
    if report["vllm"] in known:
        assert path["gates_on_dtypes"] is known[report["vllm"]], path
    ran = [c for c in report["cases"].values() if c.get("supported")]
    assert ran and all(c["vllm_fp8_path"] == path for c in ran)

