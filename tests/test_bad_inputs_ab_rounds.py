"""Hostile inputs to ``ab``, the round server and the rounds knobs: bad sides and numbers refused before any
round, a round's error naming only that round, an interrupt leaving no server, child or temp directory, and
round lists of the gate holding what is not a number."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from mla_fp8_bench.analysis import ab
from mla_fp8_bench.cli import main
from mla_fp8_bench.config import MAX_ROUNDS, RunConfig
from mla_fp8_bench.harness import rounds as R

CPU = ["-b", "torch-sdpa-bf16", "-c", "s64", "--device", "cpu"]


@pytest.fixture
def no_work(monkeypatch):
    """``ab`` may validate but never measure."""
    def refuse(*a, **k):
        raise AssertionError("a round was started")
    monkeypatch.setattr(ab, "measure_ab", refuse)


def _sides(tmp_path: Path) -> list[str]:
    """Two empty install directories: BASE and HEAD the library as installed."""
    sides = [tmp_path / "base", tmp_path / "head"]
    for d in sides:
        d.mkdir(exist_ok=True)
    return [str(d) for d in sides]


@pytest.mark.parametrize("extra, named", [
    (["--factor", "nan"], "--factor nan"), (["--factor", "inf"], "--factor inf"), (["--factor", "0"], "--factor 0.0"),
    (["--factor", "-1"], "--factor -1.0"), (["--noise-k", "nan"], "--noise-k nan"),
    (["--noise-k", "-1"], "--noise-k -1.0"), (["--noise-k", "inf"], "--noise-k inf"),
    (["--rounds", str(MAX_ROUNDS + 1)], f"--rounds {MAX_ROUNDS + 1}"), (["--rounds", "99999999999"], "--rounds 99999"),
    (["-c", ","], "--cases ','"), (["-b", ""], "--backends '': names nothing; allowed"),
])
def test_ab_refuses_bad_numbers_and_empty_cases_before_work(tmp_path, capsys, no_work, extra, named):
    args = ["ab", *_sides(tmp_path), *CPU, "--rounds", "2", *extra]
    assert main(args) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("error:") and named in out


@pytest.mark.parametrize("flag, value", [("--rounds", "\u0665"), ("--rounds", "+5"), ("--seed", "\u00b2"),
                                         ("--seed", "1_000")])
def test_ab_integers_are_ascii_digits(tmp_path, capsys, no_work, flag, value):
    """'\u0665' (Arabic-Indic five), '+5', '\u00b2' and '1_000' are integers to ``int()``, not as typed here."""
    with pytest.raises(SystemExit) as exc:
        main(["ab", *_sides(tmp_path), *CPU, "--rounds", "2", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mla-fp8-bench ab: error: argument {flag}: {value!r} is not an integer: written in ASCII digits "
                   "0-9 (mla-fp8-bench ab --help)"]


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_ab_refuses_a_side_that_cannot_run_a_round(tmp_path, capsys, no_work):
    not_python = _script(tmp_path / "not_python", "#!/bin/sh\necho hi\n")
    shadow = tmp_path / "shadow"
    (shadow / "torch").mkdir(parents=True)
    (shadow / "torch" / "__init__.py").write_text("raise ImportError('broken torch of the install')\n")
    cases = [([not_python, str(tmp_path)], "BASE '" + not_python), ([str(tmp_path), str(shadow)], "broken torch")]
    if shutil.which("python3") and os.path.realpath(shutil.which("python3")) != os.path.realpath(sys.executable):
        cases.append(([str(tmp_path), shutil.which("python3")], "HEAD"))  # another interpreter, maybe no torch
    for sides, named in cases:
        rc = main(["ab", *sides, *CPU])
        out = " ".join(capsys.readouterr().out.split())
        if sides[1] == shutil.which("python3") and rc != 2:
            continue  # that interpreter has torch and the suite: a valid side
        assert rc == 2 and out.startswith("error:") and named in out and "cannot run a round" in out, out
    assert main(["ab", *_sides(tmp_path), *CPU[:4], "--device", "nosuch"]) == 2
    assert "'nosuch'" in capsys.readouterr().out


@pytest.fixture
def no_probe(monkeypatch):
    """``ab`` may check its arguments but never start a side's interpreter."""
    def refuse(*a, **k):
        raise AssertionError("a side was probed")
    monkeypatch.setattr(ab, "probe_side", refuse)


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("error: ") and out.count("\n") == 1, out
    return out


def _env_root(path: Path, marker: str) -> str:
    path.mkdir()
    (path / marker).mkdir() if marker == "conda-meta" else (path / marker).write_text("home = /usr/bin\n")
    return str(path)


