"""Hostile inputs to the PR gate: lost results, cross-machine comparisons, floors, impossible values, and
figures that are not a kernel's (CPU host time, emulation latency, host-inclusive call latency)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mla_fp8_bench.cli import main

ACC = {"max_abs_error_fp8_ref": 0.045, "mean_abs_error_fp8_ref": 0.0028, "rel_l2_error_fp8_ref": 0.0178,
       "max_abs_error_bf16_ref": 0.19, "mean_abs_error_bf16_ref": 0.01, "rel_l2_error_bf16_ref": 0.03,
       "mismatch_fraction": 0.0004, "nonfinite_count_fp8_ref": 0}
GPU_ENV = {"vendor": "nvidia", "device": "cuda:0", "device_name": "NVIDIA H200", "arch": "sm_90"}
CPU_ENV = {"vendor": "cpu", "device": "cpu", "device_name": "x86_64", "arch": "cpu"}


def _samples(center: float, n: int = 30, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for x in center * (1 + 0.01 * rng.standard_normal(n))]


def _rec(backend="fa3-fp8", case="s1024", status="ok", latency=1e-4, scope="kernel", seed=0, call=None, **acc):
    r = {"backend": backend, "case": case, "status": status, "reason": "" if status == "ok" else "boom"}
    if status == "ok":
        r.update(ACC)
        r.update(acc)
        r["timing_scope"] = scope
        r["latency_samples_s"] = _samples(latency, seed=seed)
        r["latency_s"] = float(np.median(r["latency_samples_s"]))
        if call is not None:
            r["call_latency_samples_s"] = _samples(call, seed=seed + 100)
            r["call_latency_s"] = float(np.median(r["call_latency_samples_s"]))
    return r


def _write(tmp_path: Path, name: str, records: list, env: dict | None = None) -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"env": GPU_ENV if env is None else env, "records": records}))
    return str(p)


def _gate(*args: str) -> int:
    return main(["gate", *args])


# ------------------------------------------------------------------------------- row 1: lost results
def test_backend_missing_on_head_is_lost(tmp_path, capsys):
    """HEAD lacks a backend BASE had ok (its import broke): exit 1 naming each lost (backend, case)."""
    b = _write(tmp_path, "b.json", [_rec(), _rec(case="s2048"), _rec(backend="fa3-bf16")])
    h = _write(tmp_path, "h.json", [_rec(seed=1), _rec(case="s2048", seed=1)])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert "LOST: fa3-bf16 s1024" in out and "GATE FAILED" in out
    assert _gate(b, h, "--allow-missing") == 0
    assert "LOST: fa3-bf16 s1024" in capsys.readouterr().out  # still listed


def test_backend_skipped_on_head_that_base_had_ok_is_lost(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec(), _rec(backend="aiter", status="skipped")])
    h = _write(tmp_path, "h.json", [_rec(status="skipped"), _rec(backend="aiter", status="skipped")])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert "LOST: fa3-fp8 s1024" in out and "aiter s1024 -" not in out  # skipped on both sides: not lost


def test_empty_head_is_lost(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec(), _rec(case="s2048")])
    h = _write(tmp_path, "h.json", [])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert "HEAD holds no results" in out and "LOST: fa3-fp8 s1024" in out and "LOST: fa3-fp8 s2048" in out


def test_empty_head_and_base_fail(tmp_path, capsys):
    e = _write(tmp_path, "e.json", [])
    assert _gate(e, e) == 1
    assert "HEAD holds no results" in capsys.readouterr().out


def test_renamed_backend_is_lost(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec(backend="fa3-fp8")])
    h = _write(tmp_path, "h.json", [_rec(backend="fa3fp8", seed=1)])
    assert _gate(b, h) == 1
    assert "LOST: fa3-fp8 s1024" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [None, "0.04", "n/a", [0.04], True])
def test_null_or_non_numeric_accuracy_fails(tmp_path, capsys, bad):
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [_rec(seed=1, max_abs_error_fp8_ref=bad)])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert "max_abs_error_fp8_ref" in out and ("LOST" in out or "INVALID" in out)


def test_accuracy_key_removed_on_head_is_lost(tmp_path, capsys):
    h_rec = _rec(seed=1)
    del h_rec["rel_l2_error_fp8_ref"]
    assert _gate(_write(tmp_path, "b.json", [_rec()]), _write(tmp_path, "h.json", [h_rec])) == 1
    assert "LOST: fa3-fp8 s1024 rel_l2_error_fp8_ref" in capsys.readouterr().out


# ------------------------------------------------------------------------------- row 4: cross-machine
def test_run_jsons_of_two_devices_are_refused(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec()], env=GPU_ENV)
    h = _write(tmp_path, "h.json", [_rec(seed=1)], env=dict(GPU_ENV, device_name="NVIDIA H100 80GB HBM3"))
    assert _gate(b, h) == 2
    out = capsys.readouterr().out
    assert "different machines" in out and "NVIDIA H100" in out and "--allow-cross-machine" in out
    assert _gate(b, h, "--allow-cross-machine") == 0


def test_cpu_run_vs_gpu_run_is_refused(tmp_path):
    b = _write(tmp_path, "b.json", [_rec()], env=GPU_ENV)
    h = _write(tmp_path, "h.json", [_rec(seed=1)], env=CPU_ENV)
    assert _gate(b, h) == 2


def _asv_file(path: Path, machine: str, gpu: str, values: dict[str, float], sha: str) -> str:
    cols = ["result", "params", "version", "started_at", "duration"]
    results = {f"bench_mla_prefill.{cls}.{track}": [[v], [["'fa3-fp8'"], ["'s1024'"]], "v1", 0, 1.0]
               for (cls, track), v in values.items()}
    path.write_text(json.dumps({"commit_hash": sha, "env_name": "existing-py", "date": 0,
                                "params": {"machine": machine, "gpu": gpu}, "python": "3.11", "requirements": {},
                                "env_vars": {}, "result_columns": cols, "results": results, "durations": {},
                                "version": 2}))
    return str(path)


def test_asv_files_of_two_machines_are_refused(tmp_path, capsys):
    vals = {("MLAPrefill", "track_max_abs_error"): 0.04}
    b = _asv_file(tmp_path / "b.json", "h200", "NVIDIA H200", vals, "a" * 40)
    h = _asv_file(tmp_path / "h.json", "cpu-2core", "none", vals, "b" * 40)
    assert _gate(b, h) == 2
    assert "'h200' vs 'cpu-2core'" in capsys.readouterr().out
    assert _gate(b, h, "--allow-cross-machine") == 0


# ------------------------------------------------------------------------------- row 5: floors
def test_run_json_zero_equals_asv_floor(tmp_path, capsys):
    """num_partials 0 / nondeterminism 0 in a run JSON vs asv's stored max(0, 1e-12): equal, not 'grew inf x'."""
    base = _rec(backend="aiter-emulated", scope="emulation", nondeterminism_max_abs=0.0)
    base["num_partials"] = 0
    b = _write(tmp_path, "b.json", [base])
    vals = {("MLAPrefill", "track_max_abs_error"): ACC["max_abs_error_fp8_ref"],
            ("MLAPrefill", "track_nondeterminism"): 1e-12, ("AiterPlan", "track_num_partials"): 1e-12}
    cols = ["result", "params", "version", "started_at", "duration"]
    results = {f"bench_mla_prefill.{cls}.{track}": [[v], [["'aiter-emulated'"], ["'s1024'"]], "v1", 0, 1.0]
               for (cls, track), v in vals.items()}
    hp = tmp_path / "h.json"
    hp.write_text(json.dumps({"commit_hash": "c" * 40, "env_name": "e", "date": 0, "params": {"machine": "m"},
                              "result_columns": cols, "results": results, "version": 2}))
    assert _gate(b, str(hp), "--allow-missing") == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "inf" not in out
    assert _gate(str(hp), b) == 0  # and the other way round


