"""Bad-input catalogue, sections K to P (docs/robustness.md): the ``run``, ``asv-machine`` and
``calibrate`` command lines, run options and environment variables, case-id sizes, interrupts,
non-finite results and the asv commit guard. Each test names the hostile input it feeds; each checks
that the input is refused before any work with a message naming it, or that no result is lost.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest
import torch

from mla_fp8_bench.cli import main
from mla_fp8_bench.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
ENV_VARS = ("MLA_FP8_BENCH_SAMPLES", "MLA_FP8_BENCH_TIME_BUDGET", "MLA_FP8_BENCH_MAX_TOKENS",
            "MLA_FP8_BENCH_BACKENDS", "MLA_FP8_BENCH_CASES", "MLA_FP8_BENCH_EXPECT_COMMIT")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """A tmp HOME (asv machine file) and none of the suite's variables leaking in from outside."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("COLUMNS", "500")  # rich wraps long paths at 80 columns otherwise
    for v in ENV_VARS:
        monkeypatch.delenv(v, raising=False)
    return home


def _out(capsys) -> str:
    c = capsys.readouterr()
    return " ".join((c.out + c.err).split())


@pytest.fixture
def no_measuring(monkeypatch):
    """Fail the test if anything is measured (the refusals must come first)."""
    import mla_fp8_bench.harness.runner as runner

    def boom(*a, **k):
        raise AssertionError("measuring started before the bad input was refused")

    monkeypatch.setattr(runner, "evaluate", boom)
    monkeypatch.setattr(runner, "make_inputs", boom)


def _run(*args: str) -> int:
    return main(["--device", "cpu", "run", "--no-timing", *args])


# ============================================================================ K. run: output path (row 3)
@pytest.mark.parametrize("target,needle", [
    ("{tmp}", "is a directory: give a file path inside it"),
    ("{tmp}/afile/x.json", "lies under {tmp}/afile, which is a file, not a directory"),
    ("{tmp}/afile/deeper/x.json", "lies under {tmp}/afile, which is a file, not a directory"),
    ("/proc/mla-fp8-bench-test/x.json", "cannot be written"),  # not writable even as root
    ("", "--json path '' is empty"),
    ("   ", "is empty"),
])
def test_run_json_path_is_checked_before_measuring(tmp_path, capsys, no_measuring, target, needle):
    (tmp_path / "afile").write_text("keep me\n")
    target, needle = target.format(tmp=tmp_path), needle.format(tmp=tmp_path)
    assert _run("-b", "torch-fp8-ref", "-c", "s16-h2", "--json", target) == 2
    out = _out(capsys)
    assert needle in out and "Traceback" not in out
    assert (tmp_path / "afile").read_text() == "keep me\n"


def test_run_json_to_a_special_file_is_refused(tmp_path, capsys, no_measuring):
    fifo = tmp_path / "fifo"  # like /dev/null: an atomic rename would replace it with a regular file
    os.mkfifo(fifo)
    assert _run("-b", "torch-fp8-ref", "-c", "s16-h2", "--json", str(fifo)) == 2
    assert "exists and is not a regular file" in _out(capsys)
    assert not fifo.is_file() and fifo.exists()


def test_run_json_creates_missing_directories_and_writes_after_measuring(tmp_path):
    out = tmp_path / "new" / "dir" / "r.json"
    assert _run("-b", "torch-fp8-ref", "-c", "s16-h2", "--json", str(out)) == 0
    recs = json.loads(out.read_text())["records"]
    assert [(r["backend"], r["case"], r["status"]) for r in recs] == [("torch-fp8-ref", "s16-h2", "ok")]
    assert not list(out.parent.glob("*.probe")) and not list(out.parent.glob("*.tmp"))


# ============================================================================ L. numbers and lists (rows 9, 17)
@pytest.mark.parametrize("option,value,needle", [
    ("--samples", "0", "argument --samples: '0' is invalid: must be >= 1"),
    ("--samples", "-3", "argument --samples: '-3' is invalid: must be >= 1"),
    ("--samples", "many", "argument --samples: 'many' is not an integer: must be an integer >= 1"),
    ("--samples", "2.5", "argument --samples: '2.5' is not an integer"),
    ("--time-budget", "0", "argument --time-budget: '0' is invalid: must be > 0"),
    ("--time-budget", "-1", "argument --time-budget: '-1' is invalid: must be > 0"),
    ("--time-budget", "nan", "argument --time-budget: 'nan' is invalid: a finite number is needed"),
    ("--time-budget", "inf", "argument --time-budget: 'inf' is invalid: a finite number is needed"),
    ("--time-budget", "abc", "argument --time-budget: 'abc' is not a number"),
    ("--max-seq-len", "0", "argument --max-seq-len: '0' is invalid: must be >= 1"),
    ("--max-seq-len", "-128", "argument --max-seq-len: '-128' is invalid: must be >= 1"),
    ("--samples", "\u0665", "argument --samples: '\u0665' is not an integer: must be an integer >= 1, written in "
                         "ASCII digits 0-9"),
    ("--samples", "++5", "argument --samples: '++5' is not an integer"),
    ("--samples", "+5", "argument --samples: '+5' is not an integer"),
    ("--max-seq-len", "\u00b2", "argument --max-seq-len: '\u00b2' is not an integer"),
    ("--max-seq-len", "1_024", "argument --max-seq-len: '1_024' is not an integer"),
])
def test_run_refuses_bad_numbers_up_front(capsys, no_measuring, option, value, needle):
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "run", "-b", "torch-fp8-ref", "-c", "s16-h2", f"{option}={value}"])
    assert exc.value.code == 2
    assert needle in _out(capsys)


