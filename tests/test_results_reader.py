"""The one results reader (mla_fp8_bench.harness.results): asv results directories and run JSONs.

Expected values are written out by hand from the asv 0.6 format (independent of the reader).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mla_fp8_bench.harness import results as R

COLS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
        "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
LAT = "bench_mla_prefill.MLAPrefill.track_latency"
ERR = "bench_mla_prefill.MLAPrefill.track_max_abs_error"


def list_machines(results_dir) -> list[str]:
    """Names of the machine directories in ``results_dir``."""
    return [m.name for m in R.machine_dirs(results_dir)]


def list_commits(machine_dir) -> list[str]:
    """Commit prefixes (8 hex digits) with a result file in ``machine_dir``, sorted."""
    return sorted({r.commit for r in R.list_result_files(machine_dir) if r.commit})


def _result(commit: str, env: str = "virtualenv-py3.11", machine: str = "m1", date: int = 1000) -> dict:
    params = [["'aiter-emulated'", "'torch-ref'"], ["'s128'", "'s256'"]]
    return {
        "commit_hash": commit, "env_name": env, "date": date,
        "params": {"machine": machine, "python": "3.11"}, "python": "3.11", "requirements": {}, "env_vars": {},
        "result_columns": COLS,
        "results": {
            LAT: [[1.0, None, float("nan"), 4.0], params, "v1", 5000, 1.0, [0.9, None, None, 3.5],
                  [1.1, None, None, 4.5], [0.95, None, None, 3.8], [1.05, None, None, 4.2], [1, None, None, 1],
                  [3, None, None, 3], [[0.9, 1.0, 1.1], None, None, [3.8, 4.0, 4.2]]],
            ERR: [[0.5, 0.25, 0.125, 1e-12], params, "v1", 6000],
        },
        "durations": {}, "version": 2,
    }


def _all_measurements(r: R.AsvResult) -> list[R.Measurement]:
    return [m for name in list(r.results) for m in r.measurements(name).values()]


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    _write(root / "m1" / "machine.json", {"machine": "m1", "arch": "x86_64", "version": 1})
    _write(root / "m1" / "abcdef12-virtualenv-py3.11.json", _result("abcdef1234567890", date=1000))
    _write(root / "m1" / "12345678-virtualenv-py3.11.json", _result("1234567890abcdef", date=2000))
    _write(root / "m2" / "machine.json", {"machine": "m2", "version": 1})
    _write(root / "benchmarks.json", {"version": 2, LAT: {"name": LAT}})
    (root / "not-a-machine").mkdir()
    return root


def test_lists_machines_commits_envs(results_dir):
    assert list_machines(results_dir) == ["m1", "m2"]
    assert R.machine_dirs(results_dir / "m1") == [results_dir / "m1"]
    assert list_commits(results_dir / "m1") == ["12345678", "abcdef12"]
    assert sorted({f.env for f in R.list_result_files(results_dir / "m1")}) == ["virtualenv-py3.11"]
    assert R.list_result_files(results_dir / "m2") == []
    assert R.load_machine(results_dir / "m1")["arch"] == "x86_64"
    assert list(R.load_benchmarks(results_dir)) == ["version", LAT]


def test_measurements_values_status_and_stats(results_dir):
    r = R.load_asv_result(R.find_result(results_dir, "m1", "abcd"))
    assert r.commit_hash == "abcdef1234567890" and r.machine == "m1"
    assert list(r.results) == [LAT, ERR]
    lat = r.measurements(LAT)
    assert list(lat) == [("aiter-emulated", "s128"), ("aiter-emulated", "s256"), ("torch-ref", "s128"),
                         ("torch-ref", "s256")]
    a = lat[("aiter-emulated", "s128")]
    assert (a.status, a.value, a.q25, a.q75) == ("ok", 1.0, 0.95, 1.05)
    assert a.samples == [0.9, 1.0, 1.1] and a.version == "v1"
    assert lat[("aiter-emulated", "s256")].status == "failed" and lat[("aiter-emulated", "s256")].value is None
    assert lat[("torch-ref", "s128")].status == "skipped"
    err = r.measurements(ERR)
    assert err[("torch-ref", "s256")].value == 1e-12 and err[("torch-ref", "s256")].q25 is None
    assert r.started_at() == 6000
    assert len(_all_measurements(r)) == 8


def test_newest_result_and_commit_selection(results_dir):
    assert R.newest_result(results_dir / "m1").commit_hash == "1234567890abcdef"
    assert R.newest_result(results_dir / "m1", "abcdef").commit_hash == "abcdef1234567890"
    with pytest.raises(R.ResultsError, match="no result file of commit ffff in"):
        R.newest_result(results_dir / "m1", "ffff")
    with pytest.raises(R.ResultsError, match="no result file in"):
        R.newest_result(results_dir / "m2")


def test_find_result_errors(results_dir):
    with pytest.raises(R.ResultsError, match="not a commit hash prefix"):
        R.find_result(results_dir, "m1", "xyz!")
    with pytest.raises(R.ResultsError, match=r"machine 'nope' has no results .*machines present m1, m2"):
        R.find_result(results_dir, "nope", "abcd")
    with pytest.raises(R.ResultsError, match=r"commit ffff has no asv results .*commits present 12345678, abcdef12"):
        R.find_result(results_dir, "m1", "ffff")
    _write(results_dir / "m1" / "abcdef12-other.json", _result("abcdef1234567890", env="other"))
    with pytest.raises(R.ResultsError, match="results of 2 environments"):
        R.find_result(results_dir, "m1", "abcdef")
    assert R.find_result(results_dir, "m1", "abcdef", env="other").name == "abcdef12-other.json"


def test_truncated_result_is_named_not_no_results(results_dir):
    f = results_dir / "m1" / "abcdef12-virtualenv-py3.11.json"
    f.write_text(f.read_text()[:200])
    with pytest.raises(R.ResultsError) as ei:
        R.find_result(results_dir, "m1", "abcdef")
    msg = str(ei.value)
    assert str(f) in msg and "not valid JSON" in msg and "truncated" in msg and "\n" not in msg
    with pytest.raises(R.ResultsError, match="not valid JSON"):
        R.newest_result(results_dir / "m1")


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(version=1), "api version 1; expected 2"),
    (lambda d: d.pop("results"), "lacks a key or a column"),
    (lambda d: d.update(results=[1]), "holds malformed rows"),
    (lambda d: d["results"][LAT][0].__setitem__(0, "fast"), "holds a value that is not a number \\('fast'"),
    (lambda d: d["results"][LAT][11][0].__setitem__(1, "x"), "holds a value that is not a number"),
])
def test_malformed_result_file(tmp_path, mutate, match):
    d = _result("abcdef1234567890")
    mutate(d)
    f = _write(tmp_path / "r.json", d)
    with pytest.raises(R.ResultsError, match=match):
        r = R.load_asv_result(f)
        _all_measurements(r)


def test_run_json_reader(tmp_path):
    good = {"env": {"device_name": "cpu"}, "records": [{"backend": "torch-ref", "case": "s128", "status": "ok",
                                                       "latency_s": 0.5}]}
    doc = R.load_run_json(_write(tmp_path / "run.json", good))
    assert doc.env == {"device_name": "cpu"} and doc.records[0]["latency_s"] == 0.5 and doc.ceilings is None
    for bad, match in [(None, "JSON NoneType, not an object"), ({"x": 1}, "no 'records' list"),
                       ({"records": [1, 2]}, "record 0 is malformed"),
                       ({"records": [{"backend": "a"}]}, "record 0 is malformed"),
                       ({"env": [], "records": []}, "'env' is a list")]:
        f = _write(tmp_path / "bad.json", bad)
        with pytest.raises(R.ResultsError, match=match) as ei:
            R.load_run_json(f)
        assert str(f) in str(ei.value)


def test_load_any_tells_kinds_apart(tmp_path):
    a = R.load_any(_write(tmp_path / "a.json", _result("abcdef1234567890")))
    assert isinstance(a, R.AsvResult)
    b = R.load_any(_write(tmp_path / "b.json", {"records": []}))
    assert isinstance(b, R.RunDoc) and b.records == []
    with pytest.raises(R.ResultsError, match="neither a run JSON"):
        R.load_any(_write(tmp_path / "c.json", [1]))


def test_stored_parameter_values_read_as_the_benchmark_saw_them(tmp_path):
    d = _result("abcdef1234567890")
    d["results"][LAT][1] = [["'aiter'", "128", "not a literal("]]
    d["results"][LAT][0] = [1.0, 2.0, 3.0]
    got = R.load_asv_result(_write(tmp_path / "r.json", d)).measurements(LAT)
    assert list(got) == [("aiter",), ("128",), ("not a literal(",)]


def test_reads_the_committed_results():
    root = Path(__file__).resolve().parents[1] / "results"
    if not root.is_dir():
        pytest.skip("no committed results/ directory")
    for m in list_machines(root):
        for rf in R.list_result_files(root / m):
            r = R.load_asv_result(rf.path)
            assert r.commit_hash.startswith(rf.commit) and r.machine == m
            n = sum(1 for x in _all_measurements(r) if x.status == "ok")
            assert n > 0
            assert all(math.isfinite(x.value) or math.isinf(x.value) for x in _all_measurements(r)
                       if x.status == "ok")
