"""Bad-input catalogue, sections V to Z (docs/robustness.md): knobs an asv run reads, checked when asv
discovers the benchmarks (V), writes that cannot hurt (W), a gate that cannot be fooled (X), inputs checked before
long work (Y), file systems that are full, read-only or size-limited (Z)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main


# ============================================================================ V. knobs checked at discovery
@pytest.mark.parametrize("var,value,needle", [
    ("MLA_FP8_BENCH_CASES", "s128,nope", "MLA_FP8_BENCH_CASES names cases ['nope']"),
    ("MLA_FP8_BENCH_CASES", ",,", "MLA_FP8_BENCH_CASES=',,' names nothing"),
    ("MLA_FP8_BENCH_BACKENDS", " , ", "MLA_FP8_BENCH_BACKENDS=' , ' names nothing"),
    ("MLA_FP8_BENCH_MAX_TOKENS", "1e400", "MLA_FP8_BENCH_MAX_TOKENS='1e400' is not an integer"),
    ("MLA_FP8_BENCH_DEVICE", "tpu", "MLA_FP8_BENCH_DEVICE='tpu'"),
    ("MLA_FP8_BENCH_EMU_CU_NUM", "-1", "MLA_FP8_BENCH_EMU_CU_NUM='-1' is invalid"),
    ("MLA_FP8_BENCH_EMU_AITER_VERSION", "9.9", "MLA_FP8_BENCH_EMU_AITER_VERSION='9.9' is invalid"),
])
def test_every_knob_is_checked_at_discovery(monkeypatch, var, value, needle):
    """The benchmark module checks the knobs when asv imports it (before asv writes anything)."""
    from mla_fp8_bench.harness.asv_support import check_knobs

    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as ei:
        check_knobs()
    assert needle in str(ei.value)


# ============================================================================ X. a gate that cannot be fooled
GPU_ENV = {"vendor": "nvidia", "device": "cuda:0", "device_name": "NVIDIA H200", "arch": "sm_90"}


def _rec(backend="fa3-fp8", case="s1024", status="ok", latency=1e-4, seed=0, **acc):
    import numpy as np

    r = {"backend": backend, "case": case, "status": status, "reason": "" if status == "ok" else "boom"}
    if status == "ok":
        rng = np.random.default_rng(seed)
        r.update({"max_abs_error_fp8_ref": 0.0156, "rel_l2_error_fp8_ref": 0.01, "timing_scope": "kernel"})
        r.update(acc)
        r["latency_samples_s"] = [float(x) for x in latency * (1 + 0.01 * rng.standard_normal(30))]
        r["latency_s"] = float(np.median(r["latency_samples_s"]))
    return r


def _doc(tmp_path: Path, name: str, records: list, time_utc: str | None = None) -> str:
    env = dict(GPU_ENV, **({"time_utc": time_utc} if time_utc else {}))
    p = tmp_path / name
    p.write_text(json.dumps({"env": env, "records": records}))
    return str(p)


def test_nan_on_base_does_not_hide_a_broken_head(tmp_path, capsys):
    """BASE accuracy NaN, HEAD 0.75 (50x the usual error): INVALID, exit 1."""
    b = _doc(tmp_path, "b.json", [_rec(max_abs_error_fp8_ref=float("nan"))])
    h = _doc(tmp_path, "h.json", [_rec(seed=1, max_abs_error_fp8_ref=0.75)])
    assert main(["gate", b, h]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "impossible value nan on BASE" in out


def test_nan_latency_on_base_does_not_hide_a_10x_slower_head(tmp_path, capsys):
    base = _rec()
    base["latency_samples_s"] = [float("nan")] * 30
    base["latency_s"] = float("nan")
    b = _doc(tmp_path, "b.json", [base])
    h = _doc(tmp_path, "h.json", [_rec(seed=1, latency=1e-3)])
    assert main(["gate", b, h]) == 1
    assert "INVALID" in capsys.readouterr().out


def test_duplicate_head_records_are_ambiguous_and_fail(tmp_path, capsys):
    """An error record followed by an ok one of the same (backend, case): an ambiguous pair, not whichever came last."""
    b = _doc(tmp_path, "b.json", [_rec()])
    h = _doc(tmp_path, "h.json", [_rec(status="error"), _rec(seed=1)])
    assert main(["gate", b, h]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "records 0 and 1 are two different records of (fa3-fp8, s1024)" in out


def test_duplicate_base_records_are_ambiguous_and_fail(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec(latency=1e-3), _rec()])
    h = _doc(tmp_path, "h.json", [_rec(seed=1, latency=1e-3)])
    assert main(["gate", b, h]) == 2
    assert "two different records of (fa3-fp8, s1024)" in " ".join(capsys.readouterr().out.split())


def test_identical_duplicate_records_are_one_record(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec()])
    h = _doc(tmp_path, "h.json", [_rec(seed=1), _rec(seed=1)])
    assert main(["gate", b, h]) == 0


@pytest.mark.parametrize("base_records", [[], [_rec(status="skipped")], [_rec(status="error")]],
                         ids=["empty-base", "all-skipped-base", "all-failed-base"])
def test_a_comparison_that_compared_nothing_fails(tmp_path, capsys, base_records):
    b = _doc(tmp_path, "b.json", base_records)
    h = _doc(tmp_path, "h.json", [_rec(seed=1)])
    assert main(["gate", b, h]) == 1
    out = capsys.readouterr().out
    assert "NOTHING COMPARED" in out and out.splitlines()[-1].startswith("GATE FAILED: nothing judged: ")


def test_the_same_file_twice_is_named_and_fails(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec()])
    assert main(["gate", b, b]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "GATE FAILED: nothing judged: BASE and HEAD are the same file" in out
    assert "ok" not in out.split("are the same file")[-1]


def test_every_verdict_says_what_was_compared(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec(), _rec(case="s2048")])
    h = _doc(tmp_path, "h.json", [_rec(seed=1), _rec(case="s2048", seed=1)])
    assert main(["gate", b, h]) == 0
    lines = capsys.readouterr().out.splitlines()
    judged = 2 * 3  # two params, each: latency, max-abs error, rel-L2 error
    assert lines[0] == f"gate: BASE {b} vs HEAD {h}" and lines[-1] == f"GATE PASSED: {judged} value(s) judged"
    assert main(["gate", b, h, "--format", "markdown"]) == 0
    assert f"**GATE PASSED: {judged} value(s) judged**" in capsys.readouterr().out


# ============================================================================ W. writes that cannot hurt
import errno  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN = ["run", "-b", "torch-fp8-ref", "--no-timing"]


def _interrupt_at(monkeypatch, victim: str, how: str = "ctrl-c"):
    import mla_fp8_bench.harness.runner as runner

    orig = runner.evaluate_one

    def one(backend, ctx, pinfo, opts):
        if ctx.case.id == victim:
            raise KeyboardInterrupt
        return orig(backend, ctx, pinfo, opts)

    monkeypatch.setattr(runner, "evaluate_one", one)


def _records(path: Path) -> list:
    return json.loads(path.read_text())["records"]


def test_ctrl_c_before_the_first_record_keeps_an_existing_run_json(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    assert main([*RUN, "-c", "s16-h2,s32-h2", "--json", str(out)]) == 0
    before = out.read_bytes()
    _interrupt_at(monkeypatch, "s16-h2")
    assert main([*RUN, "-c", "s16-h2,s32-h2", "--json", str(out)]) == 130
    assert out.read_bytes() == before  # two records are not replaced by none
    side = tmp_path / "r.interrupted.json"
    assert json.loads(side.read_text())["interrupted"] is True and _records(side) == []
    assert f"{out} is kept: an interrupted run replaces no stored file" in capsys.readouterr().err


def test_an_interrupted_run_never_replaces_a_file_with_more_records(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    assert main([*RUN, "-c", "s16-h2,s32-h2,s48-h2", "--json", str(out)]) == 0
    before = out.read_bytes()
    _interrupt_at(monkeypatch, "s48-h2")
    assert main([*RUN, "-c", "s16-h2,s32-h2,s48-h2", "--json", str(out)]) == 130
    assert out.read_bytes() == before
    assert [r["case"] for r in _records(tmp_path / "r.interrupted.json")] == ["s16-h2", "s32-h2"]


def _stored(path: Path, *records: dict, **extra) -> bytes:
    path.write_text(json.dumps({"env": {"vendor": "cpu"}, "records": list(records), **extra}) + "\n")
    return path.read_bytes()


def _ok(case: str, **values) -> dict:
    return {"backend": "torch-fp8-ref", "case": case, "status": "ok", "reason": "", **values}


def _one_line_on_stderr(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_smaller_completed_run_never_replaces_a_file_with_more_records(tmp_path, capsys):
    """r.json holds three measured cases; a run of two goes to r.new.json, one of one to r.new-2.json
    (r.new.json holds a case it lacks); r.json is byte-identical throughout."""
    out = tmp_path / "r.json"
    assert main([*RUN, "-c", "s16-h2,s32-h2,s48-h2", "--json", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main([*RUN, "-c", "s16-h2,s32-h2", "--json", str(out)]) == 0
    assert out.read_bytes() == before
    side = tmp_path / "r.new.json"
    assert [r["case"] for r in _records(side)] == ["s16-h2", "s32-h2"]
    err = _one_line_on_stderr(capsys)
    assert f"{out} is kept" in err and "torch-fp8-ref s48-h2" in err and f"written to {side}" in err
    assert main([*RUN, "-c", "s16-h2", "--json", str(out)]) == 0
    assert out.read_bytes() == before and [r["case"] for r in _records(side)] == ["s16-h2", "s32-h2"]
    assert [r["case"] for r in _records(tmp_path / "r.new-2.json")] == ["s16-h2"]
    assert f"written to {tmp_path / 'r.new-2.json'}" in _one_line_on_stderr(capsys)


@pytest.mark.parametrize("kind", ["loop", "fifo", "device"])
def test_a_side_file_name_that_is_not_a_regular_file_is_passed_over(tmp_path, capsys, kind):
    """r.json is kept and r.new.json is a symlink loop, a FIFO or a link to /dev/zero: the run's records go
    to r.new-2.json (nothing is read from or written to r.new.json; the run does not hang or lose records)."""
    out, side = tmp_path / "r.json", tmp_path / "r.new.json"
    before = _stored(out, _ok("s16-h2"), _ok("s32-h2"))
    if kind == "loop":
        side.symlink_to(side.name)
    elif kind == "fifo":
        os.mkfifo(side)
    else:
        side.symlink_to("/dev/zero")
    assert main([*RUN, "-c", "s16-h2", "--json", str(out)]) == 0
    assert out.read_bytes() == before
    assert [r["case"] for r in _records(tmp_path / "r.new-2.json")] == ["s16-h2"]
    assert f"written to {tmp_path / 'r.new-2.json'}" in _one_line_on_stderr(capsys)


def test_an_interrupted_run_never_replaces_a_result_it_did_not_measure(tmp_path, monkeypatch):
    """r.json holds one measured (backend, case) of another backend; an interrupted run of two records
    goes beside it, though it holds more records."""
    out = tmp_path / "r.json"
    before = _stored(out, {**_ok("s16-h2"), "backend": "torch-sdpa-bf16"})
    _interrupt_at(monkeypatch, "s48-h2")
    assert main([*RUN, "-c", "s16-h2,s32-h2,s48-h2", "--json", str(out)]) == 130
    assert out.read_bytes() == before
    assert [r["case"] for r in _records(tmp_path / "r.interrupted.json")] == ["s16-h2", "s32-h2"]


@pytest.mark.parametrize("stored,why", [
    ([_ok("s16-h2", latency_s=1e-3)], "did not measure (e.g. torch-fp8-ref s16-h2)"),  # timed, this run is not
    ([_ok("s16-h2"), _ok("s32-h2")], "lacks"),  # s32-h2 ok there, an error here
    (None, "is not a run JSON"),
])
def test_a_completed_run_never_replaces_measured_values_or_a_foreign_file(tmp_path, monkeypatch, capsys, stored,
                                                                          why):
    import mla_fp8_bench.harness.runner as runner

    orig = runner.evaluate_one

    def one(backend, ctx, pinfo, opts):
        rec = orig(backend, ctx, pinfo, opts)
        if ctx.case.id == "s32-h2":
            rec.status, rec.reason = "error", "boom"
        return rec

    monkeypatch.setattr(runner, "evaluate_one", one)
    out = tmp_path / "r.json"
    if stored is None:
        out.write_text('{"settings": {"keep": "me"}}\n')
        before = out.read_bytes()
    else:
        before = _stored(out, *stored)
    assert main([*RUN, "-c", "s16-h2,s32-h2", "--json", str(out)]) == 0
    assert out.read_bytes() == before
    assert [(r["case"], r["status"]) for r in _records(tmp_path / "r.new.json")] == [("s16-h2", "ok"),
                                                                                     ("s32-h2", "error")]
    err = _one_line_on_stderr(capsys)
    assert err.startswith(f"{out} is kept: it ") and why in err
    assert err.endswith(f"written to {tmp_path / 'r.new.json'}")


@pytest.mark.parametrize("stored", [
    [_ok("s16-h2", marker=1)],  # the same (backend, case) measured: a newer measurement replaces it
    [_ok("s16-h2", marker=1), {**_ok("s48-h2"), "status": "skipped"}, {**_ok("s64-h2"), "status": "error"}],
    [],
    "",  # an empty file holds nothing
])
def test_a_completed_run_at_least_as_full_replaces_the_file(tmp_path, capsys, stored):
    out = tmp_path / "r.json"
    if isinstance(stored, str):
        out.write_text(stored)
    else:
        _stored(out, *stored)
    assert main([*RUN, "-c", "s16-h2,s32-h2", "--json", str(out)]) == 0
    assert [(r["case"], r["status"], "marker" in r) for r in _records(out)] == [("s16-h2", "ok", False),
                                                                             ("s32-h2", "ok", False)]
    assert not list(tmp_path.glob("r.new*")) and capsys.readouterr().err == ""


_SIGNAL_CHILD = """
import os, signal, sys
import mla_fp8_bench.harness.runner as runner
orig = runner.evaluate_one
def one(backend, ctx, pinfo, opts):
    if ctx.case.id == "s32-h2":
        os.kill(os.getpid(), signal.SIG{sig})
    return orig(backend, ctx, pinfo, opts)
