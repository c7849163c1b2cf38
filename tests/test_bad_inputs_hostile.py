"""Bad-input catalogue, sections V to Z (docs/robustness.md): what fails inside an asv run never replaces
a stored value (V), writes that cannot hurt (W), a gate that cannot be fooled (X), inputs checked before
long work (Y), file systems that are full, read-only or size-limited (Z)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main

KEYS = [("torch-fp8-ref", "s128"), ("torch-fp8-ref", "s256")]


# ============================================================================ V. stored asv values
def _result_file(path: Path, value: float | None = 0.25) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    row = [[value, float("nan")], [["'torch-fp8-ref'"], ["'s128'", "'s256'"]], "mla-prefill-v1"]
    path.write_text(json.dumps({"version": 2, "commit_hash": "ab" * 20, "env_name": "virtualenv-py3.11",
                                "date": 0, "params": {"machine": path.parent.name},
                                "result_columns": ["result", "params", "version"],
                                "results": {"bench_mla_prefill.MLAPrefill.track_max_abs_error": row}}))


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """An asv context (ASV_* variables) whose stored file holds max_abs_error 0.25 for torch-fp8-ref s128."""
    for k in ("MLA_FP8_BENCH_MACHINE", "MLA_FP8_BENCH_EXPECT_COMMIT", "MLA_FP8_BENCH_BACKENDS", "MLA_FP8_BENCH_CASES",
              "MLA_FP8_BENCH_MAX_TOKENS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ASV_CONF_DIR", str(tmp_path))
    monkeypatch.setenv("ASV_ENV_NAME", "virtualenv-py3.11")
    monkeypatch.setenv("ASV_COMMIT", "ab" * 20)
    (tmp_path / "asv.conf.json").write_text('{"results_dir": "res"}\n')
    _result_file(tmp_path / "res" / "m1" / f"{'ab' * 4}-virtualenv-py3.11.json")
    return tmp_path


def test_setup_cache_that_raises_keeps_the_stored_values(stored):
    """asv stores a setup_cache exception as null over every param: the guarded setup_cache never raises;
    a param with a stored value keeps it, the others fail naming the reason."""
    from mla_fp8_bench.harness import asv_support

    def boom(version):
        raise RuntimeError("device lost")

    cache = asv_support.never_raising(boom, "MLAPrefill", ([k[0] for k in KEYS[:1]], [k[1] for k in KEYS]),
                                      "mla-prefill-v1")
    rec = asv_support.lookup(cache, "torch-fp8-ref", "s128")
    assert rec["max_abs_error_fp8_ref"] == 0.25
    with pytest.raises(RuntimeError, match="device lost"):
        asv_support.lookup(cache, "torch-fp8-ref", "s256")  # nothing stored: a failure with the reason


def test_a_failing_backend_keeps_the_value_stored_for_this_commit(stored, monkeypatch):
    from mla_fp8_bench.harness import asv_support

    monkeypatch.setenv("MLA_FP8_BENCH_DEVICE", "cpu")
    monkeypatch.setenv("MLA_FP8_BENCH_BACKENDS", "torch-fp8-ref")
    monkeypatch.setenv("MLA_FP8_BENCH_CASES", "s128")

    def evaluate(backends, cases, **kw):
        return {"env": {}, "records": [{"backend": "torch-fp8-ref", "case": "s128", "status": "error",
                                        "reason": "CUDA error: an illegal memory access"}]}

    monkeypatch.setattr("mla_fp8_bench.harness.runner.evaluate", evaluate)
    monkeypatch.setattr("mla_fp8_bench.measure.ceilings.attach", lambda data: None)
    cache = asv_support.measure_grid("mla-prefill-v1")
    rec = asv_support.lookup(cache, "torch-fp8-ref", "s128")
    assert rec["max_abs_error_fp8_ref"] == 0.25 and "illegal memory access" in rec["reason"]


@pytest.mark.parametrize("env,argv,needle", [
    ({"MLA_FP8_BENCH_MACHINE": "box-a"}, ["asv", "run", "--machine", "box-b"], "MLA_FP8_BENCH_MACHINE=box-a but"),
    ({"MLA_FP8_BENCH_MACHINE": "box-a"}, ["asv", "run", "--machine=box-b"], "asv run --machine box-b"),
    ({"MLA_FP8_BENCH_EXPECT_COMMIT": "abcdef12"}, ["asv", "run", "--set-commit-hash", "1234567890"],
     "but asv run --set-commit-hash 1234567890"),
    ({"MLA_FP8_BENCH_EXPECT_COMMIT": "abcdef12", "ASV_COMMIT": "99" * 20}, ["asv", "run"], "but ASV_COMMIT"),
])
def test_overrides_that_contradict_asv_are_refused(monkeypatch, env, argv, needle):
    from mla_fp8_bench.harness.asv_guard import AsvRunRefused, check_overrides

    monkeypatch.delenv("ASV_COMMIT", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(AsvRunRefused, match=needle):
        check_overrides(argv)


def test_overrides_that_agree_with_asv_pass(monkeypatch):
    from mla_fp8_bench.harness.asv_guard import check_overrides

    monkeypatch.setenv("MLA_FP8_BENCH_MACHINE", "box-a")
    monkeypatch.setenv("MLA_FP8_BENCH_EXPECT_COMMIT", "abcdef12")
    monkeypatch.delenv("ASV_COMMIT", raising=False)
    check_overrides(["asv", "run", "--machine", "box-a", "--set-commit-hash", "abcdef1234567890"])


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
    """BASE accuracy NaN, HEAD 0.75 (50x the usual error): INVALID, exit 1 (was: not comparable, passed)."""
    b = _doc(tmp_path, "b.json", [_rec(max_abs_error_fp8_ref=float("nan"))])
    h = _doc(tmp_path, "h.json", [_rec(seed=1, max_abs_error_fp8_ref=0.75)])
    assert main(["gate", b, h]) == 1
    out = capsys.readouterr().out
    assert "INVALID: fa3-fp8 s1024 max_abs_error_fp8_ref" in out and "non-finite value nan on BASE" in out


def test_nan_latency_on_base_does_not_hide_a_10x_slower_head(tmp_path, capsys):
    base = _rec()
    base["latency_samples_s"] = [float("nan")] * 30
    base["latency_s"] = float("nan")
    b = _doc(tmp_path, "b.json", [base])
    h = _doc(tmp_path, "h.json", [_rec(seed=1, latency=1e-3)])
    assert main(["gate", b, h]) == 1
    assert "INVALID: fa3-fp8 s1024 latency_s" in capsys.readouterr().out


def test_duplicate_head_records_are_ambiguous_and_fail(tmp_path, capsys):
    """An error record followed by an ok one of the same (backend, case): the last no longer wins."""
    b = _doc(tmp_path, "b.json", [_rec()])
    h = _doc(tmp_path, "h.json", [_rec(status="error"), _rec(seed=1)])
    assert main(["gate", b, h]) == 1
    out = capsys.readouterr().out
    assert "AMBIGUOUS: fa3-fp8 s1024" in out and "2 different records" in out


def test_duplicate_base_records_are_ambiguous_and_fail(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec(latency=1e-3), _rec()])
    h = _doc(tmp_path, "h.json", [_rec(seed=1, latency=1e-3)])
    assert main(["gate", b, h]) == 1
    assert "AMBIGUOUS: fa3-fp8 s1024" in capsys.readouterr().out


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
    assert "NOTHING COMPARED" in out and "0 (backend, case, metric) value(s) compared" in out


def test_the_same_file_twice_is_named_and_fails(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec()])
    assert main(["gate", b, b]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "NOTHING COMPARED" in out and "are the same file" in out


def test_base_newer_than_head_is_named(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec()], time_utc="2026-11-30T10:00:00+00:00")
    h = _doc(tmp_path, "h.json", [_rec(seed=1)], time_utc="2026-11-01T10:00:00+00:00")
    assert main(["gate", b, h]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "BASE is newer than HEAD" in out and "swapped" in out


def test_every_verdict_says_what_was_compared(tmp_path, capsys):
    b = _doc(tmp_path, "b.json", [_rec(), _rec(case="s2048")])
    h = _doc(tmp_path, "h.json", [_rec(seed=1), _rec(case="s2048", seed=1)])
    assert main(["gate", b, h]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"GATE PASSED: BASE {b} vs HEAD {h}: 6 (backend, case, metric) value(s) compared" in out
    assert main(["gate", b, h, "--format", "markdown"]) == 0
    assert "**GATE PASSED** (6 value(s) compared)" in capsys.readouterr().out
