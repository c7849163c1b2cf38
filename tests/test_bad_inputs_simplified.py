"""Hostile inputs the simplified library must still refuse with one line (or judge as INVALID): integers
beyond the float range in stored files, non-numbers among latency samples, tolerance files that are not
text or nest too deep, and numbers beyond what a run can hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main

REPO = Path(__file__).resolve().parent.parent
ASV_FILE = REPO / "results" / "cpu-2core" / "37625ef1-virtualenv-py3.11-torch2.13.0.json"
#: Valid JSON whose value no float holds (float(HUGE) raises OverflowError).
HUGE = 10 ** 400
ACC = {"max_abs_error_fp8_ref": 0.0077, "mean_abs_error_fp8_ref": 0.0004, "rel_l2_error_fp8_ref": 0.0016,
       "max_abs_error_bf16_ref": 0.19, "mean_abs_error_bf16_ref": 0.01, "rel_l2_error_bf16_ref": 0.038,
       "mismatch_fraction": 0.001, "nonfinite_count_fp8_ref": 0}
CPU_ENV = {"vendor": "cpu", "device": "cpu", "device_name": "x86_64", "arch": "cpu"}


def _run_json(path: Path, **changes) -> str:
    rec = {"backend": "torch-fp8-ref", "case": "s64", "status": "ok", "reason": "", **ACC, **changes}
    path.write_text(json.dumps({"env": CPU_ENV, "records": [rec]}))
    return str(path)


def _no_traceback(capsys) -> str:
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    return " ".join((cap.out + cap.err).split())


def test_gate_refuses_an_integer_beyond_the_float_range(tmp_path, capsys):
    """A run JSON value of 400 digits is valid JSON but no float: one line naming it (exit 2), not an
    OverflowError."""
    base = _run_json(tmp_path / "b.json")
    head = _run_json(tmp_path / "h.json", max_abs_error_fp8_ref=HUGE)
    assert main(["gate", base, head]) == 2
    out = _no_traceback(capsys)
    assert "(torch-fp8-ref, s64): max_abs_error_fp8_ref = 1000" in out and "is not a number" in out
    assert "0" * 60 not in out  # the value is shown shortened


def test_gate_refuses_non_numbers_among_latency_samples(tmp_path, capsys):
    """Samples holding a string: one line naming the value, not 'could not convert string'."""
    base = _run_json(tmp_path / "b.json", latency_s=1e-3, latency_samples_s=[1e-3, 1.1e-3])
    head = _run_json(tmp_path / "h.json", latency_s=1e-3, latency_samples_s=[1e-3, "fast", 1.2e-3])
    assert main(["gate", base, head]) == 2
    assert "latency_samples_s = 'fast' is not a number" in _no_traceback(capsys)


@pytest.mark.parametrize("where", ["value", "date", "started_at"])
def test_asv_result_with_an_integer_beyond_the_float_range(tmp_path, capsys, where):
    """An asv result file with a 400-digit integer (a value, the commit date, a started_at): gate gives
    one line or skips it; merge-results takes the file without an OverflowError."""
    data = json.loads(ASV_FILE.read_text())
    name = next(k for k in data["results"] if k.endswith("MLAPrefill.track_max_abs_error"))
    if where == "value":
        data["results"][name][0][0] = HUGE
    elif where == "date":
        data["date"] = HUGE
    else:
        data["results"][name][3] = HUGE
    src = tmp_path / "src"
    (src / "cpu-2core").mkdir(parents=True)
    shutil.copy(REPO / "results" / "cpu-2core" / "machine.json", src / "cpu-2core")
    shutil.copy(REPO / "results" / "benchmarks.json", src)
    bad = src / "cpu-2core" / ASV_FILE.name
    bad.write_text(json.dumps(data))
    rc = main(["gate", str(ASV_FILE), str(bad)])
    out = _no_traceback(capsys)
    if where == "value":
        assert rc == 2 and "holds a value that is not a number (1000" in out
    else:
        assert rc in (0, 1)
    assert main(["merge-results", str(src), "--into", str(tmp_path / "into")]) in (0, 2)
    _no_traceback(capsys)


@pytest.mark.parametrize("content, want", [
    (b"\xff\xfe{}", "is not text (byte 0 is not UTF-8)"),
    (b"[" * 100_000 + b"]" * 100_000, "cannot be read as JSON (RecursionError"),
])
def test_tolerance_file_not_text_or_too_deep(tmp_path, capsys, content, want):
    """--tolerances naming a binary file or one nested 100000 deep: one line naming the file (exit 2),
    not a bare 'utf-8 codec' message or a RecursionError traceback."""
    tol = tmp_path / "tol.json"
    tol.write_bytes(content)
    base = _run_json(tmp_path / "b.json")
    assert main(["gate", base, base, "--tolerances", str(tol)]) == 2
    out = _no_traceback(capsys)
    assert f"tolerance file {tol}: {want}" in out


def test_tolerance_margin_beyond_the_float_range(tmp_path, capsys):
    """A tolerance file whose margin is a 400-digit integer: refused naming the key, shortened."""
    doc = json.loads((REPO / "tolerances" / "cpu-emulated-v1.json").read_text())
    tol = tmp_path / "tol.json"
    tol.write_text(json.dumps(doc).replace(f'"margin": {json.dumps(doc["margin"])}', f'"margin": {HUGE}', 1))
    base = _run_json(tmp_path / "b.json")
    assert main(["gate", base, base, "--tolerances", str(tol)]) == 2
    out = _no_traceback(capsys)
    assert f"tolerance file {tol}: margin is 1000" in out and "must be a finite number >= 0" in out
    assert "0" * 60 not in out


# ------------------------------------------------------------------ numbers beyond what a run can hold
@pytest.mark.parametrize("flag, value", [("--seeds", "\u0665"), ("--validate-seeds", "\u00b2")])
def test_calibrate_seed_counts_are_ascii_digits(tmp_path, capsys, flag, value):
    """Counts ``int()`` would read ('\u0665' is 5, '\u00b2' is 2) are refused by argparse: exit 2, one line."""
    out = tmp_path / "tol.json"
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--out", str(out), "--no-probes", "-b", "torch-fp8-ref", "-c", "s64", flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}: {value!r} is not an integer: written in ASCII digits 0-9" in _no_traceback(capsys)
    assert not out.exists()


@pytest.mark.parametrize("flag, value, want", [
    ("--seeds", "99999999999", "--seeds 99999999999 is too many: at most 1000"),
    ("--seeds", "1001", "--seeds 1001 is too many: at most 1000 (the held-out seeds start at 1000)"),
    ("--validate-seeds", "-1", "--validate-seeds -1 is invalid: an integer from 0 (skip) to 100000"),
    ("--validate-seeds", "99999999999", "--validate-seeds 99999999999 is invalid"),
    ("--backends", "fa3-fp8", "backend 'fa3-fp8' cannot be calibrated on this CPU (needs an NVIDIA"),
    ("--backends", "torch-fp8-ref,cudnn-fp8", "backend 'cudnn-fp8' cannot be calibrated on this CPU"),
])
def test_calibrate_refuses_before_measuring(tmp_path, capsys, flag, value, want):
    """calibrate with a seed count that would exhaust memory, calibration seeds that reach the held-out
    ones, a negative held-out count, or a backend this CPU cannot run: one
    line, exit 2, nothing written."""
    out = tmp_path / "tol.json"
    args = ["calibrate", "--out", str(out), "--no-probes", "-b", "torch-fp8-ref", "-c", "s64", flag, value]
    assert main(args) == 2
    assert want in _no_traceback(capsys)
    assert not out.exists()


def test_emulated_cu_count_is_bounded_everywhere(tmp_path, capsys):
    """MLA_FP8_BENCH_EMU_CU_NUM and calibrate --cu-num take the plan command's bound (65536) instead of
    letting every aiter-emulated case fail allocating per-CU lists (10**12 CUs: 4 TB)."""
    from mla_fp8_bench.config import PREFIX, RunConfig

    with pytest.raises(ValueError, match=r"EMU_CU_NUM='1000000000000' is invalid: an integer from 1 to 65536"):
        RunConfig.from_env({PREFIX + "EMU_CU_NUM": "1000000000000"})
    assert RunConfig.from_env({PREFIX + "EMU_CU_NUM": "65536"}).emu_cu_num == 65536
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--out", str(tmp_path / "t.json"), "--cu-num", "1000000000000"])
    assert exc.value.code == 2 and "'1000000000000' is out of range: allowed 1..65536" in capsys.readouterr().err
    assert main(["plan", "--qo-lens", "64", "--kv-lens", "64", "--heads", "16", "--cu-num", "65537"]) == 2
    assert "--cu-num=65537 is out of range: allowed 1..65536" in _no_traceback(capsys)


def test_ab_that_measured_nothing_keeps_the_stored_summary(tmp_path, capsys, monkeypatch):
    """ab whose rounds measured nothing on both sides (fa3-fp8 on a CPU, past a side probe that would refuse
    it) keeps a stored --summary as it keeps a stored --json, not replaced by a 'nothing compared' one;
    its own documents go beside them."""
    from mla_fp8_bench.analysis import ab

    monkeypatch.setattr(ab, "probe_side", lambda *a, **k: None)
    base, head = tmp_path / "base", tmp_path / "head"
    base.mkdir()
    head.mkdir()
    js, md = tmp_path / "ab.json", tmp_path / "ab.md"
    js.write_text('{"stored": true}')
    md.write_text("## stored verdict\n")
    rc = main(["ab", str(base), str(head), "-b", "fa3-fp8", "-c", "s64", "--rounds", "2", "--device", "cpu",
               "--json", str(js), "--summary", str(md)])
    assert rc == 1
    out = _no_traceback(capsys)
    assert js.read_text() == '{"stored": true}' and md.read_text() == "## stored verdict\n"
    assert (tmp_path / "ab.failed.json").is_file() and (tmp_path / "ab.failed.md").is_file()
    assert f"{md} kept, this run's document goes to {tmp_path / 'ab.failed.md'}" in out


@pytest.mark.parametrize("flag", ["--json", "--summary"])
def test_ab_output_that_is_a_directory_names_the_flag(tmp_path, capsys, flag):
    """ab --json / --summary naming a directory: the one line names the flag (it said 'output file')."""
    (tmp_path / "base").mkdir()
    assert main(["ab", str(tmp_path / "base"), str(tmp_path), "-b", "torch-fp8-ref", "-c", "s64", "--rounds", "2",
                 "--device", "cpu", flag, str(tmp_path)]) == 2
    assert f"{flag} {tmp_path} is a directory" in _no_traceback(capsys)


# ------------------------------------------------------------------ merge-results into a source
@pytest.mark.parametrize("into, want", [
    ("src/cpu-2core", "is not a results directory (a file, a broken link, a machine's folder)"),
    ("src/merged", "is a source or lies inside one"),
])
def test_merge_refuses_a_destination_inside_a_source(tmp_path, capsys, into, want):
    """merge-results into a machine's directory of the source (it wrote cpu-2core/, h200/ and a
    benchmarks.json beside that machine's result files) or into a folder inside the source: one line,
    exit 2, the source unchanged."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "results", src)
    before = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    assert main(["merge-results", str(src), "--into", str(tmp_path / into)]) == 2
    assert want in _no_traceback(capsys)
    assert sorted(str(p.relative_to(src)) for p in src.rglob("*")) == before


