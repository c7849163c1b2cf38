"""Hostile inputs to the results reader, merge-results and publish: one test per input.

Each asserts the promise of docs/robustness.md: one line naming the file and the problem (exit 2), no
stored value overwritten by less, and a failed merge or publish leaving its destination byte-identical.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


# ============================================================ #13 row 6: truncated asv result file
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


def test_result_file_of_a_future_asv_api_is_named(tmp_path):
    res = _results_dir(tmp_path / "results")
    f = res / "cpu-2core" / "aaaaaaaa-existing-py.json"
    doc = json.loads(f.read_text())
    doc["version"] = 3
    f.write_text(json.dumps(doc))
    with pytest.raises(R.ResultsError, match=r"has api version 3; expected 2"):
        R.load_asv_result(f)


# ============================================================ #13 row 2 (merge part): never overwritten by less
def _vals(path: Path, bench: str = LAT) -> dict:
    row = json.loads(path.read_text())["results"][bench]
    return dict(zip([(b, c) for b in row[1][0] for c in row[1][1]], row[0]))


def test_merge_older_full_file_into_newer_subset_keeps_every_value(tmp_path):
    sub = _results_dir(tmp_path / "sub", rows={LAT: [[9e-4], [["'fa3-fp8'"], ["'s128'"]], "v1", 5000, 1.0]})
    full = _results_dir(tmp_path / "full")
    into = tmp_path / "results"
    assert main(["merge-results", str(sub), "--into", str(into)]) == 0
    assert main(["merge-results", str(full), "--into", str(into)]) == 0  # the older, fuller run arrives later
    got = _vals(into / "cpu-2core" / "aaaaaaaa-existing-py.json")
    assert got == {("'fa3-fp8'", "'s128'"): 9e-4, ("'fa3-fp8'", "'s256'"): 2e-3,
                   ("'torch-fp8-ref'", "'s128'"): 1.5e-3, ("'torch-fp8-ref'", "'s256'"): 3e-3}


def test_merge_newer_narrower_run_with_nan_keeps_stored_values(tmp_path, capsys):
    nan = float("nan")
    full = _results_dir(tmp_path / "full")
    narrow = _results_dir(tmp_path / "narrow", rows={LAT: [[nan, nan, 1.4e-3, nan], FULL, "v1", 9000, 1.0]})
    into = tmp_path / "results"
    assert main(["merge-results", str(full), "--into", str(into)]) == 0
    assert main(["merge-results", str(narrow), "--into", str(into)]) == 0
    assert "kept3valuesthatthenewerresultsdidnotmeasure" in _out(capsys)
    got = _vals(into / "cpu-2core" / "aaaaaaaa-existing-py.json")
    assert got == {("'fa3-fp8'", "'s128'"): 1e-3, ("'fa3-fp8'", "'s256'"): 2e-3,
                   ("'torch-fp8-ref'", "'s128'"): 1.4e-3, ("'torch-fp8-ref'", "'s256'"): 3e-3}


# ============================================================ #13 row 4 (merge part): another machine's file
def test_h200_file_under_cpu_dir_is_refused(tmp_path, capsys):
    src = _results_dir(tmp_path / "src")
    f = src / "cpu-2core" / "aaaaaaaa-existing-py.json"
    f.write_text(json.dumps(_result("h200", json.loads(f.read_text())["results"], gpu="NVIDIA H200")))
    into = _results_dir(tmp_path / "results", sha="b" * 40)
    before = _snapshot(into)
    assert main(["merge-results", str(src), "--into", str(into)]) == 2
    out = _out(capsys)
    assert "wasmeasuredonanothermachine" in out and "machine='h200'vs'cpu-2core'" in out
    assert _snapshot(into) == before


def test_dest_machine_json_of_another_machine_is_refused(tmp_path, capsys):
    into = _results_dir(tmp_path / "results", gpu="NVIDIA H200", sha="b" * 40)  # an H200 named cpu-2core
    before = _snapshot(into)
    assert main(["merge-results", str(_results_dir(tmp_path / "src")), "--into", str(into)]) == 2
    assert "machine'cpu-2core'" in _out(capsys)
    assert _snapshot(into) == before


# ============================================================ #13 row 7: stage then rename
_KILL_AT_BENCHMARKS = """
import os, signal, sys
from pathlib import Path
import mla_fp8_bench.report.results_merge as rm
real = rm.write_json_atomic
def dying(data, path, **kw):
    if Path(path).name == "benchmarks.json":
        os.kill(os.getpid(), signal.SIGKILL)
    return real(data, path, **kw)
