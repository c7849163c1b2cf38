"""asv benchmarks: FP8 MLA prefill latency and accuracy over a seq_len sweep.

All measuring is done once per asv environment and commit, in ``setup_cache``
(:func:`mla_fp8_bench.harness.asv_support.measure_grid`); every ``track_*`` method only indexes the cached
records, so a run stays within minutes although asv spawns one process per (benchmark, parameter).

Params are static on every machine (one history series per id): a backend unavailable here, or a case
beyond this device's size cap, is an asv skip; a backend that failed on a case is an asv failure with the
reason, unless this commit has a stored value for it, which is kept. ``setup_cache`` never raises.

Bump ``version`` when the measurement method changes (asv hashes only the source of the methods); a track
whose samples are rounds carries ``version + "+rounds"`` (``Metric.asv_version``). The ``track_*`` methods
are generated from the metric table (``mla_fp8_bench/measure/metric_table.py``): add a metric there.
Accuracy values are floored at 1e-12 (asv's summary is a geometric mean): a plotted 1e-12 means exactly 0.
"""

from mla_fp8_bench.harness.asv_guard import check_asv_run
from mla_fp8_bench.harness.asv_support import (
    ASV_CASES,
    asv_backends,
    check_knobs,
    lookup,
    measure_grid,
    measure_plans,
    never_raising,
    plan_backends,
)
from mla_fp8_bench.harness.asv_tracks import with_tracks

# at discovery: refuse a bad knob, or a run that would measure other code or lose stored values
check_asv_run(check_knobs())


@with_tracks
class MLAPrefill:
    """Latency and accuracy of one backend on one case (backend x case id)."""

    params = (list(asv_backends()), list(ASV_CASES))
    param_names = ["backend", "case"]
    timeout = 3600
    version = "mla-prefill-v1"

    def setup_cache(self):
        return never_raising(measure_grid, "MLAPrefill", self.params, self.version)

    def setup(self, cache, backend, case):
        self.rec = lookup(cache, backend, case)


@with_tracks
class AiterPlan:
    """Host planner time and partial-buffer workspace of the AITER PS path (backend x case id)."""

    params = (list(plan_backends()), list(ASV_CASES))
    param_names = ["backend", "case"]
    timeout = 1800
    version = "aiter-plan-v1"

    def setup_cache(self):
        return never_raising(measure_plans, "AiterPlan", self.params, self.version)

    def setup(self, cache, backend, case):
        self.rec = lookup(cache, backend, case)
