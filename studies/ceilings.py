"""The device's own ceilings (GPU only), for studies/plot.py's TFLOP/s lines: ``fp8_gemm_tflops`` /
``bf16_gemm_tflops`` (an ``n x n x n`` GEMM, 2 n^3 FLOPs, on random data: a bf16 GEMM ran 13% faster on
zeros on an H200) and ``copy_tb_s`` (bytes read + written, eager or as a graph's memcpy node, the faster).

    python3 studies/ceilings.py RUN.json   # measures here and adds ``ceilings`` (and per-record fractions)
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# ruff: noqa: E402
from mla_fp8_bench.jsonio import load_json, write_file_atomic
from mla_fp8_bench.measure.devices import fp8_dtype_for, gpu_arch, platform_info
from mla_fp8_bench.measure.timing import time_device
from mla_fp8_bench.peers import first_line
from mla_fp8_bench.problem.flops import datasheet_peak

GEMM_N, COPY_BYTES = 8192, 2 * 2**30


def _timed(run, device: torch.device, samples: int, capturable: bool = True) -> dict[str, Any]:
    tr = time_device(run, device, graph_capturable=capturable, samples=samples, time_budget_s=5.0)
    return {"median_s": tr.median_s, "cv": tr.cv, "method": tr.method}


def _fp8_gemm(device: torch.device, n: int, samples: int) -> dict[str, Any]:
    if not hasattr(torch, "_scaled_mm"):
        return {"status": "skipped", "reason": f"torch {torch.__version__} has no torch._scaled_mm"}
    fp8 = fp8_dtype_for("rocm", gpu_arch(device)) if getattr(torch.version, "hip", None) else torch.float8_e4m3fn
    fmax, gen = float(torch.finfo(fp8).max), torch.Generator(device=device).manual_seed(0)
    a, bt = (torch.randn(n, n, device=device, generator=gen).clamp_(-fmax, fmax).to(fp8) for _ in range(2))
    one = torch.ones((), device=device, dtype=torch.float32)  # b: column-major [K, N], as cuBLASLt requires
    return _gemm(lambda: torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device, n,
                 samples, dtype=str(fp8).replace("torch.", ""))


def _bf16_gemm(device: torch.device, n: int, samples: int) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(1)
    a, b = (torch.randn(n, n, device=device, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    return _gemm(lambda: torch.matmul(a, b, out=out), device, n, samples)


def _gemm(run, device: torch.device, n: int, samples: int, **extra: Any) -> dict[str, Any]:
    run()
    t = _timed(run, device, samples)
    return {"status": "ok", "tflops": 2.0 * n ** 3 / t["median_s"] / 1e12, **t, **extra, "shape": [n, n, n]}


def _copy(device: torch.device, nbytes: int, samples: int) -> dict[str, Any]:
    """``dst.copy_(src)`` as eager launches and as graph replay (a memcpy node the driver may run on a copy
    engine: about 2.7 TB/s against 4 TB/s eager on an H200); the faster is the ceiling, both are kept."""
    src = torch.rand(nbytes // 4, device=device, dtype=torch.float32)
    run, moved = functools.partial(torch.empty_like(src).copy_, src), 2 * src.numel() * 4
    run()
    res: dict[str, Any] = {"status": "ok", "bytes_moved": moved}
    for label, cap in (("eager", False), ("graph", True)):
        t = _timed(run, device, samples, cap)
        res[label] = {"tb_s": moved / t["median_s"] / 1e12, **t}
    best = res[max(("eager", "graph"), key=lambda k: res[k]["tb_s"])]
    return {**res, "tb_s": best["tb_s"], "median_s": best["median_s"], "method": best["method"]}


def measure_ceilings(device: str | torch.device = "auto", *, gemm_n: int = GEMM_N, copy_bytes: int = COPY_BYTES,
                     samples: int = 20) -> dict[str, Any]:
    """``{"status": "ok", "device_name", "arch", "fp8_gemm_tflops", "bf16_gemm_tflops", "copy_tb_s",
    "datasheet", "<part>_fraction_of_datasheet", "details"}``; ``{"status": "skipped", "reason"}`` on a CPU;
    a failing part is None, its reason in ``details``."""
    pinfo = platform_info(device)
    if pinfo.device.type != "cuda":
        return {"status": "skipped", "reason": "ceilings are measured on GPUs only; this run is on the cpu"}
    details: dict[str, Any] = {}
    for key, fn, arg in (("fp8_gemm", _fp8_gemm, gemm_n), ("bf16_gemm", _bf16_gemm, gemm_n),
                         ("copy", _copy, copy_bytes)):
        try:
            details[key] = fn(pinfo.device, arg, samples)
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
    for key, part, pk in (("fp8_gemm_tflops", "fp8_gemm", "fp8"), ("bf16_gemm_tflops", "bf16_gemm", "bf16"),
                          ("copy_tb_s", "copy", "hbm_tb_s")):
        if peak and res[key] is not None:
            res[f"{part}_fraction_of_datasheet"] = res[key] / peak[pk]
    return res


def annotate_records(data: dict[str, Any], ceil: dict[str, Any]) -> None:
    """Add ``ceiling_kind``, ``fraction_of_ceiling`` and ``fraction_of_datasheet`` (of the FP8 or bf16 GEMM,
    by the record's ``fp8``) to every ok, non-emulation record with ``tflops`` whose precision is known."""
    if ceil.get("status") != "ok":
        return
    from mla_fp8_bench.backends import record_is_fp8
    from mla_fp8_bench.measure.metric_table import record_is_emulation

    for rec in data.get("records", []):
        tf = rec.get("tflops")
        if rec.get("status") != "ok" or tf is None or record_is_emulation(rec) or (fp8 := record_is_fp8(rec)) is None:
            continue
        kind = "fp8" if fp8 else "bf16"
        c, p = ceil.get(f"{kind}_gemm_tflops"), (ceil.get("datasheet") or {}).get(kind)
        rec.update(ceiling_kind=f"{kind}_gemm", fraction_of_ceiling=tf / c if c else None,
                   fraction_of_datasheet=tf / p if p else None)


def attach(data: dict[str, Any], device: str | torch.device | None = None) -> dict[str, Any]:
    """Measure the ceilings once into ``data["ceilings"]`` (and per-record fractions) and return them on
    ``device`` (default ``data["env"]["device"]``, else ``auto``). Failures are recorded, never raised."""
    try:
        ceil = measure_ceilings(device if device is not None else data.get("env", {}).get("device") or "auto")
    except Exception as exc:  # noqa: BLE001
        ceil = {"status": "error", "reason": first_line(exc)}
    data["ceilings"] = ceil
    annotate_records(data, ceil)
    return ceil


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 studies/ceilings.py RUN.json")
    doc = load_json(sys.argv[1], "run JSON")
    print(json.dumps({k: v for k, v in attach(doc).items() if k != "details"}))
    write_file_atomic(sys.argv[1], lambda f: json.dump(doc, f, indent=1))
