"""The PR gate (``mla-fp8-bench gate``): its latency rule, its accuracy rule, resources, lost results and
what it reports, on hand-built records whose ratios and thresholds are worked out here (CPU)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from mla_fp8_bench.cli import main

ROOT = Path(__file__).resolve().parents[1]
GPU = {"vendor": "cuda", "device_name": "NVIDIA H200"}
CPU = {"vendor": "cpu", "device_name": "cpu"}
US = 1e-6
COLS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
        "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]


def rec(backend: str = "fa3-fp8", case: str = "s512", status: str = "ok", **fields) -> dict:
    return {"backend": backend, "case": case, "status": status, "reason": "" if status == "ok" else "boom", **fields}


def timed(rounds_us: list[float], **fields) -> dict:
    """A record whose latency is the median of its rounds (as the rounds harness stores it)."""
    rounds = [x * US for x in rounds_us]
    return rec(latency_s=sorted(rounds)[len(rounds) // 2], latency_rounds_s=rounds, **fields)


def run_json(tmp_path: Path, name: str, records: list[dict], env: dict = GPU) -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"env": env, "records": records}))
    return str(p)


def asv_file(path: Path, commit: str, tracks: dict[str, tuple[str, dict]], machine: str = "m1",
             gpu: str = "NVIDIA H200") -> Path:
    """An asv 0.6 result file: ``tracks`` maps ``track_x`` to (version, {(backend, case): value or
    (value, samples)}); combinations not given are stored skipped (NaN)."""
    rows = {}
    for track, (version, values) in tracks.items():
        backends, cases = (sorted({k[i] for k in values}) for i in (0, 1))
        combos = list(itertools.product(backends, cases))
        got = [values.get(c, math.nan) for c in combos]
        res = [v[0] if isinstance(v, tuple) else v for v in got]
        samples = [v[1] if isinstance(v, tuple) else None for v in got]
        rows[f"bench_mla_prefill.MLAPrefill.{track}"] = [
            res, [[repr(b) for b in backends], [repr(c) for c in cases]], version, 1000, 1.0, None, None, None, None,
            None, None, samples]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commit_hash": commit, "env_name": "existing-py", "date": 1, "version": 2,
                                "params": {"machine": machine, "gpu": gpu}, "result_columns": COLS,
                                "results": rows}))
    return path


def gate(capsys, *args: str) -> tuple[int, str]:
    rc = main(["gate", *args])
    return rc, capsys.readouterr().out


def row(out: str, backend: str, case: str, metric: str) -> list[str]:
    """The cells of one table row (split on runs of 2+ spaces)."""
    import re

    line = next(x for x in out.splitlines() if re.search(rf"\s{backend}\s+{case}\s+{metric}\s", x))
    return re.split(r"\s{2,}", line.strip())


# ------------------------------------------------------------------------------------------ latency
def test_rounds_with_a_growth_below_the_threshold_pass_and_above_it_fail(tmp_path, capsys):
    """Rounds 10.0 / 10.1 / 10.2 us on both sides: MAD 0.1, robust sd 1.4826 x 0.1 = 0.14826 us, relative
    to the median 10.1; se = that x sqrt(1/3 + 1/3); with k 3 and --factor 1.02 the threshold is 1 + 3 se."""
    se = 1.4826 * 0.1 / 10.1 * math.sqrt(2 / 3)
    threshold = 1 + 3 * se  # 1.03596
    base = run_json(tmp_path, "b.json", [timed([10.0, 10.1, 10.2])])
    for scale, verdict, rc in ((1.03, "ok", 0), (1.04, "REGRESSION", 1)):
        head = run_json(tmp_path, "h.json", [timed([x * scale for x in (10.0, 10.1, 10.2)])])
        got, out = gate(capsys, base, head, "--factor", "1.02", "--all")
        cells = row(out, "fa3-fp8", "s512", "latency_s")
        assert (got, cells[0], cells[6]) == (rc, verdict, f"{scale:.3f}x")
        assert f"threshold {threshold:.3f}" in cells[7]


def test_a_slow_process_drops_out_of_its_side_fastest_mode(tmp_path, capsys):
    """BASE 10.0 / 10.2 / 12.0 us: its fastest mode (within 2 % of 10.0) is 10.0, 10.2, mean 10.1. HEAD
    10.6 / 10.7 / 10.8, mean 10.7: 10.7 / 10.1 = 1.0594 > 1.05 (the mean of all BASE rounds, 10.733, would
    hide it: 0.997)."""
    base = run_json(tmp_path, "b.json", [timed([10.0, 10.2, 12.0])])
    head = run_json(tmp_path, "h.json", [timed([10.6, 10.7, 10.8])])
    rc, out = gate(capsys, base, head)
    cells = row(out, "fa3-fp8", "s512", "latency_s")
    assert (rc, cells[0], cells[4], cells[5], cells[6]) == (1, "REGRESSION", "10.1 us (3)", "10.7 us (3)", "1.059x")


def test_one_stored_value_per_side_is_judged_against_the_factor(tmp_path, capsys):
    base = run_json(tmp_path, "b.json", [rec(latency_s=1.00e-3)])
    for head_s, rc in ((1.06e-3, 1), (1.04e-3, 0)):
        head = run_json(tmp_path, "h.json", [rec(latency_s=head_s)])
        assert gate(capsys, base, head)[0] == rc
    head = run_json(tmp_path, "h.json", [rec(latency_s=0.90e-3)])
    rc, out = gate(capsys, base, head)
    assert rc == 0 and row(out, "fa3-fp8", "s512", "latency_s")[0] == "improved"


def test_cpu_and_emulation_latencies_are_informational(tmp_path, capsys):
    """A CPU's host time 10x slower and an emulation's 10x slower never fail; the accuracy still judges."""
    acc = {"max_abs_error_fp8_ref": 0.01}
    base = run_json(tmp_path, "b.json", [rec(latency_s=1e-3, **acc)], env=CPU)
    head = run_json(tmp_path, "h.json", [rec(latency_s=1e-2, **acc)], env=CPU)
    rc, out = gate(capsys, base, head, "--all")
    assert rc == 0 and row(out, "fa3-fp8", "s512", "latency_s")[0] == "info" and "CPU host time" in out
    emu = dict(backend="aiter-emulated", case="s257", timing_scope="emulation", **acc)
    base = run_json(tmp_path, "b.json", [rec(latency_s=1e-3, **emu)])
    head = run_json(tmp_path, "h.json", [rec(latency_s=1e-2, **emu)])
    rc, out = gate(capsys, base, head, "--all")
    assert rc == 0 and row(out, "aiter-emulated", "s257", "latency_s")[0] == "info" and "emulation" in out


def test_host_latency_gates_only_when_asked(tmp_path, capsys):
    base = run_json(tmp_path, "b.json", [rec(latency_s=1e-3, call_latency_s=1e-3)])
    head = run_json(tmp_path, "h.json", [rec(latency_s=1e-3, call_latency_s=2e-3)])
    assert gate(capsys, base, head)[0] == 0
    rc, out = gate(capsys, base, head, "--gate-call-latency")
    assert rc == 1 and row(out, "fa3-fp8", "s512", "call_latency_s")[:2] == ["REGRESSION", "fa3-fp8"]


def test_a_case_off_its_clock_plateau_is_gated_on_sm_cycles(tmp_path, capsys):
    """s128 runs at the plateau (1980 MHz), s8192 at 1700 MHz (below 1980 x 0.985): HEAD takes 10 % longer
    on both; s8192's cycles per launch did not change (its clock dropped), s128's time is what counts."""
    def side(scale: float, clock: float) -> list[dict]:
        return [rec(case="s128", latency_s=10e-6 * scale, sm_clock_mhz=1980.0, latency_sm_cycles=19800.0 * scale),
                rec(case="s8192", latency_s=400e-6 * scale, sm_clock_mhz=clock, latency_sm_cycles=680000.0)]
    base = run_json(tmp_path, "b.json", side(1.0, 1700.0))
    head = run_json(tmp_path, "h.json", side(1.10, 1700.0 / 1.10))
    rc, out = gate(capsys, base, head, "--all")
    slow, capped = row(out, "fa3-fp8", "s128", "latency_s"), row(out, "fa3-fp8", "s8192", "latency_s")
    assert rc == 1 and (slow[0], slow[6]) == ("REGRESSION", "1.100x")
    assert (capped[0], capped[6]) == ("ok", "1.000x") and "gated on SM cycles" in capped[7]


# ------------------------------------------------------------------------------------------ accuracy
def tolerance_file(tmp_path: Path, limits: dict[str, float]) -> str:
    p = tmp_path / "tol.json"
    p.write_text(json.dumps({"schema": "mla_fp8_bench.tolerances", "version": 1, "name": "t", "method": "test",
                             "margin": 2.0, "distributions": {}, "tolerances": {"aiter-emulated": {"s257": limits}}}))
    return str(p)


def test_accuracy_over_its_tolerance_fails_and_within_it_passes_even_grown(tmp_path, capsys):
    tol = tolerance_file(tmp_path, {"max_abs_error_fp8_ref": 0.10})
    base = run_json(tmp_path, "b.json", [rec("aiter-emulated", "s257", max_abs_error_fp8_ref=0.02)])
    for value, rc, verdict in ((0.12, 1, "REGRESSION"), (0.08, 0, "ok")):  # 0.08: 4x BASE, within 0.10
        head = run_json(tmp_path, "h.json", [rec("aiter-emulated", "s257", max_abs_error_fp8_ref=value)])
        got, out = gate(capsys, base, head, "--tolerances", tol, "--all")
        cells = row(out, "aiter-emulated", "s257", "max_abs_error_fp8_ref")
        assert (got, cells[0]) == (rc, verdict) and "tolerance 0.1" in cells[7]


def test_accuracy_without_a_tolerance_fails_when_grown_beyond_the_factor(tmp_path, capsys):
    base = run_json(tmp_path, "b.json", [rec(max_abs_error_fp8_ref=0.04, rel_l2_error_fp8_ref=1e-9)])
    for value, rc in ((0.09, 1), (0.07, 0)):  # 2.25x and 1.75x against --acc-factor 2
        head = run_json(tmp_path, "h.json", [rec(max_abs_error_fp8_ref=value, rel_l2_error_fp8_ref=1e-7)])
        got, out = gate(capsys, base, head, "--all")
        assert got == rc  # rel_l2 100x, but by 1e-7 < 1e-6: within rounding of 0
        assert row(out, "fa3-fp8", "s512", "rel_l2_error_fp8_ref")[0] == "ok"


def test_a_non_finite_count_must_be_zero_and_a_nan_error_fails(tmp_path, capsys):
    base = run_json(tmp_path, "b.json", [rec(nonfinite_count_fp8_ref=0, max_abs_error_fp8_ref=0.01)])
    head = run_json(tmp_path, "h.json", [rec(nonfinite_count_fp8_ref=5, max_abs_error_fp8_ref=math.nan)])
    rc, out = gate(capsys, base, head)
    assert rc == 1 and row(out, "fa3-fp8", "s512", "nonfinite_count_fp8_ref")[0] == "REGRESSION"
    assert row(out, "fa3-fp8", "s512", "max_abs_error_fp8_ref")[0] == "REGRESSION"


def test_a_benchmark_version_change_does_not_hide_an_accuracy_regression(tmp_path, capsys):
    """HEAD's max-abs error x100 under a new benchmark version string still fails (its workspace, of an
    unchanged version, compares as before); its latency, whose meaning the version may have changed, is
    not comparable."""
    def side(name: str, version: str, error: float) -> str:
        key = ("fa3-fp8", "s512")
        return str(asv_file(tmp_path / name, name[0] * 40, {"track_max_abs_error": (version, {key: error}),
                                                            "track_latency": (version, {key: 1e-5}),
                                                            "track_workspace_bytes": ("aiter-plan-v1", {key: 1000})}))
    base, head = side("b.json", "mla-prefill-v1", 0.01), side("h.json", "mla-prefill-v9", 1.0)
    rc, out = gate(capsys, base, head, "--all")
    assert rc == 1
    cells = row(out, "fa3-fp8", "s512", "max_abs_error_fp8_ref")
    assert (cells[0], cells[6]) == ("REGRESSION", "100.000x") and "benchmark version changed" in cells[7]
    assert row(out, "fa3-fp8", "s512", "latency_s")[0] == "not comparable"


# ------------------------------------------------------------------------------------------ resources, lost
def test_resource_growth_fails_also_from_zero(tmp_path, capsys):
    base = run_json(tmp_path, "b.json", [rec("aiter-emulated", "s257", workspace_bytes=1000, num_partials=0)])
    head = run_json(tmp_path, "h.json", [rec("aiter-emulated", "s257", workspace_bytes=1100, num_partials=4)])
    rc, out = gate(capsys, base, head)
    assert rc == 1
    assert row(out, "aiter-emulated", "s257", "workspace_bytes")[6] == "1.100x"
    assert row(out, "aiter-emulated", "s257", "num_partials")[4:7] == ["0", "4", "0 -> 4"]


def test_lost_and_failed_results_fail_and_allow_missing_lists_only_lost(tmp_path, capsys):
    ok = {"max_abs_error_fp8_ref": 0.01}
    base = run_json(tmp_path, "b.json", [rec(case="s128", **ok), rec(case="s512", **ok), rec(case="s1024", **ok)])
    head = run_json(tmp_path, "h.json", [rec(case="s128", **ok), rec(case="s512", status="skipped")])
    rc, out = gate(capsys, base, head)
    assert rc == 1 and row(out, "fa3-fp8", "s512", "-")[:6] == ["LOST", "fa3-fp8", "s512", "-", "ok", "skipped"]
    assert row(out, "fa3-fp8", "s1024", "-")[0] == "LOST"
    assert gate(capsys, base, head, "--allow-missing")[0] == 0
    head = run_json(tmp_path, "h.json", [rec(case="s128", **ok), rec(case="s512", status="error"),
                                         rec(case="s1024", **ok)])
    rc, out = gate(capsys, base, head, "--allow-missing")
    assert rc == 1 and row(out, "fa3-fp8", "s512", "-")[0] == "FAILED"
    head = run_json(tmp_path, "h.json", [rec(case=c) for c in ("s128", "s512", "s1024")])  # ok, no accuracy
    rc, out = gate(capsys, base, head)
    assert rc == 1 and row(out, "fa3-fp8", "s128", "max_abs_error_fp8_ref")[0] == "LOST"


def test_impossible_values_are_invalid(tmp_path, capsys):
    base = run_json(tmp_path, "b.json", [rec(max_abs_error_fp8_ref=0.01, latency_s=1e-3)])
    head = run_json(tmp_path, "h.json", [rec(max_abs_error_fp8_ref=-0.01, latency_s=0.0)])
    rc, out = gate(capsys, base, head)
    assert rc == 1 and row(out, "fa3-fp8", "s512", "max_abs_error_fp8_ref")[0] == "INVALID"
    assert row(out, "fa3-fp8", "s512", "latency_s")[0] == "INVALID"


# ------------------------------------------------------------------------------------------ nothing judged
def test_a_comparison_that_judged_nothing_fails_and_says_why(tmp_path, capsys):
    cpu_only = [rec(latency_s=1e-3)]
    base = run_json(tmp_path, "b.json", cpu_only, env=CPU)
    head = run_json(tmp_path, "h.json", cpu_only, env=CPU)
    rc, out = gate(capsys, base, head)
    assert rc == 1 and "GATE FAILED: nothing judged: no value of HEAD could be judged" in out
    rc, out = gate(capsys, base, run_json(tmp_path, "e.json", [], env=CPU))
    assert rc == 1 and "nothing judged: HEAD holds no results" in out
    rc, out = gate(capsys, base, base)
    assert rc == 1 and "nothing judged: BASE and HEAD are the same file" in out


# ------------------------------------------------------------------------------------------ asv inputs, reports
def test_commits_are_found_on_the_one_machine_holding_both(tmp_path, capsys):
    results = tmp_path / "results"
    for machine, commits in (("m1", ("1111aaaa", "2222bbbb")), ("m2", ("1111aaaa",))):
        (results / machine).mkdir(parents=True)
        (results / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
        for c in commits:
            asv_file(results / machine / f"{c}-existing-py.json", c * 5, {
                "track_max_abs_error": ("v1", {("fa3-fp8", "s512"): 0.01})}, machine=machine)
    rc, out = gate(capsys, "1111aaaa", "2222bbbb", "--results-dir", str(results))
    assert rc == 0 and "m1/1111aaaa-existing-py.json" in out and "GATE PASSED: 1 value(s) judged" in out
    rc, out = gate(capsys, "1111aaaa", "1111aaaa", "--results-dir", str(results))
    assert rc == 2 and "2 machines" in out and "pass --machine" in out


def test_markdown_report_for_a_pr_comment(tmp_path, capsys):
    base = run_json(tmp_path, "b.json", [rec(latency_s=1.00e-3)])
    head = run_json(tmp_path, "h.json", [rec(latency_s=1.20e-3)])
    rc, out = gate(capsys, base, head, "--format", "markdown")
    lines = out.splitlines()
    assert rc == 1 and lines[0] == "## mla-fp8-bench gate"
    assert lines[2] == "**GATE FAILED: REGRESSION 1; 1 value(s) judged**"
    assert "| verdict | backend | case | metric | BASE | HEAD | ratio | detail |" in lines
    assert any(x.startswith("| REGRESSION | fa3-fp8 | s512 | latency_s | 1 ms | 1.2 ms | 1.200x |") for x in lines)
    assert lines[-1] == "Rows by verdict: REGRESSION 1"


def test_committed_cpu_results_pass_as_the_readme_example(capsys):
    """Two committed results of the CPU runner, one suite version apart: the README's passing example. The
    values judged, counted from the files: every accuracy and resource value stored on both sides."""
    from mla_fp8_bench.measure.metric_table import asv_metrics

    tracks = {m.asv_name for m in asv_metrics() if m.kind in ("accuracy", "resource")}
    files = [next((ROOT / "results" / "cpu-2core").glob(f"{c}-*.json")) for c in ("37625ef1", "1fed4606")]
    stored = []
    for f in files:
        data = json.loads(f.read_text())
        stored.append({(name, combo) for name, r in data["results"].items() if name in tracks
                       for combo, v in zip(itertools.product(*r[1]), r[0]) if v is not None and not math.isnan(v)})
    rc, out = gate(capsys, "--results-dir", str(ROOT / "results"), "--machine", "cpu-2core", "37625ef1", "1fed4606")
    assert rc == 0 and out.splitlines()[-1] == f"GATE PASSED: {len(stored[0] & stored[1])} value(s) judged"
