"""``mla-fp8-bench bisect``: ``git bisect run`` over a library's history (AITER, vLLM, ...) on one asv
benchmark and a threshold, in a temporary git worktree of ``--repo`` and an existing environment.

Each probe (``python -m mla_fp8_bench.analysis.bisect step ...``, :func:`step`) installs the commit
with ``--install-cmd`` (failure: exit 125, git skips it), runs ``asv run -E existing:{python}
--set-commit-hash <sha> -b <REGEX>`` on the (backend, case) params the regex selects
(:func:`probe_selection`), and exits 0 (value <= threshold), 1 (above) or 125 (failed or skipped); a
regex that selects zero or several combinations exits 128, which aborts the bisection. Both ends are
measured first and must measure good and bad (else exit 2). Why not ``asv find``:
docs/reference-facts.md#asv-find; usage: docs/regressions.md, section 5.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mla_fp8_bench.argtypes import ascii_float, check_name
from mla_fp8_bench.harness.results import ResultsError, find_result, load_asv_conf, load_asv_result

METRICS = ("track_max_abs_error", "track_latency")
DEFAULT_INSTALL = "{python} -m pip install --no-deps --no-build-isolation -q ."
EXIT_GOOD, EXIT_BAD, EXIT_SKIP, EXIT_ABORT = 0, 1, 125, 128


class BisectUsageError(ValueError):
    """Bad bisect input (the CLI exits 2)."""


def _git(repo: str, *args: str, check: bool = True) -> str:
    p = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise BisectUsageError(f"git {' '.join(args)} in {repo} failed: {(p.stderr or p.stdout).strip()[:300]}")
    return p.stdout.strip()


def results_dir_of(config: str, conf: dict[str, Any] | None = None) -> str:
    """The absolute ``results_dir`` of an asv config (``conf``: the config already read)."""
    conf = load_asv_conf(config) if conf is None else conf
    return str((Path(config).resolve().parent / conf.get("results_dir", "results")).resolve())


def read_value(results_dir: str, machine: str, sha: str, regex: str) -> tuple[str, float | None, str]:
    """(selected name, value, status) of the one benchmark combination matching ``regex``.

    The value is what asv stored (for samples the median); status a
    :class:`~mla_fp8_bench.harness.results.Measurement`'s, or ``missing`` (no result file). Names as
    ``asv run -b`` matches them: ``bench_mla_prefill.MLAPrefill.track_latency('aiter', 's512')``.

    Raises:
        BisectUsageError: the regex selects zero or several combinations in the result file.
    """
    try:
        path = find_result(results_dir, machine, sha[:8], env="existing")
    except ResultsError:
        return "", None, "missing"
    res = load_asv_result(path)
    hits: list[tuple[str, float | None, str]] = []
    rx = re.compile(regex)
    for key in res.benchmarks():
        params = res.row(key).get("params") or []
        labels = [", ".join(str(x) for x in c) for c in itertools.product(*params)] if params else [None]
        for label, m in zip(labels, res.measurements(key).values()):
            name = key if label is None else f"{key}({label})"
            if rx.search(name):
                hits.append((name, m.value, m.status))
    if len(hits) != 1:
        raise BisectUsageError(f"--benchmark {regex!r} selects {len(hits)} benchmark combinations in {path} "
                               f"({', '.join(h[0] for h in hits[:6])}): it must select exactly one")
    return hits[0]


def probe_selection(regex: str) -> dict[str, str]:
    """Environment that makes a probe measure only the (backend, case) params whose asv ``MLAPrefill`` /
    ``AiterPlan`` names ``regex`` selects: ``MLA_FP8_BENCH_BACKENDS`` / ``MLA_FP8_BENCH_CASES`` (read by
    :mod:`mla_fp8_bench.harness.asv_support`) where the selection is a strict subset of the grid's."""
    from mla_fp8_bench.harness.asv_support import ASV_CASES, asv_backends

    grid, rx = asv_backends(), re.compile(regex)
    hits = [(b, c) for cls, metric, b, c in itertools.product(("MLAPrefill", "AiterPlan"),
                                                               (*METRICS, "track_planner_time"), grid, ASV_CASES)
            if rx.search(f"bench_mla_prefill.{cls}.{metric}({b!r}, {c!r})")]
    hit_b, hit_c = {b for b, _ in hits}, {c for _, c in hits}
    out: dict[str, str] = {}
    if hit_b and len(hit_b) < len(grid):
        out["MLA_FP8_BENCH_BACKENDS"] = ",".join(b for b in grid if b in hit_b)
    if hit_c and len(hit_c) < len(ASV_CASES):
        out["MLA_FP8_BENCH_CASES"] = ",".join(c for c in ASV_CASES if c in hit_c)
    return out


