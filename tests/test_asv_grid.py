"""The asv grid's backend list is derived from the backend registry (one place per backend)."""

from __future__ import annotations

import importlib

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
