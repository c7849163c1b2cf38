"""``aiter-emulated``: the AITER PS FP8 prefill path with the kernel and reduce emulated in PyTorch.

The same :class:`~mla_fp8_bench.backends.aiter_real.AiterPsDriver` that drives the real ``aiter`` on
gfx950 drives here a stand-in ``aiter`` module (:mod:`mla_fp8_bench.aiter_ps.standin`) whose planner
is the suite's port of ``get_ps_metadata_v1`` and whose kernel and reduce are the emulator
(:mod:`mla_fp8_bench.aiter_ps.emulator`). The plan is made for ``MLA_FP8_BENCH_EMU_CU_NUM`` CUs
(default 256, MI355X), so the split layout is the one the real kernel would run.

Its latency is an emulation's (``timing_scope="emulation"``) and is never compared with kernels.
It is the suite's default AITER backend on machines without gfx950, and the model the real kernel is
compared with.
"""

from __future__ import annotations

import os
from typing import Any

from mla_fp8_bench.backends.aiter_real import AiterPsDriver, plan_stats_with
from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs

DEFAULT_EMU_CU_NUM = 256  # MI355X multiProcessorCount


def emulated_cu_num() -> int:
    """CU count the emulated plan is made for (env ``MLA_FP8_BENCH_EMU_CU_NUM``, default 256).

    Raises:
        ValueError: if the variable is not a positive integer.
    """
    raw = os.environ.get("MLA_FP8_BENCH_EMU_CU_NUM", str(DEFAULT_EMU_CU_NUM))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"MLA_FP8_BENCH_EMU_CU_NUM={raw!r} is invalid: a positive integer (256 = MI355X)")
    return n


#: Default token cap of the emulation per device type (0 = none). On an H200 it measured 127 ms per call
#: at S=2048 and 437 ms at S=4096 (helper run, docs/methodology.md); beyond 4096 it would dominate a run.
DEFAULT_EMU_MAX_TOKENS = {"cpu": 0, "cuda": 4096}


def emulated_max_tokens(device_type: str) -> int:
    """Token cap for the emulated backend (env ``MLA_FP8_BENCH_EMU_MAX_TOKENS``; 0 = no cap).

    Raises:
        ValueError: if the variable is not an integer >= 0.
    """
    raw = os.environ.get("MLA_FP8_BENCH_EMU_MAX_TOKENS")
    if raw in (None, ""):
        return DEFAULT_EMU_MAX_TOKENS.get(device_type, 0)
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"MLA_FP8_BENCH_EMU_MAX_TOKENS={raw!r} is invalid: an integer >= 0 (0 = no cap)")
    return n


class AiterEmulated(Backend):
    name = "aiter-emulated"
    description = "AITER PS FP8 prefill path: planner port + PyTorch emulation of the gfx950 kernel and reduce"
    fp8 = True
    emulation = True

    def __init__(self, faults: Any = None, cu_num: int | None = None, aiter_version: tuple[int, int, int] = (0, 1, 20)):
        self.faults = faults
        self.cu_num = cu_num
        self.aiter_version = aiter_version
        self._driver: AiterPsDriver | None = None

    def driver(self) -> AiterPsDriver:
        if self._driver is None:
            from mla_fp8_bench.aiter_ps.standin import make_standin_aiter

            module = make_standin_aiter(reduce_variant=9, cu_num=self.cu_num or emulated_cu_num(),
                                        faults=self.faults, aiter_version=self.aiter_version)
            self._driver = AiterPsDriver(module, self.aiter_version)
        return self._driver

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        cap = emulated_max_tokens(platform.device_type)
        if cap and case.total_tokens > cap:
            return Verdict.no(f"{case.total_tokens} tokens exceed the emulator's cap of {cap} on {platform.device_type} "
                              "(set MLA_FP8_BENCH_EMU_MAX_TOKENS; the emulation is O(seq_len^2) in Python-driven tiles)")
        return self.driver().supports_heads(case.num_heads)

    def prepare(self, inputs: CaseInputs) -> Prepared:
        p = self.driver().prepare(inputs)
        p.graph_capturable = False  # the emulator reads work_info on the host
        p.timing_scope = "emulation"
        return p

    def plan_stats(self, case: Case, platform: PlatformInfo) -> dict[str, Any]:
        import torch

        return plan_stats_with(self.driver().plan, case, torch.device("cpu"))
