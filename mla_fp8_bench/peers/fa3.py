"""FlashAttention-3 on Hopper: the full-FP8 peer (``fa3-fp8``) and its bf16 twin (``fa3-bf16``), from the
PyPI wheel ``fa3-fwd`` 0.0.3 (module ``fa3_fwd_interface``, lazily imported; docs/aiter-contract.md#fa3).
``run()`` is one ``flash_attn_varlen_func`` call with ``return_attn_probs=True``, host-sync free.

* q ``[T, H, 192]``, k ``[T_kv, H, 192]``, v ``[T_kv, H, 128]``: ``float8_e4m3fn`` or bf16, last dim
  contiguous (the bf16 ``mla`` v stays the strided ``kv_b_proj`` view, as vLLM passes it).
* cu_seqlens_q / cu_seqlens_k ``[B+1]`` int32 on the device (``ctx``: ``causal=False``); ``prefix`` cases
  are composed (:func:`mla_fp8_bench.backends.base.compose_prefix`), so FA3 never runs causally with
  q_len != kv_len.
* descales: fp32 ``(B, H_kv)``, stride-0 views of the per-tensor ``[1]``.
* out ``[T, H, 128]`` bf16; lse ``[H, T]`` fp32 (natural log), returned as ``[T, H]``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, ClassVar

import torch

from mla_fp8_bench.aiter_ps.facts import dist_version
from mla_fp8_bench.backends.base import Backend, BackendUnavailable, CaseUnsupported, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.peers import first_line, load_once, loadable
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs

#: The Python module of the wheel and the exact wheel to install.
FA3_MODULE = "fa3_fwd_interface"
FA3_DIST = "fa3-fwd"
FA3_PIN = "fa3-fwd==0.0.3"
INSTALL_HINT = f"pip install {FA3_PIN} (wheel tag manylinux_2_24)"

_module_cache: dict[str, Any] = {}


def _find_spec(name: str) -> Any:
    return importlib.util.find_spec(name)


def _import_module(name: str) -> Any:
    return importlib.import_module(name)


def load_fa3() -> Any:
    """``fa3_fwd_interface`` (cached); BackendUnavailable: not installed, or the import failed (e.g. the
    0.0.3 wheel links ``libcudart.so.13``)."""
    return load_once(_module_cache, FA3_MODULE, _load)


def _load() -> Any:
    try:
        spec = _find_spec(FA3_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise BackendUnavailable(f"{FA3_DIST} is not installed: {INSTALL_HINT}")
    try:
        mod = _import_module(FA3_MODULE)
    except Exception as exc:  # noqa: BLE001 - any import failure (missing .so, ABI) is "unavailable"
        raise BackendUnavailable(f"{FA3_DIST} is installed but `import {FA3_MODULE}` failed ({first_line(exc)}); "
                                 "it needs torch with CUDA 13 (libcudart.so.13); "
                                 f"reinstall with {INSTALL_HINT}") from None
    if not hasattr(mod, "flash_attn_varlen_func"):
        raise BackendUnavailable(f"{FA3_MODULE} has no flash_attn_varlen_func: expected {FA3_PIN}")
    return mod


def split_out_lse(result: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``flash_attn_varlen_func`` returns ``out`` or ``(out, lse, ...)`` depending on build and flags."""
    if isinstance(result, torch.Tensor):
        return result, None
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], torch.Tensor):
        lse = result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None
        return result[0], lse
    raise TypeError(f"flash_attn_varlen_func returned {type(result).__name__}; expected a tensor or (out, lse)")


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class _Fa3Base(Backend):
    """Shared FA3 plumbing; subclasses choose the input precision (``_tensors(inputs) -> q, k, v, kwargs``)."""

    context_chunks: ClassVar[Verdict] = Verdict.yes()

    def availability(self, platform: PlatformInfo) -> Verdict:
        """NVIDIA Hopper (sm_90) with ``fa3-fwd`` importable; otherwise a precise reason."""
        if platform.vendor != "cuda" or platform.arch != "sm_90":
            return Verdict.no(f"needs an NVIDIA Hopper (sm_90) GPU; found {platform.describe()}")
        return loadable(load_fa3)

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        if self.fp8 and platform.fp8_dtype != torch.float8_e4m3fn:
            return Verdict.no(f"FA3 FP8 takes float8_e4m3fn only, not {platform.fp8_dtype}")
        return Verdict.yes()

    def prepare(self, inputs: CaseInputs) -> Prepared:
        """Casts, contiguity and descales, outside the timed ``run``. BackendUnavailable: not a CUDA device
        or no fa3-fwd; CaseUnsupported: head dims FA3 does not build, or a non-e4m3fn fp8 dtype."""
        if inputs.device.type != "cuda":
            raise BackendUnavailable(f"needs an NVIDIA Hopper (sm_90) GPU; found {inputs.device.type}")
        fa3 = load_fa3()
        dqk, dv = int(inputs.q.shape[-1]), int(inputs.v.shape[-1])  # d_qk != d_v on Hopper: upstream 2a204125
        if not (128 < dqk <= 192 and 96 < dv <= 128) and dqk != dv:
            raise CaseUnsupported(f"FA3 with d_qk != d_v needs d_qk in (128, 192] and d_v in (96, 128]; got "
                                  f"{dqk}/{dv}")
        if dqk % 16 or dv % 16:
            raise CaseUnsupported(f"FA3 needs head dims that are multiples of 16; got {dqk}/{dv}")
        q, k, v, kw = self._tensors(inputs)
        cu_q = inputs.cu_seqlens_q.to(device=inputs.device, dtype=torch.int32).contiguous()
        cu_k = cu_q if inputs.case.kind.same_q_kv else \
            inputs.cu_seqlens_kv.to(device=inputs.device, dtype=torch.int32).contiguous()
        max_q, max_k = int(inputs.max_seqlen_q), int(inputs.max_seqlen_kv)
        causal = bool(inputs.causal)
        if causal and not inputs.case.kind.same_q_kv:
            raise CaseUnsupported(f"{inputs.case.id}: FA3 here runs causal calls with q_len == kv_len only; "
                                  "prefix cases are composed (prepare_case)")
        scale = float(inputs.softmax_scale)
        fn = fa3.flash_attn_varlen_func
        state: dict[str, torch.Tensor | None] = {"lse": None}

        def run() -> torch.Tensor:
            with torch.no_grad():
                res = fn(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal,
                         return_attn_probs=True, **kw)
            out, lse = split_out_lse(res)
            state["lse"] = lse
            return out

        t = q.shape[0]

        def lse() -> tuple[torch.Tensor, torch.Tensor]:
            lse_t = state["lse"]
            if lse_t is None:
                raise RuntimeError("FA3 returned no LSE (call run() first; this build returns out only)")
            if lse_t.shape[0] == q.shape[1] and lse_t.shape[-1] == t:
                lse_t = lse_t.transpose(0, 1)  # [H, T] -> [T, H]
            return lse_t.float(), torch.ones(t, dtype=torch.bool)

        return Prepared(run=run, graph_capturable=True, timing_scope="kernel", lse=lse,
                        extras={"fa3_version": dist_version(FA3_DIST)})


