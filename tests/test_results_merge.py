"""``mla-fp8-bench merge-results``: asv results from several runners side by side (synthetic dirs, CPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main
from mla_fp8_bench.report.results_merge import MergeError, merge_result_data, merge_results

COLS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
        "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]


def _machine(name: str, gpu: str = "none") -> dict:
    return {"arch": "x86_64", "cpu": "cpu", "gpu": gpu, "machine": name, "num_cpu": "2", "os": "Linux", "ram": "24GB",
            "version": 1}


def _bench(name: str, version: str = "v1", params=None) -> dict:
    return {"code": "...", "name": name, "param_names": ["backend", "case"],
            "params": params or [["'a'", "'b'"], ["'s128'"]], "type": "track", "unit": "seconds", "version": version}


def _result(sha: str, machine: str, benches: dict[str, tuple[list, float]], env="existing-py") -> dict:
    rows = {name: [vals, [["'a'", "'b'"], ["'s128'"]], "v1", started, 1.0] for name, (vals, started) in benches.items()}
    return {"commit_hash": sha, "env_name": env, "date": 1700000000000,
            "params": {"machine": machine, "python": "3.11"},
            "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": COLS, "results": rows,
            "durations": {}, "version": 2}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _runner_dir(root: Path, machine: str, gpu: str, benches: dict, started: float, sha="aaaaaaaa11",
                bench_names=None) -> Path:
    _write(root / machine / "machine.json", _machine(machine, gpu))
    _write(root / machine / f"{sha[:8]}-existing-py.json",
           _result(sha, machine, {k: (v, started) for k, v in benches.items()}))
    names = bench_names or list(benches)
    _write(root / "benchmarks.json", {"version": 2, **{n: _bench(n) for n in names}})
    return root


def test_two_runners_side_by_side_and_benchmarks_union(tmp_path):
    cpu = _runner_dir(tmp_path / "cpu", "cpu-2core", "none", {"b.M.track_latency": [1e-3, float("nan")]}, 1000.0)
    gpu = _runner_dir(tmp_path / "gpu", "h200", "NVIDIA H200", {"b.M.track_latency": [2e-5, 3e-5],
                                                                "b.M.track_call_latency": [4e-5, 5e-5]}, 2000.0)
    into = tmp_path / "results"
    assert main(["merge-results", str(cpu), str(gpu), "--into", str(into)]) == 0
    assert sorted(p.name for p in into.iterdir()) == ["benchmarks.json", "cpu-2core", "h200"]
    bench = json.loads((into / "benchmarks.json").read_text())
    assert set(bench) == {"version", "b.M.track_latency", "b.M.track_call_latency"}  # the union
    assert bench["version"] == 2
    res = json.loads((into / "cpu-2core" / "aaaaaaaa-existing-py.json").read_text())
    assert math.isnan(res["results"]["b.M.track_latency"][0][1])  # skips (NaN) survive the copy
    assert json.loads((into / "h200" / "machine.json").read_text())["gpu"] == "NVIDIA H200"
    # asv itself can read the merged tree
    from asv.results import iter_results

    machines = sorted(r.params["machine"] for r in iter_results(str(into)))
    assert machines == ["cpu-2core", "h200"]
    # idempotent: merging the same sources again changes nothing
    before = {p: p.read_bytes() for p in into.rglob("*.json")}
    assert main(["merge-results", str(cpu), str(gpu), "--into", str(into)]) == 0
    assert {p: p.read_bytes() for p in into.rglob("*.json")} == before


def test_newest_definition_wins_per_benchmark(tmp_path):
    old = _runner_dir(tmp_path / "old", "cpu-2core", "none", {"b.M.track_latency": [1.0, 2.0]}, 1000.0,
                      bench_names=["b.M.track_latency", "b.M.track_gone"])
    new = _runner_dir(tmp_path / "new", "h200", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]}, 5000.0)
    bj = json.loads((new / "benchmarks.json").read_text())
    bj["b.M.track_latency"]["version"] = "v2"
    _write(new / "benchmarks.json", bj)
    into = tmp_path / "results"
    # order on the command line does not matter: age (newest started_at) decides
    rep = merge_results([new, old], into)
    bench = json.loads((into / "benchmarks.json").read_text())
    assert bench["b.M.track_latency"]["version"] == "v2"
    assert "b.M.track_gone" in bench  # only the old runner knows it: kept, or its results would vanish
    assert set(rep.benchmarks_added) == {"b.M.track_latency", "b.M.track_gone"}


def test_conflicting_machine_json_is_refused_and_nothing_written(tmp_path, capsys):
    a = _runner_dir(tmp_path / "a", "gpu-box", "NVIDIA H200", {"b.M.track_latency": [1.0, 2.0]}, 1000.0)
    b = _runner_dir(tmp_path / "b", "gpu-box", "AMD MI355X", {"b.M.track_latency": [3.0, 4.0]}, 2000.0,
                    sha="bbbbbbbb22")
    into = tmp_path / "results"
    assert main(["merge-results", str(a), str(b), "--into", str(into)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "machine 'gpu-box'" in out and "differs" in out and "gpu" in out and "Nothing was written" in out
    assert not into.exists()
    # against the destination too: a first merge succeeds, the second is refused and leaves it intact
    merge_results([a], into)
    before = {p: p.read_bytes() for p in into.rglob("*") if p.is_file()}
    with pytest.raises(MergeError, match="differs from"):
        merge_results([b], into)
    assert {p: p.read_bytes() for p in into.rglob("*") if p.is_file()} == before


def test_same_file_measured_twice_merges_per_benchmark_newest_wins(tmp_path):
    a = _runner_dir(tmp_path / "a", "cpu-2core", "none", {"b.M.x": [1.0, 1.0], "b.M.y": [5.0, 5.0]}, 1000.0)
    into = tmp_path / "results"
    merge_results([a], into)
    b = tmp_path / "b"
    _write(b / "cpu-2core" / "machine.json", _machine("cpu-2core"))
    res = _result("aaaaaaaa11", "cpu-2core", {"b.M.x": ([2.0, 2.0], 3000.0), "b.M.z": ([7.0, 7.0], 3000.0)})
    res["results"]["b.M.y"] = [[9.0, 9.0], [["'a'", "'b'"], ["'s128'"]], "v1", 500.0, 1.0]  # older than a's y
    _write(b / "cpu-2core" / "aaaaaaaa-existing-py.json", res)
    rep = merge_results([b], into)
    assert rep.merged == ["cpu-2core/aaaaaaaa-existing-py.json"]
    got = json.loads((into / "cpu-2core" / "aaaaaaaa-existing-py.json").read_text())["results"]
    assert got["b.M.x"][0] == [2.0, 2.0]  # newer row wins
    assert got["b.M.y"][0] == [5.0, 5.0]  # older row loses
    assert got["b.M.z"][0] == [7.0, 7.0]  # new benchmark kept


def test_result_header_mismatch_is_refused():
    a = _result("aaaaaaaa11", "m", {"b.M.x": ([1.0, 1.0], 1.0)})
    b = _result("aaaaaaaa11", "m", {"b.M.x": ([1.0, 1.0], 2.0)}, env="virtualenv-py3.11")
    with pytest.raises(MergeError, match="env_name differs"):
        merge_result_data(a, b, "m/aaaaaaaa.json")


def test_unknown_machine_name_and_corrupt_source(tmp_path, capsys):
    a = _runner_dir(tmp_path / "a", "cpu-2core", "none", {"b.M.x": [1.0, 1.0]}, 1000.0)
    into = tmp_path / "results"
    assert main(["merge-results", str(a), "--into", str(into), "--machine", "nope"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "machine 'nope' is in none of the sources: they have cpu-2core" in out
    (a / "cpu-2core" / "aaaaaaaa-existing-py.json").write_text('{"commit_hash": "aaaa')  # truncated
    assert main(["merge-results", str(a), "--into", str(into)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "is not valid JSON" in out and "truncated" in out
    assert not into.exists()
    assert main(["merge-results", str(tmp_path / "missing"), "--into", str(into)]) == 2
    assert "does not exist" in " ".join(capsys.readouterr().out.split())


def test_machine_dir_name_must_match_machine_json(tmp_path):
    a = _runner_dir(tmp_path / "a", "cpu-2core", "none", {"b.M.x": [1.0, 1.0]}, 1000.0)
    (a / "cpu-2core").rename(a / "renamed")
    with pytest.raises(MergeError, match="names machine 'cpu-2core' but lives in directory 'renamed'"):
        merge_results([a], tmp_path / "results")


def test_single_machine_dir_as_source_and_dry_run(tmp_path):
    a = _runner_dir(tmp_path / "a", "h200", "NVIDIA H200", {"b.M.x": [1.0, 1.0]}, 1000.0)
    into = tmp_path / "results"
    rep = merge_results([a / "h200"], into, dry_run=True)
    assert rep.copied == ["h200/aaaaaaaa-existing-py.json"] and not into.exists()
    merge_results([a / "h200"], into)
    assert (into / "h200" / "machine.json").is_file() and (into / "benchmarks.json").is_file()


def test_merged_files_are_readable_per_umask(tmp_path):
    import os
    import stat

    a = _runner_dir(tmp_path / "a", "cpu-2core", "none", {"b.M.x": [1.0, 1.0]}, 1000.0)
    old = os.umask(0o022)
    try:
        merge_results([a], tmp_path / "results")
    finally:
        os.umask(old)
    for p in (tmp_path / "results").rglob("*.json"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p  # not mkstemp's 0600


# ------------------------------------------------------------------ nothing stored is overwritten by less
def _row(vals, params, started, version="v1"):
    return [vals, params, version, started, 1.0]


def _one_file(root: Path, machine: str, rows: dict, sha="aaaaaaaa11", gpu="none") -> Path:
    _write(root / machine / "machine.json", _machine(machine, gpu))
    res = _result(sha, machine, {})
    res["results"] = rows
    _write(root / machine / f"{sha[:8]}-existing-py.json", res)
    _write(root / "benchmarks.json", {"version": 2, **{n: _bench(n) for n in rows}})
    return root


FULL = [["'a'", "'b'"], ["'s128'", "'s256'"]]
SUBSET = [["'a'"], ["'s128'"]]


@pytest.mark.parametrize("order", ["old_then_new", "new_then_old"])
def test_older_full_file_and_newer_subset_keep_every_measured_value(tmp_path, order):
    nan = float("nan")
    full = _one_file(tmp_path / "full", "cpu-2core", {"b.M.x": _row([1.0, 2.0, 3.0, 4.0], FULL, 1000.0)})
    sub = _one_file(tmp_path / "sub", "cpu-2core", {"b.M.x": _row([1.5], SUBSET, 2000.0)})
    # a narrower run of the same grid stores NaN for what it did not measure
    nan_run = _one_file(tmp_path / "nanrun", "cpu-2core", {"b.M.x": _row([nan, nan, 3.5, nan], FULL, 3000.0)})
    into = tmp_path / "results"
    first, second = (full, sub) if order == "old_then_new" else (sub, full)
    merge_results([first], into)
    rep = merge_results([second], into)
    got = json.loads((into / "cpu-2core" / "aaaaaaaa-existing-py.json").read_text())["results"]["b.M.x"]
    params = got[1]
    vals = dict(zip([(b, c) for b in params[0] for c in params[1]], got[0]))
    assert vals == {("'a'", "'s128'"): 1.5, ("'a'", "'s256'"): 2.0, ("'b'", "'s128'"): 3.0, ("'b'", "'s256'"): 4.0}
    assert len(rep.kept) == 3
    merge_results([nan_run], into)
    got = json.loads((into / "cpu-2core" / "aaaaaaaa-existing-py.json").read_text())["results"]["b.M.x"]
    vals = dict(zip([(b, c) for b in got[1][0] for c in got[1][1]], got[0]))
    assert vals == {("'a'", "'s128'"): 1.5, ("'a'", "'s256'"): 2.0, ("'b'", "'s128'"): 3.5, ("'b'", "'s256'"): 4.0}
    from asv.results import Results  # asv itself reads the merged row, values in its params' order

    r = Results.load(str(into / "cpu-2core" / "aaaaaaaa-existing-py.json"))
    assert r.get_result_value("b.M.x", r.get_result_params("b.M.x")) == [1.5, 2.0, 3.5, 4.0]


def test_newer_failure_and_newer_version_replace_older_values(tmp_path):
    into = tmp_path / "results"
    merge_results([_one_file(tmp_path / "a", "m1", {"b.M.x": _row([1.0, 2.0, 3.0, 4.0], FULL, 1000.0),
                                                    "b.M.y": _row([1.0, 2.0, 3.0, 4.0], FULL, 1000.0)})], into)
    merge_results([_one_file(tmp_path / "b", "m1", {"b.M.x": _row([None, 2.5, 3.5, 4.5], FULL, 2000.0),
                                                    "b.M.y": _row([9.0], SUBSET, 2000.0, version="v2")})], into)
    got = json.loads((into / "m1" / "aaaaaaaa-existing-py.json").read_text())["results"]
    assert got["b.M.x"][0] == [None, 2.5, 3.5, 4.5]  # a failure is a measurement: it replaces the value
    assert got["b.M.y"][0] == [9.0] and got["b.M.y"][1] == SUBSET  # other benchmark code: old values dropped


def test_result_file_of_another_machine_is_refused_unless_allowed(tmp_path, capsys):
    src = _one_file(tmp_path / "src", "cpu-2core", {"b.M.x": _row([1.0], SUBSET, 1000.0)})
    f = src / "cpu-2core" / "aaaaaaaa-existing-py.json"
    doc = json.loads(f.read_text())
    doc["params"] = {"machine": "h200", "gpu": "NVIDIA H200", "python": "3.11"}  # an H200 file under cpu-2core/
    f.write_text(json.dumps(doc))
    into = tmp_path / "results"
    assert main(["merge-results", str(src), "--into", str(into)]) == 2
    out = "".join(capsys.readouterr().out.split())  # the console wraps long paths
    assert f"resultfile{f}wasmeasuredonanothermachine" in out
    assert "gpu='NVIDIAH200'vs'none'" in out and "machine='h200'vs'cpu-2core'" in out
    assert "--allow-machine-mismatch" in out and not into.exists()
    assert main(["merge-results", str(src), "--into", str(into), "--allow-machine-mismatch"]) == 0
    assert (into / "cpu-2core" / "aaaaaaaa-existing-py.json").is_file()


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_failed_merge_leaves_destination_byte_identical(tmp_path, monkeypatch, exc):
    import mla_fp8_bench.report.results_merge as rm

    into = tmp_path / "results"
    merge_results([_one_file(tmp_path / "a", "m1", {"b.M.x": _row([1.0, 2.0, 3.0, 4.0], FULL, 1000.0)})], into)
    before = _snapshot(into)
    src = _one_file(tmp_path / "b", "m1", {"b.M.x": _row([5.0, 6.0, 7.0, 8.0], FULL, 2000.0),
                                           "b.M.new": _row([1.0], SUBSET, 2000.0)})
    _write(src / "m2" / "machine.json", _machine("m2"))
    real = rm.write_json_atomic

    def dies_at_benchmarks(data, path, **kw):
        if Path(path).name == "benchmarks.json":  # killed after the result files were written
            raise exc
        return real(data, path, **kw)

    monkeypatch.setattr(rm, "write_json_atomic", dies_at_benchmarks)
    if isinstance(exc, OSError):
        with pytest.raises(MergeError, match="No space left on device.*the destination is unchanged"):
            merge_results([src], into)
    else:
        with pytest.raises(KeyboardInterrupt):
            merge_results([src], into)
    assert _snapshot(into) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "results"]  # no staging folder left
    monkeypatch.setattr(rm, "write_json_atomic", real)
    merge_results([src], into)  # the same merge succeeds once writes work
    assert json.loads((into / "m1" / "aaaaaaaa-existing-py.json").read_text())["results"]["b.M.x"][0] == \
        [5.0, 6.0, 7.0, 8.0]
    assert (into / "m2" / "machine.json").is_file()


def test_read_only_destination_part_is_refused_and_unchanged(tmp_path, capsys):
    import os

    if os.geteuid() == 0:
        pytest.skip("running as root: file modes do not stop writes")
    into = tmp_path / "results"
    merge_results([_one_file(tmp_path / "a", "m1", {"b.M.x": _row([1.0], SUBSET, 1000.0)})], into)
    before = _snapshot(into)
    (into / "m1").chmod(0o555)
    try:
        src = _one_file(tmp_path / "b", "m1", {"b.M.x": _row([2.0], SUBSET, 2000.0)})
        assert main(["merge-results", str(src), "--into", str(into)]) == 2
        assert "the destination is unchanged" in " ".join(capsys.readouterr().out.split())
        assert _snapshot(into) == before
    finally:
        (into / "m1").chmod(0o755)