@pytest.mark.parametrize("make, named", [
    (lambda t: str(t / "missing"), "does not exist"),
    (lambda t: (t / "plain").write_text("x") and str(t / "plain"), "is a file that is not executable"),
    (lambda t: _env_root(t / "venv", "pyvenv.cfg"), "is the root of an environment"),
    (lambda t: _env_root(t / "conda", "conda-meta"), "is the root of an environment"),
    (lambda t: (t / "loop").symlink_to(t / "loop") or str(t / "loop"), "does not exist or is no file"),
], ids=["missing", "not-executable", "venv-root", "conda-root", "symlink-loop"])
@pytest.mark.parametrize("label", ["BASE", "HEAD"])
def test_ab_refuses_an_unusable_side_before_any_probe_or_round(tmp_path, capsys, no_work, no_probe, make, named,
                                                               label):
    bad, good = make(tmp_path), _sides(tmp_path)[0]
    sides = [bad, good] if label == "BASE" else [good, bad]
    assert main(["ab", *sides, *CPU]) == 2
    out = _one_error_line(capsys)
    assert f"{label} {bad!r} {named}" in out and "give " in out and "interpreter" in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_ab_refuses_an_unreadable_install_directory(tmp_path, capsys, no_work, no_probe):
    base, head = _sides(tmp_path)
    os.chmod(head, 0)
    try:
        assert main(["ab", base, head, *CPU]) == 2
    finally:
        os.chmod(head, 0o755)
    assert f"HEAD {head!r} is a directory this user cannot read" in _one_error_line(capsys)


def test_ab_takes_empty_install_directories_as_the_library_as_installed(tmp_path, monkeypatch):
    probed: list[str] = []

    def measure(*a, **k):
        raise KeyboardInterrupt  # past every check: stop before measuring

    monkeypatch.setattr(ab, "probe_side", lambda side, *a, **k: probed.append(side.label))
    monkeypatch.setattr(ab, "measure_ab", measure)
    assert main(["ab", *_sides(tmp_path), *CPU]) == 128 + signal.SIGINT
    assert probed == ["BASE", "HEAD"]


def _linked_python(env: Path, *names: str) -> list[str]:
    (env / "bin").mkdir(parents=True)
    for n in names:
        (env / "bin" / n).symlink_to(sys.executable)
    return [str(env / "bin" / n) for n in names]


def test_ab_refuses_base_and_head_naming_one_install(tmp_path, capsys, no_work, no_probe):
    base, head = _sides(tmp_path)
    (tmp_path / "link").symlink_to(base)
    python, python3 = _linked_python(tmp_path / "env", "python", "python3")
    for sides, named in (([base, base], f"are one install ({base!r})"),
                         ([base, base + "/"], f"are one install ({base!r})"),
                         ([str(tmp_path / "link"), base], f"are one install ({base!r})"),
                         ([python, python3], f"are one install ({os.path.realpath(python)!r})")):
        assert main(["ab", *sides, *CPU]) == 2
        out = _one_error_line(capsys)
        assert named in out and "an A/B needs two different installs" in out, out
    # two environments that link one interpreter are two sides; so are an install and an interpreter
    ab.check_distinct(ab.parse_side(python, "BASE"), ab.parse_side(_linked_python(tmp_path / "env2", "python")[0],
                                                                   "HEAD"))
    ab.check_distinct(ab.parse_side(base, "BASE"), ab.parse_side(sys.executable, "HEAD"))
    ab.check_distinct(ab.parse_side(base, "BASE"), ab.parse_side(head, "HEAD"))


def test_ab_refuses_an_unknown_backend_before_probing(tmp_path, capsys, no_work, no_probe):
    assert main(["ab", *_sides(tmp_path), "-b", "torch-sdpa-bf16,nosuch", "-c", "s64", "--device", "cpu"]) == 2
    out = _one_error_line(capsys)
    assert "unknown nosuch; allowed " in out and "torch-sdpa-bf16" in out


def test_ab_refuses_a_backend_a_side_cannot_run_before_any_round(tmp_path, capsys, no_work):
    """fa3-fp8 on a CPU: the side's probe (its interpreter, its install) says why, before any round."""
    base, _ = sides = _sides(tmp_path)
    assert main(["ab", *sides, "-b", "torch-sdpa-bf16,fa3-fp8", "-c", "s64", "--device", "cpu"]) == 2
    out = _one_error_line(capsys)
    assert f"--backends fa3-fp8 unavailable to BASE {base!r} on --device cpu (fa3-fp8: needs an NVIDIA Hopper" in out
    assert "torch-sdpa-bf16" not in out


