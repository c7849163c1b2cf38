"""``mla-fp8-bench merge-results``: the union of asv results directories from several runners (synthetic
directories, CPU): what is copied, what is refused, and that nothing stored is overwritten."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from mla_fp8_bench.cli import main
from mla_fp8_bench.report.results_merge import merge_results

COLS = ["result", "params", "version", "started_at", "duration"]
PARAMS = [["'a'", "'b'"], ["'s128'"]]


def machine(name: str, gpu: str = "none") -> dict:
    return {"arch": "x86_64", "gpu": gpu, "machine": name, "num_cpu": "2", "version": 1}


def bench(name: str, version: str = "v1") -> dict:
    return {"code": "...", "name": name, "param_names": ["backend", "case"], "params": PARAMS, "type": "track",
            "unit": "seconds", "version": version}


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def runner_dir(root: Path, name: str, gpu: str, values: dict[str, list], sha: str = "aaaaaaaa11",
               definitions: dict | None = None) -> Path:
    """A results directory of one runner: one machine, one result file of ``sha``, its benchmarks.json."""
    write(root / name / "machine.json", machine(name, gpu))
    write(root / name / f"{sha[:8]}-existing-py.json", {
        "commit_hash": sha, "env_name": "existing-py", "date": 1, "params": {"machine": name}, "version": 2,
        "result_columns": COLS, "results": {k: [v, PARAMS, "v1", 1000, 1.0] for k, v in values.items()}})
    write(root / "benchmarks.json", {"version": 2, **(definitions or {k: bench(k) for k in values})})
    return root


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_runners_side_by_side_and_the_union_of_their_definitions(tmp_path, capsys):
    cpu = runner_dir(tmp_path / "cpu", "cpu-2core", "none", {"b.M.track_latency": [1e-3, float("nan")]})
    gpu = runner_dir(tmp_path / "gpu", "h200", "NVIDIA H200", {"b.M.track_latency": [2e-5, 3e-5],
                                                               "b.M.track_call_latency": [4e-5, 5e-5]})
    into = tmp_path / "results"
    assert main(["merge-results", str(cpu), str(gpu), "--into", str(into)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "machines: cpu-2core, h200", "result files: 4 copied, 0 already there", "benchmarks.json: 2 definitions added"]
    got = snapshot(into)
    for src in (cpu, gpu):  # every source file, byte for byte
        assert all(got[str(p.relative_to(src))] == p.read_bytes() for p in src.rglob("*.json")
                   if p.name != "benchmarks.json")
    definitions = json.loads((into / "benchmarks.json").read_text())
    assert definitions == {"version": 2, "b.M.track_latency": bench("b.M.track_latency"),
                           "b.M.track_call_latency": bench("b.M.track_call_latency")}


def test_merging_again_changes_nothing(tmp_path, capsys):
    src = runner_dir(tmp_path / "src", "h200", "NVIDIA H200", {"b.M.track_latency": [2e-5, 3e-5]})
    into = tmp_path / "results"
    assert merge_results([str(src)], str(into))["copied"] == ["h200/machine.json", "h200/aaaaaaaa-existing-py.json"]
    before = snapshot(into)
    again = merge_results([str(src)], str(into))
    assert (again["copied"], again["unchanged"], again["added"]) == (
        [], ["h200/machine.json", "h200/aaaaaaaa-existing-py.json"], [])
    assert snapshot(into) == before


def test_a_definition_that_differs_keeps_the_stored_one_and_says_so(tmp_path, capsys):
    into = runner_dir(tmp_path / "results", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    src = runner_dir(tmp_path / "src", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]}, sha="bbbbbbbb22",
                     definitions={"b.M.track_latency": bench("b.M.track_latency", "v2"), "b.M.new": bench("b.M.new")})
    assert main(["merge-results", str(src), "--into", str(into)]) == 0
    out = capsys.readouterr().out
    assert f"benchmarks.json: b.M.track_latency kept as first found; {src / 'benchmarks.json'} defines it otherwise" \
        in out
    definitions = json.loads((into / "benchmarks.json").read_text())
    assert definitions["b.M.track_latency"]["version"] == "v1" and definitions["b.M.new"] == bench("b.M.new")


def test_a_result_file_that_differs_is_refused_and_nothing_written(tmp_path, capsys):
    into = runner_dir(tmp_path / "results", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    before = snapshot(into)
    other = runner_dir(tmp_path / "other", "cpu-2core", "none", {"b.M.track_latency": [5.0, 6.0]}, sha="cccccccc33")
    src = runner_dir(tmp_path / "src", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 9.0]})
    assert main(["merge-results", str(other), str(src), "--into", str(into)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert f"{src / 'h200' / 'aaaaaaaa-existing-py.json'} differs from {into / 'h200' / 'aaaaaaaa-existing-py.json'}" \
        in out and "nothing was written" in out
    assert snapshot(into) == before  # not even the other source's new machine


def test_two_sources_with_different_files_of_one_name_are_refused(tmp_path, capsys):
    a = runner_dir(tmp_path / "a", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    b = runner_dir(tmp_path / "b", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 3.0]})
    assert main(["merge-results", str(a), str(b), "--into", str(tmp_path / "results")]) == 2
    assert "differs from the same file of another source" in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "results").exists()


def test_a_different_machine_under_one_name_is_refused(tmp_path, capsys):
    into = runner_dir(tmp_path / "results", "gpu1", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    before = snapshot(into)
    src = runner_dir(tmp_path / "src", "gpu1", "AMD Instinct MI355X", {"b.M.track_latency": [1.0, 2.0]}, sha="dddd0000")
    assert main(["merge-results", str(src), "--into", str(into)]) == 2
    assert f"{src / 'gpu1' / 'machine.json'} differs from" in " ".join(capsys.readouterr().out.split())
    assert snapshot(into) == before


def test_a_machine_folder_without_machine_json_is_named_not_dropped(tmp_path, capsys):
    src = runner_dir(tmp_path / "src", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    write(src / "mi355" / "aaaaaaaa-existing-py.json", {"version": 2})
    assert main(["merge-results", str(src), "--into", str(tmp_path / "results")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert f"{src / 'mi355'} holds JSON files but no machine.json" in out
    assert not (tmp_path / "results").exists()


def test_sources_that_are_no_results_directory_are_refused(tmp_path, capsys):
    src = runner_dir(tmp_path / "src", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    for bad, says in ((src / "h200", f"it is one machine's folder: give {src}"),
                      (tmp_path / "none", "is not an asv results directory")):
        assert main(["merge-results", str(bad), "--into", str(tmp_path / "results")]) == 2
        assert says in " ".join(capsys.readouterr().out.split())
    write(src / "h200" / "machine.json", machine("gpu9"))
    assert main(["merge-results", str(src), "--into", str(tmp_path / "results")]) == 2
    assert "names another machine than its folder 'h200'" in capsys.readouterr().out
    assert main(["merge-results", str(src), "--into", str(src / "sub")]) == 2
    assert "is a source or lies inside one" in capsys.readouterr().out


def test_dry_run_writes_nothing(tmp_path, capsys):
    src = runner_dir(tmp_path / "src", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    assert main(["merge-results", str(src), "--into", str(tmp_path / "results"), "--dry-run"]) == 0
    assert "result files: 2 copied, 0 already there (dry run: nothing written)" in capsys.readouterr().out
    assert not (tmp_path / "results").exists()


def test_merged_files_are_readable_per_umask(tmp_path):
    src = runner_dir(tmp_path / "src", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]})
    old = os.umask(0o022)
    try:
        merge_results([str(src)], str(tmp_path / "results"))
    finally:
        os.umask(old)
    for f in (tmp_path / "results").rglob("*.json"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_a_destination_name_too_long_is_one_line(tmp_path, capsys):
    cpu = runner_dir(tmp_path / "cpu", "cpu-2core", "none", {"b.M.track_latency": [1e-3, 2e-3]})
    before = snapshot(cpu)
    assert main(["merge-results", str(cpu), "--into", str(tmp_path / ("x" * 300))]) == 2
    c = capsys.readouterr()
    assert "File name too long" in c.out + c.err and "Traceback" not in c.out + c.err
    assert snapshot(cpu) == before
