"""The ``vllm-aiter`` adapter for tests: over a given ``aiter`` module with the platform gate bypassed
(:class:`GivenAiterVllmAiter`), and deliberately wrong variants that the vLLM tier must catch, each with a
clear message.

:data:`ADAPTER_FAULTS`: ``reduce-8-arg`` hands vLLM an ``mla_reduce_v1`` that forwards the pre-v0.1.16
8-argument form (vLLM #46760); ``omit-attn-out-dtype`` leaves ``attn_out_dtype`` out on >= 0.29;
``skip-one-scale`` leaves ``_fp8_prefill_one_scale`` unset on 0.33; ``no-lock`` never locks the workspace.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

from mla_fp8_bench.backends.vllm_aiter import (
    DEFAULT_VLLM_MODULE,
    DEFAULT_WORKSPACE_MODULE,
    VllmAiter,
    VllmFeatures,
)

ADAPTER_FAULTS = ("reduce-8-arg", "omit-attn-out-dtype", "skip-one-scale", "no-lock")


def _reduce_8_arg_form(reduce_9: Any) -> Any:
    """``reduce-8-arg``: forward vLLM's call in the pre-v0.1.16 8-argument form (vLLM #46760)."""

    def mla_reduce_v1(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
                      max_seqlen_q, num_kv_splits, final_output, final_lse=None):
        return reduce_9(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
                        max_seqlen_q, final_output, final_lse)

    return mla_reduce_v1


class GivenAiterVllmAiter(VllmAiter):
    """:class:`~mla_fp8_bench.backends.vllm_aiter.VllmAiter` over ``aiter_module`` (the CPU stand-in of
    :mod:`mla_fp8_bench.aiter_ps.standin`) instead of the installed ``aiter``, placed in
    ``sys.modules["aiter"]`` while vLLM's builder imports from it, the platform gate bypassed, and vLLM's
    modules imported from ``vllm_module`` / ``workspace_module`` (stand-ins in the unit tests)."""

    bypass_gate = True

    def __init__(self, *, aiter_module: types.ModuleType, vllm_module: str = DEFAULT_VLLM_MODULE,
                 workspace_module: str = DEFAULT_WORKSPACE_MODULE) -> None:
        self._aiter = aiter_module
        self.vllm_module = vllm_module
        self.workspace_module = workspace_module

    @contextlib.contextmanager
    def _aiter_for_vllm(self) -> Iterator[None]:
        module = self._aiter
        if sys.modules.get("aiter") is module:
            yield
            return
        had, old = "aiter" in sys.modules, sys.modules.get("aiter")
        sys.modules["aiter"] = module
        try:
            yield
        finally:
            if had:
                sys.modules["aiter"] = old  # type: ignore[assignment]
            else:
                sys.modules.pop("aiter", None)


class FaultyVllmAiter(GivenAiterVllmAiter):
    """:class:`GivenAiterVllmAiter` with one of :data:`ADAPTER_FAULTS`. It keeps
    the name ``vllm-aiter``: a wrong adapter still reports as the adapter.

    Raises:
        ValueError: ``adapter_fault`` is not one of :data:`ADAPTER_FAULTS` (naming the allowed ones).
    """

    def __init__(self, *, adapter_fault: str, **kwargs: Any) -> None:
        if adapter_fault not in ADAPTER_FAULTS:
            raise ValueError(f"adapter_fault {adapter_fault!r} is unknown: allowed {', '.join(ADAPTER_FAULTS)}")
        super().__init__(**kwargs)
        self.adapter_fault = adapter_fault

    def _buffer_kwargs(self, feats: VllmFeatures, kw: dict[str, Any]) -> dict[str, Any]:
        kw = super()._buffer_kwargs(feats, kw)
        if self.adapter_fault == "omit-attn-out-dtype":
            kw.pop("attn_out_dtype", None)
        return kw

    def _lock(self, workspace: Any) -> None:
        if self.adapter_fault != "no-lock":
            super()._lock(workspace)

    def _bind_ops(self, impl: Any, aiter: types.ModuleType, feats: VllmFeatures) -> None:
        super()._bind_ops(impl, aiter, feats)
        if self.adapter_fault == "reduce-8-arg":
            impl._mla_reduce_v1 = _reduce_8_arg_form(aiter.mla_reduce_v1)
        if self.adapter_fault == "skip-one-scale" and hasattr(impl, "_fp8_prefill_one_scale"):
            del impl._fp8_prefill_one_scale


def for_testing(aiter_module: types.ModuleType, vllm_module: str = DEFAULT_VLLM_MODULE,
                workspace_module: str = DEFAULT_WORKSPACE_MODULE, adapter_fault: str | None = None) -> VllmAiter:
    """The ``vllm-aiter`` adapter over a given ``aiter`` module (e.g. the stand-in) and vLLM module
    paths, with the platform gate bypassed - so the adapter's own code runs on a CPU machine; with
    ``adapter_fault``, the deliberately wrong variant."""
    kw = dict(aiter_module=aiter_module, vllm_module=vllm_module, workspace_module=workspace_module)
    return GivenAiterVllmAiter(**kw) if adapter_fault is None else FaultyVllmAiter(adapter_fault=adapter_fault, **kw)
