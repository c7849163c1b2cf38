"""The backend protocol (docs/extending.md): every implementation under test is one :class:`Backend`; what
must not be timed happens in :meth:`Backend.prepare`; callers use :meth:`Backend.prepare_case`, which also
runs composed kinds (``prefix``) the way vLLM does (:func:`compose_prefix`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mla_fp8_bench.config import RunConfig
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case, CaseKind
from mla_fp8_bench.problem.inputs import CaseInputs
from mla_fp8_bench.problem.prefix import merge_attn_states, split_prefix_inputs


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
        return cls(True)

    @classmethod
    def no(cls, reason: str) -> Verdict:
        return cls(False, reason)


@dataclass
class Prepared:
    """A ready-to-launch call. ``run()`` launches the attention and returns the output ``[T, H, 128]``
    (bf16 for the FP8 paths), the same every call. ``timing_scope``: ``"kernel"`` (device work only),
    ``"call"`` (the user's entry incl. casts/pads) or ``"emulation"`` (never compared with a kernel's)."""

    run: Callable[[], torch.Tensor]
    graph_capturable: bool = False  # no host sync or host-side planning inside run
    timing_scope: str = "kernel"
    lse: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None  # (lse [T, H] fp32, valid_rows bool [T])
    extras: dict[str, Any] = field(default_factory=dict)  # planner_s, workspace_bytes, num_partials, ...
    cleanup: Callable[[], None] | None = None  # restores global state; the runner calls it in ``finally``


class Backend(ABC):
    """One implementation of FP8 (or baseline) MLA prefill attention. ``name``: the registry name (CLI,
    asv parameter); ``fp8``: False for bf16 baselines; ``emulation``: a PyTorch model of a kernel (latency
    labelled, never compared); ``context_chunks``: yes when :meth:`prepare` runs ``ctx`` cases (q_len <
    kv_len, non-causal) with LSE on every row, else no with the reason; ``back_to_back``: yes when :meth:`prepare`
    runs ``b2b`` cases batch by batch; ``config``: the run's configuration."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    fp8: ClassVar[bool] = True
    emulation: ClassVar[bool] = False
    context_chunks: ClassVar[Verdict] = Verdict.no("does not run context-chunk attention (q_len < kv_len, non-causal)")
    back_to_back: ClassVar[Verdict] = Verdict.no("launches one batch per call (b2b checks AITER's plan buffers)")
    config: RunConfig = RunConfig()

    @abstractmethod
    def availability(self, platform: PlatformInfo) -> Verdict:
        """Whether the backend can run on ``platform``; a precise reason when not."""

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        """Whether the backend runs ``case`` (default: yes)."""
        return Verdict.yes()

    def supports_kind(self, kind: CaseKind) -> Verdict:
        """Whether :meth:`prepare_case` runs cases of ``kind``: kinds with context need :attr:`context_chunks`,
        back-to-back kinds :attr:`back_to_back`."""
        return self.back_to_back if kind.back_to_back else self.context_chunks if kind.context else Verdict.yes()

    @abstractmethod
    def prepare(self, inputs: CaseInputs) -> Prepared:
        """Build the call for ``inputs`` (a kind that is not composed); everything outside the timed
        region happens here. BackendUnavailable / CaseUnsupported are recorded as skips."""

    def prepare_case(self, inputs: CaseInputs) -> Prepared:
        """:func:`compose_prefix` for composed kinds (``prefix``), else :meth:`prepare`; CaseUnsupported for a
        kind :meth:`supports_kind` refuses."""
        case = inputs.case
        verdict = self.supports_kind(case.kind)
        if not verdict:
            raise CaseUnsupported(f"{self.name} cannot run {case.family} case {case.id}: {verdict.reason}")
        return compose_prefix(self, inputs) if case.kind.composed else self.prepare(inputs)


#: Extras of the two prefix pieces that add up (both pieces' plans, workspaces and partial slots exist).
ADDITIVE_EXTRAS = ("planner_s", "num_partials", "workspace_bytes", "reserved_workspace_bytes")

MergeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def compose_prefix(backend: Backend, inputs: CaseInputs, merge: MergeFn = merge_attn_states) -> Prepared:
    """A prefix-cached prefill as vLLM computes it, through ``backend``'s own :meth:`Backend.prepare`: ``run()``
    runs the context piece (non-causal), then the new piece (causal) of :func:`split_prefix_inputs` and merges
    them by LSE on every row (``merge(ctx_out, ctx_lse, new_out, new_lse)``, vLLM's order; ``lse()`` after
    ``run()``). Extras: the new piece's, :data:`ADDITIVE_EXTRAS` summed. CaseUnsupported: a piece has no LSE."""
    new_in, ctx_in = split_prefix_inputs(inputs)
    pieces: list[Prepared] = []

    def cleanup() -> None:
        for p in reversed(pieces):
            if p.cleanup is not None:
                p.cleanup()

    try:
        pieces.append(backend.prepare(ctx_in))
        pieces.append(backend.prepare(new_in))
        p_ctx, p_new = pieces
        if p_new.lse is None or p_ctx.lse is None:
            raise CaseUnsupported(f"{backend.name} returns no LSE, so prefix case {inputs.case.id} cannot be merged")
    except BaseException:
        cleanup()
        raise
    state: dict[str, torch.Tensor] = {}
    every_row = torch.ones(int(inputs.q.shape[0]), dtype=torch.bool)

    def run() -> torch.Tensor:
        ctx_out, ctx_lse = p_ctx.run(), p_ctx.lse()[0]
        new_out, new_lse = p_new.run(), p_new.lse()[0]
        out, state["lse"] = merge(ctx_out, ctx_lse, new_out, new_lse)
        return out

    extras = dict(p_new.extras)
    for k in ADDITIVE_EXTRAS:
        if isinstance(p_new.extras.get(k), (int, float)) and isinstance(p_ctx.extras.get(k), (int, float)):
            extras[k] = p_new.extras[k] + p_ctx.extras[k]
    extras["prefix_pieces"] = "ctx(non-causal)+new(causal), merge_attn_states"
    return Prepared(run=run, graph_capturable=p_new.graph_capturable and p_ctx.graph_capturable,
                    timing_scope=p_new.timing_scope, lse=lambda: (state["lse"], every_row), extras=extras,
                    cleanup=cleanup)
