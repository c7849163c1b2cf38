"""Runner isolation, JSON records and the CLI's handling of bad input (CPU)."""

from __future__ import annotations

import json

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
