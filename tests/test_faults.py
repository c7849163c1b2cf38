"""Every injected fault is flagged by the accuracy check with the calibrated tolerances; the healthy path
raises no alarm over >= 20 fresh seeds (CPU, a few minutes on 2 cores).

Tolerances: ``tolerances/cpu-emulated-v1.json`` (``mla-fp8-bench calibrate``: max over seeds 0..19 x 2.0).
Fault cases: the default calibration shapes (per_tensor/normal, seed 0) cheapest first, stopping at the
first flagged one; ``unsaturated_cast`` needs ``s257-cast-outlier``; ``top_left_causal`` and
``lse_no_max_subtraction`` cannot show on q_len == kv_len prefill inputs and are checked on their probes;
the prefix-cached-prefill faults (``PREFIX_FAULT_CASES``) are tried on context-chunk and prefix cases
(see :mod:`support.faults`). The full per-case numbers are in docs/regressions.md
(``python -m tests.support.faults --seeds 0,1,2``).

The faults ``calibrate`` injects around a backend's real calls (``FaultyBackend``: a doubled q descale, an
unmerged reduce group, an exp2 LSE merge, a dropped context chunk) are checked on hand values and through
``calibrate`` itself on the CPU, the code path a GPU runs; so are the refusals of a tolerance file that failed
its validation, that is not a regular file, or that calibrate would replace, and a clean A/A on tiny cases.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from mla_fp8_bench.analysis.calibrate import MIN_SEEDS
from mla_fp8_bench.analysis.tolerances import check, load_tolerances

from support.emulator_faults import ALL_FAULTS
from support.faults import (
    INPUT_FAULTS,
    PREFIX_FAULT_CASES,
    PROBE_ONLY_FAULTS,
    SUITE_FAULTS,
    FaultyEmulated,
    fault_report,
    prepare_one_call_prefix,
    previous_step_lens,
    unsaturated_fp8_cast,
    unsplit_rows,
)

TOL_PATH = Path(__file__).resolve().parents[1] / "tolerances" / "cpu-emulated-v1.json"
HELD_OUT_SEED0 = 2000  # neither calibration (0..19) nor the file's validation seeds (1000..1019)


@pytest.fixture(scope="module")
def tol():
    return load_tolerances(TOL_PATH)


def test_fault_set_covers_emulator_and_input_faults():
    assert set(ALL_FAULTS) | set(INPUT_FAULTS) == set(SUITE_FAULTS)
    assert {"unsaturated_cast", "stale_plan"} <= set(SUITE_FAULTS)
    with pytest.raises(ValueError, match="unknown fault.*allowed"):
        FaultyEmulated(faults="no_such_fault")


@pytest.mark.parametrize("fault", sorted(SUITE_FAULTS))
def test_fault_is_flagged(tol, fault):
    rows = fault_report(tol, seeds=(0,), faults=[fault], stop_at_first=True)
    flagged = [r for r in rows if r["flagged"]]
    for r in rows:
        print(f"{fault} on {r['case']}: worst {r['worst_metric']} = {r['worst_value']} vs tolerance "
              f"{r['worst_tolerance']} ({r['worst_ratio']:.3g}x) flagged={r['flagged']}")
    assert flagged, f"{fault} was not flagged on any case: {rows}"
    if fault in PROBE_ONLY_FAULTS:
        assert flagged[0]["case"] == PROBE_ONLY_FAULTS[fault]


@pytest.mark.parametrize("fault", sorted(PROBE_ONLY_FAULTS))
def test_probe_only_faults_are_invisible_on_prefill_cases(tol, fault):
    """Documented blind spot: these two need the probes (q_len < kv_len / LSE > 88.7)."""
    rows = fault_report(tol, seeds=(0,), faults=[fault], cases=("s257",))
    assert rows[0]["case"] == PROBE_ONLY_FAULTS[fault]  # the report routes them to the probe


def test_healthy_path_raises_no_alarm_over_fresh_seeds(tol):
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    pinfo = platform_info("cpu")
    opts = RunOptions(timing=False, determinism=False)
    alarms, worst = [], 0.0
    n = 0
    for seed in range(HELD_OUT_SEED0, HELD_OUT_SEED0 + MIN_SEEDS):
        for cid in ("s128", "s128-cast-outlier"):
            case_data = CaseData(dataclasses.replace(parse_case_id(cid), seed=seed), pinfo, None)
            for backend in (FaultyEmulated(), get_backend("torch-fp8-ref")):
                rec = evaluate_one(backend, case_data, pinfo, opts).as_dict()
                alarms += [str(v) for v in check(rec, tol)]
                lim, _ = tol.lookup(rec["backend"], parse_case_id(cid).id)
                worst = max(worst, max(float(rec[m]) / t for m, t in lim.items()))
                n += 1
    print(f"healthy: {n} records over {MIN_SEEDS} fresh seeds, {len(alarms)} alarms, worst value/tolerance {worst:.3f}")
    assert not alarms, alarms


def test_calibration_file_records_zero_held_out_false_alarms_and_every_fault_caught(tol):
    val = tol.data["validation"]
    assert val["passed"] and val["held_out_seeds"] >= MIN_SEEDS and val["false_alarms"] == 0
    for backend in ("aiter-emulated", "torch-fp8-ref"):
        s = val["backends"][backend]
        assert s["records"] >= 20 * 54 and s["false_alarms"] == 0, s["alarms"][:5]
        assert all(f["caught"] == f["injected"] > 0 for f in s["faults"].values()), s["faults"]
    assert set(val["backends"]["aiter-emulated"]["faults"]) == {"q_descale_x2", "drop_reduce_group", "lse_merge_exp2",
                                                                 "drop_context_chunk"}
    assert len(tol.data["seeds"]["calibration"]) >= MIN_SEEDS
    assert tol.data["margin"] == 2.0 and tol.data["method"] == "max_over_seeds_times_margin"


def test_healthy_faulty_backend_equals_aiter_emulated_bit_for_bit():
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    inp = make_inputs(parse_case_id("ragged-255-257-h8"))
    a = get_backend("aiter-emulated").prepare(inp).run()
    b = FaultyEmulated().prepare(inp).run()
    assert a.view(-1).view(dtype=a.dtype).equal(b.view(-1))


def test_unsaturated_cast_turns_out_of_range_values_into_nan():
    import torch

    x = torch.tensor([1.0, 448.0, 464.0, 465.0, -700.0, 300.0])
    y = unsaturated_fp8_cast(x).float()
    assert y[:3].tolist() == [1.0, 448.0, 448.0]  # 464 is a tie that rounds to the even 448
    assert math.isnan(y[3]) and math.isnan(y[4]) and y[5] == 288.0


def test_previous_step_lens():
    assert previous_step_lens((255, 257)) == (319, 193)
    assert previous_step_lens((4096, 4096)) == (4160, 4032)
    assert previous_step_lens((512,)) == (384,)
    assert previous_step_lens((5, 1)) == (4, 1)


@pytest.mark.parametrize("fault", sorted(PREFIX_FAULT_CASES))
def test_prefix_faults_are_caught_on_chunk_cases_and_invisible_on_prefill(tol, fault):
    """Each prefix-cached-prefill fault is flagged on a ctx/prefix case; on a prefill case it changes nothing."""
    rows = fault_report(tol, seeds=(0,), faults=[fault], stop_at_first=True)
    assert rows[-1]["flagged"] and rows[-1]["case"] in PREFIX_FAULT_CASES[fault], rows
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    inp = make_inputs(parse_case_id("s257-h2"))
    a = FaultyEmulated().prepare_case(inp).run()
    b = FaultyEmulated(faults=fault).prepare_case(inp).run()
    assert a.view(torch.int16).equal(b.view(torch.int16))


def test_one_call_prefix_passes_so_prefix_top_left_is_the_alignment(tol):
    """The healthy one-call prefix (bottom-right) passes the check: the fault's alarm is its top-left mask."""
    from mla_fp8_bench.harness.runner import CaseData
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.measure.metrics import error_metrics
    from mla_fp8_bench.problem.cases import parse_case_id

    case_data = CaseData(parse_case_id("prefix256-q100"), platform_info("cpu"), None)
    lim, _ = tol.lookup("aiter-emulated", "prefix256-q100")
    good = prepare_one_call_prefix(case_data.inputs, (), 256).run()
    bad = prepare_one_call_prefix(case_data.inputs, ("top_left_causal",), 256).run()
    good_err = error_metrics(good, case_data.fp8_ref[0]).max_abs_error
    bad_err = error_metrics(bad, case_data.fp8_ref[0]).max_abs_error
    assert good_err <= lim["max_abs_error_fp8_ref"] < bad_err, (good_err, bad_err, lim["max_abs_error_fp8_ref"])