@pytest.mark.parametrize("text", ["++5", "+5", "\u00b2", "\u0665", "5x", "1_000", "", " ", "5 5", "\u20035"])
def test_read_int_takes_ascii_digits_only(text):
    from mla_fp8_bench.argtypes import parse_int, read_int

    assert read_int(text) is None
    with pytest.raises(ValueError) as exc:
        parse_int(text, "--n", 0, 9)
    msg = str(exc.value)
    assert len(msg.splitlines()) == 1 and msg.startswith(f"--n={text!r} is not an integer: allowed 0..9, written")


@pytest.mark.parametrize("text,value", [("5", 5), (" 512 ", 512), ("\t0\n", 0), ("007", 7), ("-3", -3)])
def test_read_int_reads_what_it_did_before(text, value):
    from mla_fp8_bench.argtypes import read_int

    assert read_int(text) == value


@pytest.mark.parametrize("text,needle", [
    ("5,,6", "--l='5,,6' is not a comma-separated list of integers: --l[1] is empty; --l takes a comma-separated "
             "list of integers >= 0 written in ASCII digits 0-9, e.g. 512,1024"),
    ("", "--l='' is not a comma-separated list of integers: it is empty; --l takes"),
    ("5,", "--l='5,' is not a comma-separated list of integers: --l[1] is empty"),
    ("++5", "--l[0]='++5' is not an integer: --l takes a comma-separated list of integers >= 0"),
    ("1,\u00b2", "--l[1]='\u00b2' is not an integer: --l takes"),
    ("\u0665", "--l[0]='\u0665' is not an integer: --l takes"),
    ("5x", "--l[0]='5x' is not an integer: --l takes"),
    ("1,2,3,4", "--l has 4 items: allowed 1..3"),
    ("1,-1", "--l[1]=-1 is out of range: allowed 0..100"),
    ("1,101", "--l[1]=101 is out of range: allowed 0..100"),
    ("9" * 5000, "--l[0]='99999999999999999999999999999999999999999999999999999999999... (5000 characters) is not an "
                 "integer"),
])
def test_int_lists_name_the_bad_item_in_one_line(text, needle):
    from mla_fp8_bench.argtypes import parse_int_list

    with pytest.raises(ValueError) as exc:
        parse_int_list(text, "--l", 0, 100, 3)
    assert str(exc.value).startswith(needle) and len(str(exc.value).splitlines()) == 1, str(exc.value)


def test_int_lists_keep_the_forms_accepted_before():
    from mla_fp8_bench.argtypes import parse_int_list

    assert parse_int_list("512,1024", "--l", 0, 2048, 3) == (512, 1024)
    assert parse_int_list(" 512 , 1024 ", "--l", 0, 2048, 3) == (512, 1024)
    assert parse_int_list("0", "--l", 0, 2048, 3) == (0,)


@pytest.mark.parametrize("var,value,needle", [
    ("SAMPLES", "\u0665", "MLA_FP8_BENCH_SAMPLES='\u0665' is not an integer: must be an integer >= 1, written in "
                         "ASCII digits 0-9"),
    ("SAMPLES", "++5", "MLA_FP8_BENCH_SAMPLES='++5' is not an integer"),
    ("MAX_TOKENS", "\u00b2", "MLA_FP8_BENCH_MAX_TOKENS='\u00b2' is not an integer"),
    ("MAX_TOKENS", "1_024", "MLA_FP8_BENCH_MAX_TOKENS='1_024' is not an integer"),
    ("EMU_CU_NUM", "\u0662\u0665\u0666", "MLA_FP8_BENCH_EMU_CU_NUM='\u0662\u0665\u0666' is invalid: an integer from 1"),
])
def test_env_integers_take_ascii_digits_only(var, value, needle):
    with pytest.raises(ValueError) as exc:
        RunConfig.from_env({"MLA_FP8_BENCH_" + var: value})
    assert str(exc.value).startswith(needle) and len(str(exc.value).splitlines()) == 1, str(exc.value)


