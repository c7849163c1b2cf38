#!/usr/bin/env python3
"""Why is a small case slower when it is measured after a large one in the same process? One process.

A sequence of kernel timings (the suite's :func:`~mla_fp8_bench.measure.timing.time_device`) of FA3-FP8 that
separates the candidate causes: the same prepared small call (same buffers) before and after a large
case (an after-effect of the load, if it moves), a fresh copy of the small inputs allocated after the
large case (buffer placement, if only it moves), the same call again after idle seconds and after a
bf16 GEMM load (recovery of the state). Each step records latency, SM cycles per launch, the SM and
memory clock, temperature and power::

    python3 studies/after_effect.py --small s512 --large s8192 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="fa3-fp8")
    ap.add_argument("--small", default="s512")
    ap.add_argument("--large", default="s8192")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import torch

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.measure.timing import clock_fields, process_clock_state, time_device
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    pinfo = platform_info("auto")
    dev = pinfo.device
    b = get_backend(a.backend)
    st = process_clock_state(dev)
    reader = st["reader"]
    steps = []

    def t(label: str, prep) -> None:
        tr = time_device(prep.run, dev, graph_capturable=prep.graph_capturable)
        cf = clock_fields(tr)
        r = reader.read(full=True) if reader is not None and reader.available else None
        row = {"step": label, "latency_us": tr.median_s * 1e6, "cv": tr.cv, "cycles": cf.get("latency_sm_cycles"),
               "sm_mhz": cf.get("sm_clock_mhz"), "power_w": cf.get("gpu_power_w"), "temp_c": cf.get("gpu_temp_c"),
               "mem_mhz_after": getattr(r, "mem_mhz", None), "t": time.monotonic()}
        steps.append(row)
        print(f"{label:34s} {row['latency_us']:9.2f} us  cycles {row['cycles'] or 0:9.0f}  sm {row['sm_mhz']}  "
              f"mem {row['mem_mhz_after']}  {row['power_w']} W  {row['temp_c']} C", flush=True)

    small = parse_case_id(a.small)
    large = parse_case_id(a.large)
    in_a = make_inputs(small, dev, pinfo.fp8_dtype)
    pa = b.prepare_case(in_a)
    t("small A, first", pa)
    t("small A, again", pa)
    in_l = make_inputs(large, dev, pinfo.fp8_dtype)
    pl = b.prepare_case(in_l)
    t("large", pl)
    t("small A, right after large", pa)
    in_b = make_inputs(small, dev, pinfo.fp8_dtype)
    pb = b.prepare_case(in_b)
    t("small B (fresh buffers), after", pb)
    time.sleep(2.0)
    t("small A, after 2 s idle", pa)
    t("small B, after that", pb)
    del pl, in_l
    torch.cuda.empty_cache()
    in_c = make_inputs(small, dev, pinfo.fp8_dtype)
    pc = b.prepare_case(in_c)
    t("small C (large freed, fresh)", pc)
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    for _ in range(1500):
        torch.matmul(x, x)
    torch.cuda.synchronize(dev)
    t("small A, right after 1.5k GEMMs", pa)
    time.sleep(5.0)
    t("small A, after 5 s idle", pa)
    t("small C, after that", pc)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": pinfo.name, "heat_up": st.get("heat_up"), "steps": steps},
                                           indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
