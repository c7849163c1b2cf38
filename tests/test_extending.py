"""docs/extending.md's recipes, done: a throwaway backend, metric and case kind, each added the way the
page says (one registry line; one metric-table entry; one ``KINDS`` entry), are seen by the registry,
the runner, the asv tracks, the gate, inputs, references and metrics without another file touched.
The case kind's expected values come from a plain softmax written here, not from the suite."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mla_fp8_bench import backends
from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.cli import main
from mla_fp8_bench.harness.asv_tracks import with_tracks
from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate, evaluate_one
from mla_fp8_bench.measure import metric_table
from mla_fp8_bench.measure.devices import platform_info
from mla_fp8_bench.measure.metric_table import Metric
from mla_fp8_bench.measure.reference import reference_bf16, reference_fp8_dequant
from mla_fp8_bench.problem import cases
from mla_fp8_bench.problem.cases import Case, CaseError, CaseKind, parse_case_id
from mla_fp8_bench.problem.flops import case_flops
from mla_fp8_bench.problem.inputs import make_inputs
from mla_fp8_bench.problem.shapes import QK_HEAD_DIM, V_HEAD_DIM

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
    # the asv grid takes it as a param, after the published ones (whose order never changes)
    from mla_fp8_bench.harness.asv_support import asv_backends

    grid = asv_backends()
    assert grid[-1] == throwaway_backend and grid[:len(backends.DEFAULT_BACKENDS)] == backends.DEFAULT_BACKENDS
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


# ------------------------------------------------------------------ a case kind
CPU = platform_info("cpu")


@pytest.fixture
def bidir(monkeypatch):
    """An encoder-style kind: q_len == kv_len, every query sees every key of its sequence."""
    kind = CaseKind("bidir", context=False, causal=False, id_lead="bidir")
    monkeypatch.setitem(cases.KINDS, kind.name, kind)
    return kind


def _softmax_attention(q, k, v, lens, scale):
    """Full (non-causal) attention per sequence in float64: the independent reference."""
    out, lse, s0 = [], [], 0
    for n in lens:
        qb, kb, vb = (x[s0:s0 + n].double().transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        scores = qb @ kb.transpose(1, 2) * scale
        out.append((torch.softmax(scores, -1) @ vb).transpose(0, 1))
        lse.append(torch.logsumexp(scores, -1).transpose(0, 1))
        s0 += n
    return torch.cat(out), torch.cat(lse)


def test_throwaway_case_kind_ids(bidir):
    c = parse_case_id("bidir-ragged-17-23-h2-seed3")
    assert (c.family, c.kind, c.seq_lens, c.kv_lens, c.num_heads, c.seed) == ("bidir", bidir, (17, 23), (17, 23), 2, 3)
    assert c.id == "bidir-ragged-17-23-h2-seed3" and parse_case_id("bidir-s40").seq_lens == (40,)
    assert parse_case_id("s40").family == "prefill" and parse_case_id("ctx9-q4").family == "ctx"  # ids unchanged
    assert c.cu_seqlens() == [0, 17, 40] and c.causal is False
    with pytest.raises(CaseError, match="given for a bidir case"):
        Case((5,), context_lens=(3,), family="bidir")


def test_throwaway_case_kind(bidir):
    case = parse_case_id("bidir-ragged-17-23-h2")
    inputs = make_inputs(case, "cpu")
    assert inputs.causal is False and inputs.cu_seqlens.tolist() == [0, 17, 40]
    q, k, v = inputs.dequantized(torch.float64)
    want_out, want_lse = _softmax_attention(q, k, v, case.seq_lens, inputs.softmax_scale)
    ref_out, ref_lse = reference_fp8_dequant(inputs)
    torch.testing.assert_close(ref_out, want_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref_lse, want_lse, rtol=0, atol=1e-12)
    causal = reference_fp8_dequant(make_inputs(dataclasses.replace(case, family="prefill"), "cpu"))[0]
    assert (causal - want_out).abs().max() > 0.1  # the kind's mask is what the reference applied

    backend = backends.get_backend("torch-fp8-ref")
    assert backend.supports_kind(bidir)
    out = backend.prepare_case(inputs).run()
    torch.testing.assert_close(out.double(), want_out, rtol=2**-8, atol=1e-5)  # fp32 SDPA, bf16 output

    rec = evaluate_one(backend, CaseData(case, CPU, None), CPU, RunOptions(timing=False, determinism=False)).as_dict()
    assert rec["status"] == "ok", rec["reason"]
    assert rec["max_abs_error_fp8_ref"] == pytest.approx(float((out.double() - want_out).abs().max()), abs=1e-12)
    assert rec["lse_rows_checked"] == 40 and rec["lse_rel_error_fp8_ref"] < 1e-6
    assert rec["flops"] == 2 * 2 * (QK_HEAD_DIM + V_HEAD_DIM) * (17 * 17 + 23 * 23)  # every (q, k) pair
    assert case_flops(case) == rec["flops"]


def test_throwaway_case_kind_on_a_backend_without_context_chunks(bidir):
    vllm = backends.get_backend("vllm-aiter")
    assert vllm.supports_kind(bidir) and not vllm.supports_kind(cases.KINDS["ctx"])
    assert "#52356" in vllm.supports_kind(cases.KINDS["prefix"]).reason


def test_no_library_module_compares_a_case_kind_by_name():
    """Consumers ask ``case.kind``; only the grammar's own table (``KINDS``) spells the names."""
    import ast
    from pathlib import Path

    names = set(cases.KINDS)

    def names_a_kind(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(names_a_kind(e) for e in node.elts)

    bad = []
    for path in sorted(Path(cases.__file__).parents[1].rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(map(names_a_kind, [node.left, *node.comparators])):
                bad.append(f"{path.name}:{node.lineno}")
    assert not bad, f"comparisons with a case kind's name: {bad}"


def test_no_library_module_tells_emulation_or_fp8_from_a_name():
    """Emulation and fp8-ness come from the record (or the backend object), never from a substring of a
    backend's name."""
    import ast
    import re
    from pathlib import Path

    fragments = {"emulat", "emulated", "emulation", "fp8", "bf16"}
    bad = []
    for path in sorted(Path(cases.__file__).parents[1].rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
                    and node.left.value in fragments and isinstance(node.ops[0], (ast.In, ast.NotIn))
                    and re.search(r"backend|\bname\b|^b$", ast.unparse(node.comparators[0]))):
                bad.append(f"{path.name}:{node.lineno}")
    assert not bad, f"name-substring tests: {bad}"


def test_the_registry_traits_are_the_backends_own():
    """The asv grid reads PLAN_BACKENDS / EMULATION_BACKENDS without importing every backend: each must say
    what the backend class itself says (a ``plan_stats`` method, ``emulation``)."""
    for name in backends.backend_names():
        cls = type(backends.get_backend(name))
        assert callable(getattr(cls, "plan_stats", None)) == (name in backends.PLAN_BACKENDS), name
        assert bool(cls.emulation) == (name in backends.EMULATION_BACKENDS), name
