"""``mla-fp8-bench nightly``: one asv history point keyed by the library under test (AITER or vLLM): under the
results directory's lock, ``asv run -E existing:<python> --set-commit-hash <sha>``, the gate against the
previous stored result (or ``--base``), then publish. Exit 1 on a regression, 3 when asv stored no result."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from mla_fp8_bench.argtypes import check_name
from mla_fp8_bench.harness.asv_guard import git
from mla_fp8_bench.harness.asv_support import selection_knobs
from mla_fp8_bench.harness.results import ResultsError, find_result, list_result_files, load_asv_conf, load_asv_result
from mla_fp8_bench.jsonio import check_output_path, locked, write_file_atomic, write_json_atomic


class Library(NamedTuple):
    dists: tuple[str, ...]  # distribution names to look for
    config: str  # the default asv config
    bench: str  # the default --bench: the benchmarks that depend on it
    backend: str  # the suite's backend that runs it


LIBRARIES = {"aiter": Library(("amd-aiter", "aiter"), "asv.aiter.conf.json", r"\('aiter', ", "aiter"),
             "vllm": Library(("vllm",), "asv.vllm.conf.json", r"\('vllm-aiter', ", "vllm-aiter")}
EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_NO_RESULT = 0, 1, 2, 3
_SCM_SHA = re.compile(r"\+g([0-9a-f]{7,40})(?:\b|\.|$)")
_HEX = re.compile(r"[0-9a-f]{7,40}")
_PROBE = ("import json, sys\nfrom importlib import metadata\nout = {}\nfor d in sys.argv[1:]:\n    try:\n"
          "        m = metadata.distribution(d)\n    except metadata.PackageNotFoundError:\n        continue\n"
          "    out[d] = {'version': m.version, 'direct_url': m.read_text('direct_url.json')}\nprint(json.dumps(out))")


class NightlyError(ValueError):
    """Bad usage or nothing identifiable installed (the CLI exits 2)."""


@dataclass
class LibraryUnderTest:
    name: str  # aiter or vllm
    dist: str | None  # the installed distribution; None when only a checkout was given
    version: str | None
    commit: str  # full when resolvable, else the short SHA of the version label
    source: str  # where the commit came from: --commit, checkout <path>, direct_url vcs_info, ...
    checkout: str | None = None  # a local git checkout holding the commit


def installed_dists(python: str, dists: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``{dist: {"version", "direct_url"}}`` installed for ``python``."""
    try:
        p = subprocess.run([python, "-c", _PROBE, *dists], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise NightlyError(f"--python {python} cannot be run: {exc}") from None
    if p.returncode != 0:
        raise NightlyError(f"--python {python} failed to list packages: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _from_direct_url(text: str | None) -> tuple[str | None, str | None, str]:
    """(commit, local checkout, source) from a PEP 610 ``direct_url.json`` text."""
    try:
        du = json.loads(text or "")
    except ValueError:
        return None, None, ""
    vcs, url = du.get("vcs_info") or {}, str(du.get("url", ""))
    local = url[len("file://"):] if url.startswith("file://") else None
    head = git(local, "rev-parse", "HEAD") if local and Path(local).is_dir() else None
    if vcs.get("commit_id"):
        return str(vcs["commit_id"]), local if head else None, "direct_url vcs_info"
    return (head, local, f"git HEAD of the installed source {local}") if head else (None, None, "")


def identify(library: str, python: str, checkout: str | None = None, commit: str | None = None) -> LibraryUnderTest:
    """The library under test (``auto``: the one installed) and its commit: ``commit``, else the HEAD of
    ``checkout``, else read off the distribution installed for ``python``."""
    if library not in (*LIBRARIES, "auto"):
        raise NightlyError(f"--library {library!r} is unknown: allowed auto, {', '.join(LIBRARIES)}")
    found = {n: d for n in (LIBRARIES if library == "auto" else [library])
             if (d := installed_dists(python, LIBRARIES[n].dists))}
    if library == "auto":
        if len(found) > 1:
            raise NightlyError(f"both {' and '.join(found)} are installed for {python}: choose --library "
                               f"(aiter on AITER's runners, vllm on vLLM's)")
        if not found and not checkout:
            raise NightlyError(f"neither AITER (amd-aiter) nor vLLM is installed for {python}: install the library "
                               "under test, or pass --library and --checkout PATH")
        library = next(iter(found), "aiter")
    dist, info = next(iter(found[library].items())) if library in found else (None, {})
    version = info.get("version")
    if commit:
        if not _HEX.fullmatch(commit):
            raise NightlyError(f"--commit {commit!r} is not a commit hash (7 to 40 lowercase hex digits)")
        return LibraryUnderTest(library, dist, version, commit, "--commit", checkout)
    if checkout:
        if (head := git(checkout, "rev-parse", "HEAD")) is None:
            raise NightlyError(f"--checkout {checkout} is not a git checkout")
        return LibraryUnderTest(library, dist, version, head, f"checkout {checkout}", str(Path(checkout).resolve()))
    if dist is None:
        raise NightlyError(f"{library} is not installed for {python} ({' or '.join(LIBRARIES[library].dists)}): "
                           "install it, or pass --checkout PATH / --commit SHA")
    sha, local, source = _from_direct_url(info.get("direct_url"))
    if sha:
        return LibraryUnderTest(library, dist, version, sha, source, local)
    if m := _SCM_SHA.search(version or ""):
        return LibraryUnderTest(library, dist, version, m.group(1), f"version label {version}")
    raise NightlyError(f"{dist} {version} installed for {python} names no commit (no direct_url.json vcs_info, no "
                       "'+g<sha>' version label): pass --checkout PATH (its git checkout) or --commit SHA")


def load_conf(path: str) -> dict[str, Any]:
    if not Path(path).is_file():
        raise NightlyError(f"--config {path} does not exist (run from the suite's checkout, or pass --config)")
    try:
        return load_asv_conf(path)
    except ValueError as exc:
        raise NightlyError(f"--config {path} is not valid JSON/JSONC: {exc}") from None


def derived_config(config: str, conf: dict[str, Any], repo: str) -> str:
    """Write beside ``config`` (in ``.asv/``) a copy whose ``repo`` is ``repo`` and whose folders are absolute."""
    base = Path(config).resolve().parent
    conf = {**conf, "repo": str(Path(repo).resolve())}
    for key, default in (("benchmark_dir", "benchmarks"), ("results_dir", "results"), ("html_dir", "html"),
                         ("env_dir", "env")):
        conf[key] = str((base / conf.get(key, default)).resolve())
    out = base / ".asv" / f"nightly-{Path(config).stem.replace('.', '-')}.conf.json"
    write_json_atomic(conf, out)
    return str(out)


def check_repo_reachable(conf: dict[str, Any], config: str, lib: LibraryUnderTest, timeout: float = 30) -> bool:
    """Whether asv's mirror of a remote ``repo`` already holds ``lib.commit`` (then ``--no-pull``); False for a
    local ``repo`` or a remote that answers; NightlyError for an unreachable remote without that mirror."""
    repo = str(conf.get("repo", "."))
    if not ("://" in repo or (repo.startswith("git@") and ":" in repo)):
        return False
    mirror = Path(config).resolve().parent / str(conf.get("project", "project"))
    if mirror.is_dir() and git(mirror, "cat-file", "-e", f"{lib.commit}^{{commit}}") is not None:
        return True
    try:
        p = subprocess.run(["git", "ls-remote", "--exit-code", repo, "HEAD"], capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        why = None if p.returncode == 0 else " ".join(p.stderr.split())[-200:] or f"git exited {p.returncode}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why is None:
        return False
    raise NightlyError(f"{lib.name} commit {lib.commit[:12]} must come from {repo} ({config}'s repo), which is not "
                       f"reachable ({why}), and {mirror} holds no mirror with that commit: pass --checkout PATH "
                       f"(a git checkout of {lib.name} that has the commit; nothing is fetched then)")


def previous_commit(results_dir: str, machine: str, head: str) -> str | None:
    """The commit of the newest stored ``existing`` result on ``machine`` other than ``head`` (by commit date)."""
    mdir = Path(results_dir) / machine
    found = [r for r in (load_asv_result(f.path) for f in (list_result_files(mdir) if mdir.is_dir() else ())
                         if "existing" in f.env)
             if not (r.commit_hash.startswith(head) or head.startswith(r.commit_hash))]
    return max((r.date or 0.0, r.started_at(), r.commit_hash) for r in found)[2] if found else None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from mla_fp8_bench.cli import main; sys.exit(main(sys.argv[1:]))",
            *args]


def _machine_known(machine: str) -> bool:
    try:
        return machine in json.loads((Path.home() / ".asv-machine.json").read_text())
    except (OSError, ValueError):
        return False


@dataclass
class Plan:  # the commands of one nightly (--dry-run prints them)
    lib: LibraryUnderTest
    results_dir: str
    setup: list[list[str]]
    run: list[str]
    run_env: dict[str, str]
    gate: list[str]  # ends with the base commit
    publish: list[str] | None


def make_plan(args: argparse.Namespace) -> Plan:
    """Check the arguments, identify the library and build the commands (nothing is run)."""
    python = args.python or sys.executable
    check_name(args.machine or "", "--machine")
    if args.base is not None and not _HEX.fullmatch(args.base):
        raise NightlyError(f"--base {args.base!r} is not a commit hash (7 to 40 lowercase hex digits)")
    try:
        re.compile(args.bench or "")
    except re.error as exc:
        raise NightlyError(f"--bench {args.bench!r} is not a valid regular expression: {exc}") from None
    if args.summary is not None:
        check_output_path(args.summary, "--summary")  # before the asv run it reports on
    lib = identify(args.library, python, args.checkout, args.commit)
    config = args.config or LIBRARIES[lib.name].config
    conf = load_conf(config)
    results_dir = str((Path(config).resolve().parent / conf.get("results_dir", "results")).resolve())
    no_pull = not lib.checkout and check_repo_reachable(conf, config, lib)
    if lib.checkout:
        config = f"<{config} with repo={lib.checkout}>" if args.dry_run else derived_config(config, conf, lib.checkout)
    bench = args.bench or LIBRARIES[lib.name].bench
    run = [sys.executable, "-m", "asv", "run", "--config", config, "-E", f"existing:{python}", "--set-commit-hash",
           lib.commit, "--machine", args.machine, "--show-stderr", "--record-samples", "-b", bench,
           *(["--no-pull"] if no_pull else [])]  # samples: the per-round latencies the gate's threshold reads
    wanted = selection_knobs(bench) or {"MLA_FP8_BENCH_BACKENDS": LIBRARIES[lib.name].backend}
    gate = _cli("gate", "--results-dir", results_dir, "--machine", args.machine, "--env", "existing",
                *(["--format", args.format] if args.format != "text" else []),
                *(["--tolerances", args.tolerances] if args.tolerances else []), lib.commit)
    setup = [] if _machine_known(args.machine) else [_cli("asv-machine", args.machine, "--results-dir", results_dir)]
    return Plan(lib, results_dir, setup, run, {k: v for k, v in wanted.items() if k not in os.environ}, gate,
                None if args.no_publish else _cli("publish", "--config", config))


def _env_prefix(env: dict[str, str] | None) -> str:
    return "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())


def _run_streamed(cmd: list[str], echo, env: dict[str, str] | None = None, *,
                  tail: int | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` after echoing it and its output: each line as it comes, or its last ``tail`` characters."""
    echo(f"$ {_env_prefix(env)}{shlex.join(cmd)}")
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                          env={**os.environ, **(env or {})}) as proc:
        for line in proc.stdout:
            lines.append(line)
            if tail is None:
                echo(line.rstrip("\n"))
    out = "".join(lines)
    if tail and out.rstrip():
        echo(out.rstrip()[-tail:])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def run_nightly(args: argparse.Namespace, echo=print) -> int:
    """Run the plan (module docstring) under the results directory's lock; returns the exit status."""
    plan, md = make_plan(args), args.format == "markdown"
    lib = plan.lib
    what = f"{lib.dist or lib.name} {lib.version or ''}".strip()
    head = f"nightly: {what} at {lib.commit[:12]} ({lib.source}) on machine {args.machine}"
    echo(head)
    if args.dry_run:
        base = args.base or previous_commit(plan.results_dir, args.machine, lib.commit) or "<previous stored commit>"
        for cmd in plan.setup:
            echo(shlex.join(cmd))
        echo(_env_prefix(plan.run_env) + shlex.join(plan.run))
        echo(shlex.join([*plan.gate[:-1], base, lib.commit]))
        if plan.publish:
            echo(shlex.join(plan.publish))
        return EXIT_OK
    with locked(plan.results_dir, "results directory", wait=False):
        for cmd in plan.setup:
            if _run_streamed(cmd, echo, tail=6000).returncode != 0:
                raise NightlyError(f"could not register asv machine {args.machine}")
        p = _run_streamed(plan.run, echo, plan.run_env)
        try:
            find_result(plan.results_dir, args.machine, lib.commit[:8], env="existing")
        except ResultsError:
            echo(f"asv run exited {p.returncode} and stored no result for {lib.commit[:12]} on {args.machine}")
            return EXIT_NO_RESULT
        base = args.base or previous_commit(plan.results_dir, args.machine, lib.commit)
        title = f"### {head}\n" if md else head
        if base is None:
            summary, rc = f"{title}\nfirst result on this machine: nothing to gate against\n", EXIT_OK
        else:
            g = subprocess.run([*plan.gate[:-1], base, lib.commit], capture_output=True, text=True)
            rc = g.returncode if g.returncode in (EXIT_OK, EXIT_REGRESSION) else EXIT_USAGE
            summary = f"{title}\nbase {base[:12]} -> head {lib.commit[:12]}\n\n{g.stdout}{g.stderr}"
        echo(summary)
        if args.summary:
            write_file_atomic(args.summary, lambda f: f.write(summary))
        if plan.publish and (pp := _run_streamed(plan.publish, echo, tail=6000)).returncode != 0:
            echo(f"publish exited {pp.returncode} (results are stored; the gate's verdict stands)")
    return rc


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "nightly", help="asv history point keyed by the installed AITER/vLLM commit, gated and published",
        epilog="Exit status: 0 passed, 1 a regression, 2 bad usage, 3 asv stored nothing.")
    p.add_argument("--machine", required=True, help="asv machine name (e.g. mi355): results/<machine>/")
    p.add_argument("--library", default="auto", help="aiter, vllm or auto (the one installed; default auto)")
    p.add_argument("--python", help="interpreter of the environment with the library (default: this one)")
    p.add_argument("--checkout", help="git checkout of the library (its HEAD is the commit; asv's repo points here)")
    p.add_argument("--commit", help="the library's commit, when it cannot be read from the installed package")
    p.add_argument("--config", help="asv config (default asv.aiter.conf.json / asv.vllm.conf.json)")
    p.add_argument("--bench", help="asv -b regex (default: the benchmarks that depend on the library)")
    p.add_argument("--base", help="gate against this commit's stored result (a PR's base) instead of the "
                   "previous stored result on the machine")
    p.add_argument("--tolerances", help="calibrated tolerance JSON for the gate")
    p.add_argument("--format", default="text", choices=("text", "markdown"), help="gate summary format")
    p.add_argument("--summary", help="also write the gate summary to this file (for a PR comment / annotation)")
    p.add_argument("--no-publish", action="store_true", help="skip publishing the site")
    p.add_argument("--dry-run", action="store_true", help="identify the library and print the commands")
    p.set_defaults(handler=lambda args, console: run_nightly(
        args, echo=lambda s: console.print(s, highlight=False, markup=False, soft_wrap=True)))
