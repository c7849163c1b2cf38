"""Error metrics of an attention output against a reference, computed in float64.

``mismatch_fraction`` follows AITER's ``checkAllclose`` (aiter/test_common.py): the fraction of
elements failing ``|out - ref| <= atol + rtol * |ref|`` (0 = pass, <= 0.05 warning, else fail there;
defaults atol = rtol = 5e-2 as in op_tests/test_mla_prefill_ps.py). Non-finite outputs count as
mismatches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

#: Floor of ``|ref|`` in the denominator of ``max_rel_error``: outputs are convex combinations of v
#: rows (|v| ~ 1 for randn), so 1e-2 keeps near-zero reference elements from dominating.
REL_ERROR_FLOOR = 1e-2
MISMATCH_ATOL = 5e-2
MISMATCH_RTOL = 5e-2


@dataclass(frozen=True)
class ErrorMetrics:
    """Errors of ``out`` vs ``ref``; all floats except ``nonfinite_count``.

    Attributes:
        max_abs_error: ``max |out - ref|`` over finite elements (inf if any output is non-finite).
        mean_abs_error: mean of ``|out - ref|`` over finite elements.
        rel_l2_error: ``||out - ref||_2 / ||ref||_2``.
        max_rel_error: ``max |out - ref| / max(|ref|, REL_ERROR_FLOOR)``.
        mismatch_fraction: AITER ``checkAllclose`` failing fraction at (atol, rtol).
        nonfinite_count: NaN/Inf elements in ``out``.
        numel: elements compared.
    """

    max_abs_error: float
    mean_abs_error: float
    rel_l2_error: float
    max_rel_error: float
    mismatch_fraction: float
    nonfinite_count: int
    numel: int

    def as_dict(self, suffix: str = "") -> dict[str, float]:
        """Fields as a dict, keys suffixed (e.g. ``max_abs_error_fp8_ref``)."""
        return {f"{k}{suffix}": v for k, v in asdict(self).items()}


def error_metrics(out: torch.Tensor, ref: torch.Tensor, *, atol: float = MISMATCH_ATOL, rtol: float = MISMATCH_RTOL,
                  rel_floor: float = REL_ERROR_FLOOR) -> ErrorMetrics:
    """Compare ``out`` with ``ref`` (same shape, any float dtypes, same device) in float64.

    Raises:
        ValueError: if shapes differ or tensors are empty.
    """
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference shape {tuple(ref.shape)}")
    if out.numel() == 0:
        raise ValueError("cannot compute errors of an empty tensor")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    finite = torch.isfinite(o)
    nonfinite = int((~finite).sum().item())
    diff = (o - r).abs()
    dfin = torch.where(finite, diff, torch.zeros_like(diff))
    max_abs = float("inf") if nonfinite else float(dfin.max().item())
    mean_abs = float(dfin.sum().item() / max(1, o.numel() - nonfinite))
    ref_norm = float(torch.linalg.vector_norm(r).item())
    rel_l2 = float("inf") if nonfinite else float(torch.linalg.vector_norm(dfin).item() / max(ref_norm, 1e-300))
    max_rel = float("inf") if nonfinite else float((dfin / r.abs().clamp_min(rel_floor)).max().item())
    ok = finite & (diff <= atol + rtol * r.abs())
    mismatch = 1.0 - float(ok.sum().item()) / o.numel()
    return ErrorMetrics(max_abs, mean_abs, rel_l2, max_rel, mismatch, nonfinite, o.numel())


def lse_error(lse: torch.Tensor, ref_lse: torch.Tensor, rows: torch.Tensor | None = None) -> float:
    """Max relative LSE error ``|lse - ref| / max(|ref|, 1)`` over ``rows`` (bool ``[T]`` mask) or all rows.

    Non-finite LSE values in the compared rows give ``inf``.
    """
    a = lse.detach().to(torch.float64)
    b = ref_lse.detach().to(device=a.device, dtype=torch.float64)
    if rows is not None:
        a, b = a[rows.to(a.device)], b[rows.to(a.device)]
    if a.numel() == 0:
        return 0.0
    if not torch.isfinite(a).all():
        return float("inf")
    return float(((a - b).abs() / b.abs().clamp_min(1.0)).max().item())
