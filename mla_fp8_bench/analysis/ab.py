"""``mla-fp8-bench ab BASE HEAD``: two installs of the library under test measured on one machine in
alternating processes (a :class:`~mla_fp8_bench.harness.rounds.RoundServer` per side forks each round), judged
by the gate's latency rule on time. Exit status as the gate's."""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mla_fp8_bench.analysis import stats as S
from mla_fp8_bench.analysis.gate import judge as J
from mla_fp8_bench.analysis.gate.load import side_from_run
from mla_fp8_bench.harness import rounds as RD
from mla_fp8_bench.harness.results import run_doc_from_data


class AbUsageError(ValueError):
    """A bad ``ab`` argument; the CLI prints the message and exits 2."""


@dataclass(frozen=True)
class SideSpec:  # how to run one side: the interpreter and the directories put first on PYTHONPATH
    label: str
    spec: str
    python: str
    prepend: tuple[str, ...] = ()


_FORMS = ("give a Python interpreter (an executable file) or a directory holding an install of the library under "
          "test (an empty one: the library as installed)")


def parse_side(spec: str, label: str) -> SideSpec:  # an interpreter, or an install put first on PYTHONPATH
    if os.path.isdir(spec):
        if not os.access(spec, os.R_OK | os.X_OK):
            raise AbUsageError(f"{label} {spec!r} is a directory this user cannot read: {_FORMS}")
        if os.path.exists(os.path.join(spec, "pyvenv.cfg")) or os.path.isdir(os.path.join(spec, "conda-meta")):
            raise AbUsageError(f"{label} {spec!r} is the root of an environment, not an install directory: give "
                               f"its interpreter ({os.path.join(spec, 'bin', 'python')})")
        if os.pathsep in os.path.abspath(spec):
            raise AbUsageError(f"{label} {spec!r} holds {os.pathsep!r}, which PYTHONPATH reads as a separator: "
                               "move or link the install to a path without it")
        return SideSpec(label, spec, sys.executable, (os.path.abspath(spec),))
    if os.path.isfile(spec) and os.access(spec, os.X_OK):
        return SideSpec(label, spec, os.path.abspath(spec))  # the file checked, not a name looked up on PATH
    what = "is a file that is not executable" if os.path.isfile(spec) else "does not exist or is no file"
    raise AbUsageError(f"{label} {spec!r} {what}: {_FORMS}")


def check_distinct(base: SideSpec, head: SideSpec) -> None:
    """AbUsageError for one install twice, or one interpreter (real file) started from one real directory."""
    ids = [(os.path.realpath(s.spec), bool(s.prepend) or os.path.realpath(os.path.dirname(os.path.abspath(s.spec))))
           for s in (base, head)]
    if ids[0] == ids[1]:
        raise AbUsageError(f"BASE {base.spec!r} and HEAD {head.spec!r} are one install ({ids[0][0]!r}): an A/B "
                           "needs two different installs")


#: argv ``device backend ...``: prints ``ok`` and the backends unavailable there with their reasons.
_PROBE = """\
import json, sys, torch, mla_fp8_bench.harness.rounds
from mla_fp8_bench.backends import get_backend
from mla_fp8_bench.config import RunConfig
from mla_fp8_bench.measure.devices import platform_info
pinfo, config, no = platform_info(sys.argv[1]), RunConfig.from_env(), {}
for b in sys.argv[2:]:
    try:
        v = get_backend(b, config).availability(pinfo)
        v or no.update({b: v.reason})
    except Exception as exc:
        no[b] = f"availability check failed: {type(exc).__name__}: {exc}"
print("ok " + json.dumps(no))
"""


def probe_side(side: SideSpec, device: str = "auto", timeout: float = 300.0, backends: Sequence[str] = ()) -> None:
    """AbUsageError unless ``side``'s interpreter imports torch and this suite and has ``backends`` on ``device``."""
    try:
        p = subprocess.run([side.python, "-c", _PROBE, device, *backends], env=RD.suite_env(side.prepend),
                           capture_output=True, text=True, timeout=timeout)
        last = (p.stdout.strip().splitlines() or [""])[-1]
        why = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        no = json.loads(last[3:]) if p.returncode == 0 and last.startswith("ok ") else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        no, why = None, str(exc)
    if no is None:
        raise AbUsageError(f"{side.label} {side.spec!r} cannot run a round ({why[:300]}): give a Python interpreter "
                           "with torch and this suite importable, or a directory of an install, and a --device it has")
    if no:
        why = "; ".join(f"{b}: {' '.join(str(r).split())[:300]}" for b, r in no.items())
        raise AbUsageError(f"--backends {','.join(no)} unavailable to {side.label} {side.spec!r} on --device {device} "
                           f"({why}): name backends that side can run (its `mla-fp8-bench env` lists them)")


