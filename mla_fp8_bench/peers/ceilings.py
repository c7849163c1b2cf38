"""The device's own ceilings, measured once per run in its process (GPU only; docs/methodology.md §4):
``fp8_gemm_tflops`` / ``bf16_gemm_tflops`` (TFLOP/s of an ``n x n x n`` GEMM, 2 n^3 FLOPs, on random data:
a bf16 GEMM ran 13% faster on zeros on an H200) and ``copy_tb_s`` (TB/s, bytes read + written).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from mla_fp8_bench.peers import first_line
from mla_fp8_bench.problem.flops import datasheet_peak

#: GEMM size and copy size of the measurement.
GEMM_N = 8192
COPY_BYTES = 2 * 2**30


def _fp8_gemm(device: torch.device, n: int, samples: int) -> dict[str, Any]:
    if not hasattr(torch, "_scaled_mm"):
        return {"status": "skipped", "reason": f"torch {torch.__version__} has no torch._scaled_mm"}
    fp8 = torch.float8_e4m3fn
    if getattr(torch.version, "hip", None):
        from mla_fp8_bench.measure.devices import fp8_dtype_for, gpu_arch

        fp8 = fp8_dtype_for("rocm", gpu_arch(device))
    fmax = float(torch.finfo(fp8).max)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=gen).clamp_(-fmax, fmax).to(fp8)
    bt = torch.randn(n, n, device=device, generator=gen).clamp_(-fmax, fmax).to(fp8)
    b = bt.t()  # column-major [K, N], as cuBLASLt requires
    one = torch.ones((), device=device, dtype=torch.float32)
    return _gemm_ceiling(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                         device, n, samples, dtype=str(fp8).replace("torch.", ""))


def _bf16_gemm(device: torch.device, n: int, samples: int) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(1)
    a = torch.randn(n, n, device=device, generator=gen, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, generator=gen, dtype=torch.bfloat16)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    return _gemm_ceiling(lambda: torch.matmul(a, b, out=out), device, n, samples)


def _gemm_ceiling(run, device: torch.device, n: int, samples: int, **extra: Any) -> dict[str, Any]:
    """TFLOP/s (``2 n^3`` per call) of an ``n x n x n`` GEMM ``run``, timed by graph replay."""
    from mla_fp8_bench.measure.timing import time_device

    run()
    tr = time_device(run, device, graph_capturable=True, samples=samples, time_budget_s=5.0)
    return {"status": "ok", "tflops": 2.0 * n ** 3 / tr.median_s / 1e12, "median_s": tr.median_s, "cv": tr.cv,
            "method": tr.method, **extra, "shape": [n, n, n]}


def _copy(device: torch.device, nbytes: int, samples: int) -> dict[str, Any]:
    """``dst.copy_(src)`` timed as eager launches between events and as CUDA-graph replay (a memcpy node the
    driver may run on a copy engine: about 2.7 TB/s against 4 TB/s eager on an H200); the faster is the
    ceiling, both are kept."""
    from mla_fp8_bench.measure.timing import time_device

    n = nbytes // 4
    src = torch.rand(n, device=device, dtype=torch.float32)
    run = functools.partial(torch.empty_like(src).copy_, src)
    run()
    res: dict[str, Any] = {"status": "ok", "bytes_moved": 2 * n * 4}
    for label, cap in (("eager", False), ("graph", True)):
        tr = time_device(run, device, graph_capturable=cap, samples=samples, time_budget_s=5.0)
        res[label] = {"tb_s": 2.0 * n * 4 / tr.median_s / 1e12, "median_s": tr.median_s, "cv": tr.cv,
                      "method": tr.method}
    best = max(("eager", "graph"), key=lambda k: res[k]["tb_s"])
    res.update(tb_s=res[best]["tb_s"], median_s=res[best]["median_s"], method=res[best]["method"])
    return res


def measure_ceilings(device: str | torch.device = "auto", *, gemm_n: int = GEMM_N, copy_bytes: int = COPY_BYTES,
                     samples: int = 20) -> dict[str, Any]:
    """``{"status": "ok", "device_name", "arch", "fp8_gemm_tflops", "bf16_gemm_tflops", "copy_tb_s",
    "datasheet": {"fp8", "bf16", "hbm_tb_s"} | None, "<part>_fraction_of_datasheet", "details"}`` on
    ``device``, ``{"status": "skipped", "reason"}`` on a CPU; a failing part is None, its reason in ``details``."""
    from mla_fp8_bench.measure.devices import platform_info

    pinfo = platform_info(device)
    if pinfo.device.type != "cuda":
        return {"status": "skipped", "reason": "ceilings are measured on GPUs only; this run is on the cpu"}
    dev = pinfo.device
    details: dict[str, Any] = {}
    for key, fn, arg in (("fp8_gemm", _fp8_gemm, gemm_n), ("bf16_gemm", _bf16_gemm, gemm_n),
                         ("copy", _copy, copy_bytes)):
        try:
            details[key] = fn(dev, arg, samples)
        except Exception as exc:  # noqa: BLE001 - one failing ceiling must not lose the others
            details[key] = {"status": "error", "reason": first_line(exc)}
        finally:
            torch.cuda.empty_cache()
    peak = datasheet_peak(pinfo.name, pinfo.arch)
    res: dict[str, Any] = {"status": "ok", "device_name": pinfo.name, "arch": pinfo.arch,
                           "fp8_gemm_tflops": details["fp8_gemm"].get("tflops"),
                           "bf16_gemm_tflops": details["bf16_gemm"].get("tflops"),
                           "copy_tb_s": details["copy"].get("tb_s"), "datasheet": dict(peak) if peak else None,
                           "details": details}
    if peak:
        for k, pk in (("fp8_gemm_tflops", "fp8"), ("bf16_gemm_tflops", "bf16"), ("copy_tb_s", "hbm_tb_s")):
            if res[k] is not None:
                res[k.replace("_tflops", "").replace("_tb_s", "") + "_fraction_of_datasheet"] = res[k] / peak[pk]
    return res


def annotate_records(data: dict[str, Any], ceil: dict[str, Any]) -> None:
    """Add ``fraction_of_ceiling`` / ``fraction_of_datasheet`` (of the FP8 or bf16 GEMM, by the record's
    ``fp8``) to every ok, non-emulation record with ``tflops`` whose precision is known."""
    if ceil.get("status") != "ok":
        return
    from mla_fp8_bench.backends import record_is_fp8
    from mla_fp8_bench.measure.metric_table import record_is_emulation

    peak = ceil.get("datasheet") or {}
    for rec in data.get("records", []):
        tf = rec.get("tflops")
        if rec.get("status") != "ok" or tf is None or record_is_emulation(rec):
            continue
        is_fp8 = record_is_fp8(rec)
        if is_fp8 is None:
            continue
        kind = "fp8" if is_fp8 else "bf16"
        c, p = ceil.get(f"{kind}_gemm_tflops"), peak.get(kind)
        rec["ceiling_kind"] = f"{kind}_gemm"
        rec["fraction_of_ceiling"] = tf / c if c else None
        rec["fraction_of_datasheet"] = tf / p if p else None


def attach(data: dict[str, Any], device: str | torch.device | None = None, enabled: bool = True) -> dict[str, Any]:
    """Measure the ceilings once into ``data["ceilings"]`` (and per-record fractions) and return them;
    ``device`` defaults to ``data["env"]["device"]``, else ``auto``; ``enabled=False``
    (``MLA_FP8_BENCH_CEILINGS=0``) measures nothing. Measurement failures are recorded, never raised."""
    if not enabled:
        ceil: dict[str, Any] = {"status": "skipped", "reason": "MLA_FP8_BENCH_CEILINGS=0"}
    else:
        dev = device if device is not None else (data.get("env", {}).get("device") or "auto")
        try:
            ceil = measure_ceilings(dev)
        except Exception as exc:  # noqa: BLE001
            ceil = {"status": "error", "reason": first_line(exc)}
    data["ceilings"] = ceil
    annotate_records(data, ceil)
    return ceil
