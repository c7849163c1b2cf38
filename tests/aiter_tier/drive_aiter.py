"""Driver of the real-AITER tier: one AITER revision per process (``test_aiter_real.py`` starts it).

``python tests/aiter_tier/drive_aiter.py --root <aiter source tree> --version 0.1.20 --work <tmp> --out r.json``
installs AITER's real Python layer with the compiled modules bound to the emulation
(:mod:`real_layer`), then runs the suite's shipped ``aiter`` backend (``backends/aiter_real.py``, opted in
off gfx950 with ``RunConfig(aiter_any_device=True)``) through AITER's own wrappers on prefill, ragged,
ctx and prefix cases and compares each output and LSE with the direct emulation (``aiter-emulated`` at
the matching release) bit for bit. It also records what the driver detected and where it read it,
the runner's record of the ``lse-gap`` cases, and what ``mla-fp8-bench env`` prints.

``--env-only`` prints ``mla-fp8-bench env`` with the layer installed and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_layer  # noqa: E402

CASES = (
    "s255-h2", "s256-h2", "s257-h2",          # q-tile edges
    "ragged-255-1-300-257-h2",                # ragged, with a 1-token sequence
    "s300-h32",                               # a head count the reduce gained in v0.1.11
    "s512-h8-cast", "s512-h12-cast", "s512-h64-cast",  # serving head counts of the asv grid (12: never dispatched)
    "ctx300-q100-h2", "ctx-ragged-1024q256-100q64-h2",  # context chunks (non-causal, q_len < kv_len)
    "prefix256-q100-h2", "prefix-ragged-300q40-0q9-h2",  # prefix-cached prefill: two calls merged by LSE
)
#: lse-gap cases run through the runner (16 heads on 256 CUs: unsplit tiles)
LSE_GAP_CASES = ("ctx100-q64", "prefix256-q100")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def compare_case(real, emulated, cid: str) -> dict:
    """Run ``cid`` through both backends; bitwise equality of the output and of the LSE rows both wrote."""
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    inputs = make_inputs(parse_case_id(cid))
    rec: dict = {"case": cid}
    sup = real.supports(inputs.case, None)
    rec["supported"], rec["reason"] = bool(sup), sup.reason
    if not sup:
        return rec
    got, want = real.prepare_case(inputs), emulated.prepare_case(inputs)
    out, ref = got.run().clone(), want.run().clone()
    rec["equal_out"] = bool(torch.equal(_bits(out), _bits(ref)))
    (lse, valid), (ref_lse, ref_valid) = got.lse(), want.lse()
    both = valid.cpu() & ref_valid.cpu()
    rec["lse_rows"] = int(valid.sum())
    rec["lse_rows_direct"] = int(ref_valid.sum())
    rec["equal_lse"] = bool(torch.equal(_bits(lse[both]), _bits(ref_lse[both])))
    rec["nonfinite_out"] = int((~torch.isfinite(out.float())).sum())
    rec["need_lse"] = got.extras.get("need_lse")
    rec["num_partials"] = got.extras.get("num_partials")
    rec["timing_scope"] = got.timing_scope
    return rec


def lse_gap_records(backend) -> dict:
    """The runner's records of the lse-gap cases through the real layer."""
    from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.problem.cases import parse_case_id

    cpu = platform_info("cpu")
    out = {}
    for cid in LSE_GAP_CASES:
        rec = evaluate_one(backend, CaseData(parse_case_id(cid), cpu, None), cpu,
                           RunOptions(timing=False, determinism=False)).as_dict()
        out[cid] = {k: rec.get(k) for k in ("status", "lse_nonfinite_count", "lse_rel_error_fp8_ref",
                                            "max_abs_error_fp8_ref", "aiter_planner_revision", "need_lse")}
    return out


def env_text() -> str:
    from mla_fp8_bench.cli import main as cli_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli_main(["env", "--aiter-any-device"])
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="AITER source tree (holds aiter/ops/attention.py)")
    ap.add_argument("--version", required=True, help="the release whose compiled reduce the binding emulates")
    ap.add_argument("--direct-version", help="aiter-emulated's version to compare with (default --version)")
    ap.add_argument("--work", required=True, help="scratch folder (a temporary directory)")
    ap.add_argument("--out", help="JSON report path")
    ap.add_argument("--cases", nargs="*", help="case ids (default: the tier's list)")
    ap.add_argument("--env-only", action="store_true", help="print `mla-fp8-bench env` and exit")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    aiter = real_layer.install(Path(args.root), Path(args.work), args.version)
    if args.env_only:
        print(env_text())
        return 0

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.backends.aiter_emulated import AiterEmulated
    from mla_fp8_bench.config import RunConfig
    from mla_fp8_bench.measure.devices import platform_info

    report: dict = {"root": args.root, "version": args.version, "layer": {k: v for k, v in aiter.real_layer.items()
                                                                          if k != "standin"},
                    "wrapper_module": aiter.mla_reduce_v1.__module__, "cases": {}, "errors": {}}
    real = get_backend("aiter", RunConfig(aiter_any_device=True))
    avail = real.availability(platform_info("cpu"))
    report["available"], report["reason"] = bool(avail), avail.reason
    if avail:
        report["detection"] = real.detection()
        emulated = AiterEmulated(aiter_version=args.direct_version or args.version)
        for cid in args.cases or CASES:
            try:
                report["cases"][cid] = compare_case(real, emulated, cid)
            except Exception as exc:  # noqa: BLE001 - reported per case; the test fails on it
                report["errors"][cid] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        try:
            report["lse_gap"] = lse_gap_records(real)
        except Exception as exc:  # noqa: BLE001
            report["errors"]["lse_gap"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        report["standin_calls"] = len(aiter.real_layer["standin"].calls)
    report["env"] = env_text()
    report["wall_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