# ------------------------------------------------------------------------------- row 19: impossible values
@pytest.mark.parametrize("metric,value", [("max_abs_error_fp8_ref", -1.0), ("rel_l2_error_fp8_ref", -1e-9),
                                          ("mismatch_fraction", 1.5), ("mismatch_fraction", -0.1)])
def test_impossible_head_accuracy_is_invalid_not_improved(tmp_path, capsys, metric, value):
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [_rec(seed=1, **{metric: value})])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert f"INVALID: fa3-fp8 s1024 {metric}" in out and "improved" not in out


def test_impossible_base_value_is_invalid_and_fails(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec(max_abs_error_fp8_ref=-1.0)])
    h = _write(tmp_path, "h.json", [_rec(seed=1)])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert "INVALID: fa3-fp8 s1024 max_abs_error_fp8_ref" in out and "impossible value -1 on BASE" in out
    assert "improved" not in out


def test_negative_latency_is_invalid(tmp_path, capsys):
    h_rec = _rec(seed=1)
    h_rec["latency_samples_s"] = [-x for x in h_rec["latency_samples_s"]]
    assert _gate(_write(tmp_path, "b.json", [_rec()]), _write(tmp_path, "h.json", [h_rec])) == 1
    assert "INVALID: fa3-fp8 s1024 latency_s" in capsys.readouterr().out


