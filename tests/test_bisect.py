"""``mla-fp8-bench bisect`` pieces: usage errors, probe selection, reading one stored value.

The end-to-end proof (a fake AITER history, the shipped config and benchmark classes, ``asv run``,
``asv publish``, ``asv find`` and this command naming both faulty commits) is tests/test_history_e2e.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from mla_fp8_bench.analysis.bisect import BisectUsageError, probe_selection, read_value


@pytest.fixture(autouse=True)
def _tmp_home(tmp_path, monkeypatch):
    """asv writes machine entries into ~/.asv-machine.json: every test here gets a temporary HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


def _git(cwd, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    _git(lib, "init", "-q", "-b", "main")
    shas = []
    for i in range(2):
        (lib / "f.txt").write_text(str(i))
        _git(lib, "add", "-A")
        _git(lib, "commit", "-q", "-m", f"c{i}")
        shas.append(_git(lib, "rev-parse", "HEAD"))
    return lib, shas


def test_bisect_command_usage_errors(repo, tmp_path, capsys):
    from mla_fp8_bench.cli import main

    lib, shas = repo
    base = ["bisect", "--repo", str(lib), "--metric", "track_latency", "--threshold", "1", "--benchmark", "x"]
    assert main([*base, "--good", shas[-1], "--bad", shas[0], "--config", str(lib / "f.txt")]) == 2
    assert "not an ancestor" in capsys.readouterr().out
    assert main([*base, "--good", "deadbeef", "--bad", shas[0]]) == 2
    assert "deadbeef" in _out(capsys)
    assert main([*base, "--good", shas[0], "--bad", shas[-1], "--config", str(tmp_path / "nope.json")]) == 2
    assert "nope.json does not exist" in _out(capsys)
    assert main(["bisect", "--repo", str(tmp_path), "--metric", "track_latency", "--threshold", "1",
                 "--benchmark", "x", "--good", "a", "--bad", "b"]) == 2
    assert "is not a git repository" in _out(capsys)


def _out(capsys) -> str:
    """Captured stdout with the console's line wrapping undone."""
    return " ".join(capsys.readouterr().out.split()).replace("/ ", "/")


def test_probe_selection_measures_only_the_selected_params():
    one = probe_selection(r"MLAPrefill\.track_max_abs_error\('aiter', 's512'\)")
    assert one == {"MLA_FP8_BENCH_BACKENDS": "aiter", "MLA_FP8_BENCH_CASES": "s512"}
    two = probe_selection(r"MLAPrefill\.track_latency\('aiter-emulated', 's(128|256)'\)")
    assert two == {"MLA_FP8_BENCH_BACKENDS": "aiter-emulated", "MLA_FP8_BENCH_CASES": "s128,s256"}
    assert probe_selection("MLAPrefill.track_latency") == {}  # the whole grid: no restriction
    assert probe_selection("FakeBench.track_x") == {}  # another suite: nothing to restrict


def _result_file(tmp_path, sha: str, values: list) -> str:
    """A minimal asv 0.6 result file (api version 2) for MLAPrefill.track_max_abs_error over 2 x 2 params."""
    mdir = tmp_path / "results" / "m"
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / "machine.json").write_text(json.dumps({"version": 1, "machine": "m"}))
    doc = {"version": 2, "commit_hash": sha, "env_name": "existing-py_x", "date": 1, "params": {},
           "python": "3.11", "requirements": {}, "env_vars": {},
           "result_columns": ["result", "params", "version", "started_at", "duration"],
           "results": {"bench_mla_prefill.MLAPrefill.track_max_abs_error": [
               values, [["'aiter'", "'aiter-emulated'"], ["'s128'", "'s512'"]], "v1", 1, 1.0]},
           "durations": {}}
    (mdir / f"{sha[:8]}-existing-py_x.json").write_text(json.dumps(doc))  # NaN as asv writes it
    return str(tmp_path / "results")


def test_read_value_selects_one_combination(tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    rd = _result_file(tmp_path, sha, [0.04, None, float("nan"), 1.5])
    name, value, status = read_value(rd, "m", sha, r"track_max_abs_error\('aiter', 's128'\)")
    assert (name, value, status) == ("bench_mla_prefill.MLAPrefill.track_max_abs_error('aiter', 's128')", 0.04, "ok")
    assert read_value(rd, "m", sha, r"\('aiter', 's512'\)")[1:] == (None, "failed")
    assert read_value(rd, "m", sha, r"\('aiter-emulated', 's128'\)")[1:] == (None, "skipped")
    v = read_value(rd, "m", sha, r"\('aiter-emulated', 's512'\)")[1]
    assert math.isclose(v, 1.5)
    with pytest.raises(BisectUsageError, match="selects 2 benchmark combinations"):
        read_value(rd, "m", sha, r"\('aiter', ")
    assert read_value(rd, "m", "fedcba98" + sha[8:], "x") == ("", None, "missing")


def test_refused_ends_leave_no_probe_log_or_worktree(repo, tmp_path, monkeypatch):
    """When the ends do not measure good and bad, the bisection is refused and leaves nothing behind."""
    import tempfile

    from mla_fp8_bench.analysis import bisect as B

    lib, (good, bad) = repo
    conf = tmp_path / "asv.conf.json"
    conf.write_text(json.dumps({"version": 1, "repo": str(lib)}))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def both_good(wt, sha, step_cmd, env):
        log = step_cmd[step_cmd.index("--log") + 1]
        with open(log, "a") as f:
            f.write(json.dumps({"sha": sha, "verdict": "good", "value": 1.0, "name": "x"}) + "\n")
        return B.EXIT_GOOD

    monkeypatch.setattr(B, "measure_end", both_good)
    with pytest.raises(BisectUsageError, match=r"--bad \w+ measures good \(x = 1\)"):
        B.run_bisect(repo=str(lib), good=good, bad=bad, benchmark="fa3-fp8", metric="track_latency",
                     threshold=2.0, config=str(conf), python="python3", echo=lambda *a: None)
    assert list(scratch.iterdir()) == []
