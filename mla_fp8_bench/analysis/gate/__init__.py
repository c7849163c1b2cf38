"""``mla-fp8-bench gate BASE HEAD``: the PR gate. Each side is a run JSON, an asv result file or a commit
prefix under ``<results-dir>/<machine>/`` (:mod:`.load`); each (backend, case, metric) gets a verdict
(:mod:`.judge`); the report is a text table or markdown for a PR comment (:mod:`.render`).

The rules (what each metric is comes from :mod:`mla_fp8_bench.measure.metric_table`):

- **Latency.** Each side's figure is the mean of its fastest mode: its values (the rounds, one per
  process, when two or more are stored; else the samples; else the stored value) within 2 % of its
  fastest. HEAD regresses when the ratio of the figures exceeds ``max(--factor, 1 + k x se)``, ``se`` the
  ratio's relative standard error from each mode's robust spread (:mod:`mla_fp8_bench.analysis.stats`;
  k = ``--noise-k``, 3). A single stored value per side is judged against ``--factor`` alone. Where a
  param's SM clock lies off its side's plateau (a power-capped case) the figure is SM cycles per launch.
  An emulation's latency and a CPU's host time are informational, and so are host-side latencies (call
  latency, planner time) unless ``--gate-call-latency``. A benchmark version change makes a latency
  not comparable.
- **Accuracy.** A value over its calibrated tolerance (``--tolerances``; a non-finite count must be 0)
  regresses; where no tolerance covers it, a value grown beyond ``--acc-factor`` over BASE does. A
  non-finite value is over every limit. A benchmark version change does not stop either check.
- **Resources** (workspace bytes, partial slots): growth beyond ``--factor`` regresses.
- **Lost results.** A (backend, case) or a gated value ok on BASE and skipped, failed or absent on HEAD
  fails (LOST; FAILED for a failure); ``--allow-missing`` lists LOST rows without failing.
- A stored value outside its metric's range (a negative error, a latency of 0) is INVALID and fails; a
  comparison that judged nothing fails (NOTHING COMPARED) and says why.

Exit status: 0 passed, 1 failed, 2 bad usage (one line naming the value, before any comparison).
"""

from __future__ import annotations

import argparse
import math
import os

from mla_fp8_bench.analysis.gate.judge import DEFAULT_NOISE_K, Options, Row, compare, failing
from mla_fp8_bench.analysis.gate.load import GateUsageError, check_same_machine, load_side, pick_machine
from mla_fp8_bench.analysis.gate.render import markdown, text
from mla_fp8_bench.measure.metric_table import DEFAULT_ACC_FACTOR, DEFAULT_FACTOR

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2


def check_flags(*checks: tuple[str, float, float, str]) -> None:
    """Each ``(flag, value, least, what is allowed)``: GateUsageError unless the value is finite and >= least."""
    for flag, v, least, want in checks:
        if not (math.isfinite(v) and v >= least):
            raise GateUsageError(f"{flag} {v} is invalid: {want}")


def rules(opts: Options) -> str:
    tol = f"over its tolerance ({opts.tolerances.name}), else " if opts.tolerances else ""
    return (f"rules: latency ratio of fastest-mode means > max({opts.factor}, 1 + {opts.noise_k} x se); accuracy "
            f"{tol}grown > {opts.acc_factor}x; resources grown > {opts.factor}x; lost results fail")


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
    if os.path.realpath(base.src) == os.path.realpath(head.src):
        rows = [Row("*", "*", "-", base.src, head.src, "NOTHING COMPARED",
                    detail="BASE and HEAD are the same file: give two different runs or commits")]
    else:
        rows = compare(base, head, opts)
    title = f"gate: BASE {base.src} vs HEAD {head.src}"
    if args.format == "markdown":
        console.print(markdown(rows, title, rules(opts), allow_missing=args.allow_missing, plots=args.plots).rstrip(),
                      markup=False, highlight=False, soft_wrap=True)
    else:
        lines = text(rows, title, rules(opts), allow_missing=args.allow_missing, show_all=args.all)
        lines[-1:-1] = [f"plots: {args.plots}"] if args.plots else []
        console.print("\n".join(lines[:-1]), markup=False, highlight=False, soft_wrap=True)
        failed = bool(failing(rows, args.allow_missing))
        console.print(lines[-1], style="bold red" if failed else "green", markup=False, highlight=False, soft_wrap=True)
    return EXIT_REGRESSION if failing(rows, args.allow_missing) else EXIT_OK


def add_parser(subparsers) -> None:
    from mla_fp8_bench.argtypes import ascii_float

    p = subparsers.add_parser("gate", help="PR gate: HEAD vs BASE (latency, accuracy, resources, lost results)",
                              description="Compare HEAD with BASE per (backend, case, metric): kernel latency with "
                                          "a noise-aware threshold, accuracy against calibrated tolerances or "
                                          "growth, resources, lost results.",
                              epilog="Exit status: 0 passed, 1 a REGRESSION, FAILED, INVALID, LOST or nothing "
                                     "judged, 2 bad usage.")
    for side in ("BASE", "HEAD"):
        p.add_argument(side.lower(), metavar=side, help="run JSON, asv result file, or commit hash (prefix) in "
                       "--results-dir")
    p.add_argument("--results-dir", default="results", help="asv results directory (default: results)")
    p.add_argument("--machine", help="asv machine name (default: the only one, or the only one holding both commits)")
    p.add_argument("--env", help="substring of the asv environment name when a commit has several")
    p.add_argument("--factor", type=ascii_float, default=DEFAULT_FACTOR,
                   help=f"least latency or resource growth that fails (default {DEFAULT_FACTOR})")
    p.add_argument("--acc-factor", type=ascii_float, default=DEFAULT_ACC_FACTOR,
                   help=f"accuracy growth over BASE that fails where no tolerance covers it (default "
                        f"{DEFAULT_ACC_FACTOR})")
    p.add_argument("--noise-k", type=ascii_float, default=DEFAULT_NOISE_K,
                   help=f"k of the latency threshold max(--factor, 1 + k x se) (default {DEFAULT_NOISE_K})")
    p.add_argument("--tolerances", help="calibrated tolerance JSON (e.g. tolerances/cpu-emulated-v1.json)")
    p.add_argument("--all", action="store_true", help="list every row, not only notable ones")
    p.add_argument("--format", choices=("text", "markdown"), default="text",
                   help="text (terminal, CI log) or markdown (a PR comment)")
    p.add_argument("--plots", metavar="PATH_OR_URL", help="where the plots of this run are (printed in the report)")
    p.add_argument("--gate-call-latency", "--gate-host-latency", dest="gate_call_latency", action="store_true",
                   help="also gate host-side latencies (call latency, planner time)")
    p.add_argument("--allow-missing", action="store_true",
                   help="list results BASE had and HEAD lost (LOST) without failing")
    p.add_argument("--allow-cross-machine", action="store_true",
                   help="compare BASE and HEAD from different machines (refused by default: exit 2)")
    p.set_defaults(handler=cmd_gate)