# ------------------------------------------------------------------------------------------ the step
def step(args: argparse.Namespace) -> int:
    """One ``git bisect run`` probe in the current directory (a worktree at the probed commit)."""
    log = Path(args.log) if args.log else None

    def done(rc: int, text: str, **kw) -> int:
        print(f"[bisect step] {sha[:10]}: {text}", flush=True)
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"sha": sha, **kw}) + "\n")
        return rc

    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    py = args.python
    install = args.install_cmd.format(python=shlex.quote(py))
    p = subprocess.run(install, shell=True, capture_output=True, text=True)
    if p.returncode != 0:
        return done(EXIT_SKIP, f"install failed (skip): {(p.stderr or p.stdout)[-500:]}", verdict="skip",
                    why="install failed")
    cmd = [py, "-m", "asv", "run", "-E", f"existing:{py}", "--set-commit-hash", sha, "-b", args.benchmark,
           "--config", args.config, "--machine", args.machine, "--show-stderr"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(Path(args.config).resolve().parent))
    probe_s = time.perf_counter() - t0  # the measurement only: the install above is the build
    out = p.stdout + p.stderr
    if p.returncode != 0:
        return done(EXIT_SKIP, f"asv run exited {p.returncode} (skip):\n{out[-1500:]}", verdict="skip",
                    why=f"asv run exited {p.returncode}")
    try:
        name, value, status = read_value(results_dir_of(args.config), args.machine, sha, args.benchmark)
    except BisectUsageError as exc:
        return done(EXIT_ABORT, f"{exc} (abort)", verdict="abort", why=str(exc))
    if status != "ok":
        return done(EXIT_SKIP, f"{name or args.benchmark} {status} (skip)\n{out[-1500:]}", verdict="skip", why=status)
    bad = value > args.threshold
    return done(EXIT_BAD if bad else EXIT_GOOD, f"{name} = {value:.6g} {'>' if bad else '<='} {args.threshold} -> "
                f"{'bad' if bad else 'good'}", verdict="bad" if bad else "good", value=value, name=name,
                probe_s=round(probe_s, 2))