# ------------------------------------------------------------------ a reason with newlines in a report
def test_gate_reports_keep_a_multi_line_reason_on_one_line(tmp_path, capsys):
    """A failure whose reason holds newlines (torch errors do) and a code fence: the markdown table row
    (a PR comment) and the grep-able text line stay one line each; before, the row broke the table and
    the fence swallowed the rest of the comment."""
    base = _run_json(tmp_path / "b.json")
    head = _run_json(tmp_path / "h.json", status="error", reason="RuntimeError: boom\nsecond line | pipe\n```")
    assert main(["gate", base, head, "--format", "markdown"]) == 1
    md = capsys.readouterr().out
    rows = [line for line in md.splitlines() if line.startswith("| FAILED |")]
    assert rows and all(line.endswith("second line \\| pipe ``` |") for line in rows)
    assert not any(line.startswith(("second line", "```")) for line in md.splitlines())
    assert main(["gate", base, head]) == 1
    text = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAILED ")]
    assert text and all(line.endswith("RuntimeError: boom second line | pipe ```") for line in text)


# ------------------------------------------------------------------ interrupted runs beside a kept file
def test_an_interrupted_run_replaces_no_stored_file(tmp_path):
    """r.json holds 3 records and r.interrupted.json an earlier interrupted run's 2: an interrupted run, of
    however many records, goes to the first name beside them that holds nothing."""
    from mla_fp8_bench.harness.run_command import output_path

    def doc(n: int) -> dict:
        return {"env": {}, "records": [{"backend": "torch-fp8-ref", "case": f"s{16 * (i + 1)}"} for i in range(n)]}

    out = tmp_path / "r.json"
    out.write_text(json.dumps(doc(3)))
    assert output_path(str(out), doc(4), interrupted=True)[0] == str(tmp_path / "r.interrupted.json")
    (tmp_path / "r.interrupted.json").write_text(json.dumps(doc(2)))
    assert output_path(str(out), doc(2), interrupted=True)[0] == str(tmp_path / "r.interrupted-2.json")
    (tmp_path / "r.interrupted-2.json").write_text("")
    assert output_path(str(out), doc(1), interrupted=True)[0] == str(tmp_path / "r.interrupted-2.json")
    assert output_path(str(out), doc(4)) == (str(out), None)  # a completed run of more replaces it