runner.evaluate_one = one
from mla_fp8_bench.cli import main
sys.exit(main(["run", "-b", "torch-fp8-ref", "--no-timing", "-c", "s16-h2,s32-h2,s48-h2", "--json", sys.argv[1]]))
"""


@pytest.mark.parametrize("sig,code", [("TERM", 143), ("HUP", 129)])
def test_sigterm_and_sighup_keep_what_was_measured(tmp_path, sig, code):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-c", _SIGNAL_CHILD.format(sig=sig), str(out)], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode == code, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    data = json.loads(out.read_text())
    assert data["interrupted"] is True and [r["case"] for r in data["records"]] == ["s16-h2"]


def test_a_second_run_writing_the_same_json_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    """Two `run --json same.json` at once: the second is refused."""
    import fcntl

    out = tmp_path / "same.json"
    calls = []
    monkeypatch.setattr("mla_fp8_bench.harness.runner.evaluate", lambda *a, **k: calls.append(a) or {})
    fd = os.open(tmp_path / ".same.json.lock", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"4242")
    fcntl.flock(fd, fcntl.LOCK_EX)  # what the first run holds while it measures
    try:
        assert main([*RUN, "-c", "s16-h2", "--json", str(out)]) == 2
    finally:
        os.close(fd)
    msg = " ".join(capsys.readouterr().out.split())
    assert "is being written by another process (pid 4242)" in msg and calls == [] and not out.exists()


def test_json_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "store" / "r.json"
    target.parent.mkdir()
    target.write_text('{"records": []}')
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    assert main([*RUN, "-c", "s16-h2", "--json", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert [r["case"] for r in _records(target)] == ["s16-h2"]


def test_an_empty_output_path_is_refused_by_the_writer():
    from mla_fp8_bench.jsonio import write_json_atomic

    for bad in ("", "   "):
        with pytest.raises(ValueError, match="is empty"):
            write_json_atomic({"a": 1}, bad)


def test_a_long_but_valid_file_name_is_written(tmp_path):
    """A 250-byte name is valid (NAME_MAX 255); the temp file beside it must not be longer."""
    from mla_fp8_bench.jsonio import check_output_path, write_json_atomic

    p = tmp_path / ("r" * 245 + ".json")
    check_output_path(p)
    write_json_atomic({"a": 1}, p)
    assert json.loads(p.read_text()) == {"a": 1}


def test_an_over_long_file_name_is_refused_naming_the_limit(tmp_path, capsys):
    assert main([*RUN, "-c", "s16-h2", "--json", str(tmp_path / ("r" * 300 + ".json"))]) == 2
    assert "cannot be written: File name too long" in " ".join(capsys.readouterr().out.split())


def test_a_full_disk_is_one_line_and_the_old_file_survives(tmp_path, monkeypatch, capsys):
    out = tmp_path / "plan.json"
    out.write_text("old")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("mla_fp8_bench.jsonio.json.dump", full)
    assert main(["plan", "--qo-lens", "256", "--kv-lens", "256", "--heads", "16", "--json", str(out)]) == 2
    msg = " ".join(capsys.readouterr().out.split())
    assert f"cannot write {out}: No space left on device" in msg and "Traceback" not in msg
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


_FSIZE_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
from mla_fp8_bench.cli import main
sys.exit(main(["plan", "--qo-lens", "256,300", "--kv-lens", "256,300", "--heads", "16", "--json", sys.argv[1]]))
"""


