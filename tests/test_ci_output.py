"""What a CI log and a person see: unwrapped tables off a terminal, per-case progress lines, ratios that
read right, ``preview`` on 127.0.0.1, nightly refusing offline."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from rich.table import Table

from mla_fp8_bench.terminal import LOG_WIDTH, case_line, case_progress, make_console

ROOT = Path(__file__).resolve().parents[1]
LONG = "ragged-6992-6896-2495-cast"


# ------------------------------------------------------------------------------------------ console
def test_console_off_terminal_prints_tables_at_natural_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    con = make_console(buf)
    assert con.width == LOG_WIDTH
    t = Table()
    for col in ("verdict", "backend", "case", "metric", "BASE", "HEAD", "ratio", "detail"):
        t.add_column(col, overflow="fold")
    t.add_row("REGRESSION", "aiter-emulated", LONG, "reserved_workspace_bytes", "3.177e+07", "3.388e+07", "1.067",
              "grew 1.067x > 1.05x and a long explanation " * 3)
    con.print(t)
    lines = buf.getvalue().splitlines()
    row = [ln for ln in lines if "REGRESSION" in ln]
    assert len(row) == 1 and "aiter-emulated" in row[0] and LONG in row[0] and "reserved_workspace_bytes" in row[0]
    # natural width: the table is as wide as its content, far narrower than the console
    assert 100 < max(len(ln) for ln in lines) < 400


def test_console_respects_columns_off_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "132")
    assert make_console(io.StringIO()).width == 132


def test_case_line_format():
    assert case_line(3, 30, "aiter-emulated", "s512", "ok", 4.06, 12.84) == \
        "[3/30] aiter-emulated s512: ok (4.1 s; 12.8 s so far)"
    line = case_line(1, 2, "fa3-fp8", "s128", "skipped", 0.0, 0.0, "needs an NVIDIA Hopper\n(sm_90) GPU " + "x" * 300)
    assert line.startswith("[1/2] fa3-fp8 s128: skipped (0.0 s; 0.0 s so far): needs an NVIDIA Hopper (sm_90) GPU")
    assert len(line) < 260 and line.endswith("...")


def _rec(b, c, status="ok", reason=""):
    return SimpleNamespace(backend=b, case=c, status=status, reason=reason)


@pytest.mark.parametrize("terminal", [False, True])
def test_case_progress_prints_one_line_per_case(terminal):
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=terminal, width=200)
    with case_progress(2, con) as step:
        step(_rec("torch-fp8-ref", "s128"))
        step(_rec("aiter", "s128", "skipped", "needs gfx950"))
    out = buf.getvalue()
    assert "[1/2] torch-fp8-ref s128: ok (" in out
    assert "[2/2] aiter s128: skipped (" in out and "needs gfx950" in out


def test_case_progress_without_console_writes_plain_lines_to_stderr(capsys):
    with case_progress(1) as step:
        step(_rec("torch-fp8-ref", "s128"))
    err = capsys.readouterr().err
    assert err.startswith("[1/1] torch-fp8-ref s128: ok (") and err.endswith("so far)\n")


def test_run_piped_prints_progress_and_unwrapped_table(capsys, monkeypatch, tmp_path):
    from mla_fp8_bench.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)
    out_json = tmp_path / "run.json"
    rc = main(["--device", "cpu", "run", "-b", "torch-fp8-ref,fa3-fp8", "-c", "s128,s255", "--no-timing",
               "--json", str(out_json)])
    assert rc == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for i, (b, c) in enumerate([("torch-fp8-ref", "s128"), ("fa3-fp8", "s128"), ("torch-fp8-ref", "s255"),
                                ("fa3-fp8", "s255")], start=1):
        assert any(ln.startswith(f"[{i}/4] {b} {c}: ") for ln in lines), out
    rows = [ln for ln in lines if ln.startswith("│ fa3-fp8")]
    assert len(rows) == 2  # one line per record: the skip reason is not folded onto further lines
    assert all("Hopper" in r for r in rows)
    recs = json.loads(out_json.read_text())["records"]
    assert [(r["backend"], r["status"]) for r in recs][:2] == [("torch-fp8-ref", "ok"), ("fa3-fp8", "skipped")]


def test_asv_grid_prints_per_case_lines_to_stderr_and_the_progress_file(capsys, monkeypatch, tmp_path):
    """asv shows a setup_cache's output only when it fails: MLA_FP8_BENCH_PROGRESS also gets the lines."""
    from mla_fp8_bench.harness import asv_support

    for k in ("MLA_FP8_BENCH_EXPECT_COMMIT", "MLA_FP8_BENCH_MAX_TOKENS"):
        monkeypatch.delenv(k, raising=False)
    log = tmp_path / "grid.log"
    log.write_text("earlier line\n")
    monkeypatch.setenv("MLA_FP8_BENCH_PROGRESS", str(log))
    monkeypatch.setenv("MLA_FP8_BENCH_DEVICE", "cpu")
    monkeypatch.setenv("MLA_FP8_BENCH_BACKENDS", "torch-fp8-ref")
    monkeypatch.setenv("MLA_FP8_BENCH_CASES", "s128")
    monkeypatch.setenv("MLA_FP8_BENCH_SAMPLES", "2")
    monkeypatch.setenv("MLA_FP8_BENCH_TIME_BUDGET", "0.05")
    monkeypatch.setenv("MLA_FP8_BENCH_CEILINGS", "0")
    data = asv_support.measure_grid()
    err = capsys.readouterr().err
    assert "measuring 1 backends x 1 cases on cpu" in err
    assert "[1/1] torch-fp8-ref s128: ok (" in err
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier line" and "measuring 1 backends x 1 cases on cpu" in lines[1]
    assert lines[2].startswith("[1/1] torch-fp8-ref s128: ok (") and len(lines) == 3
    assert data["records"]["torch-fp8-ref|s128"]["status"] == "ok"