def test_zero_latency_is_invalid_not_improved(tmp_path, capsys):
    """A latency of exactly 0 s is impossible (a timer that read nothing), on either side."""
    h_rec = _rec(seed=1)
    h_rec["latency_samples_s"] = [0.0] * 30
    h_rec["latency_s"] = 0.0
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [h_rec])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert "INVALID: fa3-fp8 s1024 latency_s" in out and "improved" not in out
    assert "possible: (0, inf]" in " ".join(out.split())
    assert _gate(h, b) == 1 and "impossible value 0 on BASE" in capsys.readouterr().out


@pytest.mark.parametrize("side,key,bad,what", [
    ("h", "latency_s", [1e-4], "is an array"),
    ("h", "latency_s", {"median": 1e-4}, "is an object"),
    ("h", "latency_s", "1e-4", "is a string"),
    ("h", "latency_s", "fast", "is a string"),
    ("h", "latency_s", True, "is a bool"),
    ("b", "latency_s", [1e-4], "is an array"),
    ("b", "call_latency_s", "1e-4", "is a string"),
])
def test_a_latency_that_is_not_a_number_is_refused_before_comparing(tmp_path, capsys, side, key, bad, what):
    """A list / object / string / bool where a latency goes: exit 2, one line naming the file, the record
    and the field, no traceback."""
    recs = {"b": [_rec(call=2e-4)], "h": [_rec(seed=1, call=2e-4)]}
    recs[side][0][key] = bad
    b, h = _write(tmp_path, "b.json", recs["b"]), _write(tmp_path, "h.json", recs["h"])
    assert _gate(b, h) == 2
    c = capsys.readouterr()
    lines = (c.out + c.err).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    label = {"b": f"BASE {b}", "h": f"HEAD {h}"}[side]
    assert lines[0].startswith(f"error: {label}: record 0 (fa3-fp8, s1024): {key} = {repr(bad)[:40]} {what}")
    assert lines[0].endswith("allowed a finite number of seconds > 0, or null")


def test_flops_that_are_not_a_number_are_refused(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [{**_rec(), "flops": [1e12]}])
    assert _gate(b, _write(tmp_path, "h.json", [_rec(seed=1)])) == 2
    assert "flops = [1000000000000.0] is an array, not a number: allowed a finite number of FLOPs >= 1, or null" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("flops", [5e-324, 0, -1.0, "-inf", "inf"])
def test_flops_out_of_range_are_refused(tmp_path, capsys, flops):
    """A FLOP count below 1 or not finite (``-1e309`` reads as -inf): exit 2, one line, no traceback."""
    value = float(flops) if isinstance(flops, str) else flops
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [{**_rec(seed=1), "flops": value}])
    assert _gate(b, h) == 2
    c = capsys.readouterr()
    lines = (c.out + c.err).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "(fa3-fp8, s1024): flops = " in lines[0] and lines[0].endswith(
        "is out of range: allowed a finite number of FLOPs >= 1, or null")


@pytest.mark.parametrize("bad, what", [("0.1,0.2", "a string"), ({"a": 1}, "an object"), (0.1, "a number")])
def test_samples_that_are_not_a_list_are_refused(tmp_path, capsys, bad, what):
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [{**_rec(seed=1), "latency_samples_s": bad}])
    assert _gate(b, h) == 2
    out = capsys.readouterr().out
    assert f"latency_samples_s = {repr(bad)[:40]} is {what}: allowed a list of numbers of seconds, or null" in out


@pytest.mark.parametrize("latency", [float("inf"), 0.0, -0.0])
def test_an_impossible_latency_is_judged_though_its_samples_look_fine(tmp_path, capsys, latency):
    """The stored latency is what is compared: good samples beside an impossible value do not hide it."""
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [{**_rec(seed=1), "latency_s": latency}])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert ("REGRESSION: fa3-fp8 s1024 latency_s" if latency > 0 else "INVALID: fa3-fp8 s1024 latency_s") in out


