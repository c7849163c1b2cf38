"""Error metrics of an attention output against a reference, in float64."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import torch

from mla_fp8_bench.problem.cases import CaseKind

#: Floor of ``|ref|`` in ``max_rel_error``, so near-zero reference elements (|v| ~ 1) do not dominate.
REL_ERROR_FLOOR = 1e-2
MISMATCH_ATOL = MISMATCH_RTOL = 5e-2  # AITER's checkAllclose in op_tests/test_mla_prefill_ps.py


@dataclass(frozen=True)
class ErrorMetrics:
    max_abs_error: float  # max |out - ref| over finite elements (inf if any output is non-finite)
    mean_abs_error: float  # mean of |out - ref| over finite elements
    rel_l2_error: float  # ||out - ref||_2 / ||ref||_2 (an all-zero ref: / REL_ERROR_FLOOR * sqrt(numel))
    max_rel_error: float  # max |out - ref| / max(|ref|, REL_ERROR_FLOOR)
    mismatch_fraction: float  # failing |out - ref| <= atol + rtol * |ref| (checkAllclose); non-finite fail
    nonfinite_count: int  # NaN/Inf elements in ``out``
    numel: int  # elements compared

    def as_dict(self, suffix: str = "") -> dict[str, float]:
        return {f"{k}{suffix}": v for k, v in asdict(self).items()}


def error_metrics(out: torch.Tensor, ref: torch.Tensor, *, atol: float = MISMATCH_ATOL, rtol: float = MISMATCH_RTOL,
                  rel_floor: float = REL_ERROR_FLOOR) -> ErrorMetrics:
    """``out`` vs ``ref`` (same shape, any float dtypes); ValueError if the shapes differ or they are empty."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference shape {tuple(ref.shape)}")
    if out.numel() == 0:
        raise ValueError("cannot compute errors of an empty tensor")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    finite, n = torch.isfinite(o), o.numel()
    nonfinite = int((~finite).sum().item())
    diff = (o - r).abs()
    dfin = torch.where(finite, diff, torch.zeros_like(diff))
    ref_norm = float(torch.linalg.vector_norm(r).item())
    den = ref_norm if ref_norm > sys.float_info.min * math.sqrt(n) else rel_floor * math.sqrt(n)
    inf = float("inf")
    return ErrorMetrics(
        max_abs_error=inf if nonfinite else float(dfin.max().item()),
        mean_abs_error=float(dfin.sum().item() / max(1, n - nonfinite)),
        rel_l2_error=inf if nonfinite else float(torch.linalg.vector_norm(dfin).item() / den),
        max_rel_error=inf if nonfinite else float((dfin / r.abs().clamp_min(rel_floor)).max().item()),
        mismatch_fraction=1.0 - float((finite & (diff <= atol + rtol * r.abs())).sum().item()) / n,
        nonfinite_count=nonfinite, numel=n)


def _lse_pair(lse: torch.Tensor, ref_lse: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    a = lse.detach().to(torch.float64)
    b = ref_lse.detach().to(device=a.device, dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"LSE shape {tuple(a.shape)} differs from reference LSE shape {tuple(b.shape)}")
    return (a, b) if rows is None else (a[rows.to(a.device)], b[rows.to(a.device)])


def lse_error(lse: torch.Tensor, ref_lse: torch.Tensor, rows: torch.Tensor | None = None) -> float:
    """Max ``|lse - ref| / max(|ref|, 1)`` of ``[T, H]`` LSEs over bool ``rows`` or all (0 when none). Where the
    reference is -inf any infinite ``lse`` is exact (vLLM's merge reads +-inf as -inf), a finite one inf."""
    a, b = _lse_pair(lse, ref_lse, rows)
    if a.numel() == 0:
        return 0.0
    empty = torch.isneginf(b)
    finite_b = torch.where(empty, 0.0, b)
    err = torch.where(torch.isfinite(a), (a - finite_b).abs() / finite_b.abs().clamp_min(1.0), math.inf)
    return float(torch.where(empty, torch.where(torch.isinf(a), 0.0, math.inf), err).max().item())


def lse_metrics(lse: torch.Tensor, rows: torch.Tensor, ref_lse: torch.Tensor, kind: CaseKind) -> dict[str, float | int]:
    """``lse_rel_error_fp8_ref``, ``lse_rows_checked``, ``lse_nonfinite_count``. ``prefill`` compares the
    ``rows`` the backend wrote; kinds with context compare every row, as vLLM merges on every row."""
    mask = None if kind.context else rows
    a, b = _lse_pair(lse, ref_lse, mask)
    return {"lse_rel_error_fp8_ref": lse_error(lse, ref_lse, mask),
            "lse_rows_checked": int(rows.sum().item()) if mask is not None else int(lse.shape[0]),
            "lse_nonfinite_count": int((~torch.isfinite(a) & torch.isfinite(b)).sum().item())}