# ------------------------------------------------------------------------------------------ driver
def run_bisect(*, repo: str, good: str, bad: str, benchmark: str, metric: str, threshold: float, config: str,
               python: str, install_cmd: str = DEFAULT_INSTALL, machine: str = "bisect",
               keep_worktree: bool = False, echo=print) -> dict[str, Any]:
    """Bisect ``good..bad`` of ``repo``; returns ``{"first_bad", "probes", "log", "output"}``.

    Raises:
        BisectUsageError: not a git repo, unknown commits, good the same commit as bad or not its ancestor,
            a machine name that is not one path component, no such interpreter, bad config.
    """
    repo = str(Path(repo).resolve())
    if not Path(repo, ".git").exists() and _git(repo, "rev-parse", "--is-bare-repository", check=False) != "true":
        raise BisectUsageError(f"--repo {repo} is not a git repository")
    good_sha = _git(repo, "rev-parse", "--verify", f"{good}^{{commit}}")
    bad_sha = _git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}")
    if good_sha == bad_sha:
        raise BisectUsageError(f"--good {good} and --bad {bad} are the same commit {good_sha[:12]}: give a bad commit "
                               "after the good one")
    if subprocess.run(["git", "-C", repo, "merge-base", "--is-ancestor", good_sha, bad_sha]).returncode != 0:
        raise BisectUsageError(f"--good {good} is not an ancestor of --bad {bad}")
    try:
        check_name(machine, "--machine")
    except ValueError as exc:
        raise BisectUsageError(str(exc)) from None
    if shutil.which(python) is None:
        raise BisectUsageError(f"--python {python} is not an executable interpreter: give the python of the "
                               "environment asv runs in")
    if metric not in METRICS:
        raise BisectUsageError(f"--metric {metric!r} is unknown: allowed {', '.join(METRICS)}")
    if not math.isfinite(threshold):
        raise BisectUsageError(f"--threshold {threshold} must be finite")
    try:
        re.compile(benchmark)
    except re.error as exc:
        raise BisectUsageError(f"--benchmark {benchmark!r} is not a valid regular expression: {exc}") from None
    config = str(Path(config).resolve())
    if not Path(config).is_file():
        raise BisectUsageError(f"--config {config} does not exist (an asv.conf.json whose repo is {repo})")
    conf_repo = str(load_asv_conf(config).get("repo", "."))
    if "://" not in conf_repo and (conf_repo := str((Path(config).parent / conf_repo).resolve())) != repo:
        echo(f"note: {config} has repo {conf_repo}; --set-commit-hash needs the probed SHAs there too")
    if metric not in benchmark:
        benchmark = f"{benchmark}.*{metric}" if benchmark else metric

    # the probe results are filed under --machine: make sure asv knows it (non-interactive)
    subprocess.run([python, "-m", "asv", "machine", "--yes", "--machine", machine, "--config", config],
                   capture_output=True, cwd=str(Path(config).parent))
    wt = tempfile.mkdtemp(prefix="mla-bisect-")
    log = os.path.join(wt + "-probes.jsonl")
    _git(repo, "worktree", "add", "--detach", wt, bad_sha)
    try:
        # the step runs with the mla_fp8_bench of *this* interpreter; each probe measures only the params
        # the regex selects (unless the caller chose them)
        step_cmd = [sys.executable, "-m", "mla_fp8_bench.analysis.bisect", "step", "--benchmark", benchmark,
                    "--threshold", repr(threshold), "--config", config, "--python", python, "--install-cmd",
                    install_cmd, "--machine", machine, "--log", log]
        env = {**probe_selection(benchmark), **os.environ}
        ends = check_ends(wt, good_sha, bad_sha, step_cmd, env, log, echo)
        _git(wt, "bisect", "start", bad_sha, good_sha)
        p = subprocess.run(["git", "-C", wt, "bisect", "run", *step_cmd], capture_output=True, text=True, env=env)
        output = p.stdout + p.stderr
        blog = _git(wt, "bisect", "log", check=False)
        m = re.search(r"^([0-9a-f]{40}) is the first bad commit", output, flags=re.M)
        first_bad = m.group(1) if m else None
    finally:
        subprocess.run(["git", "-C", wt, "bisect", "reset"], capture_output=True)
        if not keep_worktree:
            subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", wt], capture_output=True)
            shutil.rmtree(wt, ignore_errors=True)
        probes = _read_log(log)
        Path(log).unlink(missing_ok=True)
    return {"first_bad": first_bad, "probes": probes, "log": blog, "output": output, "benchmark": benchmark,
            "ends": ends}


def _read_log(log: str) -> list[dict[str, Any]]:
    """The probes' JSON lines (``sha``, ``verdict``, ``value`` or ``why``, ...); [] without a log."""
    p = Path(log)
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def measure_end(wt: str, sha: str, step_cmd: list[str], env: dict[str, str]) -> int:
    """Run one probe (:func:`step`) at ``sha`` in the worktree ``wt``; its exit status (good/bad/skip/abort)."""
    _git(wt, "checkout", "-q", "--detach", sha)
    return subprocess.run(step_cmd, cwd=wt, env=env).returncode


