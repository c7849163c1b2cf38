"""Hostile inputs to the results reader, merge-results and publish: one test per input.

Each asserts a promise: one line naming the file and the problem (exit 2), a file read only if it is a
regular file (a FIFO never blocks), no stored file overwritten, a refused merge leaving its destination
byte-identical.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main
from mla_fp8_bench.harness import results as R

ROOT = Path(__file__).resolve().parents[1]
COLS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
        "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
LAT = "bench_mla_prefill.MLAPrefill.track_latency"
ERR = "bench_mla_prefill.MLAPrefill.track_max_abs_error"
FULL = [["'fa3-fp8'", "'torch-fp8-ref'"], ["'s128'", "'s256'"]]


def _out(capsys) -> str:
    return "".join(capsys.readouterr().out.split())  # the console wraps long lines


def _sq(text: str) -> str:
    return "".join(str(text).split())


def _machine(name: str, gpu: str = "none") -> dict:
    return {"arch": "x86_64", "cpu": "cpu", "gpu": gpu, "machine": name, "num_cpu": "2", "os": "Linux", "ram": "24GB",
            "version": 1}


def _result(machine: str, rows: dict, sha: str = "a" * 40, gpu: str = "none") -> dict:
    return {"commit_hash": sha, "env_name": "existing-py", "date": 1700000000000,
            "params": {**{k: v for k, v in _machine(machine, gpu).items() if k != "version"}, "python": "3.11"},
            "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": COLS, "results": rows,
            "durations": {}, "version": 2}


def _results_dir(root: Path, machine: str = "cpu-2core", rows: dict | None = None, gpu: str = "none",
                 sha: str = "a" * 40) -> Path:
    rows = rows if rows is not None else {
        LAT: [[1e-3, 2e-3, 1.5e-3, 3e-3], FULL, "v1", 1000, 1.0],
        ERR: [[0.05, 0.06, 0.01, 0.01], FULL, "v1", 1000, 1.0]}
    (root / machine).mkdir(parents=True, exist_ok=True)
    (root / machine / "machine.json").write_text(json.dumps(_machine(machine, gpu)))
    (root / machine / f"{sha[:8]}-existing-py.json").write_text(json.dumps(_result(machine, rows, sha, gpu)))
    (root / "benchmarks.json").write_text(json.dumps({"version": 2, **{n: {"name": n, "version": "v1",
                                                                            "params": FULL} for n in rows}}))
    return root


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _run_json(tmp_path: Path, recs: list, name: str = "run.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"env": {"device_name": "NVIDIA H200", "arch": "sm_90", "vendor": "cuda"},
                             "records": recs}))
    return p


def _rec(backend: str, case: str, lat: float = 1e-5, e8=0.05, e16=0.2) -> dict:
    return {"backend": backend, "case": case, "status": "ok", "reason": "", "latency_s": lat,
            "latency_samples_s": [lat, lat * 1.1], "max_abs_error_fp8_ref": e8, "max_abs_error_bf16_ref": e16,
            "tflops": 1.0, "timing_scope": "kernel"}


def test_truncated_result_file_found_by_commit_is_named_not_no_results(tmp_path):
    res = _results_dir(tmp_path / "results")
    f = res / "cpu-2core" / "aaaaaaaa-existing-py.json"
    f.write_text(f.read_text()[:-40])
    with pytest.raises(R.ResultsError) as ei:
        R.find_result(res, "cpu-2core", "aaaa")
    assert str(f) in str(ei.value) and "not valid JSON" in str(ei.value) and "has no asv results" not in str(ei.value)


def test_truncated_result_file_given_to_merge_is_named_and_nothing_written(tmp_path, capsys):
    res = _results_dir(tmp_path / "results")
    f = res / "cpu-2core" / "aaaaaaaa-existing-py.json"
    f.write_text(f.read_text()[:99])
    assert main(["merge-results", str(res), "--into", str(tmp_path / "merged")]) == 2
    assert _sq(f"asv result file {f} is not valid JSON") in _out(capsys)
    assert not (tmp_path / "merged").exists()


def test_truncated_benchmarks_json_given_to_merge_is_named(tmp_path, capsys):
    res = _results_dir(tmp_path / "results")
    (res / "benchmarks.json").write_text('{"version": 2, "bench')
    assert main(["merge-results", str(res), "--into", str(tmp_path / "merged")]) == 2
    assert _sq(f"asv benchmarks file {res / 'benchmarks.json'} is not valid JSON") in _out(capsys)
    assert not (tmp_path / "merged").exists()


def test_result_file_of_a_future_asv_api_is_named(tmp_path):
    res = _results_dir(tmp_path / "results")
    f = res / "cpu-2core" / "aaaaaaaa-existing-py.json"
    doc = json.loads(f.read_text())
    doc["version"] = 3
    f.write_text(json.dumps(doc))
    with pytest.raises(R.ResultsError, match=r"api version 3; expected 2"):
        R.load_asv_result(f)


# ============================================================ only regular files are read
def test_fifos_in_a_results_directory_are_never_opened(tmp_path, capsys, no_block):
    """A FIFO named like a result file is passed over; one in place of machine.json makes no machine
    folder; one given as a file is refused, one line."""
    res = _results_dir(tmp_path / "results")
    os.mkfifo(res / "cpu-2core" / "bbbbbbbb-existing-py.json")
    (res / "h200").mkdir()
    os.mkfifo(res / "h200" / "machine.json")
    assert [f.commit for f in R.list_result_files(res / "cpu-2core")] == ["aaaaaaaa"]
    assert R.machine_dirs(res) == [res / "cpu-2core"]
    with pytest.raises(R.ResultsError, match="bbbbbbbb-existing-py.json is not a regular file"):
        R.load_any(res / "cpu-2core" / "bbbbbbbb-existing-py.json")
    with pytest.raises(R.ResultsError, match="has no asv results"):
        R.find_result(res, "cpu-2core", "bbbb")


def test_a_fifo_in_the_destination_blocks_no_merge_and_stays(tmp_path, capsys, no_block):
    into = _results_dir(tmp_path / "results", sha="b" * 40)
    os.mkfifo(into / "cpu-2core" / "notes.json")
    src = _results_dir(tmp_path / "src")
    assert main(["merge-results", str(src), "--into", str(into)]) == 0
    assert (into / "cpu-2core" / "aaaaaaaa-existing-py.json").read_bytes() == \
        (src / "cpu-2core" / "aaaaaaaa-existing-py.json").read_bytes()
    assert not (into / "cpu-2core" / "notes.json").is_file() and (into / "cpu-2core" / "notes.json").exists()


# ============================================================ merge: nothing stored is lost or overwritten
def test_a_source_file_of_another_benchmark_version_is_refused_and_the_destination_kept(tmp_path, capsys):
    into = _results_dir(tmp_path / "results")
    before = _snapshot(into)
    src = _results_dir(tmp_path / "src", rows={LAT: [[9e-4, 9e-4, 9e-4, 9e-4], FULL, "v2", 9000, 1.0]})
    assert main(["merge-results", str(src), "--into", str(into)]) == 2
    out = _out(capsys)
    assert _sq(f"{src / 'cpu-2core' / 'aaaaaaaa-existing-py.json'} differs from") in out and "nothingwaswritten" in out
    assert _snapshot(into) == before


def test_a_newer_narrower_run_is_refused_not_merged_over_stored_values(tmp_path, capsys):
    nan = float("nan")
    into = _results_dir(tmp_path / "results")
    before = _snapshot(into)
    narrow = _results_dir(tmp_path / "narrow", rows={LAT: [[nan, nan, 1.4e-3, nan], FULL, "v1", 9000, 1.0]})
    assert main(["merge-results", str(narrow), "--into", str(into)]) == 2
    assert _snapshot(into) == before


def test_a_destination_machine_json_of_another_machine_is_refused(tmp_path, capsys):
    into = _results_dir(tmp_path / "results", gpu="NVIDIA H200", sha="b" * 40)  # an H200 named cpu-2core
    before = _snapshot(into)
    assert main(["merge-results", str(_results_dir(tmp_path / "src")), "--into", str(into)]) == 2
    assert _sq(f"{tmp_path / 'src' / 'cpu-2core' / 'machine.json'} differs from") in _out(capsys)
    assert _snapshot(into) == before


def test_merge_into_a_file_is_refused(tmp_path, capsys):
    dest = tmp_path / "results"
    dest.write_text("not a directory")
    assert main(["merge-results", str(_results_dir(tmp_path / "src")), "--into", str(dest)]) == 2
    assert _sq(f"destination {dest} is not a results directory") in _out(capsys)
    assert dest.read_text() == "not a directory"


def test_merge_write_failure_is_one_line_and_leaves_the_destination_unchanged(tmp_path, monkeypatch, capsys):
    import mla_fp8_bench.report.results_merge as rm
    from mla_fp8_bench.jsonio import OutputError

    into = _results_dir(tmp_path / "results", sha="b" * 40)
    before = _snapshot(into)

    def read_only(path, *_a, **_k):
        raise OutputError(13, f"cannot write {path}: Permission denied; the previous file, if any, is unchanged")

    monkeypatch.setattr(rm, "write_file_atomic", read_only)
    assert main(["merge-results", str(_results_dir(tmp_path / "src")), "--into", str(into)]) == 2
    assert "Permissiondenied" in _out(capsys) and _snapshot(into) == before


# ============================================================ publish
def test_publish_html_dir_is_a_file(tmp_path, capsys):
    f = tmp_path / "site.html"
    f.write_text("x")
    assert main(["publish", "--results-dir", str(_results_dir(tmp_path / "results")), "--html-dir", str(f)]) == 2
    assert _sq(f"--html-dir {f} is a file, not a folder") in _out(capsys) and f.read_text() == "x"


def test_publish_refuses_to_replace_a_folder_that_is_not_a_site(tmp_path, capsys):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "notes.md").write_text("mine")
    assert main(["publish", "--results-dir", str(_results_dir(tmp_path / "results")), "--html-dir", str(d)]) == 2
    assert "holdswhatpublishdidnotwrite(notes.md)" in _out(capsys) and (d / "notes.md").read_text() == "mine"


def test_publish_empty_results_dir(tmp_path, capsys):
    (tmp_path / "results" / "m1").mkdir(parents=True)
    (tmp_path / "results" / "m1" / "machine.json").write_text(json.dumps(_machine("m1")))
    assert main(["publish", "--results-dir", str(tmp_path / "results"), "--html-dir", str(tmp_path / "html")]) == 2
    assert "holdsnobenchmarks.json:nothingtopublish" in _out(capsys) and not (tmp_path / "html").exists()


def test_publish_bad_config(tmp_path, capsys):
    cfg = tmp_path / "asv.conf.json"
    cfg.write_text("{ not json")
    assert main(["publish", "--config", str(cfg)]) == 2
    assert _sq(f"asv config {cfg} cannot be read") in _out(capsys)