def test_a_file_size_limit_is_one_line_and_the_old_file_survives(tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("old")
    p = subprocess.run([sys.executable, "-c", _FSIZE_CHILD, str(out)], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    msg = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 2, msg[-2000:]
    assert "plan.json: File too large; the previous file, if any, is unchanged" in msg and "Traceback" not in msg
    assert out.read_text() == "old" and sorted(x.name for x in tmp_path.iterdir()) == ["plan.json"]


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 KiB tmpfs under tmp_path (root only; skipped elsewhere); unmounted at the end."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {(p.stderr or p.stdout).strip()[:100]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_really_full_file_system_is_one_line(tiny_fs, capsys):
    (tiny_fs / "filler").write_bytes(b"x" * 60_000)
    out = tiny_fs / "plan.json"
    out.write_text("old")
    rc = main(["plan", "--qo-lens", "8192,8192,8192", "--kv-lens", "8192,8192,8192", "--heads", "128", "--json",
               str(out)])
    msg = " ".join(capsys.readouterr().out.split())
    assert rc == 2 and "No space left on device" in msg, msg[-1500:]
    assert out.read_text() == "old"


def test_a_read_only_file_system_is_refused_before_work(tiny_fs, capsys):
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    assert main(["plan", "--qo-lens", "256", "--kv-lens", "256", "--heads", "16", "--json",
                 str(tiny_fs / "p.json")]) == 2
    assert "Read-only file system" in capsys.readouterr().out


def test_asv_machine_never_silently_replaces_a_hand_written_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    mf = tmp_path / ".asv-machine.json"
    mf.write_text(json.dumps({"version": 1, "mybox": {"machine": "mybox", "cpu": "hand-written", "gpu": "none"}}))
    before = mf.read_bytes()
    assert main(["asv-machine", "mybox", "--results-dir", str(tmp_path)]) == 2
    msg = " ".join(capsys.readouterr().out.split())
    assert "already has an entry 'mybox' with other facts" in msg and "--force" in msg
    assert mf.read_bytes() == before
    assert main(["asv-machine", "mybox", "--results-dir", str(tmp_path), "--force"]) == 0
    assert json.loads(mf.read_text())["mybox"]["cpu"] != "hand-written"


def test_asv_machine_refuses_a_published_name_this_machine_is_not(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # another machine than the committed 2-core one
    assert main(["asv-machine", "cpu-2core", "--results-dir", str(ROOT / "results")]) == 2
    msg = " ".join(capsys.readouterr().out.split())
    assert "this machine is not 'cpu-2core'" in msg and "num_cpu '2' vs '64'" in msg
    assert not (tmp_path / ".asv-machine.json").exists()


def test_asv_machine_on_a_read_only_home_is_one_line(tiny_fs, monkeypatch, capsys):
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    monkeypatch.setenv("HOME", str(tiny_fs))
    assert main(["asv-machine", "mybox", "--results-dir", str(tiny_fs)]) == 2
    msg = " ".join(capsys.readouterr().out.split())
    assert "Read-only file system" in msg and ".asv-machine.json" in msg


# ---------------------------------------------------------------- publish never deletes what it did not write
def _results(root: Path) -> Path:
    """A copy of the committed asv results (both machines, benchmarks.json)."""
    import shutil

    shutil.copytree(ROOT / "results", root)
    return root


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _publish(results: Path, html: Path) -> int:
    return main(["publish", "--results-dir", str(results), "--html-dir", str(html)])


def test_publish_never_deletes_a_results_dir_inside_html_dir(tmp_path, capsys):
    html = tmp_path / "site"
    results = _results(html / "results")
    before = _tree(results)
    assert _publish(results, html) == 2
    assert "holds what publish did not write (results)" in " ".join(capsys.readouterr().out.split())
    assert _tree(results) == before


def test_publish_never_replaces_a_hand_written_site(tmp_path, capsys):
    """A folder with an index.html and other files that publish did not write: refused, untouched."""
    html = tmp_path / "www"
    html.mkdir()
    (html / "index.html").write_text("<h1>our dashboard</h1>")
    (html / "notes.txt").write_text("hand-written")
    before = _tree(html)
    assert _publish(_results(tmp_path / "results"), html) == 2
    msg = " ".join(capsys.readouterr().out.split())
    assert "holds what publish did not write (index.html, notes.txt)" in msg
    assert _tree(html) == before


def test_publish_replaces_its_own_site(tmp_path):
    results, html = _results(tmp_path / "results"), tmp_path / "html"
    assert _publish(results, html) == 0
    assert (html / ".mla-fp8-bench-site").is_file()
    (html / "index.json").write_text("x")
    assert _publish(results, html) == 0
    assert json.loads((html / "index.json").read_text())["project"] == "mla_fp8_bench"


def test_publish_names_an_unreadable_result_file(tmp_path, capsys):
    """asv publish leaves a truncated file out; publish names it, once, and publishes the rest."""
    results = _results(tmp_path / "results")
    extra = results / "cpu-2core" / "bbbbbbbb-virtualenv-py3.11-torch2.13.0.json"
    extra.write_text('{"commit_hash": "bbbb')
    assert _publish(results, tmp_path / "html") == 0
    msg = " ".join(capsys.readouterr().out.split())
    assert msg.count(f"asv publish: Error parsing JSON in file '{extra}'") == 1
    assert (tmp_path / "html" / "index.html").is_file()


# ---------------------------------------------------------------- merge-results: concurrent writers
def _machine_src(root: Path, machine: str) -> Path:
    import shutil

    (root / machine).parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "results" / machine, root / machine)
    shutil.copy(ROOT / "results" / "benchmarks.json", root / "benchmarks.json")
    return root


_SLOW_MERGE_CHILD = """
import sys, time
import mla_fp8_bench.report.results_merge as rm
orig = rm._plan
def slow(*a, **k):
    out = orig(*a, **k)
    time.sleep(1.5)  # a merge that takes a while between reading the destination and writing it
    return out
rm._plan = slow
from mla_fp8_bench.cli import main
sys.exit(main(["merge-results", sys.argv[1], "--into", sys.argv[2]]))
"""


def test_two_merges_into_one_destination_keep_both(tmp_path):
    """Two merges at once both succeed and leave every machine's files in the destination."""
    import time

    dest = _machine_src(tmp_path / "dest", "cpu-2core")
    a, b = _machine_src(tmp_path / "a", "h200"), _machine_src(tmp_path / "b", "cpu-2core")
    extra = b / "cpu-2core" / ("e" * 8 + "-virtualenv-py3.11-torch2.13.0.json")
    first = sorted((b / "cpu-2core").glob("*-virtualenv-*.json"))[0]
    extra.write_text(first.read_text().replace(json.loads(first.read_text())["commit_hash"], "e" * 40))
    procs = []
    for src in (a, b):
        procs.append(subprocess.Popen([sys.executable, "-c", _SLOW_MERGE_CHILD, str(src), str(dest)], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        time.sleep(0.5)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert (dest / "h200" / "machine.json").is_file(), outs  # the first merge's machine
    assert extra.name in {p.name for p in (dest / "cpu-2core").iterdir()}, outs  # the second merge's file


def test_a_file_written_into_the_destination_during_a_merge_is_kept(tmp_path, monkeypatch):
    import mla_fp8_bench.report.results_merge as rm

    dest = _machine_src(tmp_path / "dest", "cpu-2core")
    src = _machine_src(tmp_path / "src", "h200")
    late = dest / "cpu-2core" / ("f" * 8 + "-virtualenv-py3.11-torch2.13.0.json")
    orig = rm._plan

    def plan_then_asv_writes(*a, **k):
        out = orig(*a, **k)
        late.write_text('{"written": "by asv run, during the merge"}')
        return out

    monkeypatch.setattr(rm, "_plan", plan_then_asv_writes)
    assert main(["merge-results", str(src), "--into", str(dest)]) == 0
    assert (dest / "h200" / "machine.json").is_file()
    assert late.read_text() == '{"written": "by asv run, during the merge"}'


# ============================================================================ Y. inputs checked before long work
@pytest.mark.parametrize("extra,needle", [
    (["--vllm-max-num-seqs", "1024", "--vllm-max-num-batched-tokens", "512"],
     "--vllm-max-num-batched-tokens=512 < --vllm-max-num-seqs=1024: vLLM refuses it"),
    (["--vllm-max-num-seqs", "1"], "the batch has 2 sequences but --vllm-max-num-seqs=1"),
    (["--vllm-max-num-batched-tokens", "300"], "the batch has 556 new tokens but --vllm-max-num-batched-tokens=300"),
    (["--vllm-max-model-len", "256"], "a kv_len of 300 exceeds --vllm-max-model-len=256"),
])
def test_plan_refuses_impossible_vllm_settings(capsys, extra, needle):
    assert main(["plan", "--qo-lens", "256,300", "--kv-lens", "256,300", "--heads", "16", *extra]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert needle in out and "reserved" not in out


# ---------------------------------------------------------------- found by the probe round
@pytest.mark.parametrize("bval", [float("inf"), None], ids=["inf", "null"])
def test_an_infinite_or_null_base_value_is_invalid(tmp_path, capsys, bval):
    b = _doc(tmp_path, "b.json", [_rec(max_abs_error_fp8_ref=bval)])
    h = _doc(tmp_path, "h.json", [_rec(seed=1, max_abs_error_fp8_ref=0.75)])
    assert main(["gate", b, h]) == 1
    assert "GATE FAILED: INVALID 1;" in capsys.readouterr().out


def test_an_infinite_base_latency_is_invalid(tmp_path, capsys):
    base = _rec()
    base["latency_samples_s"] = [float("inf")] * 30
    b = _doc(tmp_path, "b.json", [base])
    assert main(["gate", b, _doc(tmp_path, "h.json", [_rec(seed=1, latency=1e-3)])]) == 1
    assert "GATE FAILED: INVALID 1;" in capsys.readouterr().out


@pytest.mark.parametrize("raw,needle", [
    ("[" * 100_000 + "]" * 100_000, "cannot be read as JSON: maximum recursion depth exceeded"),
    ('{"records": [' + "9" * 5000 + "]}", "cannot be read as JSON: Exceeds the limit"),
], ids=["deep", "5000-digit-int"])
def test_hostile_json_is_one_line_naming_the_file(tmp_path, capsys, raw, needle):
    b = _doc(tmp_path, "b.json", [_rec()])
    h = tmp_path / "h.json"
    h.write_text(raw)
    assert main(["gate", b, str(h)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert needle in out and str(h) in out and "Traceback" not in out


def test_a_symlink_loop_as_output_is_refused(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert main([*RUN, "-c", "s16-h2", "--json", str(tmp_path / "a")]) == 2
    assert "is a symlink that cannot be followed" in " ".join(capsys.readouterr().out.split())
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()


def test_an_over_long_path_is_one_line(tmp_path, capsys):
    deep = tmp_path / "/".join(["x" * 200] * 25) / "r.json"
    assert main([*RUN, "-c", "s16-h2", "--json", str(deep)]) == 2
    assert "r.json cannot be written: File name too long" in " ".join(capsys.readouterr().out.split())


def test_nightly_refuses_an_invalid_bench_regex_before_any_work(capsys):
    assert main(["nightly", "--machine", "n", "--library", "aiter", "--bench", "track_(", "--dry-run",
                 "--commit", "a" * 40]) == 2
    assert "--bench 'track_(' is not a valid regular expression" in capsys.readouterr().out


def test_absurd_sample_counts_are_refused(capsys):
    with pytest.raises(SystemExit) as ei:
        main([*RUN, "-c", "s16-h2", "--samples", "99999999999999999999"])
    assert ei.value.code == 2
    assert "is out of range: allowed 1..1000000" in " ".join(capsys.readouterr().err.split())


def test_an_absurd_sample_count_knob_is_refused_at_discovery(monkeypatch):
    from mla_fp8_bench.harness.asv_support import check_knobs

    monkeypatch.setenv("MLA_FP8_BENCH_SAMPLES", "9" * 40)
    with pytest.raises(ValueError, match="MLA_FP8_BENCH_SAMPLES=.* is invalid: at most 1000000"):
        check_knobs()


def test_nightly_checks_its_summary_path_before_the_asv_run(tmp_path, capsys):
    """--summary is written after the whole asv run: a directory there is refused before it starts."""
    assert main(["nightly", "--machine", "n", "--library", "aiter", "--dry-run", "--commit", "a" * 40,
                 "--summary", str(tmp_path)]) == 2
    assert f"--summary {tmp_path} is a directory" in " ".join(capsys.readouterr().out.split())


def test_measured_records_survive_a_disk_that_fills_during_the_run(tiny_fs, capsys):
    """The path passes the check before measuring; the disk is full when the records are written: they go
    to the temp folder instead, and the message says where."""
    (tiny_fs / "filler").write_bytes(b"x" * 65_536)
    out = tiny_fs / "r.json"
    assert main([*RUN, "-c", "s16-h2,s32-h2", "--json", str(out)]) == 2
    msg = " ".join(capsys.readouterr().out.split())
    assert "No space left on device" in msg and "the run's records were saved to" in msg
    rescued = Path(msg.split("were saved to ")[1].split(" instead")[0])
    assert [r["case"] for r in json.loads(rescued.read_text())["records"]] == ["s16-h2", "s32-h2"]
    rescued.unlink()