def test_round_server_that_answers_garbage_is_an_error_round(tmp_path):
    fake = _script(tmp_path / "fake_python", "#!/bin/sh\necho hi\nsleep 30\n")
    srv = R.RoundServer(fake, None)
    try:
        doc = srv.round(["torch-sdpa-bf16"], ["s64"], "sorted", 0, str(tmp_path / "r.json"), "cpu", timeout=60)
    finally:
        srv.close()
    assert doc["rows"] == [] and "'hi'" in doc["error"]
    assert srv.proc.poll() is not None


def test_round_errors_name_their_own_round_and_a_killed_server_its_signal(tmp_path):
    srv = R.RoundServer(sys.executable, R.suite_env(), ["torch-sdpa-bf16"])
    try:
        first = srv.round(["torch-sdpa-bf16"], ["s64"], "bogus-order", 0, str(tmp_path / "a.json"), "cpu", timeout=300)
        second = srv.round(["torch-sdpa-bf16"], ["s64"], "sorted", 0, str(tmp_path / "b.json"), "nosuch", timeout=300)
        os.killpg(srv.proc.pid, signal.SIGKILL)
        third = srv.round(["torch-sdpa-bf16"], ["s64"], "sorted", 0, str(tmp_path / "c.json"), "cpu", timeout=300)
    finally:
        srv.close()
    assert "bogus-order" in first["error"]
    assert "'nosuch'" in second["error"] and "bogus-order" not in second["error"]
    assert "exited -9" in third["error"] and "nosuch" not in third["error"]


class _Interrupt:
    """``select.select`` that raises KeyboardInterrupt (Ctrl-C while a round runs) and records the servers."""

    def __init__(self, monkeypatch):
        self.servers: list[R.RoundServer] = []
        real = R.RoundServer.__init__

        def init(srv, *a, **k):
            real(srv, *a, **k)
            self.servers.append(srv)

        def select(*a, **k):
            raise KeyboardInterrupt

        monkeypatch.setattr(R.RoundServer, "__init__", init)
        monkeypatch.setattr(R.select, "select", select)


