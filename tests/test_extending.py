"""docs/extending.md's recipes, done: a throwaway backend and a throwaway metric, each added the way the
page says (one registry line; one metric-table entry), are seen by the registry, the runner, the asv
tracks and the gate without another file touched."""

from __future__ import annotations

import json

import pytest
import torch

from mla_fp8_bench import backends
from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.cli import main
from mla_fp8_bench.harness.asv_tracks import with_tracks
from mla_fp8_bench.harness.runner import RunOptions, evaluate
from mla_fp8_bench.measure import metric_table
from mla_fp8_bench.measure.metric_table import Metric
from mla_fp8_bench.measure.reference import reference_bf16
from mla_fp8_bench.problem.cases import parse_case_id

OFFSET = 0.25  # what the throwaway backend adds to one output element


class _Throwaway(Backend):
    """The bf16 reference with ``OFFSET`` added to element [0, 0, 0], and a count in its extras."""

    name = "throwaway-ref"
    description = "throwaway backend of tests/test_extending.py"
    fp8 = False
    emulation = False

    def availability(self, platform) -> Verdict:
        return Verdict.yes()

    def prepare(self, inputs) -> Prepared:
        def run() -> torch.Tensor:
            out = reference_bf16(inputs, torch.float64)[0].clone()
            out[0, 0, 0] += OFFSET
            return out

        return Prepared(run=run, timing_scope="call", extras={"throwaway_count": 7})


@pytest.fixture
def throwaway_backend(monkeypatch):
    monkeypatch.setitem(backends._REGISTRY, _Throwaway.name, _Throwaway)  # the one registry line
    return _Throwaway.name


def _write(tmp_path, name, records):
    p = tmp_path / name
    p.write_text(json.dumps({"env": {}, "records": records}))
    return str(p)


def test_throwaway_backend(throwaway_backend, tmp_path, capsys):
    assert throwaway_backend in backends.backend_names()
    assert isinstance(backends.get_backend(throwaway_backend), _Throwaway)
    # the CLI lists it
    assert main(["--device", "cpu", "env"]) == 0
    assert throwaway_backend in capsys.readouterr().out
    # the runner measures it against the references
    data = evaluate([throwaway_backend], [parse_case_id("s64-h2")], device="cpu", options=RunOptions(timing=False))
    (rec,) = data["records"]
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["backend"] == throwaway_backend and rec["fp8"] is False
    assert rec["max_abs_error_bf16_ref"] == pytest.approx(OFFSET, abs=1e-6)
    # the gate judges its records: the same record passes, a doubled max-abs error is a regression
    worse = {**rec, "max_abs_error_bf16_ref": 3 * rec["max_abs_error_bf16_ref"],
             "max_abs_error_fp8_ref": 3 * rec["max_abs_error_fp8_ref"]}
    b = _write(tmp_path, "b.json", [rec])
    assert main(["gate", b, _write(tmp_path, "same.json", [rec])]) == 0
    capsys.readouterr()
    assert main(["gate", b, _write(tmp_path, "worse.json", [worse])]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and throwaway_backend in out


def test_throwaway_metric(throwaway_backend, monkeypatch, tmp_path, capsys):
    m = Metric("throwaway", "throwaway_count", "track_throwaway_count", "MLAPrefill", "count", "throwaway count",
               "resource", gate="exact", doc="throwaway metric of tests/test_extending.py")
    monkeypatch.setattr(metric_table, "METRICS", metric_table.METRICS + (m,))  # the one table entry
    # the table knows it by name, record key, track and asv name
    for key in ("throwaway", "throwaway_count", "track_throwaway_count",
                "bench_mla_prefill.MLAPrefill.track_throwaway_count"):
        assert metric_table.metric(key) is m
    # a backend's extras carry it into the record
    data = evaluate([throwaway_backend], [parse_case_id("s64-h2")], device="cpu", options=RunOptions(timing=False))
    (rec,) = data["records"]
    assert m.value(rec) == 7

    # asv: the class decorator generates its track, which reads the record
    class MLAPrefill:
        version = "throwaway-v1"

    with_tracks(MLAPrefill)
    bench = MLAPrefill()
    bench.rec = rec
    assert bench.track_throwaway_count(None) == 7
    assert MLAPrefill.track_throwaway_count.unit == "count"
    # the gate applies its rule (exact: any change is a regression)
    b = _write(tmp_path, "b.json", [rec])
    assert main(["gate", b, _write(tmp_path, "same.json", [rec])]) == 0
    capsys.readouterr()
    assert main(["gate", b, _write(tmp_path, "moved.json", [{**rec, "throwaway_count": 8}])]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "throwaway_count" in out