def test_unsplit_rows_of_a_one_block_context_chunk():
    """A context of fewer than 128 keys is one KV block: no tile can be split, so no row has a pre-#3606 LSE."""
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    rows = unsplit_rows(make_inputs(parse_case_id("ctx100-q64")), 256)
    assert rows.shape == (64,) and bool(rows.all())


# ------------------------------------------------------------------ faults around a backend's real calls (calibrate)
def test_descale_fault_doubles_the_q_descale_the_backend_is_given():
    """``q_descale_x2`` on ``torch-fp8-ref`` equals SDPA on the dequantised inputs with q doubled (reference
    written here, float64)."""
    from mla_fp8_bench.analysis.calibrate import FaultyBackend
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    inp = make_inputs(parse_case_id("s64-h2"))
    faulty = FaultyBackend(get_backend("torch-fp8-ref"), "q_descale_x2")
    out = faulty.prepare_case(inp).run().double()
    q, k, v = (x.dequantize(torch.float64) for x in (inp.q8, inp.k8, inp.v8))
    s = torch.einsum("qhd,khd->hqk", 2 * q, k) * inp.softmax_scale
    s = s.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
    assert faulty.name == "torch-fp8-ref" and not faulty.emulation
    healthy = get_backend("torch-fp8-ref").prepare_case(inp).run().double()
    assert (out - ref).abs().max() < 0.02 < (healthy - ref).abs().max()


