"""Hostile inputs to the PR gate: each is one line naming the bad value, exit 2, before any comparison
(a FIFO never blocks), or a verdict that cannot mislead (floors, cross-machine, capped markdown)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main

GPU = {"vendor": "cuda", "device_name": "NVIDIA H200"}


def rec(**fields) -> dict:
    return {"backend": "fa3-fp8", "case": "s512", "status": "ok", **fields}


def write(tmp_path: Path, name: str, records: list[dict], env: dict = GPU) -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"env": env, "records": records}))
    return str(p)


def usage_error(capsys, *args: str) -> str:
    """The one line of a usage error (exit 2)."""
    rc = main(["gate", *args])
    out = capsys.readouterr().out
    assert rc == 2 and out.startswith("error: ") and len(out.splitlines()) == 1, (rc, out)
    return " ".join(out.split())


@pytest.mark.parametrize("flag, value, named", [
    ("--factor", "nan", "--factor nan is invalid"), ("--factor", "0.5", "--factor 0.5 is invalid"),
    ("--acc-factor", "inf", "--acc-factor inf is invalid"), ("--noise-k", "-1", "--noise-k -1.0 is invalid")])
def test_bad_numbers_are_refused(tmp_path, capsys, flag, value, named):
    f = write(tmp_path, "r.json", [rec(latency_s=1e-3)])
    assert named in usage_error(capsys, f, f, flag, value)


def test_missing_files_and_names_that_are_no_commit_are_refused(tmp_path, capsys):
    f = write(tmp_path, "r.json", [rec(latency_s=1e-3)])
    assert "HEAD 'runs/nope.json' is neither an existing file nor a commit" in usage_error(capsys, f, "runs/nope.json")
    assert "results directory" in usage_error(capsys, "abcd1234", f, "--results-dir", str(tmp_path / "none"))
    (tmp_path / "t.json").write_text('{"env": {}, "records": [')
    assert "BASE: results file" in usage_error(capsys, str(tmp_path / "t.json"), f)


def test_a_fifo_as_a_tolerance_file_is_refused_without_blocking(tmp_path, capsys, no_block):
    f = write(tmp_path, "r.json", [rec(latency_s=1e-3)])
    os.mkfifo(tmp_path / "tol.json")
    assert f"--tolerances {tmp_path / 'tol.json'} is not a regular file" in usage_error(
        capsys, f, f, "--tolerances", str(tmp_path / "tol.json"))


def test_a_fifo_as_a_side_is_refused_without_blocking(tmp_path, capsys, no_block):
    os.mkfifo(tmp_path / "fifo.json")
    f = write(tmp_path, "r.json", [rec(latency_s=1e-3)])
    assert "BASE: results file" in usage_error(capsys, str(tmp_path / "fifo.json"), f)


@pytest.mark.parametrize("key, bad", [("latency_s", "1e-3"), ("latency_s", [1e-3]), ("max_abs_error_fp8_ref", True),
                                      ("workspace_bytes", {"v": 1})])
def test_a_value_that_is_not_a_number_is_refused_naming_record_and_field(tmp_path, capsys, key, bad):
    b = write(tmp_path, "b.json", [rec(latency_s=1e-3)])
    h = write(tmp_path, "h.json", [rec(latency_s=1e-3), {**rec(case="s1024"), key: bad}])
    msg = usage_error(capsys, b, h)
    assert f"HEAD {h}: record 1 (fa3-fp8, s1024): {key} = {bad!r}"[:60] in msg and "is not a number" in msg


@pytest.mark.parametrize("bad", ["1e-3", 5, [1e-3, "x"]])
def test_rounds_or_samples_that_are_not_numbers_are_refused(tmp_path, capsys, bad):
    b = write(tmp_path, "b.json", [rec(latency_s=1e-3)])
    h = write(tmp_path, "h.json", [rec(latency_s=1e-3, latency_rounds_s=bad)])
    assert "record 0 (fa3-fp8, s512)" in usage_error(capsys, b, h)


def test_two_different_records_of_one_backend_and_case_are_refused(tmp_path, capsys):
    b = write(tmp_path, "b.json", [rec(latency_s=1e-3)])
    h = write(tmp_path, "h.json", [rec(latency_s=1e-3), rec(latency_s=2e-3)])
    assert "records 0 and 1 are two different records of (fa3-fp8, s512)" in usage_error(capsys, b, h)
    h = write(tmp_path, "h.json", [rec(latency_s=1e-3), rec(latency_s=1e-3)])  # the same record twice: one
    assert main(["gate", b, h]) == 0


def test_two_machines_are_refused_unless_allowed(tmp_path, capsys):
    b = write(tmp_path, "b.json", [rec(latency_s=1e-3)])
    h = write(tmp_path, "h.json", [rec(latency_s=1e-3)], env={"vendor": "amd", "device_name": "AMD Instinct MI355X"})
    assert "different machines (gpu 'NVIDIA H200' vs 'AMD Instinct MI355X')" in usage_error(capsys, b, h)
    assert main(["gate", b, h, "--allow-cross-machine"]) == 0 and "GATE PASSED" in capsys.readouterr().out
    h = write(tmp_path, "h.json", [rec(latency_s=1e-3)], env={"vendor": "cpu"})
    assert "different machines" in usage_error(capsys, b, h)


def test_an_asv_value_that_is_not_a_number_is_refused(tmp_path, capsys):
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"commit_hash": "a" * 40, "env_name": "e", "version": 2, "params": {}, "results": {
        "bench_mla_prefill.MLAPrefill.track_latency": [["fast"], [["'fa3-fp8'"], ["'s512'"]], "v1"]},
        "result_columns": ["result", "params", "version"]}))
    assert "holds a value that is not a number ('fast'" in usage_error(capsys, str(f), str(f))


def test_a_run_json_zero_equals_the_asv_floor(tmp_path, capsys):
    """asv stores an exact 0 error as 1e-12; a run JSON's 0 against it is no growth, and its 0.001 is a
    regression from 0."""
    lines = []
    for value in (0.0, 0.001):
        asv = tmp_path / "a.json"
        asv.write_text(json.dumps({"commit_hash": "a" * 40, "env_name": "e", "version": 2, "params": {"gpu": "H200"},
                                   "result_columns": ["result", "params", "version"], "results": {
                                       "bench_mla_prefill.MLAPrefill.track_max_abs_error": [
                                           [1e-12], [["'fa3-fp8'"], ["'s512'"]], "v1"]}}))
        h = write(tmp_path, "h.json", [rec(max_abs_error_fp8_ref=value)])
        lines.append((main(["gate", str(asv), h, "--all"]), capsys.readouterr().out.splitlines()))
    assert lines[0][0] == 0 and any(x.startswith("ok ") and " 0 " in x for x in lines[0][1])
    assert lines[1][0] == 1 and any(x.startswith("REGRESSION") and "0 -> 0.001" in x for x in lines[1][1])


def test_markdown_lists_at_most_fifty_rows(tmp_path, capsys):
    b = write(tmp_path, "b.json", [rec(case=f"s{n}", latency_s=1e-3) for n in range(128, 128 + 60)])
    h = write(tmp_path, "h.json", [rec(case=f"s{n}", latency_s=2e-3) for n in range(128, 128 + 60)])
    assert main(["gate", b, h, "--format", "markdown"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n| REGRESSION |") == 50 and "... and 10 more (the text report lists every row)" in out
