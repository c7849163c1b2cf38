"""The backend protocol: every implementation under test is one :class:`Backend`.

A backend says whether it can run here (:meth:`Backend.availability`, with the reason when not),
whether it supports a case (:meth:`Backend.supports`), and turns a case's inputs into a
:class:`Prepared` call whose ``run()`` launches the attention and returns the bf16 output
``[T, H, 128]``. Everything that must not be timed (planning, workspace reservation, casts the
production path does ahead of time) happens in :meth:`Backend.prepare`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (missing package, wrong vendor/arch). Recorded as a skip."""


class CaseUnsupported(RuntimeError):
    """The backend cannot run this case (head count, dtype, size limit). Recorded as a skip."""


@dataclass(frozen=True)
class Verdict:
    """A yes/no with the reason for a no."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls) -> Verdict:
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> Verdict:
        return cls(False, reason)


@dataclass
class Prepared:
    """A ready-to-launch call.

    Attributes:
        run: launches the attention and returns the output ``[T, H, 128]`` (bf16 for the FP8 paths).
            It must be repeatable (same result every call) and must not allocate host-visible state.
        graph_capturable: True if ``run`` may be captured in a CUDA/HIP graph (no host sync, no
            host-side planning inside).
        timing_scope: what ``run`` covers: ``"kernel"`` (device work only), ``"call"`` (the user's
            entry incl. casts/pads), or ``"emulation"`` (a PyTorch model of a kernel: never compare its
            latency with a kernel's).
        lse: optional callable returning ``(lse [T, H] fp32, valid_rows bool [T])`` after a run.
        extras: extra tracked numbers (``planner_s``, ``workspace_bytes``, ``num_partials``, ...).
        cleanup: restores global state (workspaces, env vars); the runner calls it in ``finally``.
    """

    run: Callable[[], torch.Tensor]
    graph_capturable: bool = False
    timing_scope: str = "kernel"
    lse: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    cleanup: Callable[[], None] | None = None


class Backend(ABC):
    """One implementation of FP8 (or baseline) MLA prefill attention.

    Class attributes:
        name: registry name used on the CLI and as the asv parameter.
        description: one line for ``mla-fp8-bench env``.
        fp8: True if the computation runs in fp8 (False for bf16 baselines).
        emulation: True if this is a PyTorch model of a kernel (latency is labelled, never compared).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    fp8: ClassVar[bool] = True
    emulation: ClassVar[bool] = False

    @abstractmethod
    def availability(self, platform: PlatformInfo) -> Verdict:
        """Whether the backend can run on ``platform``; a precise reason when not."""

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        """Whether the backend runs ``case`` (default: yes)."""
        return Verdict.yes()

    @abstractmethod
    def prepare(self, inputs: CaseInputs) -> Prepared:
        """Build the call for ``inputs``; everything outside the timed region happens here.

        Raises:
            BackendUnavailable / CaseUnsupported: recorded as skips by the runner.
        """