def test_env_integers_keep_the_forms_accepted_before():
    cfg = RunConfig.from_env({"MLA_FP8_BENCH_SAMPLES": " 30 ", "MLA_FP8_BENCH_MAX_TOKENS": "512",
                              "MLA_FP8_BENCH_EMU_CU_NUM": "", "MLA_FP8_BENCH_ROUNDS": "3"})
    assert (cfg.samples, cfg.max_tokens, cfg.emu_cu_num, cfg.rounds) == (30, 512, 256, 3)


def test_max_seq_len_below_the_sweep_runs_nothing_is_refused(capsys, no_measuring):
    assert _run("-b", "torch-fp8-ref", "--max-seq-len", "64") == 2
    assert "--max-seq-len 64 leaves no case of the default sweep: allowed >= 128" in _out(capsys)


@pytest.mark.parametrize("option,value", [("-b", ",,,"), ("-b", " , "), ("-c", ",,,"), ("-c", "")])
def test_empty_name_lists_are_refused_not_defaulted(capsys, no_measuring, option, value):
    other = ["-c", "s16-h2"] if option == "-b" else ["-b", "torch-fp8-ref"]
    assert _run(option, value, *other) == 2
    long = {"-b": "--backends", "-c": "--cases"}[option]
    assert f"{long} {value!r} names nothing" in _out(capsys)


@pytest.mark.parametrize("args", [
    ("-b", "torch-fp8-ref,torch-fp8-ref", "-c", "s16-h2"),
    ("-b", "torch-fp8-ref", "-b", "torch-fp8-ref", "-c", "s16-h2,s16-h2"),
    ("-b", "torch-fp8-ref", "-c", "s16-h2", "-c", "s16-h2"),
])
def test_duplicated_backends_and_cases_give_one_record_each(tmp_path, args):
    out = tmp_path / "r.json"
    assert _run(*args, "--json", str(out)) == 0
    recs = json.loads(out.read_text())["records"]
    assert [(r["backend"], r["case"]) for r in recs] == [("torch-fp8-ref", "s16-h2")]


def test_library_evaluate_measures_duplicates_once():
    from mla_fp8_bench.harness.runner import RunOptions, evaluate
    from mla_fp8_bench.problem.cases import resolve_cases

    cases = resolve_cases(["s16-h2"]) * 2
    data = evaluate(["torch-fp8-ref", "torch-fp8-ref"], cases, device="cpu",
                    options=RunOptions(timing=False, determinism=False))
    assert len(data["records"]) == 1


@pytest.mark.parametrize("kw,needle", [
    ({"samples": 0}, "samples=0 is invalid: an integer >= 1"),
    ({"samples": -1}, "samples=-1 is invalid"),
    ({"samples": True}, "samples=True is invalid"),
    ({"samples": 2.5}, "samples=2.5 is invalid"),
    ({"time_budget_s": 0.0}, "time_budget_s=0.0 is invalid: a finite number of seconds > 0"),
    ({"time_budget_s": float("nan")}, "time_budget_s=nan is invalid"),
    ({"time_budget_s": float("inf")}, "time_budget_s=inf is invalid"),
    ({"time_budget_s": "10"}, "time_budget_s='10' is invalid"),
])
def test_run_options_refuse_values_that_would_fail_every_record(kw, needle):
    from mla_fp8_bench.harness.runner import RunOptions

    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        RunOptions(**kw)


@pytest.mark.parametrize("var,value,needle", [
    ("MLA_FP8_BENCH_SAMPLES", "-1", "MLA_FP8_BENCH_SAMPLES='-1' is invalid: must be >= 1"),
    ("MLA_FP8_BENCH_SAMPLES", "0", "MLA_FP8_BENCH_SAMPLES='0' is invalid: must be >= 1"),
    ("MLA_FP8_BENCH_SAMPLES", "1e3", "MLA_FP8_BENCH_SAMPLES='1e3' is not an integer: must be an integer >= 1"),
    ("MLA_FP8_BENCH_TIME_BUDGET", "abc", "MLA_FP8_BENCH_TIME_BUDGET='abc' is not a number: must be a number > 0"),
    ("MLA_FP8_BENCH_TIME_BUDGET", "0", "MLA_FP8_BENCH_TIME_BUDGET='0' is invalid: must be > 0"),
    ("MLA_FP8_BENCH_TIME_BUDGET", "-5", "MLA_FP8_BENCH_TIME_BUDGET='-5' is invalid"),
    ("MLA_FP8_BENCH_TIME_BUDGET", "nan", "MLA_FP8_BENCH_TIME_BUDGET='nan' is invalid: a finite number"),
    ("MLA_FP8_BENCH_MAX_TOKENS", "0", "MLA_FP8_BENCH_MAX_TOKENS='0' is invalid: must be >= 1"),
    ("MLA_FP8_BENCH_MAX_TOKENS", "-5", "MLA_FP8_BENCH_MAX_TOKENS='-5' is invalid"),
    ("MLA_FP8_BENCH_MAX_TOKENS", "lots", "MLA_FP8_BENCH_MAX_TOKENS='lots' is not an integer: must be an integer >= 1"),
])
def test_asv_env_vars_are_refused_naming_the_variable_before_measuring(monkeypatch, no_measuring, var, value,
                                                                        needle):
    from mla_fp8_bench.harness import asv_support

    monkeypatch.setenv("MLA_FP8_BENCH_DEVICE", "cpu")
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as exc:
        asv_support.measure_grid()
    assert needle in str(exc.value)