def test_calibrate_refuses_more_jobs_than_cpus_and_an_empty_out(capsys, monkeypatch):
    import os

    from mla_fp8_bench.cli import main

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--jobs", "3"])
    assert exc.value.code == 2 and "'3' is out of range: allowed 1..2" in capsys.readouterr().err
    assert main(["calibrate", "--out", ""]) == 2
    assert "--out '' is empty" in capsys.readouterr().out


def test_a_number_beyond_the_float_range_is_not_finite_anywhere():
    from mla_fp8_bench.jsonio import finite_number

    huge = int("1" + "0" * 400)
    assert finite_number(huge) is None and finite_number(2.5) == 2.5 and finite_number(float("inf")) is None


# ------------------------------------------------------------------ rounds that judge nothing
GPU_ENV = {"vendor": "nvidia", "device": "cuda:0", "device_name": "NVIDIA H200", "arch": "sm_90"}


def _gpu_json(path: Path, rounds: list) -> str:
    rec = {"backend": "fa3-fp8", "case": "s1024", "status": "ok", "reason": "", "timing_scope": "kernel",
           "latency_s": 1e-4, "latency_rounds_s": rounds}
    path.write_text(json.dumps({"env": GPU_ENV, "records": [rec]}))
    return str(path)


@pytest.mark.parametrize("bad, shown", [(float("inf"), "inf"), (-1e-4, "-0.0001"), (0.0, "0")])
def test_gate_judges_a_round_that_is_no_latency_invalid(tmp_path, capsys, bad, shown):
    """A stored round of inf, a negative or zero seconds is no latency: INVALID naming it (an inf round made
    the spread, and so the threshold, infinite and passed a 5x slower HEAD)."""
    base = _gpu_json(tmp_path / "b.json", [bad, 1e-4, 1e-4])
    head = _gpu_json(tmp_path / "h.json", [5e-4] * 3)
    assert main(["gate", base, head]) == 1
    out = _no_traceback(capsys)
    assert "INVALID fa3-fp8 s1024 latency_s" in out and f"impossible value {shown} on BASE" in out


