"""``mla-fp8-bench gate BASE HEAD``: the PR gate. Each side is a run JSON, an asv result file or a commit
prefix under ``<results-dir>/<machine>/`` (:mod:`.load`); each (backend, case, metric) gets a verdict
(:mod:`.judge`), reported as a text table or markdown (:mod:`.render`). The rules: docs/regressions.md.
Exit status: 0 passed, 1 failed, 2 bad usage (one line, before any work).
"""

from __future__ import annotations

import argparse
import math
import os

from mla_fp8_bench.analysis.gate.judge import Options, Row, compare
from mla_fp8_bench.analysis.gate.load import GateUsageError, check_same_machine, load_side, pick_machine
from mla_fp8_bench.analysis.gate.render import show
from mla_fp8_bench.analysis.stats import DEFAULT_NOISE_K
from mla_fp8_bench.measure.metric_table import DEFAULT_ACC_FACTOR, DEFAULT_FACTOR


def check_flags(*checks: tuple[str, float, float, str]) -> None:
    for flag, v, least, want in checks:
        if not (math.isfinite(v) and v >= least):
            raise GateUsageError(f"{flag} {v} is invalid: {want}")


def cmd_gate(args: argparse.Namespace, console) -> int:
    from mla_fp8_bench.analysis.tolerances import load_tolerances

    check_flags(("--factor", args.factor, 1.0, "a ratio >= 1.0 (e.g. 1.05)"),
                ("--acc-factor", args.acc_factor, 1.0, "a ratio >= 1.0 (e.g. 2.0)"),
                ("--noise-k", args.noise_k, 0.0, "a number >= 0 (e.g. 3)"))
    if args.tolerances and not os.path.isfile(args.tolerances):  # a FIFO would block the read
        raise GateUsageError(f"--tolerances {args.tolerances} is not a regular file (or does not exist)")
    opts = Options(args.factor, args.acc_factor, args.noise_k, args.tolerances and load_tolerances(args.tolerances),
                   args.gate_call_latency)
    machine = pick_machine(args.results_dir, args.machine, (args.base, args.head), args.env)
    base, head = (load_side(s, label, args.results_dir, machine, args.env)
                  for s, label in ((args.base, "BASE"), (args.head, "HEAD")))
    if not args.allow_cross_machine:
        check_same_machine(base, head)
    rows = compare(base, head, opts) if os.path.realpath(base.src) != os.path.realpath(head.src) else [
        Row("*", "*", "-", base.src, head.src, "NOTHING COMPARED", detail="BASE and HEAD are the same file")]
    tol = f"over its tolerance ({opts.tolerances.name}), else " if opts.tolerances else ""
    rules = (f"rules: latency ratio of fastest-mode means > max({opts.factor}, 1 + {opts.noise_k} x se); accuracy "
             f"{tol}grown > {opts.acc_factor}x; resources grown > {opts.factor}x; lost results fail")
    return int(show(console, rows, f"gate: BASE {base.src} vs HEAD {head.src}", rules, fmt=args.format,
                    allow_missing=args.allow_missing, show_all=args.all))


def add_parser(subparsers) -> None:
    from mla_fp8_bench.argtypes import ascii_float

    p = subparsers.add_parser("gate", help="PR gate: HEAD vs BASE (latency, accuracy, resources, lost results)",
                              description="Judge HEAD against BASE per (backend, case, metric).",
                              epilog="Exit status: 0 passed, 1 a REGRESSION, FAILED, INVALID, LOST or nothing "
                                     "judged, 2 bad usage.")
    for side in ("BASE", "HEAD"):
        p.add_argument(side.lower(), metavar=side, help="run JSON, asv result file, or commit in --results-dir")
    p.add_argument("--results-dir", default="results", help="asv results directory (default: results)")
    p.add_argument("--machine", help="asv machine name (default: the only one, or the only one holding both commits)")
    p.add_argument("--env", help="substring of the asv environment name when a commit has several")
    for flag, default, what in (("--factor", DEFAULT_FACTOR, "least latency or resource growth that fails"),
                                ("--acc-factor", DEFAULT_ACC_FACTOR, "accuracy growth that fails without a tolerance"),
                                ("--noise-k", DEFAULT_NOISE_K, "k of the latency threshold max(--factor, 1 + k x se)")):
        p.add_argument(flag, type=ascii_float, default=default, help=f"{what} (default {default})")
    p.add_argument("--tolerances", help="calibrated tolerance JSON (e.g. tolerances/cpu-emulated-v1.json)")
    p.add_argument("--all", action="store_true", help="list every row, not only notable ones")
    p.add_argument("--format", choices=("text", "markdown"), default="text", help="text, or markdown for a PR comment")
    p.add_argument("--gate-call-latency", "--gate-host-latency", dest="gate_call_latency", action="store_true",
                   help="also gate host-side latencies (call latency, planner time)")
    p.add_argument("--allow-missing", action="store_true", help="list LOST results without failing")
    p.add_argument("--allow-cross-machine", action="store_true", help="compare results of two machines (else exit 2)")
    p.set_defaults(handler=cmd_gate)