def schedule(rounds: int) -> list[tuple[int, str]]:
    """(round index, side) in measuring order: BASE HEAD, HEAD BASE, BASE HEAD, ..."""
    return [(i, s) for i in range(rounds) for s in (("base", "head") if i % 2 == 0 else ("head", "base"))]


def measure_ab(base: SideSpec, head: SideSpec, backends: Sequence[str], cases: Sequence[str], rounds: int,
               runner: Callable[..., dict[str, Any]], seed: int = 0, log: Callable[[str], None] | None = None
               ) -> dict[str, Any]:
    """``{"base": {"spec", "label", "rounds"}, "head": {...}, "schedule"}``: ``rounds`` rounds a side in
    :func:`schedule` order; ``runner(side, backends, cases, order, seed, out)`` returns one round's document."""
    sides = {"base": base, "head": head}
    out: dict[str, Any] = {s: {"spec": sides[s].spec, "label": sides[s].label, "rounds": []} for s in sides}
    plan = schedule(rounds)
    with tempfile.TemporaryDirectory(prefix="mla_fp8_ab_") as tmp:
        try:
            for k, (i, s) in enumerate(plan):
                doc = runner(sides[s], backends, cases, RD.round_order(i), seed + i, os.path.join(tmp, f"{s}{i}.json"))
                doc.update(round=i, position=k)
                out[s]["rounds"].append(doc)
                if log is not None:
                    done = doc.get("error") or f"{sum(1 for r in doc.get('rows', []) if 'latency_s' in r)} pairs"
                    log(f"[{k + 1}/{len(plan)}] {s} round {i} ({RD.round_order(i)}): {done}")
        except BaseException:  # interrupted: no round child may write into tmp after it is removed
            if callable(kill := getattr(runner, "kill", None)):
                kill()
            raise
    out["schedule"] = [list(x) for x in plan]
    return out


def judge(measured: dict[str, Any], factor: float = S.DEFAULT_AB_FACTOR, noise_k: float = S.DEFAULT_NOISE_K
          ) -> tuple[dict[str, dict[str, Any]], list[J.Row]]:
    """Both sides' run documents and the gate's rows for them, on time."""
    docs = {}
    for s in ("base", "head"):
        rounds = measured[s]["rounds"]
        first = {k: next((r.get(k) for r in rounds if r.get(k)), None) for k in ("device", "vendor")}
        docs[s] = {"env": {"vendor": first["vendor"], "device_name": first["device"], "ab_side": s,
                           "ab_spec": measured[s]["spec"]}, "records": RD.records_from_rounds(rounds)}
    base, head = (side_from_run(run_doc_from_data(docs[s], measured[s]["spec"]), s.upper()) for s in docs)
    return docs, J.compare(base, head, J.Options(factor=factor, noise_k=noise_k, interleaved=True))


class ServerRunner:
    """A round runner of :func:`measure_ab`: one :class:`RoundServer` per side."""

    def __init__(self, preload: Sequence[str], device: str = "auto", timeout: float = 600.0):
        self.preload, self.device, self.timeout = tuple(preload), device, timeout
        self.servers: dict[str, RD.RoundServer] = {}

    def __call__(self, side, backends, cases, order, seed, out):
        if side.label not in self.servers or self.servers[side.label].proc.poll() is not None:
            self.servers[side.label] = RD.RoundServer(side.python, RD.suite_env(side.prepend), self.preload)
        return self.servers[side.label].round(backends, cases, order, seed, out, self.device, timeout=self.timeout)

    def close(self, now: bool = False) -> None:  # now: also the running round child, at once
        for s in self.servers.values():
            s.kill() if now else s.close()

    kill = functools.partialmethod(close, now=True)


def _check_args(args: argparse.Namespace) -> tuple[SideSpec, SideSpec, list[str], list[str]]:
    from mla_fp8_bench.analysis.gate import check_flags
    from mla_fp8_bench.backends import backend_names
    from mla_fp8_bench.config import MAX_ROUNDS
    from mla_fp8_bench.jsonio import check_output_path
    from mla_fp8_bench.problem.cases import resolve_cases

    base, head = parse_side(args.base, "BASE"), parse_side(args.head, "HEAD")
    check_distinct(base, head)
    backends = list(dict.fromkeys(b for b in args.backends.split(",") if b))  # a pair twice would be two rounds
    if not backends or (unknown := [b for b in backends if b not in backend_names()]):
        what = f"unknown {', '.join(unknown)}" if backends else "names nothing"
        raise AbUsageError(f"--backends {args.backends!r}: {what}; allowed {', '.join(backend_names())}")
    cases = [c.id for c in resolve_cases([c for c in args.cases.split(",") if c])]
    if not cases:
        raise AbUsageError(f"--cases {args.cases!r} names no case: give comma-separated case ids or suite names")
    if not 2 <= args.rounds <= MAX_ROUNDS:
        raise AbUsageError(f"--rounds {args.rounds} is invalid: an integer from 2 to {MAX_ROUNDS}")
    check_flags(("--factor", args.factor, 1.0, "a finite ratio >= 1.0 (e.g. 1.02)"),
                ("--noise-k", args.noise_k, 0.0, "a finite number >= 0 (e.g. 3.0)"))
    for flag, path in (("--json", args.json), ("--summary", args.summary)):
        if path:
            check_output_path(path, flag)
    if args.json and args.summary and os.path.realpath(args.json) == os.path.realpath(args.summary):
        raise AbUsageError(f"--json and --summary are both {args.json!r}: give two different files")
    return base, head, backends, cases


