"""asv benchmarks: FP8 MLA prefill latency and accuracy over a seq_len sweep.

Thin by design: all measuring is done by :func:`mla_fp8_bench.harness.asv_support.measure_grid` ONCE per
asv environment and commit, in ``setup_cache`` (one process; torch and CUDA are initialised once),
and every ``track_*`` method only indexes the cached, plain-Python records. That keeps an asv run
within minutes even though asv spawns one process per (benchmark, parameter).

Params are static on every machine (so the history of an id is one series everywhere): a backend
unavailable here, or a case beyond this device's size cap, is an asv skip (``NotImplementedError``
in ``setup``); a backend that failed on a case is an asv failure carrying the reason, unless this
commit has a stored value for it, which is kept. ``setup_cache`` never raises (asv would store its
exception as a failure of every param, over the stored values).

Bump ``version`` when the measurement method changes (asv hashes only the source of the methods); a track
whose samples are rounds carries ``version + "+rounds"`` (``Metric.asv_version``).

The ``track_*`` methods are generated from the metric table (``mla_fp8_bench/measure/metric_table.py``:
record key, unit, pretty name, floor) by :func:`~mla_fp8_bench.harness.asv_tracks.with_tracks`; add a
metric there, not here. Accuracy values are floored at 1e-12 (asv's summary uses a geometric mean over
params, and one exact 0 would make it 0): a plotted 1e-12 means exactly 0.
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

# asv imports this module to discover the benchmarks: the one check made then builds the run's
# configuration from the environment (a bad knob is refused) and refuses a run that would measure
# other code or lose stored values, before asv writes anything.
check_asv_run(check_knobs())

_VERSION = "mla-prefill-v1"


@with_tracks
class MLAPrefill:
    """Latency and accuracy of one backend on one case (backend x case id)."""

    params = (list(asv_backends()), list(ASV_CASES))
    param_names = ["backend", "case"]
    timeout = 3600
    version = _VERSION

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