def test_grid_defaults_keep_the_cpu_main_job_small():
    from mla_fp8_bench.harness.asv_support import ASV_CASES, GRID_CAPS
    from mla_fp8_bench.problem.cases import SWEEP_CAPS, parse_case_id

    cpu = [c for c in ASV_CASES if max(parse_case_id(c).total_tokens, parse_case_id(c).total_kv_tokens)
           <= GRID_CAPS["cpu"]]
    assert "s2048" not in cpu and "prefix1024-q300" in cpu and "ctx1024-q256" in cpu
    assert GRID_CAPS["cuda"] == SWEEP_CAPS["cuda"]  # GPUs measure the whole grid


# ------------------------------------------------------------------------------------------ emulation apart
def test_emulation_latency_has_its_own_track():
    from mla_fp8_bench.harness.asv_support import emulation_apart
    from mla_fp8_bench.harness.asv_tracks import track_value
    from mla_fp8_bench.measure.metric_table import find

    lat, emu = find("track_latency"), find("track_emulation_latency")
    assert emu.asv_class == "MLAPrefill" and emu.kind == "informational"
    rec = {"backend": "aiter-emulated", "case": "s128", "status": "ok", "latency_s": 0.25,
           "latency_samples_s": [0.24, 0.25, 0.26], "timing_scope": "emulation", "max_abs_error_fp8_ref": 0.04}
    moved = emulation_apart(rec)
    assert track_value(moved, emu) == {"samples": [0.24, 0.25, 0.26], "number": 1}
    v = track_value(moved, lat)
    assert v != v  # NaN: asv stores n/a for the kernel-latency track
    assert rec["latency_s"] == 0.25  # the input record is not modified
    kernel = {"backend": "torch-fp8-ref", "case": "s128", "status": "ok", "latency_s": 1e-5,
              "latency_samples_s": [1e-5, 1.1e-5]}
    assert emulation_apart(kernel) is kernel


# ------------------------------------------------------------------------------------------ gate numbers
def test_gate_rows_for_a_floored_zero_and_a_close_latency():
    """The ratio column has the digits that decide (1.0503 beside a threshold of 1.05, never 1.050); a
    growth from a floored 0 reads ``0 -> 64``."""
    from mla_fp8_bench.analysis.gate.judge import Options, compare
    from mla_fp8_bench.analysis.gate.load import Side, Value

    base, head = Side("BASE", "b"), Side("HEAD", "h")
    for side, partials, lat in ((base, 1e-12, 9.7449e-6), (head, 64.0, 10.2346e-6)):
        side.data[("aiter", "s16384", "num_partials")] = Value("ok", partials, (partials,))
        side.data[("fa3-fp8", "s128", "latency_s")] = Value("ok", lat, (lat,))
        side.params.update({("aiter", "s16384"): ("ok", ""), ("fa3-fp8", "s128"): ("ok", "")})
    rows = {r.metric: r for r in compare(base, head, Options())}
    np_row = rows["num_partials"]
    assert (np_row.verdict, np_row.base, np_row.head, np_row.ratio) == ("REGRESSION", "0", "64", "0 -> 64")
    lat = rows["latency_s"]
    assert (lat.verdict, lat.base, lat.head, lat.ratio) == ("REGRESSION", "9.745 us", "10.23 us", "1.0503x")
    assert lat.detail.startswith("threshold 1.050")


