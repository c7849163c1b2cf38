"""Every injected fault is flagged by the accuracy check with the calibrated tolerances; the healthy path
raises no alarm over >= 20 fresh seeds (CPU, a few minutes on 2 cores).

Tolerances: ``tolerances/cpu-emulated-v1.json`` (``mla-fp8-bench calibrate``: max over seeds 0..19 x 2.0).
Fault cases: the default calibration shapes (per_tensor/normal, seed 0) cheapest first, stopping at the
first flagged one; ``unsaturated_cast`` needs ``s257-cast-outlier``; ``top_left_causal`` and
``lse_no_max_subtraction`` cannot show on q_len == kv_len prefill inputs and are checked on their probes;
the prefix-cached-prefill faults (``PREFIX_FAULT_CASES``) are tried on context-chunk and prefix cases
(see :mod:`support.faults`). The full per-case numbers are in docs/regressions.md
(``python -m tests.support.faults --seeds 0,1,2``).
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


def test_calibration_file_records_zero_held_out_false_alarms(tol):
    val = tol.data["validation"]
    for backend in ("aiter-emulated", "torch-fp8-ref"):
        assert val[backend]["records"] >= 20 * 30
        assert val[backend]["false_alarms"] == 0, val[backend]["alarms"][:5]
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
