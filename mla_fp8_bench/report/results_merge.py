"""``mla-fp8-bench merge-results``: asv results directories of several runners merged into one.

asv has no merge command (asv#1362), and a plain copy loses data: every ``asv run`` rewrites
``benchmarks.json`` with the benchmarks it discovered, and results whose definition is missing are not
rendered. So:

* ``benchmarks.json`` is the union of all definitions; of two, the newest wins (a source's age: the
  newest ``started_at`` of its results, else the file's mtime; the destination takes part like a source).
* A different ``machine.json`` under an existing machine name is refused (two machines, one history),
  and so is a result file whose machine facts (``params``) differ from its directory's ``machine.json``,
  unless ``allow_machine_mismatch``.
* A result file the destination has with other content is merged per parameter combination: the newer
  row (``started_at``) wins where it measured the combination (a value or a failure, ``null``); where it
  has ``NaN`` (skipped, not in its grid) the older value is kept. A row of another benchmark ``version``
  replaces the older whole; files whose header (commit, env, machine params, columns) differs are refused.

Every input is checked before anything is written. The changes go into a copy of the destination that is
swapped into place with one ``renameat2(RENAME_EXCHANGE)`` (Linux; elsewhere two renames), so a failure
or a kill leaves the destination byte-identical. Merges into one destination are serialised by a lock;
a file another program writes into the destination meanwhile is carried into the new tree (a result
file the merge also wrote is merged again).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import math
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.harness.results import (
    ASV_BENCHMARKS_API_VERSION,
    AsvResult,
    ResultsError,
    list_result_files,
    load_asv_result,
    load_benchmarks,
    load_machine,
    machine_dirs,
)
from mla_fp8_bench.jsonio import OutputError, locked, write_file_atomic, write_json_atomic

#: Row columns that hold one entry per parameter combination (asv 0.6 ``result_columns``).
PER_COMBO_COLUMNS = ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number",
                     "stats_repeat", "samples")
#: Result-file header keys that must agree for two files to be merged.
_HEADER_KEYS = ("commit_hash", "env_name", "params", "result_columns", "python")


class MergeError(ValueError):
    """A merge is refused (conflict, corrupt or unknown input); the message names file and reason."""


@dataclass
class MergeReport:
    """What a merge did (or, with ``dry_run``, would do)."""

    machines: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "<file>: <benchmark>(<params>)" kept from the older row
    benchmarks_added: list[str] = field(default_factory=list)
    benchmarks_replaced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- reading
@dataclass
class MachineDir:
    name: str
    path: Path
    machine_json: dict[str, Any]
    result_files: list[Path]


@dataclass
class Source:
    path: Path
    machines: list[MachineDir]
    benchmarks: dict[str, Any] | None
    age: float


def _machine_dir(path: Path) -> MachineDir:
    mj = load_machine(path)
    if mj["machine"] != path.name:
        raise MergeError(f"machine file {path / 'machine.json'} names machine {mj['machine']!r} but lives in "
                         f"directory {path.name!r}: asv files results under results/<machine>/, rename one of them")
    return MachineDir(mj["machine"], path, mj, [f.path for f in list_result_files(path)])


def check_result_machine(m: MachineDir, res: AsvResult) -> None:
    """Refuse a result file whose stored machine facts differ from its directory's ``machine.json``.

    Raises:
        MergeError: naming the file, the differing keys and both values.
    """
    keys = sorted(k for k in m.machine_json if k != "version" and k in res.params)
    diff = [k for k in keys if str(res.params[k]) != str(m.machine_json[k])]
    if diff:
        shown = ", ".join(f"{k}={res.params[k]!r} vs {m.machine_json[k]!r}" for k in diff[:4])
        raise MergeError(f"result file {res.path} was measured on another machine than {m.path / 'machine.json'} "
                         f"describes ({shown}): refusing to merge it into {m.name!r}'s history; move it to its "
                         "machine's directory, or pass --allow-machine-mismatch")


def scan_source(src: str | os.PathLike, allow_machine_mismatch: bool = False) -> Source:
    """Read an asv results directory (``<src>/<machine>/machine.json`` + result files, optional
    ``<src>/benchmarks.json``) or one machine's directory (``<src>/machine.json``).

    Raises:
        MergeError: missing directory, no machines, corrupt files (named), a result file of another
            machine (unless ``allow_machine_mismatch``).
    """
    path = Path(src)
    try:
        mdirs = [_machine_dir(p) for p in machine_dirs(path)]
        if not mdirs:
            raise MergeError(f"{path} holds no asv results: expected <machine>/machine.json directories "
                             "(an asv results_dir) or a machine.json (one machine's directory)")
        cand = (path.parent if mdirs[0].path == path else path) / "benchmarks.json"
        bpath = cand if cand.is_file() else None
        bench = load_benchmarks(bpath) if bpath is not None else None
        age = 0.0
        for m in mdirs:
            for f in m.result_files:
                res = load_asv_result(f)
                if not allow_machine_mismatch:
                    check_result_machine(m, res)
                age = max(age, res.started_at())
    except ResultsError as exc:
        raise MergeError(str(exc)) from None
    if age == 0.0 and bpath is not None:
        age = bpath.stat().st_mtime * 1000.0  # asv's started_at is in ms since the epoch
    return Source(path, mdirs, bench, age)


# ---------------------------------------------------------------------------------------- merging
def _same_json(a: Any, b: Any) -> bool:
    """Deep equality that treats NaN == NaN (asv stores skips as NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    return a == b


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _num(v: Any) -> float:
    """A ``started_at`` value as a number (0 when absent or malformed)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _combos(row: dict[str, Any]) -> dict[tuple, int] | None:
    """params combination -> index in the row's per-combination lists; None if malformed."""
    params = row.get("params")
    if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
        return None
    return {c: i for i, c in enumerate(itertools.product(*params))}


def merge_rows(old: list[Any], new: list[Any], cols: list[str], where: str = "") -> tuple[list[Any], list[str]]:
    """Merge two rows of one benchmark (see the module docstring); returns (row, kept), ``kept`` naming the
    parameter combinations whose value came from the older row because the newer one lacked it."""
    o, n = dict(zip(cols, old)), dict(zip(cols, new))
    newer, older = (n, o) if _num(n.get("started_at")) >= _num(o.get("started_at")) else (o, n)
    oc, nc = _combos(older), _combos(newer)
    if newer.get("version") != older.get("version") or oc is None or nc is None or len(o["params"]) != len(
            n["params"]):
        return (new if newer is n else old), []
    # the destination's order first, then values only the other has
    params = [list(po) + [v for v in pn if v not in po] for po, pn in zip(o["params"], n["params"])]

    def at(row: dict[str, Any], col: str, i: int | None) -> Any:
        c, missing = row.get(col), (float("nan") if col == "result" else None)
        if i is not None and col == "result" and not isinstance(c, list):
            return c
        return c[i] if i is not None and isinstance(c, list) and i < len(c) else missing

    out = dict(newer, params=params)
    per = [c for c in cols if c in PER_COMBO_COLUMNS]
    merged: dict[str, list[Any]] = {c: [] for c in per}
    kept: list[str] = []
    for combo in itertools.product(*params):
        ni, oi = nc.get(combo), oc.get(combo)
        take_old = _is_nan(at(newer, "result", ni)) and not _is_nan(at(older, "result", oi))
        src, i = (older, oi) if take_old else (newer, ni)
        if take_old:
            kept.append(f"{where}({', '.join(map(str, combo))})")
        for c in per:
            merged[c].append(at(src, c, i))
    for c in per:
        out[c] = merged[c] if any(v is not None for v in merged[c]) or c == "result" else None
    row = [out.get(c) for c in cols]
    while row and row[-1] is None:  # asv drops trailing empty columns
        row.pop()
    return row, kept


def merge_result_data(old: dict[str, Any], new: dict[str, Any], name: str,
                      kept: list[str] | None = None) -> dict[str, Any]:
    """Merge two asv result files of one (machine, commit, env) per benchmark and parameter combination
    (see the module docstring); benchmarks present in one only are kept.

    Args:
        old, new: the parsed files (the destination's and the incoming one).
        name: the file's name for messages.
        kept: if given, receives ``"<name>: <benchmark>(<params>)"`` for each value kept from the older row.

    Raises:
        MergeError: the headers (commit, env, params, columns) differ.
    """
    for key in _HEADER_KEYS:
        if not _same_json(old.get(key), new.get(key)):
            raise MergeError(f"result file {name}: {key} differs between the destination ({old.get(key)!r:.80}) and "
                             f"the source ({new.get(key)!r:.80}); refusing to mix them")
    cols = old["result_columns"]
    out = dict(old)
    results = dict(old["results"])
    for bench, row in new["results"].items():
        if bench not in results:
            results[bench] = row
            continue
        results[bench], k = merge_rows(results[bench], row, cols, f"{name}: {bench}")
        if kept is not None:
            kept.extend(k)
    out["results"] = results
    i = cols.index("started_at") if "started_at" in cols else None

    def started(row: Any) -> float:
        return _num(row[i]) if i is not None and isinstance(row, list) and len(row) > i else 0.0

    new_is_newer = (max(map(started, new["results"].values()), default=0.0)
                    >= max(map(started, old["results"].values()), default=0.0))
    durations = dict(old.get("durations") or {})
    for k, v in (new.get("durations") or {}).items():
        if new_is_newer or k not in durations:
            durations[k] = v
    out["durations"] = durations
    return out


# ---------------------------------------------------------------------------------------- planning
@dataclass
class _Plan:
    """Files to create in the destination: byte copies and JSON documents (paths inside ``dest``)."""

    dest: Path
    copies: dict[Path, Path] = field(default_factory=dict)
    writes: dict[Path, Any] = field(default_factory=dict)


def _read_sources(sources: list[str | os.PathLike], dest: Path, machines: list[str] | None,
                  allow_machine_mismatch: bool) -> list[Source]:
    if not sources:
        raise MergeError("no source results directory given")
    srcs: list[Source] = []
    for s in sources:
        sp = Path(s)
        if dest.exists() and sp.exists() and sp.resolve() == dest.resolve():
            raise MergeError(f"source {sp} is the destination itself")
        srcs.append(scan_source(sp, allow_machine_mismatch=allow_machine_mismatch))
    if machines:
        have = {m.name for s in srcs for m in s.machines}
        unknown = [m for m in machines if m not in have]
        if unknown:
            raise MergeError(f"machine {', '.join(map(repr, unknown))} is in none of the sources: they have "
                             f"{', '.join(sorted(have))}")
        for s in srcs:
            s.machines = [m for m in s.machines if m.name in machines]
    return srcs


def _plan_machines(srcs: list[Source], dest: Path, report: MergeReport) -> None:
    """Refuse two different ``machine.json`` under one name (between sources, and against ``dest``)."""
    machine_json: dict[str, tuple[dict[str, Any], str]] = {}
    if dest.is_dir():
        for p in machine_dirs(dest):
            machine_json[p.name] = (load_machine(p), str(p / "machine.json"))
    for s in srcs:
        for m in s.machines:
            if m.name in machine_json and not _same_json(machine_json[m.name][0], m.machine_json):
                prev, where = machine_json[m.name]
                diff = sorted(k for k in set(prev) | set(m.machine_json) if prev.get(k) != m.machine_json.get(k))
                raise MergeError(
                    f"machine {m.name!r}: {m.path / 'machine.json'} differs from {where} (keys {', '.join(diff)}); "
                    "two different machines under one name would merge into one history - rename one "
                    "(asv machine --machine <name>) or fix the file. Nothing was written.")
            machine_json[m.name] = (m.machine_json, str(m.path / "machine.json"))
            if m.name not in report.machines:
                report.machines.append(m.name)


def _plan_results(srcs: list[Source], plan: _Plan, report: MergeReport) -> None:
    """Result files: copy new ones byte for byte, merge ones the destination (or an earlier source) has."""
    for s in srcs:
        for m in s.machines:
            ddir = plan.dest / m.name
            if not (ddir / "machine.json").exists() and ddir / "machine.json" not in plan.copies:
                plan.copies[ddir / "machine.json"] = m.path / "machine.json"
            for f in m.result_files:
                new = load_asv_result(f).raw
                target, rel = ddir / f.name, f"{m.name}/{f.name}"
                if target in plan.writes:
                    old = plan.writes[target]
                elif target in plan.copies:
                    old = load_asv_result(plan.copies[target]).raw
                elif target.exists():
                    old = load_asv_result(target).raw
                else:
                    plan.copies[target] = f
                    report.copied.append(rel)
                    continue
                if _same_json(old, new):
                    if rel not in report.copied and rel not in report.merged:
                        report.unchanged.append(rel)
                    continue
                plan.writes[target] = merge_result_data(old, new, rel, report.kept)
                plan.copies.pop(target, None)
                if rel in report.copied:
                    report.copied.remove(rel)
                if rel not in report.merged:
                    report.merged.append(rel)


def _plan_benchmarks(srcs: list[Source], plan: _Plan, report: MergeReport) -> None:
    """``benchmarks.json``: the union of all definitions, the newest definition of each name wins."""
    dest_bench = plan.dest / "benchmarks.json"
    existing: dict[str, Any] | None = None
    bench_sources: list[tuple[float, int, dict[str, Any]]] = []
    if dest_bench.is_file():
        existing = load_benchmarks(dest_bench)
        dage = scan_source(plan.dest, allow_machine_mismatch=True).age if machine_dirs(plan.dest) else 0.0
        bench_sources.append((dage or dest_bench.stat().st_mtime * 1000.0, -1, existing))
    for idx, s in enumerate(srcs):
        if s.benchmarks is not None:
            bench_sources.append((s.age, idx, s.benchmarks))
        else:
            report.notes.append(f"{s.path} has no benchmarks.json: its results render only if another source "
                                "defines their benchmarks")
    if not bench_sources:
        return
    merged_bench: dict[str, Any] = {}
    for _age, _idx, bench in sorted(bench_sources, key=lambda t: (t[0], t[1])):  # oldest first: newer overwrite
        for name, definition in bench.items():
            if name != "version":
                merged_bench[name] = definition
    old_defs = {k: v for k, v in (existing or {}).items() if k != "version"}
    for name, definition in merged_bench.items():
        if name not in old_defs:
            report.benchmarks_added.append(name)
        elif not _same_json(old_defs[name], definition):
            report.benchmarks_replaced.append(name)
    merged_bench["version"] = ASV_BENCHMARKS_API_VERSION
    if existing is None or not _same_json(existing, merged_bench):
        plan.writes[dest_bench] = merged_bench


# ---------------------------------------------------------------------------------------- applying
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False  # ENOSYS / EINVAL / EOPNOTSUPP: the file system cannot exchange
    raise OSError(err, os.strerror(err), str(b))


def remove_tree(path: Path) -> None:
    """Delete a folder tree (also read-only parts of it); no error if it is absent."""
    def onerror(func, p, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            func(p)

    if path.exists():
        shutil.rmtree(path, onerror=onerror)


def umask_dir_mode() -> int:
    """The mode a new folder gets under the current umask (``mkdtemp`` alone gives 0700)."""
    old = os.umask(0)
    os.umask(old)
    return 0o777 & ~old


def _swap_into_place(stage: Path, dest: Path) -> Path | None:
    """Put ``stage`` at ``dest``; returns the path now holding the previous tree (to delete), if any."""
    if not dest.exists():
        os.rename(stage, dest)
        return None
    if _exchange(stage, dest):
        return stage
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    os.rmdir(old)
    os.rename(dest, old)
    try:
        os.rename(stage, dest)
    except BaseException:
        os.rename(old, dest)
        raise
    return old


def replace_dir(new: Path, dest: Path) -> None:
    """Put the folder ``new`` at ``dest`` in one step where the OS allows (see :func:`_swap_into_place`)
    and delete the previous ``dest``."""
    old = _swap_into_place(new, dest)
    if old is not None:
        remove_tree(old)


Snapshot = dict[str, tuple[int, int, int]]


def _snapshot(dest: Path) -> Snapshot:
    """relative path -> (inode, size, mtime_ns) of every file under ``dest`` ({} if absent)."""
    out: Snapshot = {}
    if dest.is_dir():
        for p in dest.rglob("*"):
            if p.is_file() and not p.is_symlink():
                st = p.stat()
                out[str(p.relative_to(dest))] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _rescue(previous: Path, dest: Path, seen: Snapshot, plan: _Plan, report: MergeReport) -> None:
    """Carry files written into the destination during the merge (new or changed since ``seen``) from the
    previous tree into the new one; a result file the merge wrote too is merged again."""
    targets = {str(t.relative_to(plan.dest)) for t in (*plan.copies, *plan.writes)}
    for rel, now in _snapshot(previous).items():
        if seen.get(rel) == now:
            continue
        src, dst = previous / rel, dest / rel
        if rel in targets and rel.endswith(".json") and "/" in rel and not rel.endswith("machine.json"):
            try:
                theirs = load_asv_result(src).raw
                ours = load_asv_result(dst).raw
                write_json_atomic(merge_result_data(ours, theirs, rel, report.kept), dst, indent=4, sort_keys=True)
                report.notes.append(f"{rel} was written during the merge: merged again with it")
                continue
            except (ResultsError, MergeError):
                dst = dst.with_name(dst.name + ".concurrent")
        elif rel in targets:
            dst = dst.with_name(dst.name + ".concurrent")
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
        report.notes.append(f"{rel} was written during the merge: kept as {dst.relative_to(dest)}")


def _apply_staged(plan: _Plan, seen: Snapshot, report: MergeReport) -> None:
    """Write the plan into a copy of the destination, then swap the copy into place; files written into
    the destination meanwhile (not in ``seen``) are carried over (:func:`_rescue`).

    Raises:
        MergeError: any write failure (the destination is unchanged).
    """
    dest = plan.dest.absolute()
    stage: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.merge-", dir=dest.parent))
        if dest.is_dir():
            shutil.copytree(dest, stage, symlinks=True, dirs_exist_ok=True)
            shutil.copystat(dest, stage)
        else:
            os.chmod(stage, umask_dir_mode())
        for target, src_file in plan.copies.items():
            data = src_file.read_bytes()
            write_file_atomic(stage / target.relative_to(plan.dest), lambda f, d=data: f.write(d), binary=True)
        for target, data in plan.writes.items():
            write_json_atomic(data, stage / target.relative_to(plan.dest), indent=4, sort_keys=True)
        stage = _swap_into_place(stage, dest)  # now the previous tree, if any
        if stage is not None:
            _rescue(stage, dest, seen, plan, report)
    except OSError as exc:
        raise MergeError(f"cannot write the merged results into {plan.dest}: "
                         f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}; "
                         "the destination is unchanged") from None
    finally:
        if stage is not None:
            remove_tree(stage)


def merge_results(sources: list[str | os.PathLike], into: str | os.PathLike, *, machines: list[str] | None = None,
                  dry_run: bool = False, allow_machine_mismatch: bool = False) -> MergeReport:
    """Merge asv results directories (or single machine directories) ``sources`` into the results
    directory ``into`` (created if missing); ``machines``: only these names (each must exist in some
    source); ``dry_run``: check and report, write nothing.

    Raises:
        MergeError: conflicting ``machine.json`` for one machine name, a result file of another machine,
            incompatible result files, corrupt JSON (named), unknown machine names - all raised before
            anything is written; or a failed write, after which the destination is unchanged.
    """
    if into is None or str(into).strip() == "":
        raise MergeError("--into '' is empty: give the destination results directory, e.g. results")
    dest = Path(into)
    if dest.exists() and not dest.is_dir():
        raise MergeError(f"destination {dest} exists and is not a directory")
    try:
        with locked(dest, "destination"):
            seen = _snapshot(dest)
            report, plan = MergeReport(), _Plan(dest)
            try:
                srcs = _read_sources(sources, dest, machines, allow_machine_mismatch)
                _plan_machines(srcs, dest, report)
                _plan_results(srcs, plan, report)
                _plan_benchmarks(srcs, plan, report)
            except ResultsError as exc:
                raise MergeError(str(exc)) from None
            if dry_run:
                report.notes.append("dry run: nothing written")
            elif plan.copies or plan.writes:
                _apply_staged(plan, seen, report)
            return report
    except OutputError as exc:
        raise MergeError(str(exc)) from None


# ---------------------------------------------------------------------------------------- CLI
def add_merge_parser(subparsers) -> None:
    """Register ``merge-results`` on the CLI's sub-parsers."""
    p = subparsers.add_parser(
        "merge-results",
        help="merge asv results directories from several runners into one (union of benchmarks.json, "
             "machines side by side; asv has no merge command, asv#1362)")
    p.add_argument("sources", nargs="+", metavar="SRC_RESULTS_DIR",
                   help="asv results directories (results/ with <machine>/ inside) or single machine directories")
    p.add_argument("--into", required=True, help="destination results directory (e.g. results/)")
    p.add_argument("--machine", action="append", default=None,
                   help="copy only this machine (repeatable); an unknown name is an error")
    p.add_argument("--allow-machine-mismatch", action="store_true",
                   help="merge result files whose stored machine facts differ from their directory's machine.json "
                        "(refused by default: it would mix two machines' histories)")
    p.add_argument("--dry-run", action="store_true", help="check and report, write nothing")
    p.set_defaults(handler=cmd_merge_results)


def cmd_merge_results(args, console) -> int:
    """Handler of ``merge-results``: 0 on success; a :class:`MergeError` (destination unchanged) goes to the
    CLI (exit 2)."""
    rep = merge_results(args.sources, args.into, machines=args.machine, dry_run=args.dry_run,
                        allow_machine_mismatch=args.allow_machine_mismatch)
    console.print(f"machines: {', '.join(rep.machines)}", highlight=False)
    console.print(f"result files: {len(rep.copied)} copied, {len(rep.merged)} merged per benchmark and params "
                  f"(newest started_at wins), {len(rep.unchanged)} unchanged", highlight=False)
    if rep.kept:
        console.print(f"kept {len(rep.kept)} values that the newer results did not measure (never overwritten "
                      f"by a skip), e.g. {rep.kept[0]}", highlight=False)
    console.print(f"benchmarks.json: {len(rep.benchmarks_added)} definitions added, "
                  f"{len(rep.benchmarks_replaced)} replaced by a newer one", highlight=False)
    for n in rep.notes:
        console.print(f"note: {n}", highlight=False)
    return 0
