"""asv benchmarks: FP8 MLA prefill latency and accuracy over a seq_len sweep.

All measuring is done once per asv environment and commit, in ``setup_cache``
(:func:`mla_fp8_bench.harness.asv_support.measure_grid`); every ``track_*`` method only indexes the cached
records, so a run stays within minutes although asv spawns one process per (benchmark, parameter).

Params are static on every machine (one history series per id): a backend unavailable here, or a case
beyond this device's size cap, is an asv skip (n/a); a failure is an asv failure with the reason. Bad
``MLA_FP8_BENCH_*`` knobs are refused while asv discovers the benchmarks, before it writes anything.

Bump ``version`` when the measurement method changes (asv hashes only the source of the methods). The
``track_*`` methods are generated from the metric table (``mla_fp8_bench/measure/metric_table.py``).
Accuracy values are floored at 1e-12 (asv's summary is a geometric mean): a plotted 1e-12 means exactly 0.
"""

from mla_fp8_bench.harness import asv_support as grid
from mla_fp8_bench.harness.asv_guard import check_commit
from mla_fp8_bench.harness.asv_tracks import with_tracks

# at discovery: refuse a bad knob (one line naming it), or other code than the commit named
check_commit(grid.check_knobs())


@with_tracks
class MLAPrefill:
    """Latency and accuracy of one backend on one case (backend x case id)."""

    params = (list(grid.asv_backends()), list(grid.ASV_CASES))
    param_names = ["backend", "case"]
    timeout = 3600
    version = "mla-prefill-v1"

    def setup_cache(self):
        return grid.measure_grid()

    def setup(self, cache, backend, case):
        self.rec = grid.lookup(cache, backend, case)


@with_tracks
class AiterPlan:
    """Host planner time and partial-buffer workspace of the AITER PS path (backend x case id)."""

    params = (list(grid.plan_backends()), list(grid.ASV_CASES))
    param_names = ["backend", "case"]
    timeout = 1800
    version = "aiter-plan-v1"

    def setup_cache(self):
        return grid.measure_plans()

    def setup(self, cache, backend, case):
        self.rec = grid.lookup(cache, backend, case)
