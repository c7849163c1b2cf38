"""FP8 e4m3 quantisation as the paths under test do it, in two modes. ``per_tensor``: AITER's
``per_tensor_quant`` (op_tests/test_mla_prefill_ps.py), ``scale = amax / fp8_max``, ``x8 = clamp(x / scale,
-fp8_max, fp8_max).to(fp8)``, descale ``scale``; the clamp is explicit (eager e4m3fn casts gave NaN above 464 up
to PyTorch 2.11, pytorch#178817). ``cast``: vLLM's ``_mla_fp8_prefill_attn``, ``x.to(fp8)`` at unit descale,
torch's own behaviour beyond +-fp8_max on purpose (saturating from 2.12, NaN before: :func:`cast_saturates`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


class QuantError(ValueError):
    """Invalid quantisation request (unknown mode, dtype, non-finite input)."""


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype: 448 for e4m3fn, 240 for e4m3fnuz."""
    if dtype not in FP8_DTYPES:
        raise QuantError(f"fp8 dtype {dtype} is not supported: allowed {', '.join(map(str, FP8_DTYPES))}")
    return float(torch.finfo(dtype).max)


@dataclass
class Quantized:
    """An fp8 tensor and its descale."""

    data: torch.Tensor  # fp8, the input's shape, contiguous
    descale: torch.Tensor  # fp32 [1] on the same device; real value = data * descale
    mode: str  # "per_tensor" or "cast"

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.data.to(dtype) * self.descale.to(dtype)


def quantize(x: torch.Tensor, mode: str = "per_tensor", fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> Quantized:
    """Quantise ``x`` (bf16/fp16/fp32, any shape, may be a strided view) to ``fp8_dtype`` (e4m3fn: gfx950,
    Hopper; e4m3fnuz: gfx942) in ``mode`` ``"per_tensor"`` or ``"cast"``: a :class:`Quantized` with a
    contiguous fp8 ``data`` and an fp32 ``[1]`` ``descale``. QuantError: unknown mode, non-floating input,
    unsupported fp8 dtype, or (per_tensor) a non-finite amax."""
    if mode not in ("per_tensor", "cast"):
        raise QuantError(f"quantisation mode {mode!r} is unknown: allowed per_tensor, cast")
    if not torch.is_floating_point(x) or x.dtype in FP8_DTYPES:
        raise QuantError(f"input dtype {x.dtype} is not a float16/bfloat16/float32 tensor")
    fmax = fp8_max(fp8_dtype)
    if mode == "cast":
        return Quantized(x.contiguous().to(fp8_dtype), torch.ones(1, dtype=torch.float32, device=x.device), mode)
    amax = (xf := x.float()).abs().amax()
    if not torch.isfinite(amax):
        raise QuantError("per_tensor quantisation needs finite inputs: amax is not finite (NaN or Inf in the tensor)")
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)).reshape(1).float()
    data = (xf / scale).clamp_(-fmax, fmax).to(fp8_dtype).contiguous()
    return Quantized(data, scale, mode)


def cast_saturates(fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> bool:
    """Whether this torch's plain ``.to(fp8)`` saturates out-of-range values (True from 2.12)."""
    return bool(torch.isfinite(torch.tensor([10_000.0]).to(fp8_dtype).float()).all())