rm.write_json_atomic = dying
rm.merge_results([sys.argv[1]], sys.argv[2])
"""


def test_kill_before_benchmarks_json_leaves_destination_byte_identical(tmp_path):
    into = _results_dir(tmp_path / "results", sha="b" * 40)
    before = _snapshot(into)
    src = _results_dir(tmp_path / "src", rows={LAT: [[5e-4] * 4, FULL, "v1", 9000, 1.0],
                                               "b.New.track_x": [[1.0] * 4, FULL, "v1", 9000, 1.0]})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", _KILL_AT_BENCHMARKS, str(src), str(into)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert _snapshot(into) == before


def test_merge_into_a_file_is_refused(tmp_path, capsys):
    dest = tmp_path / "results"
    dest.write_text("not a directory")
    assert main(["merge-results", str(_results_dir(tmp_path / "src")), "--into", str(dest)]) == 2
    assert _sq(f"destination {dest} exists and is not a directory") in _out(capsys)
    assert dest.read_text() == "not a directory"


def test_merge_write_failure_leaves_destination_unchanged(tmp_path, monkeypatch, capsys):
    import mla_fp8_bench.report.results_merge as rm

    into = _results_dir(tmp_path / "results", sha="b" * 40)
    before = _snapshot(into)

    def read_only(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(into / "cpu-2core" / "aaaaaaaa-existing-py.json"))

    monkeypatch.setattr(rm, "write_file_atomic", read_only)
    assert main(["merge-results", str(_results_dir(tmp_path / "src")), "--into", str(into)]) == 2
    assert "Permissiondenied" in _out(capsys) and _snapshot(into) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "src"]


# ============================================================ publish
def test_publish_missing_assets_says_the_one_command(tmp_path, capsys):
    assert main(["publish", "--results-dir", str(_results_dir(tmp_path / "results")), "--html-dir",
                 str(tmp_path / "html"), "--assets", str(tmp_path / "none")]) == 2
    out = _out(capsys)
    assert f"`mla-fp8-benchpublish--install-assets--assets{tmp_path / 'none'}`" in out
    assert not (tmp_path / "html").exists()


def _assets_or_skip():
    from mla_fp8_bench.report.publish import asset_problems, assets_dir

    if asset_problems(assets_dir()):
        pytest.skip("site assets not installed (mla-fp8-bench publish --install-assets)")
    return assets_dir()


def test_publish_html_dir_is_a_file(tmp_path, capsys):
    assets = _assets_or_skip()
    f = tmp_path / "site.html"
    f.write_text("x")
    assert main(["publish", "--results-dir", str(_results_dir(tmp_path / "results")), "--html-dir", str(f),
                 "--assets", str(assets)]) == 2
    assert _sq(f"--html-dir {f} is a file, not a directory") in _out(capsys) and f.read_text() == "x"


def test_publish_refuses_to_replace_a_folder_that_is_not_a_site(tmp_path, capsys):
    assets = _assets_or_skip()
    d = tmp_path / "docs"
    d.mkdir()
    (d / "notes.md").write_text("mine")
    assert main(["publish", "--results-dir", str(_results_dir(tmp_path / "results")), "--html-dir", str(d),
                 "--assets", str(assets)]) == 2
    assert "isanon-emptyfolderthatisnotanasvsite" in _out(capsys) and (d / "notes.md").read_text() == "mine"


def test_publish_empty_results_dir(tmp_path, capsys):
    assets = _assets_or_skip()
    (tmp_path / "results" / "m1").mkdir(parents=True)
    (tmp_path / "results" / "m1" / "machine.json").write_text(json.dumps(_machine("m1")))
    assert main(["publish", "--results-dir", str(tmp_path / "results"), "--html-dir", str(tmp_path / "html"),
                 "--assets", str(assets)]) == 2
    assert "holdsnoasvresultfiles:nothingtopublish" in _out(capsys)


def test_publish_tampered_asset_is_refused(tmp_path, capsys):
    import shutil

    assets = _assets_or_skip()
    copy = tmp_path / "assets"
    shutil.copytree(assets, copy)
    (copy / "node_modules" / "jquery" / "dist" / "jquery.min.js").write_text("alert('not jquery')")
    assert main(["publish", "--results-dir", str(_results_dir(tmp_path / "results")), "--html-dir",
                 str(tmp_path / "html"), "--assets", str(copy)]) == 2
    assert "jquery/dist/jquery.min.jsisnotthepinnedversion" in _out(capsys)


def test_publish_bad_config(tmp_path, capsys):
    assets = _assets_or_skip()
    cfg = tmp_path / "asv.conf.json"
    cfg.write_text("{ not json")
    assert main(["publish", "--config", str(cfg), "--assets", str(assets)]) == 2
    assert _sq(f"asv config {cfg} cannot be read") in _out(capsys)
