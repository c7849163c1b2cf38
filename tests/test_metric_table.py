"""The metric table and everything derived from it agree: the asv classes, the gate, calibrate/tolerances,
the runner's record keys and asv.conf.json's regression keys."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

from mla_fp8_bench.harness.asv_tracks import MissingMetricError, track_value, with_tracks
from mla_fp8_bench.measure import metric_table as mt

_spec = importlib.util.spec_from_file_location("asv_regression_keys", Path(__file__).resolve().parents[1] / "scripts"
                                               / "asv_regression_keys.py")
keys_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(keys_script)

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
#: The asv benchmarks published before the table existed (results/ holds their history): names and pretty
#: names must never change. Units are asv's axis labels, not part of a series' identity (asv keys a series by
#: name, params and version; the unit lives only in results/benchmarks.json): they are pinned here as the
#: words the graphs show.
PUBLISHED = {
    "MLAPrefill.track_latency": ("seconds", "MLA prefill latency"),
    "MLAPrefill.track_call_latency": ("seconds", "MLA prefill call latency (host-inclusive)"),
    "MLAPrefill.track_max_abs_error": ("max-abs error", "max-abs error vs fp8-dequant reference"),
    "MLAPrefill.track_max_abs_error_bf16_ref": ("max-abs error", "max-abs error vs bf16 reference"),
    "MLAPrefill.track_rel_l2_error": ("rel-L2 error", "rel-L2 error vs fp8-dequant reference"),
    "MLAPrefill.track_mismatch_fraction": ("fraction of elements", "mismatch fraction (AITER checkAllclose 5e-2)"),
    "MLAPrefill.track_nondeterminism": ("max-abs difference", "run-to-run max difference"),
    "MLAPrefill.track_seconds_per_pflop": ("s/PFLOP", "seconds per PFLOP (informational)"),
    "AiterPlan.track_planner_time": ("seconds", "AITER PS planner time"),
    "AiterPlan.track_workspace_bytes": ("bytes", "partial + LSE workspace"),
    "AiterPlan.track_num_partials": ("partial slots", "live partial slots"),
}


def _bench_module():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_mla_prefill
    finally:
        sys.path.remove(str(BENCH))
    return bench_mla_prefill


# ------------------------------------------------------------------------------------------ the table
def test_table_keys_are_unique_and_values_valid():
    for attr in ("name", "record_key"):
        vals = [getattr(m, attr) for m in mt.METRICS]
        assert len(vals) == len(set(vals)), attr
    tracks = [m.track for m in mt.METRICS if m.track]
    assert len(tracks) == len(set(tracks))
    for m in mt.METRICS:
        assert m.kind in mt.KINDS and m.gate in mt.GATES and m.better in ("lower", "higher")
        assert m.unit and m.pretty_name
        if m.calibrated:
            assert m.kind == "accuracy" and m.gate == "tolerance" and m.tolerance_floor > 0
        if m.track:
            assert m.track.startswith("track_") and m.asv_class in mt.ASV_CLASSES and m.doc


@pytest.mark.parametrize("bad", [dict(kind="speed"), dict(gate="maybe"), dict(better="up"),
                                 dict(track="track_x"), dict(calibrated=True), dict(bounds=(1.0, 0.0))])
def test_bad_entries_are_refused(bad):
    args = dict(name="x", record_key="x", track=None, asv_class=None, unit="u", pretty_name="x", kind="accuracy")
    args.update(bad)
    with pytest.raises(ValueError, match="metric x"):
        mt.Metric(**args)


def test_lookup_by_name_key_track_and_asv_name():
    m = mt.metric("max_abs_error")
    assert mt.metric("max_abs_error_fp8_ref") is m and mt.metric("track_max_abs_error") is m
    assert mt.metric("bench_mla_prefill.MLAPrefill.track_max_abs_error") is m
    assert mt.label("rel_l2_error_fp8_ref") == "rel-L2 error vs fp8-dequant reference"
    assert mt.label("not_a_metric") == "not_a_metric" and mt.find("not_a_metric") is None
    with pytest.raises(mt.UnknownMetricError, match="allowed"):
        mt.metric("bench_mla_prefill.Other.track_max_abs_error")


def test_floors_and_bounds():
    m = mt.metric("max_abs_error")
    assert m.floored(0.0) == 1e-12 and m.floored(0.5) == 0.5 and math.isnan(m.floored(float("nan")))
    assert mt.metric("workspace_bytes").floored(0.0) == 0.0  # no floor
    frac = mt.metric("mismatch_fraction")
    assert frac.possible(0.0) and frac.possible(1.0) and not frac.possible(1.01) and not frac.possible(-1e-9)
    assert not m.possible(float("nan")) and m.possible(math.inf)


# ------------------------------------------------------------------------------------------ asv class
def test_asv_classes_have_exactly_the_table_tracks():
    bench = _bench_module()
    for cls_name in mt.ASV_CLASSES:
        cls = getattr(bench, cls_name)
        have = {n for n in dir(cls) if n.startswith("track_")}
        assert have == {m.track for m in mt.asv_metrics(cls_name)}
        for m in mt.asv_metrics(cls_name):
            fn = getattr(cls, m.track)
            assert fn.unit == m.unit and fn.pretty_name == m.pretty_name and fn.__name__ == m.track


def test_published_names_units_and_pretty_names_are_kept():
    bench = _bench_module()
    for name, (unit, pretty) in PUBLISHED.items():
        cls, track = name.split(".")
        fn = getattr(getattr(bench, cls), track)
        assert (fn.unit, fn.pretty_name) == (unit, pretty), name
    # the class keeps its version (accuracy history stays one series); only the tracks whose asv samples
    # are one value per round (process) carry a version of their own
    assert bench.MLAPrefill.version == "mla-prefill-v1" and bench.AiterPlan.version == "aiter-plan-v1"
    assert bench.MLAPrefill.track_max_abs_error.version == "mla-prefill-v1"
    assert bench.MLAPrefill.track_latency.version == "mla-prefill-v1+rounds"
    assert bench.MLAPrefill.track_sm_cycles.version == "mla-prefill-v1+rounds"
    assert not hasattr(bench.AiterPlan.track_num_partials, "version") or \
        bench.AiterPlan.track_num_partials.version == "aiter-plan-v1"


def test_asv_discovers_the_published_benchmarks_unchanged():
    """asv's own discovery: every benchmark in results/benchmarks.json is found with the same name,
    params, param names, unit, pretty name, type and version."""
    runner = pytest.importorskip("asv_runner.discovery", reason="asv_runner is not installed")
    published = json.loads((ROOT / "results" / "benchmarks.json").read_text())
    buf = io.StringIO()
    saved = list(sys.path)
    try:
        runner.list_benchmarks(str(BENCH), buf)
    finally:
        sys.path[:] = saved
    found = {b["name"]: b for b in json.loads(buf.getvalue())}
    for name, old in published.items():
        if name == "version":
            continue
        assert name in found, name
        for k in ("param_names", "unit", "pretty_name", "type", "version"):
            assert found[name].get(k) == old.get(k), (name, k)
        # parameter values may be appended, never removed or reordered
        for new_vals, old_vals in zip(found[name]["params"], old["params"]):
            assert new_vals[:len(old_vals)] == old_vals, name


def test_with_tracks_refuses_a_hand_written_duplicate_and_an_unknown_class():
    class MLAPrefill:
        def track_latency(self, cache, backend, case):
            return 1.0

    with pytest.raises(ValueError, match="by hand and by the metric table"):
        with_tracks(MLAPrefill)

    class Nothing:
        pass

    with pytest.raises(ValueError, match="no asv track"):
        with_tracks(Nothing)


def test_track_values():
    lat = mt.metric("latency")
    assert track_value({"latency_samples_s": [1e-3, 2e-3]}, lat) == {"samples": [1e-3, 2e-3], "number": 1}
    assert math.isnan(track_value({}, lat))  # not measured: a skip
    call = mt.metric("call_latency")
    assert track_value({"call_latency_s": 2.5e-4}, call) == 2.5e-4  # no samples: the stored median
    err = mt.metric("max_abs_error")
    assert track_value({"max_abs_error_fp8_ref": 0.0}, err) == 1e-12
    assert track_value({"max_abs_error_fp8_ref": 0.03125}, err) == 0.03125
    with pytest.raises(MissingMetricError, match="missing"):
        track_value({"backend": "b", "case": "c"}, err)
    with pytest.raises(MissingMetricError, match="non-finite"):
        track_value({"max_abs_error_fp8_ref": math.inf}, err)
    spp = mt.metric("seconds_per_pflop")
    # 2 ms for 4e12 FLOP = 0.5 s per PFLOP
    assert track_value({"latency_s": 2e-3, "flops": 4e12, "timing_scope": "kernel"}, spp) == pytest.approx(0.5)
    assert math.isnan(track_value({"latency_s": 2e-3, "flops": 4e12, "timing_scope": "emulation"}, spp))
    assert track_value({"workspace_bytes": 0}, mt.metric("workspace_bytes")) == 0.0
    assert track_value({"num_partials": 0}, mt.metric("num_partials")) == 1e-12


# ------------------------------------------------------------------------------------------ consumers
def test_runner_record_keys_include_the_published_keys():
    from mla_fp8_bench.harness.runner import RECORD_KEYS

    documented = ("backend", "case", "status", "reason", "latency_s", "latency_samples_s", "latency_method",
                  "timing_scope", "max_abs_error_fp8_ref", "max_abs_error_bf16_ref", "rel_l2_error_fp8_ref",
                  "mismatch_fraction", "tflops")
    assert set(documented) <= set(RECORD_KEYS) and len(RECORD_KEYS) == len(set(RECORD_KEYS))


def test_calibrate_and_tolerances_use_the_table():
    from mla_fp8_bench.analysis import calibrate, tolerances

    expected_floors = {"max_abs_error_fp8_ref": 1e-3, "mean_abs_error_fp8_ref": 1e-5, "rel_l2_error_fp8_ref": 1e-4,
                       "max_abs_error_bf16_ref": 1e-3, "mean_abs_error_bf16_ref": 1e-5,
                       "rel_l2_error_bf16_ref": 1e-4, "mismatch_fraction": 1e-4}
    assert {k: tolerances.FLOORS[k] for k in expected_floors} == expected_floors
    assert set(tolerances.METRICS) == set(tolerances.FLOORS) == {m.record_key for m in mt.METRICS if m.calibrated}
    assert "nonfinite_count_fp8_ref" in tolerances.ZERO_METRICS
    assert set(tolerances.ZERO_METRICS) == {m.record_key for m in mt.METRICS if m.gate == "zero"}
    assert calibrate.METRICS is tolerances.METRICS and calibrate.FLOORS is tolerances.FLOORS
    shipped = json.loads((ROOT / "tolerances" / "cpu-emulated-v1.json").read_text())
    assert set(shipped["metrics"]) <= set(tolerances.METRICS)
    assert all(tolerances.FLOORS[k] == v for k, v in shipped["floors"].items())
    assert set(shipped["always_zero"]) <= set(tolerances.ZERO_METRICS)


def test_calibrate_derives_max_times_margin_floored_and_group_maxima():
    from mla_fp8_bench.analysis.calibrate import _derive

    vals = {m: [0.0, 0.0] for m in ("max_abs_error_fp8_ref", "mismatch_fraction")}
    big = dict(vals, max_abs_error_fp8_ref=[0.01, 0.03, 0.02])
    dists, tol, groups = _derive({"b": {"s128": vals, "s257": big}}, 2.0)
    assert tol["b"]["s128"]["max_abs_error_fp8_ref"] == 1e-3  # all zero: the floor
    assert tol["b"]["s257"]["max_abs_error_fp8_ref"] == pytest.approx(0.06)  # 0.03 x 2
    assert tol["b"]["s257"]["mismatch_fraction"] == 1e-4
    assert groups["b"]["per_tensor/normal"]["max_abs_error_fp8_ref"] == pytest.approx(0.06)
    assert dists["b"]["s257"]["max_abs_error_fp8_ref"]["median"] == pytest.approx(0.02)


def test_gate_kinds_come_from_the_table(tmp_path):
    from mla_fp8_bench.analysis.gate.judge import Options, compare
    from mla_fp8_bench.analysis.gate.load import side_from_run
    from mla_fp8_bench.harness.results import run_doc_from_data

    rec = {"backend": "fa3-fp8", "case": "s128", "status": "ok", "latency_s": 1e-4, "max_abs_error_fp8_ref": 0.02,
           "num_partials": 0, "call_latency_s": 2e-4, "tflops": 100.0}
    side = side_from_run(run_doc_from_data({"env": {}, "records": [rec]}, "x.json"), "HEAD")
    rows = {r.metric: r.verdict for r in compare(side, side, Options())}
    # judged kinds get a row (host latency informational), informational figures none
    assert rows == {"latency_s": "ok", "max_abs_error_fp8_ref": "ok", "num_partials": "ok", "call_latency_s": "info"}
    # floors applied as asv stores them
    assert side.data[("fa3-fp8", "s128", "num_partials")].center == 1e-12


# ------------------------------------------------------------------------------------------ asv.conf.json
def _load_conf(path: Path) -> dict:
    text = "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("//"))
    return json.loads(text)


@pytest.mark.parametrize("conf_name", ["asv.conf.json", "asv.aiter.conf.json", "asv.vllm.conf.json"])
def test_asv_conf_regression_keys_equal_the_table(conf_name):
    if not (ROOT / conf_name).exists():
        pytest.skip(f"{conf_name} is not in this checkout")
    conf = _load_conf(ROOT / conf_name)
    gen = keys_script.asv_regression_config(suite=conf["repo"] == ".")  # the suite's own history: its first commits too
    assert conf["regressions_thresholds"] == gen["regressions_thresholds"]
    assert conf["regressions_first_commits"] == gen["regressions_first_commits"]


def _entry(m: mt.Metric, backend: str = "fa3-fp8", case: str = "s1024") -> str:
    return f"{m.asv_name}('{backend}', '{case}')"


def test_threshold_regexes_are_disjoint_and_cover_every_gated_track():
    gen = keys_script.asv_regression_config()
    thr, off = gen["regressions_thresholds"], gen["regressions_first_commits"]
    for m in mt.asv_metrics():
        for name in (m.asv_name, _entry(m)):
            hits = [rx for rx in thr if re.match(rx, name)]
            disabled = [rx for rx in off if re.match(rx, name)]
            assert len(hits) + len(disabled) >= 1, name
            assert len(hits) <= 1, (name, hits)
            if hits:
                expected = {"accuracy": 1.0, "kernel_latency": 0.05, "resource": 0.05}[m.kind]
                assert thr[hits[0]] == expected, name
    # regressions of figures that are not a kernel's are never reported by asv
    assert any(re.match(rx, _entry(mt.metric("latency"), "aiter-emulated")) for rx in off)
    assert not any(re.match(rx, _entry(mt.metric("latency"), "fa3-fp8")) for rx in off)
    assert any(re.match(rx, _entry(mt.metric("call_latency"))) for rx in off)
    assert any(re.match(rx, _entry(mt.metric("planner_time"), "aiter")) for rx in off)
    # track_max_abs_error's pattern does not also catch track_max_abs_error_bf16_ref
    bf16 = _entry(mt.metric("max_abs_error_bf16_ref"))
    assert [rx for rx in thr if re.match(rx, bf16)] == [keys_script._asv_regex(mt.metric("max_abs_error_bf16_ref"))]


def _gate_verdict(m: mt.Metric, base: float, head: float) -> str:
    from mla_fp8_bench.analysis.gate import judge, load

    key = ("fa3-fp8", "s1024", m.record_key)

    def side(label: str, v: float) -> load.Side:  # one value a side: the latency threshold is --factor
        return load.Side(label, label, data={key: load.Value("ok", v, (v,))}, params={key[:2]: ("ok", "")})

    rows = judge.compare(side("BASE", base), side("HEAD", head), judge.Options())
    return next((r.verdict for r in rows if r.metric == m.record_key), "no row")


@pytest.mark.parametrize("track", [m.track for m in mt.asv_metrics()])
def test_asv_thresholds_flag_what_the_gate_flags(track):
    """asv's Regressions page and ``mla-fp8-bench gate`` apply one rule: a growth just above asv's
    threshold fails the gate, one just below passes it, and a track asv never reports never gates."""
    m = mt.metric(track)
    gen = keys_script.asv_regression_config()
    hits = [t for rx, t in gen["regressions_thresholds"].items() if re.match(rx, _entry(m))]
    base = 0.04 if m.kind == "accuracy" else 1e-3 if m.kind == "kernel_latency" else 1e6
    if not hits:
        assert _gate_verdict(m, base, base * 10) != "REGRESSION", track
        return
    (thr,) = hits
    above, below = base * (1 + thr) * 1.01 + (1e-9 if thr == 0 else 0), base * (1 + thr) * 0.99
    assert _gate_verdict(m, base, above) == "REGRESSION", (track, thr)
    assert _gate_verdict(m, base, below) != "REGRESSION", (track, thr)


def test_a_calibrated_metric_a_tolerance_file_lacks_is_an_error(tmp_path):
    """Never a silent pass: where the tolerance file lacks a metric, the gate judges it on growth over BASE;
    loading a file whose metric list lacks a calibrated metric of the table is refused, naming both."""
    from mla_fp8_bench.analysis.gate import judge, load
    from mla_fp8_bench.analysis.tolerances import ToleranceFileError, Tolerances, load_tolerances

    src = ROOT / "tolerances" / "cpu-emulated-v1.json"
    doc = json.loads(src.read_text())
    del doc["tolerances"]["aiter-emulated"]["s512"]["mismatch_fraction"]
    tol = Tolerances(str(tmp_path / "tol.json"), doc)
    key = ("aiter-emulated", "s512", "mismatch_fraction")

    def side(v: float) -> load.Side:
        return load.Side("x", "x", data={key: load.Value("ok", v, (v,))}, params={key[:2]: ("ok", "")})
    (row,) = judge.compare(side(0.01), side(0.03), judge.Options(tolerances=tol))
    assert (row.verdict, row.detail) == ("REGRESSION", "grew beyond 2.0x over BASE")
    doc["metrics"].remove("lse_rel_error_fp8_ref")
    (tmp_path / "tol2.json").write_text(json.dumps(doc))
    with pytest.raises(ToleranceFileError, match=r"tol2\.json: lacks calibrated metric lse_rel_error_fp8_ref"):
        load_tolerances(tmp_path / "tol2.json")


def test_write_asv_config_updates_in_place_and_asv_reads_it(tmp_path):
    conf = tmp_path / "asv.conf.json"
    old = ('{\n    // a comment\n    "version": 1,\n    "project": "x",\n    // thresholds: old\n'
           '    "regressions_thresholds": {\n        ".*": 0.05\n    }\n}\n')
    conf.write_text(old)
    assert keys_script.write_asv_config(str(conf)) is True
    assert keys_script.write_asv_config(str(conf)) is False  # already current
    text = conf.read_text()
    assert "// a comment" in text and "thresholds: old" not in text
    data = _load_conf(conf)
    assert data["project"] == "x" and data["regressions_thresholds"] == keys_script.asv_regression_config()[
        "regressions_thresholds"]
    if shutil.which("asv") or (Path(sys.executable).parent / "asv").exists():
        from asv.util import load_json

        first = keys_script.asv_regression_config()["regressions_first_commits"]
        assert load_json(str(conf), js_comments=True)["regressions_first_commits"] == first
    bad = tmp_path / "none.json"
    bad.write_text('{"version": 1}\n')
    with pytest.raises(ValueError, match="no \"regressions_thresholds\""):
        keys_script.write_asv_config(str(bad))