# ============================================================================ M. case sizes (row 8)
@pytest.mark.parametrize("spec,needle", [
    ("ragged-1x200000000", "1048576"),
    ("ragged-1x100000000000", "too large"),
    ("ragged-1x" + "1" + "0" * 22, "too large"),
    ("s" + "9" * 5000, "too large"),
    ("ragged-" + "9" * 5000, "too large"),
    ("ragged-4096x300", "1048576"),
    ("s2000000", "1048576"),
])
def test_absurd_sizes_are_refused_at_parse_time(capsys, no_measuring, spec, needle):
    from mla_fp8_bench.problem.cases import CaseError, parse_case_id

    tracemalloc.start()
    try:
        with pytest.raises(CaseError) as exc:
            parse_case_id(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert peak < 1 << 20  # refused before any list of lengths was built
    assert _run("-b", "torch-fp8-ref", "-c", spec) == 2
    assert "Traceback" not in _out(capsys)


# ============================================================================ N. interrupts (row 16)
def _interrupt_on(monkeypatch, victim: str):
    import mla_fp8_bench.harness.runner as runner

    orig = runner.evaluate_one

    def one(backend, ctx, pinfo, opts):
        if ctx.case.id == victim:
            raise KeyboardInterrupt
        return orig(backend, ctx, pinfo, opts)

    monkeypatch.setattr(runner, "evaluate_one", one)


def test_ctrl_c_in_a_multi_case_run_writes_the_completed_records_and_exits_130(tmp_path, monkeypatch, capsys):
    _interrupt_on(monkeypatch, "s48-h2")
    out = tmp_path / "r.json"
    out.write_text('{"old": true}\n')
    assert _run("-b", "torch-fp8-ref", "-c", "s16-h2,s32-h2,s48-h2,s64-h2", "--json", str(out)) == 130
    assert out.read_text() == '{"old": true}\n'  # not a run JSON: kept, the records go beside it
    data = json.loads((tmp_path / "r.interrupted.json").read_text())
    assert data["interrupted"] is True and data["planned"] == 4
    assert data["interrupted_before"] == {"backend": "torch-fp8-ref", "case": "s48-h2"}
    assert [(r["case"], r["status"]) for r in data["records"]] == [("s16-h2", "ok"), ("s32-h2", "ok")]
    assert all(0 < r["max_abs_error_fp8_ref"] < 0.05 for r in data["records"])
    assert "interrupted: 2 of 4" in _out(capsys)


def test_ctrl_c_in_the_library_raises_a_keyboard_interrupt_carrying_the_records(monkeypatch):
    from mla_fp8_bench.harness.runner import RunInterrupted, RunOptions, evaluate
    from mla_fp8_bench.problem.cases import resolve_cases

    _interrupt_on(monkeypatch, "s32-h2")
    with pytest.raises(KeyboardInterrupt) as exc:
        evaluate(["torch-fp8-ref"], resolve_cases(["s16-h2", "s32-h2"]), device="cpu",
                 options=RunOptions(timing=False, determinism=False))
    assert isinstance(exc.value, RunInterrupted)
    assert [r["case"] for r in exc.value.data["records"]] == ["s16-h2"]


# ============================================================================ O. non-finite results (row 11)
INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("backend,value", [
    ("torch-sdpa-bf16", INF), ("torch-sdpa-bf16", -INF), ("torch-sdpa-bf16", NAN),
    ("torch-fp8-ref", -INF), ("torch-fp8-ref", NAN), ("aiter-emulated", -INF), ("aiter-emulated", NAN),
])
def test_a_non_finite_result_is_an_error_record_never_a_skip(monkeypatch, value, backend, poison_inputs):
    from mla_fp8_bench.harness import asv_support
    from mla_fp8_bench.harness.runner import RunOptions, evaluate
    from mla_fp8_bench.problem.cases import resolve_cases

    poison_inputs("s32-h2-cast", value)
    data = evaluate([backend], resolve_cases(["s16-h2-cast", "s32-h2-cast"]), device="cpu",
                    options=RunOptions(timing=False, determinism=False))
    good, bad = data["records"]
    if good["status"] == "skipped":
        pytest.skip(f"{backend} cannot run here: {good['reason']}")
    assert good["status"] == "ok" and 0 < good["max_abs_error_bf16_ref"] < 0.5
    assert bad["status"] == "error" and bad["reason"].startswith("non-finite result")
    # the values stay in the record: the damage is counted, not hidden
    undefined = [k for k in ("max_abs_error_bf16_ref", "rel_l2_error_fp8_ref") if bad[k] != bad[k]]
    assert bad["nonfinite_count_fp8_ref"] > 0 or undefined
    cache = {"records": {f"{backend}|s32-h2-cast": bad}}
    with pytest.raises(RuntimeError, match="failed: non-finite result"):  # an asv failure, not a skip (n/a)
        asv_support.lookup(cache, backend, "s32-h2-cast")


def test_plus_inf_in_cast_mode_saturates_and_is_measured_not_hidden(monkeypatch, poison_inputs):
    """vLLM's cast saturates +Inf at 448 (torch >= 2.12): the output is finite; the error vs the bf16
    reference shows the damage as a large finite number."""
    from mla_fp8_bench.harness.runner import RunOptions, evaluate
    from mla_fp8_bench.problem.cases import resolve_cases
    from mla_fp8_bench.problem.fp8 import cast_saturates

    if not cast_saturates(torch.float8_e4m3fn):
        pytest.skip("this torch's fp8 cast returns NaN for out-of-range values")
    poison_inputs("s32-h2-cast", INF)
    (rec,) = evaluate(["torch-fp8-ref"], resolve_cases(["s32-h2-cast"]), device="cpu",
                      options=RunOptions(timing=False, determinism=False))["records"]
    assert rec["status"] == "ok" and rec["nonfinite_count_fp8_ref"] == 0
    assert 0 < rec["max_abs_error_fp8_ref"] < 0.05 and rec["max_abs_error_bf16_ref"] > 1.0


def test_non_finite_results_make_strict_runs_fail(monkeypatch, tmp_path, capsys, poison_inputs):
    poison_inputs("s16-h2-cast", float("inf"))
    assert _run("-b", "torch-fp8-ref", "-c", "s16-h2-cast", "--strict") == 1
    assert "1 of 1 records are errors" in _out(capsys)


# ============================================================================ P. names and files
@pytest.mark.parametrize("name,needle", [
    ("../escape", "is invalid"), ("a/b", "is invalid"), ("..", "is invalid"), (".hidden", "is invalid"),
    ("", "is invalid"), ("x" * 65, "is invalid"), ("version", "reserved by asv"), ("machine.json", "reserved"),
    ("benchmarks.json", "reserved"), ("VERSION", "reserved"), ("bad name", "is invalid"), ("/abs", "is invalid"),
])
def test_asv_machine_refuses_names_that_escape_or_asv_reserves(_isolated, tmp_path, capsys, name, needle):
    mf = _isolated / ".asv-machine.json"
    mf.write_text('{"version": 1, "keep": {"machine": "keep"}}\n')
    before = mf.read_bytes()
    assert main(["--device", "cpu", "asv-machine", name, "--results-dir", str(tmp_path / "results")]) == 2
    assert needle in _out(capsys)
    assert mf.read_bytes() == before
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("content,needle", [
    ("[]", "holds a JSON list, not an object of machines"),
    ("null", "holds a JSON NoneType"),
    ('"cpu"', "holds a JSON str"),
    ('{"version": 1, "cpu-2c', "is not valid JSON (line 1"),
    ("", "is not valid JSON"),
])
def test_corrupt_asv_machine_file_is_named_and_left_alone(_isolated, tmp_path, capsys, content, needle):
    mf = _isolated / ".asv-machine.json"
    mf.write_text(content)
    assert main(["--device", "cpu", "asv-machine", "pytest-cpu", "--results-dir", str(tmp_path)]) == 2
    out = _out(capsys)
    assert needle in out and str(mf) in out
    assert mf.read_text() == content


def test_asv_machine_keeps_other_machines_and_honours_the_umask(_isolated, tmp_path):
    mf = _isolated / ".asv-machine.json"
    mf.write_text('{"version": 1, "other": {"machine": "other", "gpu": "H200"}}\n')
    old = os.umask(0o022)
    try:
        assert main(["--device", "cpu", "asv-machine", "pytest-cpu", "--results-dir", str(tmp_path)]) == 0
    finally:
        os.umask(old)
    data = json.loads(mf.read_text())
    assert data["other"] == {"machine": "other", "gpu": "H200"} and data["pytest-cpu"]["machine"] == "pytest-cpu"
    assert data["version"] == 1 and (mf.stat().st_mode & 0o777) == 0o644


def test_asv_machine_refuses_a_corrupt_committed_machine_file(_isolated, tmp_path, capsys):
    (tmp_path / "pytest-cpu").mkdir()
    (tmp_path / "pytest-cpu" / "machine.json").write_text("[1, 2]")
    assert main(["--device", "cpu", "asv-machine", "pytest-cpu", "--results-dir", str(tmp_path)]) == 2
    assert "committed machine file" in _out(capsys) and not (_isolated / ".asv-machine.json").exists()


@pytest.mark.parametrize("args,needle", [
    (["--cu-num", "-5"], "argument --cu-num: '-5' is invalid: must be >= 1"),
    (["--cu-num", "0"], "argument --cu-num: '0' is invalid: must be >= 1"),
    (["--cu-num", "many"], "argument --cu-num: 'many' is not an integer"),
    (["--name", "../../x"], "tolerance set name '../../x' is invalid"),
    (["--name", "/tmp/x"], "tolerance set name '/tmp/x' is invalid"),
    (["--name", ".x"], "tolerance set name '.x' is invalid"),
])
def test_calibrate_refuses_bad_cu_num_and_escaping_names_up_front(capsys, monkeypatch, args, needle):
    from mla_fp8_bench.analysis import calibrate

    monkeypatch.setattr(calibrate, "calibrate", lambda **k: pytest.fail("calibration started"))
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", *args])
    assert exc.value.code == 2 and needle in _out(capsys)


def test_calibrate_checks_its_output_path_before_measuring(tmp_path, capsys, monkeypatch):
    from mla_fp8_bench.analysis import calibrate

    monkeypatch.setattr(calibrate, "calibrate", lambda **k: pytest.fail("calibration started"))
    assert main(["calibrate", "--out", str(tmp_path)]) == 2
    assert "--out" in _out(capsys)


# ============================================================================ Q. the asv commit guard (row 12)
def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repo with the package tracked at pkg/ and a stale copy in an ignored .asv/env folder."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = tmp_path / "repo"
    (r / "pkg").mkdir(parents=True)
    (r / "pkg" / "__init__.py").write_text("x = 1\n")
    (r / ".gitignore").write_text(".asv/\n")
    _git(r, "init", "-q")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    stale = r / ".asv" / "env" / "site-packages" / "pkg"
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text("x = 0\n")
    return r


@pytest.mark.parametrize("where,expect,needle", [
    ("outside", "HEAD", "is not in a git work tree"),
    ("stale", "HEAD", "is not tracked by the git tree around it"),
    ("tracked", "0123456789abcdef0123456789abcdef01234567", "is at"),
    ("tracked", "deadbeefXYZ", "is not a commit SHA"),
])
def test_expect_commit_guard_refuses_unverifiable_or_other_code(tmp_path, monkeypatch, repo, where, expect, needle):
    from mla_fp8_bench.harness.asv_guard import AsvRunRefused, check_commit

    head = _git(repo, "rev-parse", "HEAD")
    cfg = RunConfig(expect_commit=head if expect == "HEAD" else expect)
    outside = tmp_path / "wheel" / "pkg"
    outside.mkdir(parents=True)
    lib = {"outside": outside, "stale": repo / ".asv" / "env" / "site-packages" / "pkg",
           "tracked": repo / "pkg"}[where]
    with pytest.raises(AsvRunRefused, match=needle):
        check_commit(cfg, lib)


def test_expect_commit_guard_passes_the_tracked_code_of_that_commit(monkeypatch, repo):
    from mla_fp8_bench.harness.asv_guard import check_commit

    check_commit(RunConfig.from_env({"MLA_FP8_BENCH_EXPECT_COMMIT": _git(repo, "rev-parse", "HEAD")[:10]}),
                 repo / "pkg")  # no exception


# ============================================================================ S. files and JSON (jsonio)
@pytest.mark.parametrize("make,needle", [
    (lambda p: None, "cannot read run JSON"),
    (lambda p: p.mkdir(), "cannot read run JSON"),
    (lambda p: p.write_bytes(b"\x00\xff\xfe garbage"), "is not UTF-8 text (byte 1)"),
    (lambda p: p.write_text('{"records": [1, 2'), "is not valid JSON (line 1"),
])
def test_load_json_names_the_file_for_every_failure(tmp_path, make, needle):
    from mla_fp8_bench.jsonio import load_json

    p = tmp_path / "r.json"
    make(p)
    with pytest.raises(ValueError) as exc:
        load_json(p, "run JSON")
    assert needle in str(exc.value) and str(p) in str(exc.value)


def test_unserialisable_record_keeps_the_previous_file(tmp_path):
    from mla_fp8_bench.jsonio import write_json_atomic

    p = tmp_path / "r.json"
    p.write_text('{"old": 1}\n')
    with pytest.raises(TypeError, match="not JSON-serialisable: object"):
        write_json_atomic({"records": [object()]}, p)
    assert p.read_text() == '{"old": 1}\n' and sorted(os.listdir(tmp_path)) == ["home", "r.json"]


def test_tensors_and_dtypes_in_records_are_written_as_plain_json(tmp_path):
    from mla_fp8_bench.jsonio import write_json_atomic

    p = tmp_path / "r.json"
    write_json_atomic({"t": torch.tensor([1.5, 2.0]), "d": torch.float8_e4m3fn, "dev": torch.device("cpu")}, p)
    assert json.loads(p.read_text()) == {"t": [1.5, 2.0], "d": "torch.float8_e4m3fn", "dev": "cpu"}


# ============================================================================ T. tiny inputs (row 18)
def test_tiny_q_and_k_underflow_the_kernels_score_scale_and_the_run_reports_it(monkeypatch):
    """q, k x 1e-25 with per-tensor scales: descale = amax/448 ~ 1e-27 is representable, but the kernel's
    c = softmax_scale*q_scale*k_scale (fp32, docs/aiter-contract.md step 1) is ~1e-55 and underflows to 0;
    a causally masked score (-inf) times c2 = 0 is NaN. The emulated kernel therefore gives NaN as the
    kernel would, and the run records it as an error (counted), while the references stay finite."""
    import mla_fp8_bench.problem.inputs as inputs_mod
    from mla_fp8_bench.harness.runner import RunOptions, evaluate
    from mla_fp8_bench.problem.cases import resolve_cases
    from mla_fp8_bench.problem.inputs import make_inputs

    orig = inputs_mod.make_bf16_qkv
    monkeypatch.setattr(inputs_mod, "make_bf16_qkv",
                        lambda case, *a, **k: (lambda q, k_, v: (q * 1e-25, k_ * 1e-25, v))(*orig(case, *a, **k)))
    (case,) = resolve_cases(["s64-h2"])
    inp = make_inputs(case, "cpu")
    qs, ks = float(inp.q8.descale), float(inp.k8.descale)
    assert 1e-29 < qs < 1e-26 and 1e-29 < ks < 1e-26  # each scale is a normal fp32 number
    c = torch.tensor(inp.softmax_scale, dtype=torch.float32) * torch.tensor(qs) * torch.tensor(ks)
    assert float(c) == 0.0 and math.isnan(float(torch.tensor(-math.inf) * c))
    data = evaluate(["aiter-emulated", "torch-fp8-ref"], [case], device="cpu",
                    options=RunOptions(timing=False, determinism=False))
    emu, ref = data["records"]
    if emu["status"] == "skipped":
        pytest.skip(f"aiter-emulated cannot run here: {emu['reason']}")
    assert emu["status"] == "error" and emu["reason"].startswith("non-finite result")
    assert emu["nonfinite_count_fp8_ref"] > 0
    assert ref["status"] == "ok" and ref["max_abs_error_fp8_ref"] < 0.05  # the references are finite


# ============================================================================ U. newer commands and case families
@pytest.mark.parametrize("spec,needle", [
    ("ctx0-q5", "a ctx case needs at least one context_len >= 1"),
    ("prefix-ragged-0q5", "a prefix case needs at least one context_len >= 1"),
    ("ctx-ragged-1024q0", "seq_len 0 is invalid"),
    ("prefix1024-q0", "seq_len 0 is invalid"),
    ("ctx99999999999-q1", "is too large"),
    ("ctx1024-q2000000", "exceed the supported maximum 1048576"),
    ("prefix-ragged-1024q256x999999999", "makes more than 1048576 tokens"),
    ("ctx1024-q256-h0", "num_heads 0 is invalid: allowed 1..1024"),
    ("ctx1024", "must be followed by '-q<Q>'"),
    ("prefix-q5", "is invalid: expected"),
    ("ctx1024-q256-cast-cast", "suffix 'cast' is not recognised"),
    ("ctx-ragged-", "(empty batch)"),
])
def test_bad_ctx_and_prefix_case_ids_are_refused_before_any_case_runs(capsys, no_measuring, spec, needle):
    assert _run("-b", "torch-fp8-ref", "-c", f"s16-h2,{spec}") == 2  # the good case is not run first
    out = _out(capsys)
    assert needle in out and "Traceback" not in out


def _plan(*args: str) -> int:
    return main(["plan", *args])


@pytest.mark.parametrize("args,needle", [
    (["--qo-lens", "5", "--kv-lens", "3", "--heads", "16"], "q_len=5 > kv_len=3"),
    (["--qo-lens", "128", "--kv-lens", "128", "--heads", "0"], "--heads=0 is out of range"),
    (["--qo-lens", "128", "--kv-lens", "128", "--heads", "16", "--cu-num", "0"], "--cu-num=0 is out of range"),
    (["--qo-lens", "128", "--kv-lens", "128", "--heads", "16", "--cu-num", "-5"], "--cu-num=-5 is out of range"),
    (["--qo-lens", "99999999999", "--kv-lens", "99999999999", "--heads", "16"], "is out of range"),
    (["--qo-lens", ",,,", "--kv-lens", "128", "--heads", "16"], "is not a comma-separated list of integers"),
    (["--qo-lens", "128,128", "--kv-lens", "128", "--heads", "16"], "has 2 sequences but --kv-lens has 1"),
    (["--qo-lens", "abc", "--kv-lens", "128", "--heads", "16"], "'abc' is not an integer"),
    (["--qo-lens", "128", "--kv-lens", "128", "--heads", "16", "--limit", "-1"], "--limit=-1 is out of range"),
    (["--qo-lens", "128", "--kv-lens", "128", "--heads", "16", "--json", "{tmp}"], "is a directory"),
    (["--qo-lens", "128", "--kv-lens", "128", "--heads", "16", "--json", "{tmp}/afile/p.json"], "which is a file"),
])
def test_plan_refuses_bad_batches_and_outputs(tmp_path, capsys, args, needle):
    (tmp_path / "afile").write_text("x")
    assert _plan(*[a.format(tmp=tmp_path) for a in args]) == 2
    out = _out(capsys)
    assert needle in out and "Traceback" not in out
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("args,needle", [
    (["--machine", "../x"], "--machine '../x' is invalid"),
    (["--machine", "version"], "--machine 'version' is reserved by asv"),
    (["--machine", "benchmarks.json"], "is reserved by asv"),
    (["--machine", "h200", "--library", "nope"], "--library 'nope' is unknown: allowed auto, aiter, vllm"),
    (["--machine", "h200", "--library", "aiter", "--commit", "zzz"], "--commit 'zzz' is not a commit hash"),
    (["--machine", "h200", "--base", "xyz"], "--base 'xyz' is not a commit hash"),
])
def test_nightly_refuses_bad_names_and_commits_before_running_anything(capsys, monkeypatch, args, needle):
    real = subprocess.run

    def run(cmd, *a, **k):  # read-only probes of the installed library are fine; asv or pip are not
        if any(str(x).endswith(("asv", "pip")) or x in ("asv", "pip", "install") for x in cmd):
            pytest.fail(f"nightly ran {cmd!r} before refusing")
        return real(cmd, *a, **k)

    monkeypatch.setattr(subprocess, "run", run)
    assert main(["nightly", "--dry-run", *args]) == 2
    assert needle in _out(capsys)


def test_calibrate_measure_restores_the_emulated_cu_count(monkeypatch):
    """calibrate's per-case measurement plans for its own CU count and leaves the environment alone."""
    from mla_fp8_bench.analysis import calibrate

    monkeypatch.setenv("MLA_FP8_BENCH_EMU_CU_NUM", "80")
    calibrate._measure_case("s128-h1", ("torch-fp8-ref",), 304)
    assert os.environ["MLA_FP8_BENCH_EMU_CU_NUM"] == "80"
    monkeypatch.delenv("MLA_FP8_BENCH_EMU_CU_NUM")
    rec = calibrate._measure_case("s512", ("aiter-emulated",), 304)["aiter-emulated"]
    few = calibrate._measure_case("s512", ("aiter-emulated",), 8)["aiter-emulated"]
    # 16 heads x 512 tokens: 304 CUs split tiles (6 live partial slots), 8 CUs split none
    assert rec["status"] == few["status"] == "ok" and (rec["num_partials"], few["num_partials"]) == (6, 0)
    assert "MLA_FP8_BENCH_EMU_CU_NUM" not in os.environ


@pytest.mark.parametrize("argv", [["run", "--samples", "\u0665"], ["run", "--time-budget", "1_0"], ["nosuch"],
                                  ["gate", "a.json"], ["ab", "x", "y", "--factor", "\u0661.\u0665"]])
def test_a_usage_error_is_one_line(capsys, argv):
    """argparse's refusals: one line naming the command, the bad value and where help is; exit 2."""
    from mla_fp8_bench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    c = capsys.readouterr()
    lines = c.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mla-fp8-bench") and ": error: " in lines[0], c.err
    assert lines[0].endswith("--help)") and c.out == ""


def test_no_subcommand_prints_the_list_of_them(capsys):
    from mla_fp8_bench.cli import main

    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mla-fp8-bench") and "run" in err and "gate" in err


def test_nightly_runs_one_at_a_time_per_results_directory(tmp_path, monkeypatch, capsys):
    """A second nightly into a results directory another run holds is refused before it runs anything (two asv
    runs into one results directory at once can store a stale value over a fresh one)."""
    from mla_fp8_bench.analysis import nightly
    from mla_fp8_bench.jsonio import locked

    suite = tmp_path / "suite"
    suite.mkdir()
    cfg = suite / "asv.aiter.conf.json"
    cfg.write_text(json.dumps({"version": 1, "project": "amd-aiter", "repo": ".", "results_dir": "results"}))
    ran: list = []
    monkeypatch.setattr(nightly, "_run_streamed", lambda cmd, *a, **k: ran.append(cmd))
    with locked(suite / "results", "results directory"):
        assert main(["nightly", "--library", "aiter", "--commit", "a" * 40, "--machine", "m", "--config", str(cfg),
                     "--no-publish"]) == 2
    assert ran == []
    assert f"results directory {suite / 'results'} is being written by another process (pid {os.getpid()})" in \
        _out(capsys)


def test_asv_machine_away_from_the_results_never_files_this_machine_under_a_published_name(_isolated, tmp_path,
                                                                                         capsys):
    assert main(["--device", "cpu", "asv-machine", "h200", "--results-dir", str(tmp_path / "reslts")]) == 2
    assert f"--results-dir {tmp_path / 'reslts'} is not a directory" in _out(capsys)
    assert not (_isolated / ".asv-machine.json").exists()
