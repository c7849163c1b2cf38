"""Command line: ``mla-fp8-bench env | run | cases | ...``. Bad input (unknown backend or case, bad device)
exits with status 2 and one line naming the value and the allowed ones, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform as _pf
import signal
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from mla_fp8_bench.terminal import fmt_seconds, signals_interrupt

EXIT_USAGE = 2
#: Third-party modules of the optional ``bench`` extra.
BENCH_MODULES = ("asv", "asv_runner")
ANY_DEVICE_HELP = "let the aiter backend drive a non-gfx950 aiter package (e.g. a test library); labelled emulation"


def _fmt_f(x: Any, spec: str = ".4g") -> str:
    try:
        return "-" if x is None else format(float(x), spec)
    except (TypeError, ValueError):
        return str(x)


def cmd_env(args: argparse.Namespace, console: Console) -> int:
    from mla_fp8_bench.backends import backend_names, get_backend
    from mla_fp8_bench.config import RunConfig
    from mla_fp8_bench.measure.devices import environment, platform_info, vendor_of_build
    from mla_fp8_bench.problem.fp8 import cast_saturates

    pinfo = platform_info(args.device)
    env = environment(pinfo)
    t = Table(title="platform", show_header=False)
    for k in ("vendor", "arch", "device", "device_name", "fp8_dtype", "torch", "cuda", "hip", "asv", "asv_runner"):
        t.add_row(k, str(env.get(k)))
    for k, v in (("amd-aiter", env.get("aiter")), ("vllm", env.get("vllm")), ("fa3-fwd", env.get("fa3_fwd_interface")),
                 ("torch build vendor", vendor_of_build()), ("fp8 cast saturates", cast_saturates(pinfo.fp8_dtype))):
        t.add_row(k, str(v))
    console.print(t)
    bt = Table("backend", "available", "reason / description", title="backends")
    detected = Table("backend", "what", "form (where it was read)", title="detected on the installed library")
    for name in backend_names():
        try:
            b = get_backend(name, RunConfig(aiter_any_device=args.aiter_any_device))
            v = b.availability(pinfo)
            bt.add_row(name, "yes" if v else "no", b.description if v else v.reason)
            for what, how in (getattr(b, "detection", lambda: {})() if v else {}).items():
                detected.add_row(name, what, how)
        except Exception as exc:  # noqa: BLE001 - one broken backend must not hide the others
            bt.add_row(name, "no", f"backend failed to load: {type(exc).__name__}: {exc}")
    console.print(bt)
    if detected.row_count:
        console.print(detected)
    return 0


def cmd_cases(args: argparse.Namespace, console: Console) -> int:
    from mla_fp8_bench.problem.cases import SUITES, default_sweep

    t = Table("suite", "case ids", title="named suites")
    for k, v in SUITES.items():
        t.add_row(k, " ".join(v))
    console.print(t)
    for dev in ("cpu", "cuda"):
        console.print(default_sweep(dev)[1])
    return 0


def _records_table(data: dict) -> Table:
    from mla_fp8_bench.measure.metric_table import record_is_emulation

    t = Table(title=f"FP8 MLA prefill on {data['env']['device_name']} ({data['env']['arch']})")
    for col in ("backend", "case", "status", "latency", "method", "TFLOP/s", "max-abs vs fp8", "max-abs vs bf16",
                "rel-L2 vs fp8", "mismatch", "note"):
        t.add_column(col, overflow="fold")
    for r in data["records"]:
        emu = record_is_emulation(r)
        t.add_row(r["backend"], r["case"], r["status"], fmt_seconds(r.get("latency_s")),
                  (r.get("latency_method") or "-") + (" (emulation)" if emu else ""),
                  "-" if emu else _fmt_f(r.get("tflops"), ".3g"), _fmt_f(r.get("max_abs_error_fp8_ref")),
                  _fmt_f(r.get("max_abs_error_bf16_ref")), _fmt_f(r.get("rel_l2_error_fp8_ref")),
                  _fmt_f(r.get("mismatch_fraction")), r.get("reason", ""))
    return t


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """``run``: arguments checked before measuring; a second run writing the same ``--json`` is refused.
    Ctrl-C, SIGTERM and SIGHUP write the records completed (marked ``"interrupted"``) and exit 128 + the
    signal's number; a ``--json`` file holding what the run lacks is kept (:func:`output_path`)."""
    from mla_fp8_bench.argtypes import split_list
    from mla_fp8_bench.backends import DEFAULT_BACKENDS, get_backend
    from mla_fp8_bench.config import RunConfig, check_emu_aiter_version
    from mla_fp8_bench.harness.run_command import check_json_path, output_path, select_cases
    from mla_fp8_bench.harness.runner import RunInterrupted, RunOptions, evaluate
    from mla_fp8_bench.jsonio import locked, write_json_or_rescue
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.terminal import case_progress

    config = RunConfig(emu_aiter_version=check_emu_aiter_version(args.emu_aiter_version or "",
                                                                 "--emu-aiter-version"),
                       aiter_any_device=args.aiter_any_device)
    with (contextlib.nullcontext() if args.json is None
          else locked(check_json_path(args.json), "--json", wait=False)):
        pinfo = platform_info(args.device)
        names = split_list(args.backends, "--backends") or list(DEFAULT_BACKENDS)
        for n in names:
            get_backend(n)  # validates the name early
        cases, note = select_cases(split_list(args.cases, "--cases"), pinfo.device_type, args.max_seq_len)
        if note:
            console.print(f"[dim]{note}[/dim]")
        opts = RunOptions(timing=not args.no_timing, samples=args.samples, time_budget_s=args.time_budget,
                          flush_l2=args.flush_l2, **({"max_wait_s": None} if args.allow_long else {}))
        interrupted = False
        with signals_interrupt() as signals, case_progress(len(names) * len(cases), console) as step:
            try:
                data = evaluate(names, cases, device=pinfo.device, options=opts, config=config, progress=step)
            except RunInterrupted as exc:
                data, interrupted = exc.data, True
        rounds_cut = (_fold_run_rounds(args, data, str(pinfo.device), console)
                      if args.rounds > 1 and not args.no_timing and not interrupted else None)
        out, kept = output_path(args.json, data, interrupted) if args.json else (None, None)
        if out:
            write_json_or_rescue(data, out, "run's records")
    console.print(_records_table(data))
    if out:
        console.print(f"wrote {out}" + (" (marked interrupted)" if interrupted else ""), highlight=False)
    if kept:
        print(f"{args.json} is kept: {kept}; this run was written to {out}", file=sys.stderr, flush=True)
    if interrupted:
        console.print(f"[red]interrupted:[/red] {len(data['records'])} of {data['planned']} (backend, case) "
                      f"records completed; stopped at {data['interrupted_before']}", highlight=False)
        return 128 + (signals[0] if signals else signal.SIGINT)
    if rounds_cut is not None:
        console.print(f"[red]interrupted:[/red] the latency rounds were stopped ({signal.Signals(rounds_cut).name});"
                      " the records carry the first round's latency", highlight=False)
        return 128 + rounds_cut
    errors = sum(r["status"] == "error" for r in data["records"])
    if errors:
        console.print(f"{errors} of {len(data['records'])} records are errors (see note)")
    return 1 if errors and args.strict else 0