def _left(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mla_fp8_"))


def test_interrupted_run_rounds_leaves_no_server_child_or_temp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    spy = _Interrupt(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        R.run_rounds(["torch-sdpa-bf16"], ["s64"], 2, device="cpu", timeout=300)
    assert len(spy.servers) == 1 and spy.servers[0].proc.poll() is not None
    assert _left(tmp_path) == []


def test_interrupted_ab_leaves_no_server_child_or_temp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    spy = _Interrupt(monkeypatch)
    side = ab.parse_side(sys.executable, "BASE")
    runner = ab.ServerRunner(["torch-sdpa-bf16"], "cpu", timeout=300)
    try:
        with pytest.raises(KeyboardInterrupt):
            ab.measure_ab(side, ab.parse_side(sys.executable, "HEAD"), ["torch-sdpa-bf16"], ["s64"], 2, runner)
    finally:
        runner.close()
    assert len(spy.servers) == 1 and spy.servers[0].proc.poll() is not None
    assert _left(tmp_path) == []


@pytest.mark.parametrize("raw", [str(MAX_ROUNDS + 1), "99999999999999999999"])
def test_rounds_knob_above_the_most_is_refused(raw):
    with pytest.raises(ValueError, match=f"MLA_FP8_BENCH_ROUNDS='{raw}' is invalid: .*{MAX_ROUNDS}"):
        RunConfig.from_env({"MLA_FP8_BENCH_ROUNDS": raw})
    assert RunConfig.from_env({"MLA_FP8_BENCH_ROUNDS": str(MAX_ROUNDS)}).rounds == MAX_ROUNDS


GPU_ENV = {"vendor": "nvidia", "device": "cuda:0", "device_name": "NVIDIA H200", "arch": "sm_90"}


@pytest.mark.parametrize("bad", [[True, False, True], ["a", "b", 1e-4], [[1e-4], [1e-4]], {"a": 1e-4}])
@pytest.mark.parametrize("on", ["base", "head"])
def test_gate_round_lists_holding_non_numbers_are_refused(tmp_path, capsys, bad, on):
    rec = {"backend": "fa3-fp8", "case": "s1024", "status": "ok", "reason": "", "timing_scope": "kernel",
           "latency_s": 1e-4, "latency_rounds_s": [1e-4, 1.001e-4, 0.999e-4]}
    for side in ("base", "head"):
        r = dict(rec, latency_rounds_s=bad) if side == on else rec
        (tmp_path / f"{side}.json").write_text(json.dumps({"env": GPU_ENV, "records": [r]}))
    assert main(["gate", str(tmp_path / "base.json"), str(tmp_path / "head.json")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert f"{on.upper()} {tmp_path / (on + '.json')}: record 0 (fa3-fp8, s1024)" in out


def test_sigterm_during_ab_kills_the_rounds_and_exits_143(tmp_path, monkeypatch, capsys):
    """A cancelled CI job (SIGTERM) ends ``ab`` as Ctrl-C does: servers killed, temp dir gone, no verdict."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    killed: list[bool] = []

    class Terminated:
        def __init__(self, *a, **k):
            pass

        def __call__(self, side, backends, cases, order, seed, out):
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("SIGTERM did not interrupt the round")

        def kill(self):
            killed.append(True)

        def close(self):
            pass

    monkeypatch.setattr(ab, "ServerRunner", Terminated)
    monkeypatch.setattr(ab, "probe_side", lambda *a, **k: None)
    def outside(signum, frame):  # what a SIGTERM that ab does not handle reaches (instead of ending pytest)
        raise AssertionError("ab left SIGTERM unhandled")

    old = signal.signal(signal.SIGTERM, outside)
    try:
        assert main(["ab", *_sides(tmp_path), *CPU]) == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is outside
    finally:
        signal.signal(signal.SIGTERM, old)
    assert killed == [True] and _left(tmp_path) == []
    assert "interrupted (SIGTERM): no verdict" in capsys.readouterr().out


def test_ab_that_measured_nothing_keeps_the_stored_json(tmp_path, monkeypatch, capsys):
    """Every round failed (the device is gone): the earlier --json stays, this run's document goes beside it."""
    class Failing:
        def __init__(self, *a, **k):
            pass

        def __call__(self, side, backends, cases, order, seed, out):
            return {"error": "round server exited 1: no device", "rows": []}

        def close(self):
            pass

    monkeypatch.setattr(ab, "ServerRunner", Failing)
    monkeypatch.setattr(ab, "probe_side", lambda *a, **k: None)
    stored = tmp_path / "ab.json"
    stored.write_text('{"rows": ["an earlier, complete result"]}')
    assert main(["ab", *_sides(tmp_path), *CPU, "--json", str(stored)]) == 1
    assert json.loads(stored.read_text()) == {"rows": ["an earlier, complete result"]}
    failed = json.loads((tmp_path / "ab.failed.json").read_text())
    assert [r["verdict"] for r in failed["rows"]] == ["NOTHING COMPARED"]
    assert failed["measured"]["base"]["rounds"][0]["error"].startswith("round server")
    assert "AB FAILED: nothing judged: BASE holds no results" in capsys.readouterr().out
    fresh = tmp_path / "new.json"  # no earlier file: the document goes where asked
    assert main(["ab", *_sides(tmp_path), *CPU, "--json", str(fresh)]) == 1 and fresh.exists()


def test_ab_measures_a_backend_named_twice_once_and_refuses_one_file_for_two_outputs(tmp_path, monkeypatch, no_work):
    seen: list[list[str]] = []

    def measure(base, head, backends, cases, rounds, runner, seed=0, log=None):
        seen.append(list(backends))
        raise KeyboardInterrupt  # stop here: only the arguments matter

    monkeypatch.setattr(ab, "measure_ab", measure)
    monkeypatch.setattr(ab, "probe_side", lambda *a, **k: None)
    args = ["ab", *_sides(tmp_path), "-c", "s64", "--device", "cpu"]
    assert main([*args, "-b", "torch-sdpa-bf16,torch-fp8-ref,torch-sdpa-bf16"]) == 130
    assert seen == [["torch-sdpa-bf16", "torch-fp8-ref"]]
    out = str(tmp_path / "x.json")
    assert main([*args, "-b", "torch-sdpa-bf16", "--json", out, "--summary", out]) == 2 and len(seen) == 1


def test_ab_same_install_named_with_a_newline_is_one_line(tmp_path, capsys, no_work, no_probe):
    odd = tmp_path / "new\nline"
    odd.mkdir()
    assert main(["ab", str(odd), str(odd) + "/", *CPU]) == 2
    out = _one_error_line(capsys)
    assert "are one install" in out and "\\n" in out


def test_ab_refuses_an_install_path_holding_the_pythonpath_separator(tmp_path, capsys, no_work, no_probe):
    odd = tmp_path / f"x{os.pathsep}y"
    odd.mkdir()
    assert main(["ab", str(odd), _sides(tmp_path)[1], *CPU]) == 2
    out = _one_error_line(capsys)
    assert f"BASE {str(odd)!r} holds {os.pathsep!r}, which PYTHONPATH reads as a separator" in out


def test_ab_runs_the_interpreter_file_it_checked_not_one_on_path(tmp_path, monkeypatch):
    """A bare relative name of an executable file in the working directory is that file (subprocess would
    look the name up on PATH instead)."""
    monkeypatch.chdir(tmp_path)
    wrapper = tmp_path / "python3"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    side = ab.parse_side("python3", "BASE")
    assert side.python == str(wrapper) and os.path.isabs(side.python)
