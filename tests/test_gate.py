"""The PR gate (``mla-fp8-bench gate``): every exit code path, both input kinds, and its statistics (CPU)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mla_fp8_bench.analysis.gate import (
    Measure,
    latency_verdict,
    mann_whitney_greater,
    min_attainable_p,
)
from mla_fp8_bench.cli import main

ROOT = Path(__file__).resolve().parents[1]
TOL = ROOT / "tolerances" / "cpu-emulated-v1.json"

BASE_ACC = {"max_abs_error_fp8_ref": 0.045, "mean_abs_error_fp8_ref": 0.0028, "rel_l2_error_fp8_ref": 0.0178,
            "max_abs_error_bf16_ref": 0.19, "mean_abs_error_bf16_ref": 0.01, "rel_l2_error_bf16_ref": 0.03,
            "mismatch_fraction": 0.0004, "nonfinite_count_fp8_ref": 0}


def _samples(center: float, n: int = 30, cv: float = 0.01, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for x in center * (1 + cv * rng.standard_normal(n))]


def _record(backend="aiter-emulated", case="s257", status="ok", latency=1e-3, seed=0, **acc):
    r = {"backend": backend, "case": case, "status": status, "reason": "" if status == "ok" else "boom"}
    if status == "ok":
        r.update(BASE_ACC)
        r.update(acc)
        s = _samples(latency, seed=seed)
        r["latency_samples_s"] = s
        r["latency_s"] = float(np.median(s))
    return r


def _write(tmp_path: Path, name: str, records: list[dict]) -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"env": {}, "records": records}))
    return str(p)


def _gate(*args: str) -> int:
    return main(["gate", *args])


# ------------------------------------------------------------------------------------------ run JSON
def test_identical_runs_pass(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_record(), _record(case="s128")])
    h = _write(tmp_path, "h.json", [_record(seed=1), _record(case="s128", seed=1)])
    assert _gate(b, h) == 0
    assert "GATE PASSED" in capsys.readouterr().out


def test_latency_regression_significant_fails(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_record(latency=1e-3)])
    h = _write(tmp_path, "h.json", [_record(latency=1.10e-3, seed=1)])
    assert _gate(b, h, "--factor", "1.05") == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "latency_s" in out and "mann-whitney" in out


def test_latency_growth_below_factor_passes(tmp_path):
    b = _write(tmp_path, "b.json", [_record(latency=1e-3)])
    h = _write(tmp_path, "h.json", [_record(latency=1.03e-3, seed=1)])
    assert _gate(b, h, "--factor", "1.05") == 0  # significant but below the factor


def test_latency_beyond_factor_but_not_significant_passes(tmp_path):
    # 3 vs 3 samples: the exact test's smallest p is 0.05 >= alpha 0.01, so nothing can be significant
    b = _record(latency=1e-3)
    h = _record(latency=1.2e-3)
    b["latency_samples_s"], h["latency_samples_s"] = [1e-3, 1.1e-3, 0.9e-3], [1.2e-3, 1.3e-3, 1.1e-3]
    assert _gate(_write(tmp_path, "b.json", [b]), _write(tmp_path, "h.json", [h])) == 0


def test_accuracy_growth_fails_without_tolerances(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_record()])
    h = _write(tmp_path, "h.json", [_record(seed=1, max_abs_error_fp8_ref=0.2)])
    assert _gate(b, h) == 1
    assert "grew" in capsys.readouterr().out


def test_accuracy_small_growth_passes_without_tolerances(tmp_path):
    b = _write(tmp_path, "b.json", [_record()])
    h = _write(tmp_path, "h.json", [_record(seed=1, max_abs_error_fp8_ref=0.05)])
    assert _gate(b, h) == 0


@pytest.mark.skipif(not TOL.exists(), reason="tolerances/cpu-emulated-v1.json not generated yet")
def test_accuracy_exceeding_calibrated_tolerance_fails(tmp_path, capsys):
    from mla_fp8_bench.analysis.tolerances import load_tolerances

    lim = load_tolerances(TOL).lookup("aiter-emulated", "s257")[0]["max_abs_error_fp8_ref"]
    # within the growth factor of BASE, but over the calibrated tolerance: only the tolerance catches it
    b = _write(tmp_path, "b.json", [_record(max_abs_error_fp8_ref=lim * 0.9)])
    h = _write(tmp_path, "h.json", [_record(seed=1, max_abs_error_fp8_ref=lim * 1.1)])
    assert _gate(b, h) == 0
    assert _gate(b, h, "--tolerances", str(TOL)) == 1
    assert "exceeds tolerance" in capsys.readouterr().out


def test_nonfinite_accuracy_fails(tmp_path):
    b = _write(tmp_path, "b.json", [_record()])
    h = _write(tmp_path, "h.json", [_record(seed=1, max_abs_error_fp8_ref=math.inf)])
    assert _gate(b, h) == 1


def test_new_failure_fails_and_skips_are_listed(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_record(), _record(case="s128"), _record(backend="aiter", status="skipped")])
    h = _write(tmp_path, "h.json", [_record(seed=1), _record(case="s128", status="error"),
                                    _record(backend="aiter", status="skipped")])
    assert _gate(b, h) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "skipped" in out


def test_still_failing_and_new_skip_do_not_fail(tmp_path, capsys):
    b = _write(tmp_path, "b.json", [_record(), _record(case="s128", status="error")])
    h = _write(tmp_path, "h.json", [_record(seed=1), _record(case="s128", status="error"),
                                    _record(case="s512", status="skipped")])
    assert _gate(b, h) == 0
    assert "still failing" in capsys.readouterr().out


def test_resource_growth_fails(tmp_path):
    b, h = _record(), _record(seed=1)
    b["workspace_bytes"], h["workspace_bytes"] = 70e6, 190e6  # the vLLM #57923 class
    assert _gate(_write(tmp_path, "b.json", [b]), _write(tmp_path, "h.json", [h])) == 1


# ------------------------------------------------------------------------------------------ usage errors
def test_usage_errors_exit_2(tmp_path, capsys):
    good = _write(tmp_path, "g.json", [_record()])
    assert _gate(good, str(tmp_path / "missing.json")) == 2  # not a file, not hex
    assert "neither an existing file nor a commit" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert _gate(good, str(bad)) == 2
    assert "not valid JSON" in capsys.readouterr().out
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    assert _gate(good, str(other)) == 2
    assert _gate(good, good, "--factor", "0.9") == 2
    assert _gate(good, good, "--alpha", "2") == 2
    corrupt = tmp_path / "tol.json"
    corrupt.write_text(json.dumps({"schema": "mla_fp8_bench.tolerances", "version": 1, "method": "x", "margin": 1.5,
                                   "tolerances": {"aiter-emulated": {"s257": {"max_abs_error_fp8_ref": "big"}}},
                                   "distributions": {}}))
    assert _gate(good, good, "--tolerances", str(corrupt)) == 2
    out = capsys.readouterr().out
    assert str(corrupt) in out.replace("\n", "") and "max_abs_error_fp8_ref" in out
    with pytest.raises(SystemExit) as ei:
        main(["gate", good])  # HEAD missing: argparse usage error
    assert ei.value.code == 2


# ------------------------------------------------------------------------------------------ asv results
def _asv_doc(sha: str, lat: dict, acc: dict, *, samples: bool = True, version: str = "v1",
             env: str = "existing-py_work_venv_bin_python") -> dict:
    """An asv 0.6.6 (api 2) result file for MLAPrefill.track_latency / track_max_abs_error over
    backends x cases; values None = failed, NaN = skipped."""
    backends, cases = ["'aiter-emulated'", "'torch-fp8-ref'"], ["'s128'", "'s257'"]
    combos = list(itertools.product([b.strip("'") for b in backends], [c.strip("'") for c in cases]))
    cols = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
            "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
    lat_res, lat_smp, ci_a, ci_b = [], [], [], []
    for i, k in enumerate(combos):
        v = lat.get(k)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            lat_res.append(v)
            lat_smp.append(None)
            ci_a.append(None)
            ci_b.append(None)
            continue
        s = _samples(v, n=20, seed=i + len(sha))
        lat_res.append(float(np.median(s)))
        lat_smp.append(s)
        ci_a.append(min(s))
        ci_b.append(max(s))
    results = {
        "bench_mla_prefill.MLAPrefill.track_latency": [
            lat_res, [backends, cases], version, 0, 1.0, ci_a, ci_b, None, None, [1] * 4, [20] * 4,
            lat_smp if samples else None],
        "bench_mla_prefill.MLAPrefill.track_max_abs_error": [
            [acc.get(k) for k in combos], [backends, cases], version, 0, 1.0],
    }
    return {"commit_hash": sha, "env_name": env, "date": 0, "params": {"machine": "cpu-test"}, "python": "3.11",
            "requirements": {}, "env_vars": {}, "result_columns": cols, "results": results, "durations": {},
            "version": 2}


def _asv_dir(tmp_path: Path, docs: dict[str, dict]) -> Path:
    root = tmp_path / "results"
    (root / "cpu-test").mkdir(parents=True)
    (root / "cpu-test" / "machine.json").write_text(json.dumps({"machine": "cpu-test", "version": 1}))
    for sha, d in docs.items():
        (root / "cpu-test" / f"{sha[:8]}-{d['env_name']}.json").write_text(json.dumps(d))
    return root


ALL = [("aiter-emulated", "s128"), ("aiter-emulated", "s257"), ("torch-fp8-ref", "s128"), ("torch-fp8-ref", "s257")]
SHA_B, SHA_H = "aaaa1111" + "0" * 32, "bbbb2222" + "0" * 32


def test_asv_commits_pass_and_regress(tmp_path, capsys):
    lat = {k: 1e-3 for k in ALL}
    acc = {k: 0.04 for k in ALL}
    root = _asv_dir(tmp_path, {SHA_B: _asv_doc(SHA_B, lat, acc), SHA_H: _asv_doc(SHA_H, lat, acc)})
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root)) == 0
    slow = dict(lat)
    slow[("torch-fp8-ref", "s257")] = 1.2e-3
    root2 = _asv_dir(tmp_path / "2", {SHA_B: _asv_doc(SHA_B, lat, acc), SHA_H: _asv_doc(SHA_H, slow, acc)})
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root2), "--machine", "cpu-test") == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "torch-fp8-ref" in out
    # the same slowdown of an emulation (aiter-emulated: Backend.emulation) is informational, never a regression
    emu = dict(lat)
    emu[("aiter-emulated", "s257")] = 1.2e-3
    root3 = _asv_dir(tmp_path / "3", {SHA_B: _asv_doc(SHA_B, lat, acc), SHA_H: _asv_doc(SHA_H, emu, acc)})
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root3), "--machine", "cpu-test") == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "emulation" in out


def test_asv_without_samples_uses_ci(tmp_path, capsys):
    lat = {k: 1e-3 for k in ALL}
    slow = dict(lat)
    slow[("torch-fp8-ref", "s128")] = 1.5e-3
    acc = {k: 0.04 for k in ALL}
    root = _asv_dir(tmp_path, {SHA_B: _asv_doc(SHA_B, lat, acc, samples=False),
                               SHA_H: _asv_doc(SHA_H, slow, acc, samples=False)})
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root)) == 1
    assert "ci-99" in capsys.readouterr().out


def test_asv_failed_skipped_and_version(tmp_path, capsys):
    lat = {k: 1e-3 for k in ALL}
    acc = {k: 0.04 for k in ALL}
    acc_h = dict(acc)
    acc_h[("torch-fp8-ref", "s257")] = None  # failed on HEAD
    acc_h[("torch-fp8-ref", "s128")] = float("nan")  # skipped on HEAD
    root = _asv_dir(tmp_path, {SHA_B: _asv_doc(SHA_B, lat, acc), SHA_H: _asv_doc(SHA_H, lat, acc_h)})
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root)) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "skipped" in out
    # a benchmark version bump makes the series not comparable: listed; with nothing else, nothing was
    # compared, which fails
    slow = {k: 2e-3 for k in ALL}
    root2 = _asv_dir(tmp_path / "v", {SHA_B: _asv_doc(SHA_B, lat, acc),
                                      SHA_H: _asv_doc(SHA_H, slow, acc, version="v2")})
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root2)) == 1
    out = capsys.readouterr().out
    assert "not comparable" in out and "NOTHING COMPARED" in out


def test_asv_usage_errors(tmp_path, capsys):
    lat = {k: 1e-3 for k in ALL}
    acc = {k: 0.04 for k in ALL}
    sha_b2 = "aaaa9999" + "0" * 32
    root = _asv_dir(tmp_path, {SHA_B: _asv_doc(SHA_B, lat, acc), SHA_H: _asv_doc(SHA_H, lat, acc),
                               sha_b2: _asv_doc(sha_b2, lat, acc)})
    assert _gate("aaaa", "bbbb22", "--results-dir", str(root)) == 2  # ambiguous prefix
    assert "ambiguous" in capsys.readouterr().out
    assert _gate("cccc1234", "bbbb22", "--results-dir", str(root)) == 2  # unknown commit
    assert "no asv results" in capsys.readouterr().out
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(tmp_path / "nope")) == 2
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root), "--machine", "h200") == 2
    (root / "other-machine").mkdir()
    capsys.readouterr()
    # two machines, only one holds both commits: that one is compared
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root)) == 0
    assert f"{root}/cpu-test/aaaa1111" in capsys.readouterr().out
    # two machines holding both commits, no --machine: refused, naming the flag
    (root / "other-machine" / "machine.json").write_text(json.dumps({"machine": "other-machine", "version": 1}))
    for sha in (SHA_B, SHA_H):
        doc = _asv_doc(sha, lat, acc)
        (root / "other-machine" / f"{sha[:8]}-existing-py_work_venv_bin_python.json").write_text(json.dumps(doc))
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root)) == 2
    assert "--machine" in capsys.readouterr().out
    import shutil

    shutil.rmtree(root / "other-machine")
    # two environments for one commit
    d = _asv_doc(SHA_H, lat, acc, env="virtualenv-py3.11")
    (root / "cpu-test" / f"{SHA_H[:8]}-virtualenv-py3.11.json").write_text(json.dumps(d))
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root), "--machine", "cpu-test") == 2
    assert _gate("aaaa11", "bbbb22", "--results-dir", str(root), "--machine", "cpu-test", "--env", "existing") == 0


# ------------------------------------------------------------------------------------------ statistics
def _brute_p(h, b):
    """Exact one-sided p by enumerating every split of the pooled sample."""
    pooled = list(h) + list(b)
    u_obs = sum((x > y) + 0.5 * (x == y) for x in h for y in b)
    hits = tot = 0
    for idx in itertools.combinations(range(len(pooled)), len(h)):
        hh = [pooled[i] for i in idx]
        bb = [pooled[i] for i in range(len(pooled)) if i not in idx]
        u = sum((x > y) + 0.5 * (x == y) for x in hh for y in bb)
        hits += u >= u_obs - 1e-9
        tot += 1
    return hits / tot


@pytest.mark.parametrize("seed", range(4))
def test_mann_whitney_exact_matches_enumeration(seed):
    rng = np.random.default_rng(seed)
    h = list(rng.normal(1.0 + 0.3 * seed, 1, 5))
    b = list(rng.normal(1.0, 1, 6))
    assert mann_whitney_greater(h, b)[1] == pytest.approx(_brute_p(h, b), abs=1e-12)


def test_mann_whitney_normal_approximation_close_to_exact():
    rng = np.random.default_rng(7)
    h, b = list(rng.normal(1.1, 1, 12)), list(rng.normal(1.0, 1, 12))
    _, p_exact = mann_whitney_greater(h, b)
    h2 = h + [h[0]]  # a tie forces the normal approximation
    _, p_norm = mann_whitney_greater(h2, b)
    assert abs(p_exact - p_norm) < 0.05
    assert min_attainable_p(3, 3) == pytest.approx(0.05)


def test_latency_verdict_aa_false_positive_rate_is_low():
    """Synthetic A/A: 200 pairs of 30 samples from one distribution; the gate rule (factor 1.0,
    alpha 0.01) flags about 1 % of them, the default factor 1.05 none."""
    rng = np.random.default_rng(123)
    flagged_1 = flagged_105 = 0
    for _ in range(200):
        a = list(1e-3 * (1 + 0.01 * rng.standard_normal(30)))
        b = list(1e-3 * (1 + 0.01 * rng.standard_normal(30)))
        flagged_1 += latency_verdict(Measure("ok", samples=a), Measure("ok", samples=b), 1.0).regressed
        flagged_105 += latency_verdict(Measure("ok", samples=a), Measure("ok", samples=b), 1.05).regressed
    assert flagged_1 <= 6 and flagged_105 == 0
