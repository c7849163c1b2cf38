"""``aiter-emulated``: :class:`~mla_fp8_bench.backends.aiter_real.AiterPsDriver` over the PyTorch stand-in
``aiter`` (:mod:`mla_fp8_bench.aiter_ps.standin`) for the configured ``emu_cu_num`` and ``emu_aiter_version``.
Its latency is an emulation's, never compared."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mla_fp8_bench.aiter_ps.facts import NEWEST_MODELLED_VERSION, format_version, parse_aiter_version
from mla_fp8_bench.backends.aiter_real import AiterPsBackend, AiterPsDriver
from mla_fp8_bench.backends.base import Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs

if TYPE_CHECKING:  # the emulator itself is imported only when a driver is made
    from mla_fp8_bench.aiter_ps.emulator import Emulator


class AiterEmulated(AiterPsBackend):
    name = "aiter-emulated"
    description = "AITER PS FP8 prefill path: planner port + PyTorch emulation of the gfx950 kernel and reduce"
    emulation = True

    def __init__(self, cu_num: int | None = None, aiter_version: Any = None, emulator: Emulator | None = None):
        """``cu_num`` / ``aiter_version``: the emulated plan's CU count and AITER version (None: the run
        configuration's); ``emulator``: the kernel and reduce emulation (default the faithful one)."""
        self.emulator = emulator
        self.cu_num = cu_num
        self.aiter_version = None if aiter_version is None else parse_aiter_version(aiter_version)

    def make_driver(self) -> AiterPsDriver:
        from mla_fp8_bench.aiter_ps.standin import make_standin_aiter

        ver = self.aiter_version or self.config.emu_aiter_version or NEWEST_MODELLED_VERSION
        module = make_standin_aiter(reduce_variant=9, cu_num=self.cu_num or self.config.emu_cu_num,
                                    emulator=self.emulator, aiter_version=ver)
        return AiterPsDriver(module, ver)

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        cap = self.config.emulation_token_cap(platform.device_type)
        if cap and case.total_tokens > cap:
            return Verdict.no(f"{case.total_tokens} tokens exceed the emulator's cap of {cap} on "
                              f"{platform.device_type} (set MLA_FP8_BENCH_EMU_MAX_TOKENS; the emulation is "
                              "O(seq_len^2) in Python-driven tiles)")
        return super().supports(case, platform)

    def prepare(self, inputs: CaseInputs) -> Prepared:
        p = super().prepare(inputs)
        p.extras["emulated_aiter_version"] = format_version(self.driver().version)
        return p