def test_a_stalled_round_does_not_hide_a_5x_slower_head(tmp_path, capsys):
    """One stalled round (10x the others) falls out of BASE's fastest mode: a 5x slower HEAD regresses."""
    base = _gpu_json(tmp_path / "b.json", [1e-4, 1e-4, 1e-3])
    head = _gpu_json(tmp_path / "h.json", [5e-4] * 3)
    assert main(["gate", base, head]) == 1
    out = _no_traceback(capsys)
    assert "REGRESSION fa3-fp8 s1024 latency_s 100 us (3) 500 us (3) 5.000x" in out


def test_the_latency_ratio_near_the_float_limit():
    """Means of rounds near 1e308 are taken relative to the fastest round: no overflow to a NaN ratio (which
    read as ok)."""
    from mla_fp8_bench.analysis.stats import latency_ratio

    ratio, thr, _se = latency_ratio([1e308] * 3, [1.7e308] * 3, 1.02, 3.0)
    assert ratio == pytest.approx(1.7) and ratio > thr


def test_merge_refuses_a_symlink_loop(tmp_path, capsys):
    """A source or destination that is a symlink loop: one line, exit 2."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert main(["merge-results", str(tmp_path / "a"), "--into", str(tmp_path / "m")]) == 2
    assert "is not an asv results directory" in _no_traceback(capsys)
    assert main(["merge-results", str(REPO / "results"), "--into", str(tmp_path / "a"), "--dry-run"]) == 2
    assert "is not a results directory" in _no_traceback(capsys)
