"""Runner isolation, JSON records and the CLI's handling of bad input (CPU)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mla_fp8_bench import backends
from mla_fp8_bench.backends import Backend, Prepared, Verdict
from mla_fp8_bench.cli import main
from mla_fp8_bench.harness.runner import RECORD_KEYS, RunOptions, evaluate
from mla_fp8_bench.jsonio import write_json_atomic
from mla_fp8_bench.problem.cases import resolve_cases


class _Boom(Backend):
    name = "test-boom"
    description = "raises in run()"

    def availability(self, platform):
        return Verdict.yes()

    def prepare(self, inputs):
        def run():
            raise RuntimeError("kernel exploded")
        return Prepared(run=run)


class _Missing(Backend):
    name = "test-missing"
    description = "never available"

    def availability(self, platform):
        return Verdict.no("needs a device this machine does not have")

    def prepare(self, inputs):  # pragma: no cover - never called
        raise AssertionError


class _Restores(Backend):
    """Sets a global 'workspace locked' flag in prepare; run() fails on long cases; cleanup must reset it."""

    name = "test-restores"
    description = "sets global state, fails on long cases"
    state = {"locked": False}

    def availability(self, platform):
        return Verdict.yes()

    def prepare(self, inputs):
        type(self).state["locked"] = True
        too_long = inputs.case.total_tokens > 40
        out = torch.nn.functional.scaled_dot_product_attention(
            inputs.q.transpose(0, 1).float(), inputs.k.transpose(0, 1).float(), inputs.v.transpose(0, 1).float(),
            is_causal=True, scale=inputs.softmax_scale).transpose(0, 1).bfloat16()

        def cleanup():
            type(self).state["locked"] = False
        def run():
            if too_long:
                raise ValueError("too long for this fake")
            return out
        return Prepared(run=run, cleanup=cleanup)


@pytest.fixture(autouse=True)
def _fakes(monkeypatch):
    for cls in (_Boom, _Missing, _Restores):
        monkeypatch.setitem(backends._REGISTRY, cls.name, cls)


def test_failing_backend_loses_no_other_result():
    cases = resolve_cases(["s32-h2", "s64-h2"])
    data = evaluate(["test-boom", "torch-sdpa-bf16", "test-missing", "test-restores"], cases,
                    device="cpu", options=RunOptions(samples=3, time_budget_s=0.5))
    recs = {(r["backend"], r["case"]): r for r in data["records"]}
    assert len(recs) == 8
    for cid in ("s32-h2", "s64-h2"):
        boom = recs[("test-boom", cid)]
        assert boom["status"] == "error" and "kernel exploded" in boom["reason"]
        ok = recs[("torch-sdpa-bf16", cid)]
        assert ok["status"] == "ok" and ok["latency_s"] > 0 and len(ok["latency_samples_s"]) >= 3
        assert 0 < ok["max_abs_error_bf16_ref"] < 0.05  # bf16 output rounding only
        miss = recs[("test-missing", cid)]
        assert miss["status"] == "skipped" and "does not have" in miss["reason"]
        for k in RECORD_KEYS:
            assert k in ok
        assert (ok["fp8"], ok["emulation"], ok["timing_scope"]) == (False, False, "call")  # bf16 SDPA on CPU
    assert recs[("test-restores", "s32-h2")]["status"] == "ok"
    assert recs[("test-restores", "s64-h2")]["status"] == "error"
    assert _Restores.state["locked"] is False  # cleanup ran in finally even on failure


def test_record_traits_fall_back_to_the_backend_for_old_records():
    from mla_fp8_bench.backends import record_is_fp8
    from mla_fp8_bench.measure.metric_table import record_is_emulation

    assert record_is_fp8({"backend": "fa3-bf16"}) is False and record_is_fp8({"backend": "fa3-fp8"}) is True
    assert record_is_fp8({"backend": "fa3-bf16", "fp8": True}) is True  # the record's own field wins
    assert record_is_fp8({"backend": "not-registered"}) is None
    assert record_is_emulation({"backend": "torch-fp8-ref", "timing_scope": "emulation"})
    assert not record_is_emulation({"backend": "aiter-emulated", "timing_scope": "kernel", "emulation": False})


def test_json_written_atomically(tmp_path):
    path = tmp_path / "run.json"
    write_json_atomic({"a": 1}, path)

    class Unserialisable:
        pass

    with pytest.raises(TypeError):
        write_json_atomic({"a": Unserialisable()}, path)
    assert json.loads(path.read_text()) == {"a": 1}  # the earlier file survived the failed write
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temp files left


@pytest.mark.parametrize("argv,needle", [
    (["run", "-b", "nope", "-c", "s8"], "backend 'nope' is unknown: allowed"),
    (["run", "-b", "torch-sdpa-bf16", "-c", "s0"], "seq_len 0"),
    (["run", "-b", "torch-sdpa-bf16", "-c", "ragged-"], "empty batch"),
    (["run", "-b", "torch-sdpa-bf16", "-c", "s8-h0"], "num_heads 0"),
    (["--device", "hip", "env"], "'hip' is not a torch tensor device"),
    (["--device", "tpu", "env"], "device 'tpu'"),
    (["--device", "cuda:0", "env"], "no CUDA/ROCm GPU is available"),
])
def test_cli_bad_input_exits_2_with_a_clear_line(argv, needle, capsys):
    assert main(argv) == 2
    out = capsys.readouterr().out.replace("\n", " ")
    assert "error:" in out and needle in " ".join(out.split())
    assert "Traceback" not in out


def test_cli_run_writes_records(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["run", "-b", "torch-sdpa-bf16,torch-fp8-ref", "-c", "s16-h2", "--samples", "3",
                 "--time-budget", "0.2", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert {r["backend"] for r in data["records"]} == {"torch-sdpa-bf16", "torch-fp8-ref"}
    assert all(r["status"] == "ok" for r in data["records"])
    assert data["env"]["vendor"] == "cpu" and data["env"]["fp8_dtype"] == "float8_e4m3fn"


def test_cli_env_reports_backends(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "torch-sdpa-bf16" in out and "aiter" in out


# ------------------------------------------------- what a run measures, how long it may take, where it goes
RUN_CPU = ["--device", "cpu", "run", "--no-timing", "-b", "torch-fp8-ref"]


def _no_inputs(monkeypatch):
    """Fail any measurement (a refusal must come before the first input is built)."""
    from mla_fp8_bench.harness import runner

    def boom(*a, **k):
        raise AssertionError("inputs were built before the run was refused")

    monkeypatch.setattr(runner, "make_inputs", boom)


def test_a_run_file_measured_on_another_machine_is_kept(tmp_path, capsys):
    """The same (backend, case) pairs measured on another host are not replaced: the run goes beside them."""
    out = tmp_path / "r.json"
    assert main([*RUN_CPU, "-c", "s16-h2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    doc["env"]["hostname"] = "another-host"
    out.write_text(json.dumps(doc))
    before = out.read_bytes()
    capsys.readouterr()
    assert main([*RUN_CPU, "-c", "s16-h2", "--json", str(out)]) == 0
    assert out.read_bytes() == before
    assert [r["case"] for r in json.loads((tmp_path / "r.new.json").read_text())["records"]] == ["s16-h2"]
    err = " ".join(capsys.readouterr().err.split())
    assert f"{out} is kept: it was measured on another machine (hostname 'another-host'" in err


def test_a_named_suite_keeps_the_max_seq_len_cap(monkeypatch, capsys):
    from mla_fp8_bench.harness import runner

    seen: list[str] = []

    def fake(names, cases, **kw):
        seen.extend(c.id for c in cases)
        return {"env": {"device_name": "cpu", "arch": "cpu"}, "records": []}

    monkeypatch.setattr(runner, "evaluate", fake)
    assert main([*RUN_CPU, "-c", "sweep,ctx1024-q256", "--max-seq-len", "128"]) == 0
    assert seen == ["s128"]
    assert "leaves out 9 case(s): s256, s512" in " ".join(capsys.readouterr().out.split())
    assert main([*RUN_CPU, "-c", "s256,ctx1024-q256", "--max-seq-len", "128"]) == 2
    assert "--max-seq-len 128 leaves none of the cases asked for (s256, ctx1024-q256)" in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    ["--samples", "1000000", "--time-budget", "1e9", "-c", "s128"],  # the default backends, timed
    ["--no-timing", "-c", "ragged-1x1048576-h1"],  # 1048576 sequences of one token: the emulator's per-sequence work
], ids=["samples", "case"])
def test_a_run_of_hours_is_refused_before_any_work(monkeypatch, capsys, args):
    _no_inputs(monkeypatch)
    assert main(["--device", "cpu", "run", *args]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "error: this run would take at least" in out and "more than 1 h" in out and "--allow-long" in out


def test_allow_long_starts_a_run_expected_to_take_hours(monkeypatch, tmp_path):
    from mla_fp8_bench.harness import runner

    monkeypatch.setattr(runner, "_RATE", {"cpu": 1e2, "cuda": 1e2})  # s16-h2: 1638 s a call, 4 calls
    assert main([*RUN_CPU, "-c", "s16-h2"]) == 2
    assert main([*RUN_CPU, "-c", "s16-h2", "--allow-long", "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["records"][0]["status"] == "ok"


def test_expected_seconds_counts_references_calls_and_samples():
    from mla_fp8_bench.harness.runner import expected_seconds
    from mla_fp8_bench.problem.cases import parse_case_id

    sdpa, emu = backends.get_backend("torch-sdpa-bf16"), backends.get_backend("aiter-emulated")
    case = parse_case_id("s1024")  # 2 * 16 heads * 320 * 1024^2 / 2 FLOPs = 5.37e9: 0.0537 s at 1e11 FLOP/s
    call = 2 * 16 * 320 * 1024 ** 2 / 2 / 1e11
    opts = RunOptions(samples=10, time_budget_s=0.2)
    assert expected_seconds([(sdpa, case)], "cpu", opts) == pytest.approx(2 * call + 2 * call + 0.2)
    tiny = parse_case_id("s16-h2")  # calls at their floor: 1e-4 s, an emulation's 1e-2 s on a CPU
    assert expected_seconds([(emu, tiny)], "cpu", RunOptions(samples=5)) == pytest.approx(2 * 1e-4 + 7 * 1e-2)
    many = parse_case_id("ragged-1x1000-h1")  # 1000 sequences: at least 2e-5 s each, 2e-3 s in an emulation
    assert expected_seconds([(sdpa, many), (emu, many)], "cpu", RunOptions(timing=False)) == pytest.approx(
        2 * 0.02 + 2 * 0.02 + 2 * 2.0)


def test_a_run_json_inside_an_asv_results_directory_is_refused(tmp_path, monkeypatch, capsys):
    _no_inputs(monkeypatch)
    mdir = tmp_path / "results" / "m"
    mdir.mkdir(parents=True)
    (mdir / "machine.json").write_text('{"machine": "m", "version": 1}')
    assert main([*RUN_CPU, "-c", "s16-h2", "--json", str(mdir / "r.json")]) == 2
    assert "lies in an asv results directory" in " ".join(capsys.readouterr().out.split())
    assert sorted(p.name for p in mdir.iterdir()) == ["machine.json"]


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """Reading a FIFO would block until a writer comes: the reader opens it without blocking and refuses it."""
    import subprocess
    import sys
    from pathlib import Path

    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    code = ("import sys; from mla_fp8_bench.jsonio import load_json\ntry:\n load_json(sys.argv[1], 'run JSON')\n"
            "except ValueError as e:\n print(e)")
    p = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.stdout.strip() == f"cannot read run JSON {fifo}: it is not a regular file"


def test_sampling_longer_than_a_user_waits_is_refused_once_a_call_is_timed(monkeypatch):
    """The start-of-run estimate is a lower bound; once the first call is timed, sampling expected past the
    limit (samples x that call, within the budget) is an error record that says so, not hours of silence."""
    import time

    from mla_fp8_bench.harness import runner

    class Slow(Backend):
        name, description = "test-slow", "sleeps 20 ms a call"

        def availability(self, platform):
            return Verdict.yes()

        def prepare(self, inputs):
            def run():
                time.sleep(0.02)
                return torch.zeros(inputs.q.shape[0], inputs.q.shape[1], 128, dtype=torch.float32)
            return Prepared(run=run, graph_capturable=False)

    monkeypatch.setitem(backends._REGISTRY, "test-slow", Slow)
    monkeypatch.setattr(runner, "check_duration", lambda *a: None)  # past the start-of-run lower bound
    opts = RunOptions(samples=1_000_000, time_budget_s=1e9)
    (rec,) = evaluate(["test-slow"], resolve_cases(["s16"]), device="cpu", options=opts)["records"]
    assert rec["status"] == "error" and "latency sampling would take about" in rec["reason"]
    hours = float(rec["reason"].split("about ")[1].split(" h")[0])
    assert hours >= 1_000_000 * 0.02 / 3600 - 0.05  # at least samples x the 20 ms call
