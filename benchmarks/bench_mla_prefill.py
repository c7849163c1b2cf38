"""asv benchmarks: FP8 MLA prefill latency and accuracy over a seq_len sweep.

Thin by design: all measuring is done by :func:`mla_fp8_bench.harness.asv_support.measure_grid` ONCE per
asv environment and commit, in ``setup_cache`` (one process; torch and CUDA are initialised once),
and every ``track_*`` method only indexes the cached, plain-Python records. That keeps an asv run
within minutes even though asv spawns one process per (benchmark, parameter).

Params are static on every machine (so the history of an id is one series everywhere): a backend
unavailable here, or a case beyond this device's size cap, is an asv skip (``NotImplementedError``
in ``setup``); a backend that failed on a case is an asv failure carrying the reason.

Bump ``version`` when the measurement method changes (asv hashes only the source of the methods).

Accuracy values are floored at 1e-12 (asv's summary uses a geometric mean over params, and one exact 0
would make it 0): a plotted 1e-12 means exactly 0.
"""

from mla_fp8_bench.harness.asv_support import (
    ASV_BACKENDS,
    ASV_CASES,
    PLAN_BACKENDS,
    lookup,
    measure_grid,
    measure_plans,
)

_VERSION = "mla-prefill-v1"


class MLAPrefill:
    """Latency and accuracy of one backend on one case (backend x case id)."""

    params = (list(ASV_BACKENDS), list(ASV_CASES))
    param_names = ["backend", "case"]
    timeout = 3600
    version = _VERSION

    def setup_cache(self):
        return measure_grid()

    def setup(self, cache, backend, case):
        self.rec = lookup(cache, backend, case)

    def track_latency(self, cache, backend, case):
        """Kernel-only device time (CUDA/HIP graph replay) on GPUs; host time on CPU; seconds."""
        return {"samples": self.rec["latency_samples_s"], "number": 1}

    track_latency.unit = "seconds"
    track_latency.pretty_name = "MLA prefill latency"

    def track_call_latency(self, cache, backend, case):
        """Host-inclusive latency of one call (run + synchronize), seconds (GPU only)."""
        samples = self.rec.get("call_latency_samples_s")
        if samples:  # samples give asv (and the gate) statistics; host-side timing is noisy across hosts
            return {"samples": samples, "number": 1}
        val = self.rec.get("call_latency_s")
        # NaN is stored as a skip (n/a); NotImplementedError here (outside setup) would be a failure
        return float("nan") if val is None else val

    track_call_latency.unit = "seconds"
    track_call_latency.pretty_name = "MLA prefill call latency (host-inclusive)"

    def track_max_abs_error(self, cache, backend, case):
        """max |out - ref| against float64/float32 attention on the dequantised fp8 inputs."""
        return max(self.rec["max_abs_error_fp8_ref"], 1e-12)

    track_max_abs_error.unit = "max_abs_err"
    track_max_abs_error.pretty_name = "max-abs error vs fp8-dequant reference"

    def track_max_abs_error_bf16_ref(self, cache, backend, case):
        """max |out - ref| against attention on the original bf16 inputs (end-to-end FP8 error)."""
        return max(self.rec["max_abs_error_bf16_ref"], 1e-12)

    track_max_abs_error_bf16_ref.unit = "max_abs_err"
    track_max_abs_error_bf16_ref.pretty_name = "max-abs error vs bf16 reference"

    def track_rel_l2_error(self, cache, backend, case):
        """||out - ref||_2 / ||ref||_2 against the dequantised-fp8 reference."""
        return max(self.rec["rel_l2_error_fp8_ref"], 1e-12)

    track_rel_l2_error.unit = "rel_l2"
    track_rel_l2_error.pretty_name = "rel-L2 error vs fp8-dequant reference"

    def track_mismatch_fraction(self, cache, backend, case):
        """AITER checkAllclose fraction failing atol=rtol=5e-2 against the bf16 reference."""
        return max(self.rec["mismatch_fraction"], 1e-12)

    track_mismatch_fraction.unit = "fraction"
    track_mismatch_fraction.pretty_name = "mismatch fraction (AITER checkAllclose 5e-2)"

    def track_nondeterminism(self, cache, backend, case):
        """Largest |difference| between two runs on the same inputs (0 for deterministic kernels)."""
        return max(self.rec.get("nondeterminism_max_abs") or 0.0, 1e-12)

    track_nondeterminism.unit = "max_abs_diff"
    track_nondeterminism.pretty_name = "run-to-run max difference"

    def track_seconds_per_pflop(self, cache, backend, case):
        """Informational throughput as seconds per PFLOP (asv treats larger as worse; TFLOP/s would invert)."""
        if self.rec.get("timing_scope") == "emulation":
            return float("nan")  # throughput of an emulation is not a kernel's: stored as n/a
        return self.rec["latency_s"] / (self.rec["flops"] / 1e15)

    track_seconds_per_pflop.unit = "s/PFLOP"
    track_seconds_per_pflop.pretty_name = "seconds per PFLOP (informational)"


class AiterPlan:
    """Host planner time and partial-buffer workspace of the AITER PS path (backend x case id)."""

    params = (list(PLAN_BACKENDS), list(ASV_CASES))
    param_names = ["backend", "case"]
    timeout = 1800
    version = "aiter-plan-v1"

    def setup_cache(self):
        return measure_plans()

    def setup(self, cache, backend, case):
        self.rec = lookup(cache, backend, case)

    def track_planner_time(self, cache, backend, case):
        """``get_ps_metadata_v1`` host planning time (the real planner on gfx950, the port elsewhere), seconds."""
        return {"samples": self.rec["planner_samples_s"], "number": 1}

    track_planner_time.unit = "seconds"
    track_planner_time.pretty_name = "AITER PS planner time"

    def track_workspace_bytes(self, cache, backend, case):
        """Scratch bytes for partial outputs + partial LSE + final LSE (catches sizing regressions, vLLM #57923)."""
        return self.rec["workspace_bytes"]

    track_workspace_bytes.unit = "bytes"
    track_workspace_bytes.pretty_name = "partial + LSE workspace"

    def track_num_partials(self, cache, backend, case):
        """Live partial slots (``reduce_indptr[-1]``) the plan uses."""
        return max(self.rec["num_partials"], 1e-12)

    track_num_partials.unit = "partial_slots"
    track_num_partials.pretty_name = "live partial slots"