def _fold_run_rounds(args: argparse.Namespace, data: dict, device: str, console: Console) -> int | None:
    """``run --rounds N``: rounds 1 .. N-1 in fresh processes (flags passed through their environment) folded
    into ``data``'s records; None, or the number of the signal that stopped them (records keep round 0)."""
    from mla_fp8_bench.config import PREFIX
    from mla_fp8_bench.harness.rounds import fold_rounds

    flags = {"AITER_ANY_DEVICE": "1" if args.aiter_any_device else "", "EMU_AITER_VERSION": args.emu_aiter_version}
    env = {**os.environ, **{PREFIX + k: v for k, v in flags.items() if v}}
    with signals_interrupt() as got:
        try:
            data["rounds"] = fold_rounds(data["records"], args.rounds, device, env=env,
                                         log=lambda m: console.print(m, highlight=False, markup=False))
        except KeyboardInterrupt as exc:
            data["rounds"] = {"rounds": 1, "extra": [], "interrupted": str(exc) or "KeyboardInterrupt"}
            return got[0] if got else int(signal.SIGINT)
    return None


def _machine_facts(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(facts, where from) for ``asv-machine``: the committed ``results/<name>/machine.json``, else this
    machine's with a ``gpu`` key; ValueError: a committed file that is no object or (without ``--force``)
    contradicts this machine (arch, GPU model, or the CPU count without a GPU)."""
    from mla_fp8_bench.jsonio import load_json
    from mla_fp8_bench.measure.devices import platform_info

    pinfo = platform_info(args.device)
    here = {"machine": args.name, "arch": _pf.machine(), "os": _pf.system(), "cpu": _pf.processor() or _pf.machine(),
            "num_cpu": str(os.cpu_count()), "ram": str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
            "gpu": pinfo.name if pinfo.device_type == "cuda" else "none"}
    committed = Path(args.results_dir) / args.name / "machine.json"
    if not Path(args.results_dir).is_dir():  # elsewhere than the checkout: a published name would get this machine
        raise ValueError(f"--results-dir {args.results_dir} is not a directory: run from the checkout or pass the "
                         "results directory that holds the committed machines")
    if not committed.exists():
        return here, "this machine"
    facts = load_json(committed, "committed machine file")
    if not isinstance(facts, dict):
        raise ValueError(f"committed machine file {committed} is not a JSON object")
    facts.pop("version", None)
    cg, hg = str(facts.get("gpu", here["gpu"])).strip().lower(), here["gpu"].strip().lower()
    differs = {"arch": str(facts.get("arch", here["arch"])) != here["arch"],
               "gpu": cg != hg and ("none" in (cg, hg) or not (cg in hg or hg in cg)),
               "num_cpu": hg == "none" and str(facts.get("num_cpu", here["num_cpu"])) != here["num_cpu"]}
    differ = [f"{k} {facts.get(k)!r} vs {here[k]!r}" for k, d in differs.items() if d]
    if differ and not args.force:
        raise ValueError(f"this machine is not {args.name!r} as {committed} describes it ({'; '.join(differ)}): "
                         f"its results would be filed under {args.name!r}'s published history; name your own "
                         "machine (mla-fp8-bench asv-machine mybox), or pass --force")
    if facts.get("machine") != args.name:
        raise ValueError(f"{committed} names machine {facts.get('machine')!r}, not {args.name!r}")
    return facts, str(committed)


def cmd_asv_machine(args: argparse.Namespace, console: Console) -> int:
    """Write ``args.name``'s :func:`_machine_facts` to ``~/.asv-machine.json`` (other machines kept); without
    ``--force`` an entry with other facts is not replaced."""
    from mla_fp8_bench.argtypes import check_name
    from mla_fp8_bench.jsonio import load_json, locked, write_json_atomic

    check_name(args.name, "asv machine name")
    path = Path.home() / ".asv-machine.json"
    with locked(path, "asv machine file"):
        data = load_json(path, "asv machine file") if path.exists() else {"version": 1}
        if not isinstance(data, dict):
            raise ValueError(f"asv machine file {path} holds a JSON {type(data).__name__}, not an object of "
                             "machines: fix or remove it")
        facts, src = _machine_facts(args)
        if (prev := data.get(args.name)) not in (None, facts) and not args.force:
            changed = sorted(k for k in {*prev, *facts} if prev.get(k) != facts.get(k)) if isinstance(prev, dict) \
                else ["(not an object)"]
            raise ValueError(f"asv machine file {path} already has an entry {args.name!r} with other facts (keys "
                             f"{', '.join(changed)}): refusing to replace it; pass --force to replace it, or choose "
                             "another name")
        data.update({args.name: facts, "version": 1})
        write_json_atomic(data, path, indent=4, sort_keys=True)
    console.print(f"wrote machine {args.name!r} to {path} (facts from {src}): {facts}")
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``PROG: error: MESSAGE (PROG --help)``), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help)\n")


def _add_run_parser(sub) -> None:
    from mla_fp8_bench.argtypes import int_in, positive_float, positive_int
    from mla_fp8_bench.config import MAX_ROUNDS, MAX_SAMPLES

    r = sub.add_parser("run", help="measure backends x cases (latency, errors, TFLOP/s)")
    r.set_defaults(handler=cmd_run)
    add = r.add_argument
    add("--backends", "-b", action="append", help="comma-separated backend names (default: all)")
    add("--cases", "-c", action="append", help="comma-separated case ids or suite names (default: the device's "
        "seq_len sweep)")
    add("--max-seq-len", type=positive_int, default=None, help="cap of the default sweep")
    add("--json", help="write records to this JSON file (atomically); a file there holding (backend, case) "
        "results this run lacks is kept and the records go to <stem>.new.json")
    add("--samples", type=int_in(1, MAX_SAMPLES), default=30, help="latency samples per (backend, case)")
    add("--time-budget", type=positive_float, default=20.0, help="seconds of latency sampling per (backend, case)")
    add("--no-timing", action="store_true", help="accuracy only")
    add("--rounds", type=int_in(1, MAX_ROUNDS), default=1, help="latency rounds: the run's own timing, then N-1 "
        "latency-only passes in fresh processes; the latency is the median over rounds, each round kept in the "
        "record (default 1)")
    add("--flush-l2", action="store_true", help="flush L2 before every latency sample (GPU)")
    add("--strict", action="store_true", help="exit 1 if any (backend, case) errored")
    add("--allow-long", action="store_true", help="start a run expected to take over an hour")
    add("--aiter-any-device", action="store_true", help=ANY_DEVICE_HELP)
    add("--emu-aiter-version", default=None, metavar="VERSION", help="AITER version aiter-emulated models, e.g. "
        "0.1.20 (pre-#3606) or 0.1.22 (default; MLA_FP8_BENCH_EMU_AITER_VERSION in asv runs)")


def build_parser() -> argparse.ArgumentParser:
    from mla_fp8_bench.aiter_ps import plan_cli
    from mla_fp8_bench.analysis import ab, calibrate, gate, nightly
    from mla_fp8_bench.report import publish, results_merge, site_view

    p = OneLineParser(prog="mla-fp8-bench", description="Benchmark and accuracy suite for FP8 MLA "
                                "prefill attention; one subcommand per task (mla-fp8-bench SUBCOMMAND --help).",
                                epilog="Exit status: 0 success, 2 bad usage (one line naming the bad value); "
                                       "gate and ab exit 1 on a regression (their --help says more).")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N (ROCm GPUs are 'cuda')")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env", help="platform, versions and each backend's availability with the reason")
    e.set_defaults(handler=cmd_env)
    e.add_argument("--aiter-any-device", action="store_true", help=ANY_DEVICE_HELP)
    sub.add_parser("cases", help="list named suites and the default sweep per device").set_defaults(handler=cmd_cases)
    am = sub.add_parser("asv-machine", help="write ~/.asv-machine.json for NAME from results/NAME/machine.json "
                        "(or from this machine's facts, with a gpu key)")
    am.set_defaults(handler=cmd_asv_machine)
    am.add_argument("name", help="asv machine name, e.g. cpu-2core, h200, mi355")
    am.add_argument("--results-dir", default="results")
    am.add_argument("--force", action="store_true", help="replace an existing entry of NAME with other facts, or "
                    "use a published NAME whose committed facts are not this machine's")
    _add_run_parser(sub)
    # sub-commands of their own modules: each module's add_parser sets handler=, as the commands above do
    for register in (calibrate.add_parser, gate.add_parser, results_merge.add_merge_parser, nightly.add_parser,
                     ab.add_parser, plan_cli.add_parser, publish.add_parser, site_view.add_parser):
        register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The ``mla-fp8-bench`` console script; returns the exit status."""
    from rich.markup import escape

    from mla_fp8_bench.terminal import make_console

    console = make_console()
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # no subcommand: the list of them
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        return args.handler(args, console)
    except (FileNotFoundError, ValueError) as exc:  # bad input: unknown backend or case, bad device, ...
        msg = str(exc)
    except ModuleNotFoundError as exc:
        if (top := (exc.name or "").partition(".")[0]) not in BENCH_MODULES:
            raise
        msg = escape(f"`mla-fp8-bench {args.cmd}` needs {top}, which is not installed: install the bench extra "
                     "(pip install -e '.[bench]')")
    console.print(f"[red]error:[/red] {msg}", highlight=False, soft_wrap=True)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