def test_merge_faults_on_hand_values():
    """Context piece: out 0, LSE 0; new piece: out 1, LSE 1 (natural log). exp weights give the new piece
    e/(1+e) = 0.731; the exp2 mix-up gives 2/(1+2) = 2/3 and LSE log2(3); dropping the context chunk gives 1."""
    from mla_fp8_bench.analysis.calibrate import FaultyBackend
    from mla_fp8_bench.backends import get_backend

    o0, o1, l0, l1 = torch.zeros(1, 1, 4), torch.ones(1, 1, 4), torch.zeros(1, 1), torch.ones(1, 1)
    exp2 = FaultyBackend(get_backend("torch-fp8-ref"), "lse_merge_exp2")
    out, lse = exp2._merge(o0, l0, o1, l1)
    assert out.flatten().tolist() == pytest.approx([2 / 3] * 4) and float(lse) == pytest.approx(math.log2(3))
    out, lse = FaultyBackend(get_backend("torch-fp8-ref"), "drop_context_chunk")._merge(o0, l0, o1, l1)
    assert out.flatten().tolist() == [1.0] * 4 and float(lse) == 1.0


def test_dropped_reduce_group_keeps_the_first_partial_of_the_first_split_group():
    """Groups: rows 0..2 from one partial (slot row 0), rows 2..4 from two (slot rows 256 and 512). After the
    real reduce (here: writes 7), rows 2..4 hold partial rows 256..258 (the group's first) and their LSE."""
    from mla_fp8_bench.analysis.calibrate import FaultyBackend
    from mla_fp8_bench.backends import get_backend

    partial_out = torch.zeros(768, 1, 2)
    partial_out[256:258] = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]])
    partial_lse = torch.arange(768, dtype=torch.float32).reshape(768, 1)
    out, lse = torch.zeros(4, 1, 2, dtype=torch.bfloat16), torch.zeros(4, 1)

    def real_reduce(po, pl, indptr, fmap, pmap, *rest):
        rest[-2].fill_(7)
        rest[-1].fill_(7)

    f = FaultyBackend(get_backend("aiter-emulated"), "drop_reduce_group")
    f._reduce(real_reduce, partial_out, partial_lse, torch.tensor([0, 1, 3]), torch.tensor([[0, 2], [2, 4]]),
              torch.tensor([0, 256, 512]), 256, 0, out, lse)
    assert out[:2].flatten().tolist() == [7.0] * 4 and lse.flatten().tolist() == [7.0, 7.0, 256.0, 257.0]
    assert out[2:].flatten().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_dropped_reduce_group_changes_nothing_without_split_tiles():
    """s128 at 256 CUs splits no tile: the wrapped reduce leaves the output bit for bit (calibrate counts no
    injection there); on s257 one block of at most one q tile (256 rows) differs, the rest stays bit for bit."""
    from mla_fp8_bench.analysis.calibrate import FaultyBackend
    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    for cid, rows in (("s128-h2", False), ("s257-h2", True)):
        inp = make_inputs(parse_case_id(cid))
        good = get_backend("aiter-emulated").prepare_case(inp).run()
        bad = FaultyBackend(get_backend("aiter-emulated"), "drop_reduce_group").prepare_case(inp).run()
        idx = (good.view(torch.int16) != bad.view(torch.int16)).any(-1).any(-1).nonzero().flatten().tolist()
        assert len(idx) == 0 if not rows else idx == list(range(idx[0], idx[0] + len(idx))) and len(idx) <= 256, cid


