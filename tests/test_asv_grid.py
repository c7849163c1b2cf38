"""The asv grid: its backend list is derived from the backend registry (one place per backend), the knobs
that measure what ``asv run -b`` selects, and how asv prints it in a log."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from mla_fp8_bench import backends as registry
from mla_fp8_bench.harness import asv_support

#: The param order of published asv history (results/): append-only, never reordered.
PUBLISHED_MLAPREFILL_BACKENDS = ("aiter", "vllm-aiter", "aiter-emulated", "fa3-fp8", "fa3-bf16", "torch-sdpa-bf16",
                                 "torch-fp8-ref")
PUBLISHED_AITERPLAN_BACKENDS = ("aiter", "vllm-aiter", "aiter-emulated")


def test_every_registered_backend_is_in_the_asv_grid():
    assert set(registry.backend_names()) <= set(asv_support.asv_backends())
    assert len(set(asv_support.asv_backends())) == len(asv_support.asv_backends())
    assert asv_support.asv_backends()[:len(PUBLISHED_MLAPREFILL_BACKENDS)] == PUBLISHED_MLAPREFILL_BACKENDS


def test_plan_backends_are_the_ones_with_a_planner():
    assert asv_support.plan_backends() == PUBLISHED_AITERPLAN_BACKENDS
    for name in asv_support.asv_backends():
        has = callable(getattr(type(registry.get_backend(name)), "plan_stats", None))
        assert has == (name in asv_support.plan_backends()), name


def test_a_newly_registered_backend_joins_the_grid_without_other_edits():
    class Extra(registry.Backend):
        name = "extra-test-backend"

        def availability(self, platform):
            return registry.Verdict.no("test only")

        def prepare(self, inputs):
            raise registry.BackendUnavailable("test only")

    registry._REGISTRY[Extra.name] = Extra
    try:
        grid = importlib.reload(asv_support)
        assert grid.asv_backends()[-1] == "extra-test-backend"
        assert "extra-test-backend" not in grid.plan_backends()
        assert grid.asv_backends()[:len(PUBLISHED_MLAPREFILL_BACKENDS)] == PUBLISHED_MLAPREFILL_BACKENDS
    finally:
        del registry._REGISTRY[Extra.name]
        importlib.reload(asv_support)
    assert "extra-test-backend" not in asv_support.asv_backends()


def test_selection_knobs_measure_only_the_selected_params():
    knobs = asv_support.selection_knobs
    assert knobs(r"MLAPrefill\.track_max_abs_error\('aiter', 's512'\)") == {
        "MLA_FP8_BENCH_BACKENDS": "aiter", "MLA_FP8_BENCH_CASES": "s512"}
    assert knobs(r"MLAPrefill\.track_latency\('aiter-emulated', 's(256|128)'\)") == {
        "MLA_FP8_BENCH_BACKENDS": "aiter-emulated", "MLA_FP8_BENCH_CASES": "s128,s256"}  # the grid's order
    assert knobs(r"\('vllm-aiter', ") == {"MLA_FP8_BENCH_BACKENDS": "vllm-aiter"}  # every case: no _CASES
    assert knobs("MLAPrefill.track_latency") == {}  # the whole grid: nothing to narrow
    assert knobs("FakeBench.track_x") == {}  # another suite's name selects nothing here


def test_a_wide_log_prints_one_row_per_backend():
    """asv prints a track as a table that fits 3/4 of the terminal's width, the cases as columns if they
    fit, else one row per (backend, case). At the COLUMNS asv.conf.json advises, every track of the grid
    folds, with the widest value asv prints (a raw float of 21 characters): one row per backend."""
    fmt = pytest.importorskip("asv.results")._format_benchmark_result
    text = (Path(__file__).resolve().parents[1] / "asv.conf.json").read_text()
    columns = int(re.search(r"COLUMNS=(\d+) asv run", text).group(1))
    for backends in (asv_support.asv_backends(), asv_support.plan_backends()):
        bench = {"params": [[repr(b) for b in backends], [repr(c) for c in asv_support.ASV_CASES]],
                 "param_names": ["backend", "case"], "unit": "max_abs_err"}
        cells = [(0.0076908247298410615, None)] * (len(backends) * len(asv_support.ASV_CASES))
        assert len(fmt(cells, bench, max_width=columns * 3 // 4)) == len(backends) + 6
        assert len(fmt(cells, bench, max_width=80 * 3 // 4)) == len(cells) + 4  # at 80 columns: a row per param