def test_readme_gate_example_runs_on_committed_results(capsys):
    """README's example picks the one machine holding both commits (the committed results hold two)."""
    from mla_fp8_bench.cli import main

    rc = main(["gate", "1fed4606", "9c57e48d", "--results-dir", str(ROOT / "results"), "--tolerances",
               str(ROOT / "tolerances" / "cpu-emulated-v1.json")])
    out = capsys.readouterr().out
    assert rc in (0, 1), out
    assert "results/cpu-2core/1fed4606" in out and "128000000000000" not in out


# ------------------------------------------------------------------------------------------ site
def test_preview_serves_on_localhost_only(tmp_path):
    import http.client

    site = tmp_path / "html"
    site.mkdir()
    (site / "index.html").write_text("<html><body>site</body></html>")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "mla_fp8_bench.cli", "preview", "--html-dir", str(site), "--port",
                          "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        line = p.stdout.readline()
        assert "http://127.0.0.1:" in line, line
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/index.html")
        assert conn.getresponse().read() == b"<html><body>site</body></html>"
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_preview_refuses_a_folder_without_a_site(tmp_path, capsys):
    from mla_fp8_bench.cli import main

    assert main(["preview", "--html-dir", str(tmp_path / "none")]) == 2
    assert "no published site" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ nightly
def _conf(tmp_path: Path, repo: str) -> Path:
    conf = json.loads(json.dumps({"version": 1, "project": "amd-aiter", "repo": repo, "branches": ["main"],
                                  "results_dir": "results-aiter", "html_dir": "html-aiter",
                                  "benchmark_dir": str(ROOT / "benchmarks")}))
    d = tmp_path / "suite"
    d.mkdir()
    (d / "asv.aiter.conf.json").write_text(json.dumps(conf))
    return d / "asv.aiter.conf.json"


def test_nightly_offline_without_checkout_refuses_before_creating_anything(tmp_path, monkeypatch, capsys):
    from mla_fp8_bench.cli import main

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    cfg = _conf(tmp_path, "file:///nonexistent/aiter.git")  # remote to asv, unreachable without any network
    before = sorted(p.name for p in cfg.parent.iterdir())
    for extra in ([], ["--dry-run"]):
        rc = main(["nightly", "--library", "aiter", "--commit", "abcdef1234", "--machine", "mi355", "--config",
                   str(cfg), *extra])
        out = capsys.readouterr().out
        assert rc == 2, out
        assert "--checkout PATH" in out and "file:///nonexistent/aiter.git" in out and "not reachable" in out
    assert sorted(p.name for p in cfg.parent.iterdir()) == before  # no results-aiter/, no .asv/
    assert list(home.iterdir()) == []  # no ~/.asv-machine.json entry


def test_nightly_uses_a_mirror_that_holds_the_commit(tmp_path, monkeypatch, capsys):
    from mla_fp8_bench.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = _conf(tmp_path, "file:///nonexistent/aiter.git")
    src = tmp_path / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(src)], check=True)
    subprocess.run([*git, "-C", str(src), "commit", "-q", "--allow-empty", "-m", "c"], check=True)
    sha = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--mirror", str(src), str(cfg.parent / "amd-aiter")], check=True)
    rc = main(["nightly", "--library", "aiter", "--commit", sha, "--machine", "mi355", "--config", str(cfg),
               "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "--no-pull" in out and sha in out




def test_nightly_streams_asv_output_line_by_line():
    from mla_fp8_bench.analysis.nightly import _run_streamed

    seen: list[str] = []
    code = "import sys; print('one', flush=True); print('two', file=sys.stderr, flush=True); sys.exit(3)"
    p = _run_streamed([sys.executable, "-c", code], seen.append, {"MLA_FP8_BENCH_X": "1"})
    assert seen[0].startswith("$ MLA_FP8_BENCH_X=1 ") and seen[1:] == ["one", "two"]
    assert p.returncode == 3 and p.stdout == "one\ntwo\n"
