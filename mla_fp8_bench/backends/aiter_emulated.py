"""``aiter-emulated``: the AITER PS FP8 prefill path with the kernel and reduce emulated in PyTorch.

The same :class:`~mla_fp8_bench.backends.aiter_real.AiterPsDriver` that drives the real ``aiter`` on
gfx950 drives here a stand-in ``aiter`` module (:mod:`mla_fp8_bench.aiter_ps.standin`) whose planner
is the suite's port of ``get_ps_metadata_v1`` and whose kernel and reduce are the emulator
(:mod:`mla_fp8_bench.aiter_ps.emulator`). The plan is made for the run configuration's ``emu_cu_num``
CUs (:class:`~mla_fp8_bench.config.RunConfig`; default 256, MI355X), so the split layout is the one the
real kernel would run.

Its latency is an emulation's (``timing_scope="emulation"``) and is never compared with kernels.
It is the suite's default AITER backend on machines without gfx950, and the model the real kernel is
compared with.

The emulated AITER version is the configuration's ``emu_aiter_version`` (default the newest modelled,
0.1.22; ``mla-fp8-bench run --emu-aiter-version``, or ``MLA_FP8_BENCH_EMU_AITER_VERSION`` in asv runs).
It selects the reduce's head-count dispatch and the ROCm/aiter#3606 semantics (from 0.1.22: every tile
reduced, ``final_lse`` on every row); at 0.1.20 the prefix cases' LSE merge breaks on unsplit rows, as it
did on hardware.
"""

from __future__ import annotations

from typing import Any

from mla_fp8_bench.aiter_ps.emulator import Emulator
from mla_fp8_bench.aiter_ps.facts import NEWEST_MODELLED_VERSION, format_version, parse_aiter_version
from mla_fp8_bench.backends.aiter_real import AiterPsDriver
from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs


class AiterEmulated(Backend):
    name = "aiter-emulated"
    description = "AITER PS FP8 prefill path: planner port + PyTorch emulation of the gfx950 kernel and reduce"
    fp8 = True
    emulation = True
    context_chunks = Verdict.yes()  # the driver runs non-causal context chunks (q_len < kv_len) with final_lse

    def __init__(self, cu_num: int | None = None, aiter_version: Any = None, emulator: Emulator | None = None):
        """``cu_num`` / ``aiter_version``: the emulated plan's CU count and AITER version; None takes the
        run configuration's (:attr:`Backend.config`) when the driver is first built. ``emulator``: the
        kernel and reduce emulation (default the faithful one)."""
        self.emulator = emulator
        self.cu_num = cu_num
        self.aiter_version = None if aiter_version is None else parse_aiter_version(aiter_version)
        self._driver: AiterPsDriver | None = None

    def driver(self) -> AiterPsDriver:
        if self._driver is None:
            from mla_fp8_bench.aiter_ps.standin import make_standin_aiter

            ver = self.aiter_version or self.config.emu_aiter_version or NEWEST_MODELLED_VERSION
            module = make_standin_aiter(reduce_variant=9, cu_num=self.cu_num or self.config.emu_cu_num,
                                        emulator=self.emulator, aiter_version=ver)
            self._driver = AiterPsDriver(module, ver)
        return self._driver

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()

    def detection(self) -> dict[str, str]:
        """What the driver read from the stand-in (its op schemas, as from a real install)."""
        return self.driver().detection()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        cap = self.config.emulation_token_cap(platform.device_type)
        if cap and case.total_tokens > cap:
            return Verdict.no(f"{case.total_tokens} tokens exceed the emulator's cap of {cap} on "
                              f"{platform.device_type} (set MLA_FP8_BENCH_EMU_MAX_TOKENS; the emulation is "
                              "O(seq_len^2) in Python-driven tiles)")
        return self.driver().supports_heads(case.num_heads)

    def prepare(self, inputs: CaseInputs) -> Prepared:
        drv = self.driver()
        p = drv.prepare(inputs)
        p.graph_capturable = False  # the emulator reads work_info on the host
        p.timing_scope = "emulation"
        p.extras["emulated_aiter_version"] = format_version(drv.version)
        return p

    def plan_stats(self, case: Case, platform: PlatformInfo) -> dict[str, Any]:
        import torch

        return self.driver().plan_stats(case, torch.device("cpu"))
