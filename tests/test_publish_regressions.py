"""``mla-fp8-bench publish`` over the committed results/ (into temporary folders): what the site opens on,
what its Regressions page lists, and the folders it refuses to replace; ``preview``'s bad port."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
from asv import util

from mla_fp8_bench.cli import main
from mla_fp8_bench.report.publish import asset_problems, publish_site

ROOT = Path(__file__).resolve().parents[1]
LAT = "bench_mla_prefill.MLAPrefill.track_latency"
EMULATION_CHANGE = "1bc13b171e28c9d31ee2b863ffc03b541a0ce44f"  # the aiter-emulated plan changed here


def _config(tmp: Path, first_commits: dict) -> Path:
    """The repository's asv config, its ``null`` first commits kept and ``first_commits`` added."""
    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    first_commits = {**{k: v for k, v in conf["regressions_first_commits"].items() if v is None}, **first_commits}
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(ROOT / "results"),
                regressions_first_commits=first_commits)
    (tmp / "asv.conf.json").write_text(json.dumps(conf))
    return tmp / "asv.conf.json"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The committed results published with no CDN copies installed (HOME is an empty folder)."""
    tmp = tmp_path_factory.mktemp("pub")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp))
        cfg = _config(tmp, {r"^bench_mla_prefill\.AiterPlan\.track_(num_partials|workspace_bytes)\('aiter-emulated'":
                            EMULATION_CHANGE})
        return publish_site(cfg, html_dir=tmp / "html")[0]


def test_regressions_page_honours_first_commits(site, tmp_path):
    assert json.loads((site / "regressions.json").read_text())["regressions"] == []
    assert "<entry>" not in (site / "regressions.xml").read_text()
    # control: without the key, asv lists the emulation change's steps (8 plan tracks of aiter-emulated)
    other = publish_site(_config(tmp_path, {}), html_dir=tmp_path / "html")[0]
    rows = json.loads((other / "regressions.json").read_text())["regressions"]
    hashes = json.loads((other / "index.json").read_text())["revision_to_hash"]
    assert len(rows) == 8 and {hashes[str(r[6][0][1])] for r in rows} == {EMULATION_CHANGE}
    assert all(".AiterPlan." in r[0] and "'aiter-emulated'" in r[0] for r in rows)


def test_site_opens_on_the_gpu_machines_kernel_latency(site):
    # the reference: the h200's newest committed result file, read directly
    newest = max((json.loads(f.read_text()) for f in (ROOT / "results" / "h200").glob("*-*.json")),
                 key=lambda d: d["date"])
    vals, params = newest["results"][LAT][:2]
    measured = {c: v for c, v in zip(itertools.product(*params), vals) if v is not None and math.isfinite(v)}
    per_case = {case: [v for (b, c), v in measured.items() if c == case] for case in params[1]}
    slowest_of_most = max(per_case, key=lambda c: (len(per_case[c]), sum(per_case[c])))
    assert slowest_of_most == "'s32768'" and len(per_case["'s32768'"]) == 4
    shown = [b for b in params[0] if (b, "'s32768'") in measured]
    assert shown == ["'fa3-fp8'", "'fa3-bf16'", "'cudnn-fp8'", "'cudnn-bf16'"]
    view = re.search(r'replaceState\(null, "", "#([^"]+)"\)', (site / "index.html").read_text())[1]
    assert view == (f"{LAT}?machine=h200" + "".join(f"&p-backend=%27{b[1:-1]}%27" for b in shown)
                    + "&p-case=%27s32768%27")


def test_no_emulation_latency_is_drawn_as_a_kernel_latency(site):
    bench = json.loads((site / "index.json").read_text())["benchmarks"][LAT]
    emulated = [i for i, c in enumerate(itertools.product(*bench["params"])) if c[0] == "'aiter-emulated'"]
    files = [f for f in site.glob(f"graphs/**/{LAT}.json") if "summary" not in f.parts]
    assert len(files) == 2 and emulated
    for f in files:
        assert all(row[1][i] is None for row in json.loads(f.read_text()) for i in emulated), f


def test_a_folder_copied_into_the_site_stops_the_next_publish(tmp_path, capsys):
    html, args = tmp_path / "html", ["publish", "--results-dir", str(ROOT / "results")]
    assert main([*args, "--html-dir", str(html)]) == 0
    (html / "graphs" / "mine").mkdir()
    (html / "graphs" / "mine" / "notes.md").write_text("mine")
    before = (html / "index.html").read_text()
    capsys.readouterr()
    assert main([*args, "--html-dir", str(html)]) == 2
    assert "holds what publish did not write (graphs/mine)" in " ".join(capsys.readouterr().out.split())
    assert (html / "graphs" / "mine" / "notes.md").read_text() == "mine"
    assert (html / "index.html").read_text() == before
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("a")
    assert main([*args, "--html-dir", str(tmp_path / "docs")]) == 2
    assert "(a.md)" in capsys.readouterr().out and (tmp_path / "docs" / "a.md").read_text() == "a"


def test_a_file_asv_cannot_read_is_named_and_the_rest_published(tmp_path, capsys):
    import shutil

    shutil.copytree(ROOT / "results", tmp_path / "results")
    (tmp_path / "results" / "h200" / "run.new.json").write_text('{"records": []}')
    assert main(["publish", "--results-dir", str(tmp_path / "results"), "--html-dir", str(tmp_path / "html")]) == 0
    out = capsys.readouterr().out
    bad = f"{tmp_path}/results/h200/run.new.json"
    assert " ".join(out.split()).count(f"asv publish: No version specified in {bad}") == 1
    assert (tmp_path / "html" / "index.html").is_file()


def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path, capsys):
    long = tmp_path / ("a" * 300)
    assert main(["publish", "--results-dir", str(ROOT / "results"), "--html-dir", str(long)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: cannot publish: File name too long") and "Traceback" not in out
    assert list(tmp_path.iterdir()) == []


def test_preview_port_out_of_range_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["preview", "--port", "99999"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "'99999' is not a TCP port (0..65535)" in err


def test_offline_without_the_copies_names_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["publish", "--offline", "--html-dir", str(tmp_path / "html"), "--config",
                 str(ROOT / "asv.conf.json")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "run `mla-fp8-bench publish --install-assets`" in out and "(14 of 14 missing or changed)" in out
    assert not (tmp_path / "html").exists()


def test_offline_site_loads_nothing_from_the_network(site, tmp_path):
    if asset_problems():
        pytest.skip("the pinned CDN copies are not installed (mla-fp8-bench publish --install-assets)")
    html = publish_site(_config(tmp_path, {}), html_dir=tmp_path / "html", offline=True)[0]
    page = (html / "index.html").read_text()
    assert not re.search(r"<(script|link)\b[^>]*\b(src|href)=\"(https?:)?//", page)
    for ref in re.findall(r'(?:src|href)="(_assets/[^"]+)"', page):
        assert (html / ref).is_file(), ref
    assert page.count('"_assets/') == 10


def test_the_opening_view_never_picks_a_machine_without_a_gpu(tmp_path):
    from mla_fp8_bench.report.site_view import kernel_latency_view

    params = [["'fa3-fp8'", "'torch-fp8-ref'"], ["'s128'", "'s256'"]]
    machines = {"cpu": {"gpu": "none"}, "gpu1": {"gpu": "NVIDIA H200"}}
    (tmp_path / "index.json").write_text(json.dumps({"machines": machines, "benchmarks": {
        LAT: {"params": params, "param_names": ["backend", "case"]}}}))
    for machine, last in (("cpu", [1e-3, 2e-3, 3e-3, 4e-3]), ("gpu1", [None, None, 5e-6, None])):
        (tmp_path / "graphs" / f"machine-{machine}").mkdir(parents=True)
        (tmp_path / "graphs" / f"machine-{machine}" / f"{LAT}.json").write_text(json.dumps([[1, last]]))
    assert kernel_latency_view(tmp_path) == f"{LAT}?machine=gpu1&p-backend=%27torch-fp8-ref%27&p-case=%27s128%27"
    machines["gpu1"]["gpu"] = "none"
    (tmp_path / "index.json").write_text(json.dumps({"machines": machines, "benchmarks": {
        LAT: {"params": params, "param_names": ["backend", "case"]}}}))
    assert kernel_latency_view(tmp_path) is None


def test_a_fifo_in_the_results_is_refused_before_asv_reads_it(tmp_path, capsys):
    import os
    import shutil

    shutil.copytree(ROOT / "results", tmp_path / "results")
    os.mkfifo(tmp_path / "results" / "h200" / "p.json")
    assert main(["publish", "--results-dir", str(tmp_path / "results"), "--html-dir", str(tmp_path / "html")]) == 2
    c = capsys.readouterr()
    assert "p.json, which is not a regular file" in " ".join((c.out + c.err).split())
    assert not (tmp_path / "html").exists()