def expand_descale(descale: torch.Tensor, batch: int, heads_k: int) -> torch.Tensor:
    """A per-tensor fp32 descale ``[1]`` as FA3's ``(batch, num_heads_k)``: a stride-0 expanded view."""
    return descale.to(torch.float32).reshape(1, 1).expand(batch, heads_k)


class Fa3Fp8(_Fa3Base):
    """FA3 FP8 forward: e4m3 q/k/v with per-tensor descales in, bf16 out (the Hopper FP8 peer)."""

    name = "fa3-fp8"
    description = "FlashAttention-3 FP8 (fa3-fwd 0.0.3): e4m3 in, per-tensor descales, bf16 out (Hopper peer)"
    fp8 = True

    def _tensors(self, inputs: CaseInputs):
        if inputs.fp8_dtype != torch.float8_e4m3fn:
            raise CaseUnsupported(f"FA3 FP8 takes float8_e4m3fn only, not {inputs.fp8_dtype}")
        q, k, v = (_last_dim_contiguous(x.data) for x in (inputs.q8, inputs.k8, inputs.v8))
        b, hk = int(inputs.cu_seqlens_q_cpu.numel()) - 1, int(k.shape[1])
        kw = {f"{n}_descale": expand_descale(x.descale.to(inputs.device), b, hk)
              for n, x in (("q", inputs.q8), ("k", inputs.k8), ("v", inputs.v8))}
        return q, k, v, kw


class Fa3Bf16(_Fa3Base):
    """FA3 bf16 forward on the original bf16 inputs (non-FP8 baseline on Hopper)."""

    name = "fa3-bf16"
    description = "FlashAttention-3 bf16 (fa3-fwd 0.0.3) on the bf16 inputs (Hopper non-FP8 baseline)"
    fp8 = False

    def _tensors(self, inputs: CaseInputs):
        q, k, v = (_last_dim_contiguous(x.to(torch.bfloat16)) for x in (inputs.q, inputs.k, inputs.v))
        return q, k, v, {}
