"""FlashAttention-3 on Hopper (wheel ``fa3-fwd`` 0.0.3, imported lazily): ``fa3-fp8`` and its bf16 twin.
``run()`` is one host-sync free ``flash_attn_varlen_func`` call (last dims contiguous, fp32 ``(B, H_kv)``
descales as stride-0 views); LSE ``[H, T]`` is returned as ``[T, H]``."""

from __future__ import annotations

from importlib import import_module
from typing import Any, ClassVar

import torch

from mla_fp8_bench.aiter_ps.facts import dist_version
from mla_fp8_bench.backends.base import Backend, BackendUnavailable, CaseUnsupported, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.peers import first_line, load_once, loadable
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs

FA3_MODULE, FA3_DIST, FA3_PIN = "fa3_fwd_interface", "fa3-fwd", "fa3-fwd==0.0.3"
INSTALL_HINT = f"pip install {FA3_PIN} (wheel tag manylinux_2_24)"

_module_cache: dict[str, Any] = {}


def load_fa3() -> Any:
    """``fa3_fwd_interface`` (cached); BackendUnavailable when not installed or not importable."""
    return load_once(_module_cache, FA3_MODULE, _load)


def _load() -> Any:
    try:
        mod = import_module(FA3_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name == FA3_MODULE:
            raise BackendUnavailable(f"{FA3_DIST} is not installed: {INSTALL_HINT}") from None
        raise BackendUnavailable(f"{FA3_DIST} is installed but `import {FA3_MODULE}` failed ({first_line(exc)})") \
            from None
    except Exception as exc:  # noqa: BLE001 - any import failure (missing .so, ABI) is "unavailable"
        raise BackendUnavailable(f"{FA3_DIST} is installed but `import {FA3_MODULE}` failed ({first_line(exc)}); it "
                                 f"needs torch with CUDA 13 (libcudart.so.13); reinstall with {INSTALL_HINT}") from None
    if not hasattr(mod, "flash_attn_varlen_func"):
        raise BackendUnavailable(f"{FA3_MODULE} has no flash_attn_varlen_func: expected {FA3_PIN}")
    return mod


def split_out_lse(result: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(result, torch.Tensor):
        return result, None
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], torch.Tensor):
        return result[0], result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None
    raise TypeError(f"flash_attn_varlen_func returned {type(result).__name__}; expected a tensor or (out, lse)")


def expand_descale(descale: torch.Tensor, batch: int, heads_k: int) -> torch.Tensor:
    return descale.to(torch.float32).reshape(1, 1).expand(batch, heads_k)


def _contiguous_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class _Fa3Base(Backend):
    """Subclasses give ``_tensors(inputs) -> q, k, v, kwargs``."""

    context_chunks: ClassVar[Verdict] = Verdict.yes()

    def availability(self, platform: PlatformInfo) -> Verdict:
        if platform.vendor != "cuda" or platform.arch != "sm_90":
            return Verdict.no(f"needs an NVIDIA Hopper (sm_90) GPU; found {platform.describe()}")
        return loadable(load_fa3)

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        if self.fp8 and platform.fp8_dtype != torch.float8_e4m3fn:
            return Verdict.no(f"FA3 FP8 takes float8_e4m3fn only, not {platform.fp8_dtype}")
        return Verdict.yes()

    def prepare(self, inputs: CaseInputs) -> Prepared:
        if inputs.device.type != "cuda":
            raise BackendUnavailable(f"needs an NVIDIA Hopper (sm_90) GPU; found {inputs.device.type}")
        fn = load_fa3().flash_attn_varlen_func
        dqk, dv = int(inputs.q.shape[-1]), int(inputs.v.shape[-1])  # d_qk != d_v on Hopper: upstream 2a204125
        if not (128 < dqk <= 192 and 96 < dv <= 128) and dqk != dv:
            raise CaseUnsupported(f"FA3 with d_qk != d_v needs d_qk in (128, 192] and d_v in (96, 128]; got {dqk}/{dv}")
        if dqk % 16 or dv % 16:
            raise CaseUnsupported(f"FA3 needs head dims that are multiples of 16; got {dqk}/{dv}")
        same, causal = inputs.case.kind.same_q_kv, bool(inputs.causal)
        if causal and not same:
            raise CaseUnsupported(f"{inputs.case.id}: FA3 here runs causal calls with q_len == kv_len only; "
                                  "prefix cases are composed (prepare_case)")
        q, k, v, kw = self._tensors(inputs)
        cu_q = inputs.cu_seqlens_q.to(device=inputs.device, dtype=torch.int32).contiguous()
        cu_k = cu_q if same else inputs.cu_seqlens_kv.to(device=inputs.device, dtype=torch.int32).contiguous()
        max_q, max_k, scale = int(inputs.max_seqlen_q), int(inputs.max_seqlen_kv), float(inputs.softmax_scale)
        t = q.shape[0]
        state: dict[str, torch.Tensor | None] = {"lse": None}

        def run() -> torch.Tensor:
            with torch.no_grad():
                out, state["lse"] = split_out_lse(fn(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale,
                                                     causal=causal, return_attn_probs=True, **kw))
            return out

        def lse() -> tuple[torch.Tensor, torch.Tensor]:
            if (lse_t := state["lse"]) is None:
                raise RuntimeError("FA3 returned no LSE (call run() first; this build returns out only)")
            if lse_t.shape[0] == q.shape[1] and lse_t.shape[-1] == t:
                lse_t = lse_t.transpose(0, 1)  # [H, T] -> [T, H]
            return lse_t.float(), torch.ones(t, dtype=torch.bool)

        return Prepared(run=run, graph_capturable=True, timing_scope="kernel", lse=lse,
                        extras={"fa3_version": dist_version(FA3_DIST)})


class Fa3Fp8(_Fa3Base):
    name = "fa3-fp8"
    description = "FlashAttention-3 FP8 (fa3-fwd 0.0.3): e4m3 in, per-tensor descales, bf16 out (Hopper peer)"
    fp8 = True

    def _tensors(self, inputs: CaseInputs):
        if inputs.fp8_dtype != torch.float8_e4m3fn:
            raise CaseUnsupported(f"FA3 FP8 takes float8_e4m3fn only, not {inputs.fp8_dtype}")
        q, k, v = (_contiguous_last(x.data) for x in (inputs.q8, inputs.k8, inputs.v8))
        b, hk = int(inputs.cu_seqlens_q_cpu.numel()) - 1, int(k.shape[1])
        return q, k, v, {f"{n}_descale": expand_descale(x.descale.to(inputs.device), b, hk)
                         for n, x in (("q", inputs.q8), ("k", inputs.k8), ("v", inputs.v8))}


class Fa3Bf16(_Fa3Base):
    name = "fa3-bf16"
    description = "FlashAttention-3 bf16 (fa3-fwd 0.0.3) on the bf16 inputs (Hopper non-FP8 baseline)"
    fp8 = False

    def _tensors(self, inputs: CaseInputs):
        return (*(_contiguous_last(x.to(torch.bfloat16)) for x in (inputs.q, inputs.k, inputs.v)), {})