def check_ends(wt: str, good: str, bad: str, step_cmd: list[str], env: dict[str, str], log: str,
               echo=print) -> dict[str, str]:
    """Measure ``good`` and ``bad`` before bisecting; BisectUsageError unless they measure good and bad
    (a skipped or aborted probe included), naming what each end measured."""

    verdict = {EXIT_GOOD: "good", EXIT_BAD: "bad", EXIT_SKIP: "skip", EXIT_ABORT: "abort"}
    out: dict[str, str] = {}
    for opt, sha, want in (("--good", good, EXIT_GOOD), ("--bad", bad, EXIT_BAD)):
        echo(f"measuring {opt} {sha[:12]} before bisecting")
        rc = measure_end(wt, sha, step_cmd, env)
        out[opt] = verdict.get(rc, f"exit {rc}")
        if rc != want:
            last = next((x for x in reversed(_read_log(log)) if x.get("sha") == sha), {})
            seen = (f"{last.get('name') or 'the benchmark'} = {last['value']:.6g}" if "value" in last
                    else last.get("why", "no value"))
            raise BisectUsageError(f"{opt} {sha[:12]} measures {out[opt]} ({seen}), not {verdict[want]}: the ends of "
                                   "a bisection must be measured good and bad; pick other commits or another "
                                   "--threshold")
    return out


def cmd_bisect(args: argparse.Namespace, console) -> int:
    res = run_bisect(repo=args.repo, good=args.good, bad=args.bad, benchmark=args.benchmark, metric=args.metric,
                     threshold=args.threshold, config=args.config, python=args.python or sys.executable,
                     install_cmd=args.install_cmd, machine=args.machine, keep_worktree=args.keep_worktree,
                     echo=console.print)
    console.print(f"ends measured: --good {res['ends'].get('--good')}, --bad {res['ends'].get('--bad')}",
                  highlight=False)
    for pr in res["probes"]:
        v = pr.get("value")
        shown = f"{v:.6g} (probe {pr.get('probe_s', 0):.1f} s)" if v is not None else pr.get("why", "")
        console.print(f"  {pr['sha'][:12]}  {pr['verdict']:5s}  {shown}", highlight=False)
    if res["first_bad"]:
        subj = _git(args.repo, "log", "-1", "--format=%s", res["first_bad"], check=False)
        console.print(f"first bad commit: {res['first_bad']} {subj}", highlight=False)
        return 0
    console.print("[red]bisection named no first bad commit[/red]\n" + res["output"][-3000:], highlight=False)
    return 1


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bisect", help="git bisect a library's history on one asv benchmark and a threshold")
    p.add_argument("--repo", required=True, help="git repository of the library (AITER, vLLM, ...)")
    p.add_argument("--good", required=True, help="a commit where the value is <= threshold")
    p.add_argument("--bad", required=True, help="a later commit where the value is > threshold")
    p.add_argument("--benchmark", required=True, help="regex selecting ONE benchmark combination, matched against "
                   "asv's 'name(param, ...)' (e.g. \"MLAPrefill.track_max_abs_error\\('aiter', 's4096'\\)\")")
    p.add_argument("--metric", required=True, choices=METRICS)
    p.add_argument("--threshold", required=True, type=ascii_float, help="value above which a commit is bad")
    p.add_argument("--config", default="asv.aiter.conf.json", help="asv config of the suite; its repo is --repo")
    p.add_argument("--python", help="interpreter of the existing environment (default: this one)")
    p.add_argument("--install-cmd", default=DEFAULT_INSTALL, help="builds/installs the checked-out commit; "
                   "{python} is replaced (default: %(default)s)")
    p.add_argument("--machine", default="bisect", help="asv machine name for the probe results (default bisect)")
    p.add_argument("--keep-worktree", action="store_true", help="keep the temporary worktree")
    p.set_defaults(handler=cmd_bisect)


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_fp8_bench.analysis.bisect")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("step", help="one git-bisect-run probe (internal)")
    s.add_argument("--benchmark", required=True)
    s.add_argument("--threshold", required=True, type=ascii_float)
    s.add_argument("--config", required=True)
    s.add_argument("--python", required=True)
    s.add_argument("--install-cmd", default=DEFAULT_INSTALL)
    s.add_argument("--machine", default="bisect")
    s.add_argument("--log", default=None)
    a = ap.parse_args(argv)
    try:
        return step(a)
    except Exception as exc:  # noqa: BLE001 - anything unexpected aborts the bisection, never marks a commit
        print(f"[bisect step] unexpected {type(exc).__name__}: {exc} (abort)", flush=True)
        return EXIT_ABORT


if __name__ == "__main__":
    sys.exit(_main())
