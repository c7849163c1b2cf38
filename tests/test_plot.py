"""``mla-fp8-bench plot``: run JSONs and asv results directories to figures (CPU, synthetic inputs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main
from mla_fp8_bench.report.plot import load_inputs, plot


def _rec(backend, case, lat, e8, e16, tf, emu=False):
    return {"backend": backend, "case": case, "status": "ok", "reason": "", "latency_s": lat,
            "latency_samples_s": [lat * 0.9, lat, lat * 1.2], "latency_method": "graph",
            "max_abs_error_fp8_ref": e8, "max_abs_error_bf16_ref": e16, "tflops": tf, "emulation": emu,
            "timing_scope": "emulation" if emu else "kernel"}


def _run_json(tmp_path: Path, ceilings=None) -> Path:
    recs = []
    for s in (128, 256, 257, 512):
        recs.append(_rec("fa3-fp8", f"s{s}", 1e-5 * s / 128, 0.05, 0.2, 10.0 * s / 128))
        recs.append(_rec("aiter-emulated", f"s{s}", 1e-1 * s / 128, 0.04, 0.2, 0.001, emu=True))
    recs.append({"backend": "fa3-bf16", "case": "s128", "status": "skipped", "reason": "needs sm_90"})
    recs.append(_rec("fa3-fp8", "ragged-4096x4", 1e-3, 0.05, 0.2, 500.0))
    doc = {"env": {"device_name": "NVIDIA H200", "arch": "sm_90", "vendor": "cuda"}, "records": recs}
    if ceilings is not None:
        doc["ceilings"] = ceilings
    p = tmp_path / "run.json"
    p.write_text(json.dumps(doc))
    return p


CEIL = {"status": "ok", "fp8_gemm_tflops": 1250.0, "bf16_gemm_tflops": 750.0, "copy_tb_s": 4.1,
        "datasheet": {"fp8": 1979.0, "bf16": 989.5, "hbm_tb_s": 4.8}}


def test_run_json_to_png_and_svg_with_ceilings(tmp_path, capsys):
    src = _run_json(tmp_path, CEIL)
    assert main(["plot", str(src), "--out", str(tmp_path / "img")]) == 0
    names = sorted(p.name for p in (tmp_path / "img").iterdir())
    assert names == sorted(f"nvidia-h200-{k}.{f}" for k in ("latency", "error", "tflops", "summary")
                           for f in ("png", "svg"))
    svg = (tmp_path / "img" / "nvidia-h200-tflops.svg").read_text()
    assert "FP8 GEMM measured 1,250 TFLOP/s" in svg and "bf16 datasheet peak 990 TFLOP/s" in svg
    assert "NVIDIA H200 (sm_90)" in svg and "copy bandwidth measured 4.10 TB/s" in svg
    assert "not shown: aiter-emulated" in svg  # no throughput for an emulation
    lat = (tmp_path / "img" / "nvidia-h200-latency.svg").read_text()
    assert "EMULATION" in lat
    out = " ".join(capsys.readouterr().out.split())
    assert "fa3-bf16 s128: skipped - needs sm_90" in out and "ragged-4096x4: not a single-sequence case" in out


def test_values_and_absent_ceilings(tmp_path):
    (ds,) = load_inputs([str(_run_json(tmp_path))])
    assert ds.ceilings is None
    pts = {(p.backend, p.seq_len): p for p in ds.points}
    assert pts[("fa3-fp8", 512)].latency_s == pytest.approx(4e-5)
    assert pts[("fa3-fp8", 512)].latency_q25 < 4e-5 < pts[("fa3-fp8", 512)].latency_q75
    assert pts[("aiter-emulated", 256)].emulation and pts[("aiter-emulated", 256)].tflops is None
    written, _ = plot([str(_run_json(tmp_path))], tmp_path / "img", formats=("svg",))
    svg = next(p for p in written if p.name.endswith("tflops.svg")).read_text()
    assert "no measured ceilings or datasheet peaks in this input" in svg


def test_asv_results_directory(tmp_path):
    m = tmp_path / "results" / "h200"
    m.mkdir(parents=True)
    (m / "machine.json").write_text(json.dumps({"machine": "h200", "gpu": "NVIDIA H200", "version": 1}))
    backends, cases = ["'fa3-fp8'", "'aiter-emulated'"], ["'s128'", "'s256'", "'ragged-4096x4'"]
    cols = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
            "stats_q_75"]
    nan = float("nan")

    def row(vals, q25=None, q75=None):
        return [vals, [backends, cases], "v1", 1, 1.0, None, None, q25, q75]

    res = {"commit_hash": "b" * 40, "env_name": "e", "date": 2, "params": {"machine": "h200"}, "python": "3.11",
           "requirements": {}, "env_vars": {}, "result_columns": cols, "durations": {}, "version": 2, "results": {
               "bench_mla_prefill.MLAPrefill.track_latency": row([1e-5, 2e-5, None, 0.1, 0.2, nan],
                                                                 [0.9e-5] * 6, [1.1e-5] * 6),
               "bench_mla_prefill.MLAPrefill.track_max_abs_error": row([0.05, 0.06, 0.05, 0.04, 0.05, nan]),
               "bench_mla_prefill.MLAPrefill.track_max_abs_error_bf16_ref": row([0.2] * 6),
               "bench_mla_prefill.MLAPrefill.track_seconds_per_pflop": row([2.0, 1.0, 0.5, nan, nan, nan]),
           }}
    (m / "bbbbbbbb-e.json").write_text(json.dumps(res))
    (ds,) = load_inputs([str(tmp_path / "results")])
    assert "machine h200 (NVIDIA H200), commit bbbbbbbb" == ds.device
    pts = {(p.backend, p.seq_len): p for p in ds.points}
    assert set(pts) == {("fa3-fp8", 128), ("fa3-fp8", 256), ("aiter-emulated", 128), ("aiter-emulated", 256)}
    assert pts[("fa3-fp8", 256)].tflops == pytest.approx(1000.0)  # 1 s/PFLOP = 1000 TFLOP/s
    assert pts[("aiter-emulated", 128)].emulation and pts[("aiter-emulated", 128)].tflops is None
    assert any("ragged-4096x4: failed in asv" in n for n in ds.notes)  # null = failed
    assert math.isclose(pts[("fa3-fp8", 128)].latency_q25, 0.9e-5)
    # the newest commit is picked; --commit selects another, an unknown one is named
    assert main(["plot", str(tmp_path / "results"), "--out", str(tmp_path / "img"), "--format", "png"]) == 0
    assert main(["plot", str(tmp_path / "results"), "--commit", "cafe", "--out", str(tmp_path / "img")]) == 2


def test_asv_results_with_the_emulation_on_its_own_track(tmp_path):
    """As the suite stores it: an emulation's track_latency is n/a (skipped, NaN) and its host time is
    track_emulation_latency; its points are drawn (on the emulation axis) with its errors."""
    m = tmp_path / "results" / "cpu"
    m.mkdir(parents=True)
    (m / "machine.json").write_text(json.dumps({"machine": "cpu", "cpu": "x86_64", "version": 1}))
    cols = ["result", "params", "version", "started_at", "duration"]
    nan = float("nan")

    def row(vals):
        return [vals, [["'torch-sdpa-bf16'", "'aiter-emulated'"], ["'s128'", "'s256'"]], "v1", 1, 1.0]

    res = {"commit_hash": "c" * 40, "env_name": "e", "date": 2, "params": {"machine": "cpu"}, "python": "3.11",
           "requirements": {}, "env_vars": {}, "result_columns": cols, "durations": {}, "version": 2, "results": {
               "bench_mla_prefill.MLAPrefill.track_latency": row([1e-3, 2e-3, nan, nan]),
               "bench_mla_prefill.MLAPrefill.track_emulation_latency": row([nan, nan, 0.3, 0.6]),
               "bench_mla_prefill.MLAPrefill.track_max_abs_error": row([0.01, 0.01, 0.04, 0.05]),
               "bench_mla_prefill.MLAPrefill.track_max_abs_error_bf16_ref": row([0.02, 0.02, 0.2, 0.3]),
           }}
    (m / "cccccccc-e.json").write_text(json.dumps(res))
    (ds,) = load_inputs([str(tmp_path / "results")])
    pts = {(p.backend, p.seq_len): p for p in ds.points}
    assert set(pts) == {(b, s) for b in ("torch-sdpa-bf16", "aiter-emulated") for s in (128, 256)}
    emu = pts[("aiter-emulated", 256)]
    assert emu.emulation and emu.latency_s == 0.6 and emu.err_fp8 == 0.05 and emu.err_bf16 == 0.3
    assert not pts[("torch-sdpa-bf16", 128)].emulation and pts[("torch-sdpa-bf16", 128)].latency_s == 1e-3


def test_variant_selection(tmp_path):
    recs = [_rec("fa3-fp8", f"s{s}-h128", 1e-5, 0.05, 0.2, 1.0) for s in (128, 256)]
    p = tmp_path / "v.json"
    p.write_text(json.dumps({"env": {"device_name": "NVIDIA H200", "arch": "sm_90"}, "records": recs}))
    (ds,) = load_inputs([str(p)])
    assert ds.variant == "-h128" and len(ds.points) == 2  # no plain ids: the variant present is used
    with pytest.raises(ValueError, match="case variant '-cast' has no single-sequence results"):
        load_inputs([str(p)], variant="-cast")


# ------------------------------------------------------------------ axes: kernel vs emulation latency
def test_kernel_and_emulation_latency_never_share_an_axis(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mla_fp8_bench.report.plot import backend_styles, draw_latency, latency_scopes

    (ds,) = load_inputs([str(_run_json(tmp_path))])
    assert latency_scopes(ds) == ["kernel", "emulation"]
    st = backend_styles([p.backend for p in ds.points])
    want = {"kernel": ("fa3-fp8", 1e-5), "emulation": ("aiter-emulated", 1e-1)}  # latency = scale * s / 128
    for scope, (backend, scale) in want.items():
        fig, ax = plt.subplots()
        assert draw_latency(ax, ds, st, scope) == [backend]
        ys = [float(y) for line in ax.get_lines() for y in line.get_ydata()]  # medians and IQR caps
        medians = [scale * s / 128 for s in (128, 256, 257, 512)]
        assert all(any(math.isclose(m, y, rel_tol=1e-9) for y in ys) for m in medians)
        assert scale * 0.9 * 0.999 <= min(ys) and max(ys) <= scale * 4 * 1.2 * 1.001  # nothing of the other scope
        plt.close(fig)
    written, _ = plot([str(_run_json(tmp_path))], tmp_path / "img", formats=("svg",))
    lat = next(p for p in written if p.name.endswith("-latency.svg")).read_text()
    assert "EMULATION latency vs seq_len" in lat and "Latency vs seq_len" in lat


def test_only_kernel_backends_give_one_latency_panel(tmp_path):
    from mla_fp8_bench.report.plot import latency_scopes

    recs = [_rec("fa3-fp8", f"s{s}", 1e-5, 0.05, 0.2, 1.0) for s in (128, 256)]
    p = tmp_path / "k.json"
    p.write_text(json.dumps({"env": {"device_name": "NVIDIA H200", "arch": "sm_90"}, "records": recs}))
    (ds,) = load_inputs([str(p)])
    assert latency_scopes(ds) == ["kernel"]
    written, _ = plot([str(p)], tmp_path / "img", formats=("svg",))
    assert "EMULATION latency" not in next(w for w in written if w.name.endswith("-latency.svg")).read_text()


def test_variant_title_from_the_case_grammar(tmp_path):
    from mla_fp8_bench.problem.shapes import DEFAULT_NUM_HEADS

    recs = [_rec("fa3-fp8", f"s{s}-h128-cast", 1e-5, 0.05, 0.2, 1.0) for s in (128, 256)]
    p = tmp_path / "v.json"
    p.write_text(json.dumps({"env": {"device_name": "NVIDIA H200", "arch": "sm_90"}, "records": recs}))
    written, (ds,) = plot([str(p)], tmp_path / "img", formats=("svg",))
    assert ds.variant == "-h128-cast"
    svg = next(w for w in written if w.name.endswith("-error.svg")).read_text()
    assert "128 heads" in svg and "cast quant" in svg
    written, _ = plot([str(_run_json(tmp_path))], tmp_path / "img2", formats=("svg",))
    svg = next(w for w in written if w.name.endswith("-error.svg")).read_text()
    assert f"{DEFAULT_NUM_HEADS} heads" in svg and "per-tensor fp8" in svg


def test_unrecognised_case_id_is_named(tmp_path, capsys):
    recs = [_rec("fa3-fp8", f"s{s}", 1e-5, 0.05, 0.2, 1.0) for s in (128, 256)]
    recs.append(_rec("fa3-fp8", "s0128", 1e-5, 0.05, 0.2, 1.0))  # not canonical
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"env": {"device_name": "NVIDIA H200", "arch": "sm_90"}, "records": recs}))
    (ds,) = load_inputs([str(p)])
    assert len(ds.points) == 2
    assert any("s0128: case id not recognised" in n for n in ds.notes)


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    assert main(["plot", str(_run_json(tmp_path)), "--out", str(tmp_path / "img")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "`mla-fp8-bench plot` needs matplotlib" in out and "install the plot extra (pip install -e '.[plot]')" in out
    assert not (tmp_path / "img").exists() or not any((tmp_path / "img").iterdir())