# ------------------------------------------------------------------------------- figures that are not a kernel's
def test_cpu_run_latency_x3_passes_but_accuracy_x3_fails(tmp_path, capsys):
    recs = [_rec(backend="torch-sdpa-bf16", case=c, scope="call", latency=2e-3) for c in ("s128", "s512")]
    b = _write(tmp_path, "b.json", recs, env=CPU_ENV)
    slow = [_rec(backend="torch-sdpa-bf16", case=c, scope="call", latency=6e-3, seed=1) for c in ("s128", "s512")]
    assert _gate(b, _write(tmp_path, "slow.json", slow, env=CPU_ENV)) == 0
    out = capsys.readouterr().out
    assert "CPU host time" in out and "GATE PASSED" in out
    worse = [_rec(backend="torch-sdpa-bf16", case=c, scope="call", latency=2e-3, seed=1,
                  max_abs_error_fp8_ref=3 * ACC["max_abs_error_fp8_ref"]) for c in ("s128", "s512")]
    assert _gate(b, _write(tmp_path, "worse.json", worse, env=CPU_ENV)) == 1
    out = capsys.readouterr().out
    assert "REGRESSION: torch-sdpa-bf16 s128 max_abs_error_fp8_ref" in out


def test_same_latency_x3_on_a_gpu_fails(tmp_path):
    b = _write(tmp_path, "b.json", [_rec(latency=1e-4)])
    h = _write(tmp_path, "h.json", [_rec(latency=3e-4, seed=1)])
    assert _gate(b, h) == 1


def test_cpu_asv_machine_latency_is_informational(tmp_path, capsys):
    lat = ("MLAPrefill", "track_latency")
    b = _asv_file(tmp_path / "b.json", "cpu-2core", "none", {lat: 1e-3}, "a" * 40)
    h = _asv_file(tmp_path / "h.json", "cpu-2core", "none", {lat: 3e-3}, "b" * 40)
    assert _gate(b, h) == 0
    assert "CPU host time" in capsys.readouterr().out
    hg = _asv_file(tmp_path / "hg.json", "h200", "NVIDIA H200", {lat: 3e-3}, "b" * 40)
    bg = _asv_file(tmp_path / "bg.json", "h200", "NVIDIA H200", {lat: 1e-3}, "a" * 40)
    assert _gate(bg, hg) == 1  # no samples, no CI: the ratio decides on a GPU machine


def test_emulation_latency_never_regresses(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec(backend="aiter-emulated", scope="emulation", latency=0.1)])
    h = _write(tmp_path, "h.json", [_rec(backend="aiter-emulated", scope="emulation", latency=0.5, seed=1)])
    assert _gate(b, h) == 0
    assert "emulation" in capsys.readouterr().out


def test_call_latency_is_informational_unless_asked(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec(call=150e-6)])
    h = _write(tmp_path, "h.json", [_rec(call=262e-6, seed=1)])
    assert _gate(b, h) == 0
    assert "host-side latency" in capsys.readouterr().out
    assert _gate(b, h, "--gate-call-latency") == 1
    assert "REGRESSION: fa3-fp8 s1024 call_latency_s" in capsys.readouterr().out


# ------------------------------------------------------------------------------- markdown summary
def test_markdown_summary_lists_regressions_lost_improvements_and_plots(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec(), _rec(case="s2048"), _rec(case="s4096", latency=4e-4)])
    h = _write(tmp_path, "h.json", [_rec(seed=1, max_abs_error_fp8_ref=1.0), _rec(case="s4096", latency=2e-4)])
    assert _gate(b, h, "--format", "markdown", "--plots", "plots/") == 1
    out = capsys.readouterr().out
    assert out.startswith("## mla-fp8-bench gate") and "**GATE FAILED**" in out
    assert "### Regressions (1)" in out and "| REGRESSION | fa3-fp8 | s1024 | max_abs_error_fp8_ref |" in out
    assert "### Lost results (1)" in out and "| LOST | fa3-fp8 | s2048 |" in out
    assert "### Improvements (1)" in out and "| improved | fa3-fp8 | s4096 | latency_s |" in out
    assert "Plots: `plots/`" in out


def test_markdown_passes_with_exit_0(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [_rec(seed=1)])
    assert _gate(b, h, "--format", "markdown") == 0
    out = capsys.readouterr().out
    assert "**GATE PASSED**" in out and "### Regressions (0)" in out