def test_a_fault_that_changes_no_result_is_not_counted():
    """``torch-sdpa-bf16`` never reads the fp8 descale, and s64 is no prefix case: no fault record; on
    prefix256-q100 the two merge faults change its result and are kept."""
    from mla_fp8_bench.analysis.calibrate import _measure_case

    assert list(_measure_case("s64-h2", ("torch-sdpa-bf16",), None, "cpu", True)) == ["torch-sdpa-bf16"]
    recs = _measure_case("prefix256-q100-h2", ("torch-sdpa-bf16",), None, "cpu", True)
    assert list(recs) == ["torch-sdpa-bf16", "torch-sdpa-bf16 lse_merge_exp2", "torch-sdpa-bf16 drop_context_chunk"]


def test_calibrate_on_the_cpu_validates_with_held_out_seeds_and_every_fault():
    """The code path a GPU runs (only the device differs): 20 seeds, 3 held-out seeds, 0 false alarms, every
    fault injected where it applies and caught; the file carries the numbers and the machine."""
    from mla_fp8_bench.analysis.calibrate import calibrate
    from mla_fp8_bench.analysis.tolerances import validate_tolerances

    doc = calibrate(backends=("aiter-emulated", "torch-fp8-ref"), shapes=("s257", "prefix256-q100"),
                    quants=("per_tensor",), dists=("normal",), validate_seeds=3, probes=False)
    val = doc["validation"]
    print({b: (s["false_alarms"], s["worst_ratio"], s["faults"]) for b, s in val["backends"].items()})
    assert val["held_out_seeds"] == 3 and val["false_alarms"] == 0 and val["passed"]
    faults = {b: {f: (x["caught"], x["injected"]) for f, x in s["faults"].items()} for b, s in val["backends"].items()}
    assert faults == {"aiter-emulated": {"q_descale_x2": (2, 2), "drop_reduce_group": (2, 2), "lse_merge_exp2": (1, 1),
                                         "drop_context_chunk": (1, 1)},
                      "torch-fp8-ref": {"q_descale_x2": (2, 2), "lse_merge_exp2": (1, 1), "drop_context_chunk": (1, 1)}}
    assert val["backends"]["aiter-emulated"]["records"] == 2 * 3
    assert doc["env"]["device"] == "cpu" and doc["env"]["device_name"] and doc["env"]["torch"] == torch.__version__
    assert validate_tolerances(doc) is doc


