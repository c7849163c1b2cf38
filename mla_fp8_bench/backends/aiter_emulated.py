"""``aiter-emulated``: the AITER PS FP8 prefill path with the kernel and reduce emulated in PyTorch.

The same :class:`~mla_fp8_bench.backends.aiter_real.AiterPsDriver` that drives the real ``aiter`` on
gfx950 drives here a stand-in ``aiter`` module (:mod:`mla_fp8_bench.aiter_ps.standin`) whose planner
is the suite's port of ``get_ps_metadata_v1`` and whose kernel and reduce are the emulator
(:mod:`mla_fp8_bench.aiter_ps.emulator`). The plan is made for ``MLA_FP8_BENCH_EMU_CU_NUM`` CUs
(default 256, MI355X), so the split layout is the one the real kernel would run.

Its latency is an emulation's (``timing_scope="emulation"``) and is never compared with kernels.
It is the suite's default AITER backend on machines without gfx950, and the model the real kernel is
compared with.

The emulated AITER version is ``MLA_FP8_BENCH_EMU_AITER_VERSION`` (default the newest modelled, 0.1.22;
``mla-fp8-bench run --emu-aiter-version`` sets it for one run). It selects the reduce's head-count
dispatch and the ROCm/aiter#3606 semantics (from 0.1.22: every tile reduced, ``final_lse`` on every
row); at 0.1.20 the prefix cases' LSE merge breaks on unsplit rows, as it did on hardware.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from mla_fp8_bench.aiter_ps.facts import (
    NEWEST_MODELLED_VERSION,
    PS_PREFILL_FIRST_VERSION,
    AiterVersionError,
    format_version,
    parse_aiter_version,
)
from mla_fp8_bench.backends.aiter_real import AiterPsDriver
from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs

DEFAULT_EMU_CU_NUM = 256  # MI355X multiProcessorCount
#: Environment variable selecting the emulated AITER version.
EMU_AITER_VERSION_ENV = "MLA_FP8_BENCH_EMU_AITER_VERSION"


def emulated_aiter_version() -> tuple[int, int, int]:
    """AITER version the emulation models (env ``MLA_FP8_BENCH_EMU_AITER_VERSION``; default the newest
    modelled, 0.1.22). The one place the variable is read.

    Raises:
        ValueError: not a version like ``0.1.20`` / ``0.1.20.post1`` / ``v0.1.22``, or outside the modelled
            range (0.1.10, the first with the PS prefill, ... 0.1.22).
    """
    raw = os.environ.get(EMU_AITER_VERSION_ENV, "")
    if not raw.strip():
        return NEWEST_MODELLED_VERSION
    lo, hi = format_version(PS_PREFILL_FIRST_VERSION), format_version(NEWEST_MODELLED_VERSION)
    try:
        ver = parse_aiter_version(raw)
    except AiterVersionError:
        ver = None
    if ver is None or not PS_PREFILL_FIRST_VERSION <= ver <= NEWEST_MODELLED_VERSION:
        raise ValueError(f"{EMU_AITER_VERSION_ENV}={raw!r} is invalid: an AITER version MAJOR.MINOR.PATCH[.postN] "
                         f"from {lo} to {hi} (e.g. 0.1.20, 0.1.20.post1, v0.1.22)")
    return ver


@contextlib.contextmanager
def emulated_aiter_version_set(value: str) -> Iterator[tuple[int, int, int]]:
    """Set ``MLA_FP8_BENCH_EMU_AITER_VERSION`` to ``value`` for the ``with`` block (restored in ``finally``).

    Raises:
        ValueError: ``value`` is not an allowed version (checked before the block runs; nothing is changed).
    """
    old = os.environ.get(EMU_AITER_VERSION_ENV)
    os.environ[EMU_AITER_VERSION_ENV] = value
    try:
        yield emulated_aiter_version()
    finally:
        if old is None:
            os.environ.pop(EMU_AITER_VERSION_ENV, None)
        else:
            os.environ[EMU_AITER_VERSION_ENV] = old


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
#: at S=2048 and 437 ms at S=4096 (docs/methodology.md); beyond 4096 it would dominate a run.
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
    context_chunks = Verdict.yes()  # the driver runs non-causal context chunks (q_len < kv_len) with final_lse

    def __init__(self, faults: Any = None, cu_num: int | None = None, aiter_version: Any = None):
        """``aiter_version``: the emulated AITER version; None reads :func:`emulated_aiter_version` when the
        driver is first built."""
        self.faults = faults
        self.cu_num = cu_num
        self.aiter_version = None if aiter_version is None else parse_aiter_version(aiter_version)
        self._driver: AiterPsDriver | None = None

    def driver(self) -> AiterPsDriver:
        if self._driver is None:
            from mla_fp8_bench.aiter_ps.standin import make_standin_aiter

            ver = self.aiter_version or emulated_aiter_version()
            module = make_standin_aiter(reduce_variant=9, cu_num=self.cu_num or emulated_cu_num(),
                                        faults=self.faults, aiter_version=ver)
            self._driver = AiterPsDriver(module, ver)
        return self._driver

    def availability(self, platform: PlatformInfo) -> Verdict:
        return Verdict.yes()

    def detection(self) -> dict[str, str]:
        """What the driver read from the stand-in (its op schemas, as from a real install)."""
        return self.driver().detection()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        cap = emulated_max_tokens(platform.device_type)
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