def test_bad_format_is_a_usage_error(tmp_path):
    b = _write(tmp_path, "b.json", [_rec()])
    with pytest.raises(SystemExit) as ei:
        _gate(b, b, "--format", "html")
    assert ei.value.code == 2


def test_nonfinite_head_accuracy_is_a_regression_not_invalid(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [_rec(seed=1, rel_l2_error_fp8_ref=math.inf)])
    assert _gate(b, h) == 1
    assert "non-finite on HEAD" in capsys.readouterr().out


# ------------------------------------------------------------------------------- row 19: all-zero reference
def test_rel_l2_against_an_all_zero_reference_is_defined():
    """||ref|| = 0: rel-L2 is the RMS error over the 1e-2 floor that max_rel_error uses (not 1e272)."""
    import torch

    from mla_fp8_bench.measure.metrics import error_metrics

    ref = torch.zeros(4, 8, dtype=torch.float64)
    out = torch.full((4, 8), 1e-28, dtype=torch.float64)
    m = error_metrics(out, ref)
    # ||out - ref||_2 = 1e-28 * sqrt(32); denominator 1e-2 * sqrt(32)
    assert m.rel_l2_error == pytest.approx(1e-26, rel=1e-12)
    assert error_metrics(ref.clone(), ref).rel_l2_error == 0.0
    # a tiny but non-zero reference stays a true relative error
    tiny = torch.full((4, 8), 1e-30, dtype=torch.float64)
    assert error_metrics(2 * tiny, tiny).rel_l2_error == pytest.approx(1.0, rel=1e-12)


def test_run_json_and_asv_file_of_one_device_are_compared(tmp_path):
    """A run JSON's full device name and the asv machine file's short one name the same device."""
    amd = {"vendor": "amd", "device": "cuda:0", "device_name": "AMD Instinct MI355X", "arch": "gfx950"}
    b = _write(tmp_path, "b.json", [_rec(max_abs_error_fp8_ref=0.04)], env=amd)
    h = _asv_file(tmp_path / "h.json", "mi355", "MI355X", {("MLAPrefill", "track_max_abs_error"): 0.04}, "b" * 40)
    assert _gate(b, h, "--allow-missing") == 0
    h2 = _asv_file(tmp_path / "h2.json", "h200", "NVIDIA H200", {("MLAPrefill", "track_max_abs_error"): 0.04},
                   "c" * 40)
    assert _gate(b, h2, "--allow-missing") == 2


# ------------------------------------------------------------------------------- gate rules "zero" and "exact"
def test_nonfinite_count_must_be_zero(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_rec()])
    h = _write(tmp_path, "h.json", [_rec(seed=1, nonfinite_count_fp8_ref=3)])
    assert _gate(b, h) == 1
    assert "REGRESSION: fa3-fp8 s1024 nonfinite_count_fp8_ref" in capsys.readouterr().out


def test_exact_rule_flags_any_change(monkeypatch):
    from mla_fp8_bench.analysis import gate
    from mla_fp8_bench.measure.metric_table import Metric

    exact = Metric("slots", "slots", None, None, "slots", "slots", "resource", gate="exact")
    monkeypatch.setattr(gate, "find", lambda name: exact if name == "slots" else None)

    def side(v):
        s = gate.Side("x", params={("b", "c"): ("ok", "")}, kinds={"slots": "resource"})
        s.data[("b", "c", "slots")] = gate.Measure("ok", v)
        return s

    opts = gate.GateOptions()
    assert gate.compare_one(("b", "c", "slots"), side(64.0), side(64.0), opts).verdict == "ok"
    assert gate.compare_one(("b", "c", "slots"), side(64.0), side(60.0), opts).verdict == "REGRESSION"
    assert gate.compare_one(("b", "c", "slots"), side(64.0), side(65.0), opts).verdict == "REGRESSION"


def test_markdown_tables_are_capped_for_a_pr_comment(tmp_path, capsys):
    from mla_fp8_bench.analysis.gate import MD_MAX_ROWS

    cases = [f"s{64 + i}" for i in range(MD_MAX_ROWS + 7)]
    b = _write(tmp_path, "b.json", [_rec(case=c) for c in cases])
    h = _write(tmp_path, "h.json", [])
    assert _gate(b, h, "--format", "markdown") == 1
    out = capsys.readouterr().out
    assert f"### Lost results ({len(cases) + 1})" in out  # every case + "HEAD holds no results"
    assert out.count("| LOST |") == MD_MAX_ROWS and "and 8 more" in out