def test_a_tolerance_file_that_failed_its_validation_is_refused(tmp_path):
    import json

    from mla_fp8_bench.analysis.tolerances import ToleranceFileError

    doc = json.loads(TOL_PATH.read_text())
    doc["validation"] = {"passed": False, "false_alarms": 1, "faults_caught": 3, "faults_injected": 4}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    with pytest.raises(ToleranceFileError, match=r"t\.json: failed its own validation \(1 false alarm\(s\) on held-out "
                                                 r"seeds, faults caught 3/4\): recalibrate"):
        load_tolerances(tmp_path / "t.json")


def test_a_fifo_as_tolerance_file_is_refused_without_blocking(tmp_path):
    """Reading a FIFO with no writer blocks forever: it is refused as not a regular file."""
    import os
    import threading

    from mla_fp8_bench.analysis.tolerances import ToleranceFileError

    fifo = tmp_path / "tol.json"
    os.mkfifo(fifo)
    got: list = []
    t = threading.Thread(target=lambda: got.append(pytest.raises(ToleranceFileError, load_tolerances, fifo)),
                         daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader so the test process can end
        with open(fifo, "w"):
            pass
    assert got and "tol.json: is not a regular file" in str(got[0].value)


def test_calibrate_never_replaces_the_shipped_tolerance_file(capsys, monkeypatch):
    """``calibrate --name cpu-emulated-v1`` in the checkout: one line, exit 2, before any measuring; the file
    stays as it was."""
    from mla_fp8_bench.analysis import calibrate
    from mla_fp8_bench.cli import main

    before = TOL_PATH.read_bytes()
    monkeypatch.chdir(TOL_PATH.parents[1])
    monkeypatch.setattr(calibrate, "calibrate", lambda **k: pytest.fail("calibration started"))
    for args in (["--name", "cpu-emulated-v1"], [], ["--out", str(TOL_PATH)]):
        assert main(["--device", "cpu", "calibrate", "-b", "torch-fp8-ref", *args]) == 2
        out = capsys.readouterr().out.strip()
        assert "cpu-emulated-v1.json exists: calibrate never replaces a tolerance file" in out and "\n" not in out
    assert TOL_PATH.read_bytes() == before


def test_clean_aa_on_tiny_cases_passes_the_shipped_tolerances(tmp_path, capsys):
    """Identical records of cases smaller than every calibrated shape (s1: 16 rows, s21: 336; the smallest
    calibrated is ctx100-q64, 1024 rows), re-serialised: the gate passes. Their per-element errors (a mismatch
    fraction of 0.0046 on s21 against the group's 0.0023) are outside what the group was calibrated on; they
    get no tolerance, and the growth rule judges them."""
    import json

    from mla_fp8_bench.cli import main

    base, head = tmp_path / "base.json", tmp_path / "head.json"
    assert main(["--device", "cpu", "run", "-b", "aiter-emulated,torch-fp8-ref", "-c", "s1,s21", "--no-timing",
                 "--json", str(base)]) == 0
    head.write_text(json.dumps(json.loads(base.read_text()), indent=2))
    capsys.readouterr()
    assert main(["gate", str(base), str(head), "--tolerances", str(TOL_PATH)]) == 0, capsys.readouterr().out
    tol = load_tolerances(TOL_PATH)
    assert tol.lookup("aiter-emulated", "s21") == (
        None, "none (shape not calibrated and smaller than group per_tensor/normal's calibrated shapes: 336 < 1024 "
              "output rows)")
    assert tol.lookup("aiter-emulated", "s1024")[1] == "group per_tensor/normal (extrapolated: shape not calibrated)"