def _kept(path: str, judged: bool, console) -> str:  # beside a stored file when this run judged nothing
    if judged or not os.path.exists(path):
        return path
    root, ext = os.path.splitext(path)
    console.print(f"nothing judged: {path} kept, this run's document goes to {root}.failed{ext}", highlight=False,
                  markup=False)
    return f"{root}.failed{ext}"


def cmd_ab(args: argparse.Namespace, console) -> int:
    """Every argument and both sides are checked before any round."""
    from mla_fp8_bench.analysis.gate import render
    from mla_fp8_bench.jsonio import write_file_atomic, write_json_atomic
    from mla_fp8_bench.terminal import signals_interrupt

    base, head, backends, cases = _check_args(args)
    runner = ServerRunner(backends, args.device)
    try:
        with signals_interrupt() as signals:  # SIGTERM/SIGHUP (a cancelled CI job) end the rounds as Ctrl-C does
            for side in (base, head):
                probe_side(side, args.device, backends=backends)
            measured = measure_ab(base, head, backends, cases, args.rounds, runner, args.seed,
                                  log=lambda s: console.print(s, highlight=False, markup=False))
    except KeyboardInterrupt:
        sig = signals[0] if signals else signal.SIGINT
        console.print(f"interrupted ({signal.Signals(sig).name}): no verdict", highlight=False, markup=False)
        return 128 + sig
    finally:
        runner.close()
    docs, rows = judge(measured, args.factor, args.noise_k)
    judged = any(r.judged for r in rows)
    title = f"ab: BASE {args.base} vs HEAD {args.head}"
    settings = (f"{args.rounds} rounds per side in alternating processes; time: ratio of fastest-mode means > "
                f"max({args.factor}, 1 + {args.noise_k} x se)")
    if args.json:
        write_json_atomic({"measured": measured, **docs, "rows": [r.__dict__ for r in rows], "settings": {
            "factor": args.factor, "noise_k": args.noise_k, "rounds": args.rounds}}, _kept(args.json, judged, console))
    if args.summary:
        md = render.markdown(rows, title, settings, word="ab")
        write_file_atomic(_kept(args.summary, judged, console), lambda f: f.write(md))
    return int(render.show(console, rows, title, settings, word="AB", show_all=True))


def add_parser(subparsers) -> None:
    from mla_fp8_bench.argtypes import ascii_float, ascii_int

    p = subparsers.add_parser("ab", help="PR mode: BASE and HEAD installs in alternating processes, then the gate",
                              epilog="Exit status: 0 passed, 1 a regression or nothing judged, 2 bad usage; "
                                     "128 + N when signal N ended it.")
    p.add_argument("base", metavar="BASE", help="Python interpreter, or a directory holding an install of the "
                   "library under test (put first on PYTHONPATH; an empty one: the library as installed)")
    p.add_argument("head", metavar="HEAD", help="the same for the head")
    p.add_argument("-b", "--backends", default="fa3-fp8", help="comma-separated backends (default fa3-fp8)")
    p.add_argument("-c", "--cases", default="s512,s8192", help="comma-separated case ids (default s512,s8192)")
    p.add_argument("--rounds", type=ascii_int, default=4, help="rounds (processes) per side (default 4)")
    for flag, default, what in (("--factor", S.DEFAULT_AB_FACTOR, "least latency growth that fails"),
                                ("--noise-k", S.DEFAULT_NOISE_K, "k of the threshold max(--factor, 1 + k x se)")):
        p.add_argument(flag, type=ascii_float, default=default, help=f"{what} (default {default})")
    p.add_argument("--seed", type=ascii_int, default=0, help="seed of the shuffled case order")
    p.add_argument("--device", default="auto", help="auto, cuda or cuda:N, cpu (default auto)")
    p.add_argument("--json", help="write both sides' rounds, documents and verdicts here")
    p.add_argument("--summary", metavar="MD", help="write the verdict as markdown (a PR comment) here")
    p.set_defaults(handler=cmd_ab)
