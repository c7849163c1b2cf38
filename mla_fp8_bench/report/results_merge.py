"""``mla-fp8-bench merge-results``: asv results directories of several runners merged into one.

asv has no merge command (asv#1362), and a plain copy loses data (``asv run`` rewrites ``benchmarks.json``;
results without a definition are not rendered). So:

* ``benchmarks.json``: the union of all definitions, the newest of two wins (a source's age: its newest
  ``started_at``, else the file's mtime; the destination counts as a source).
* A different ``machine.json`` under an existing name is refused, and so is a result file whose ``params``
  differ from its directory's ``machine.json`` (unless ``allow_machine_mismatch``).
* Result files of one name are merged per parameter combination: the newer row (``started_at``) wins where
  it measured (a value or a failure, ``null``); where it has ``NaN`` (skipped) the older value is kept.
  A row of another benchmark ``version`` replaces the older whole; a differing header is refused.

Every input is checked before anything is written; the changes go into a copy of the destination swapped
in with ``renameat2(RENAME_EXCHANGE)`` (Linux; elsewhere two renames), under a lock. Files written into
the destination meanwhile are carried into the new tree (a result file the merge wrote is merged again).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import json
import math
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.harness import results as R
from mla_fp8_bench.jsonio import OutputError, json_number, locked, umask_mode, write_file_atomic, write_json_atomic

#: Row columns that hold one entry per parameter combination (asv 0.6 ``result_columns``).
PER_COMBO_COLUMNS = ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number",
                     "stats_repeat", "samples")
#: Result-file header keys that must agree for two files to be merged.
_HEADER_KEYS = ("commit_hash", "env_name", "params", "result_columns", "python")


class MergeError(ValueError):
    """A merge is refused (conflict, corrupt or unknown input); the message names file and reason."""


@dataclass
class MergeReport:
    """What a merge did (with ``dry_run``: would do)."""

    machines: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "<file>: <benchmark>(<params>)" kept from the older row
    benchmarks_added: list[str] = field(default_factory=list)
    benchmarks_replaced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Machine:
    path: Path
    facts: dict[str, Any]  # its machine.json
    results: list[R.AsvResult]


@dataclass
class _Source:
    path: Path
    machines: list[_Machine]
    benchmarks: dict[str, Any] | None
    age: float  # ms since the epoch


def _scan(path: Path, allow_machine_mismatch: bool = False) -> _Source:
    """Read an asv results directory (``<machine>/`` directories, optional ``benchmarks.json``) or one
    machine's directory. MergeError: missing directory, no machines, corrupt files (named), a directory
    named unlike its machine, a result file of another machine (unless ``allow_machine_mismatch``)."""
    try:
        machines = []
        for d in R.machine_dirs(path):
            facts = R.load_machine(d)
            if facts["machine"] != d.name:
                raise MergeError(f"machine file {d / 'machine.json'} names machine {facts['machine']!r} but lives "
                                 f"in directory {d.name!r}: asv files results under results/<machine>/, rename one "
                                 "of them")
            machines.append(_Machine(d, facts, [R.load_asv_result(f.path) for f in R.list_result_files(d)]))
        if not machines:
            raise MergeError(f"{path} holds no asv results: expected <machine>/machine.json directories "
                             "(an asv results_dir) or a machine.json (one machine's directory)")
        bpath = (path.parent if machines[0].path == path else path) / "benchmarks.json"
        bench = R.load_benchmarks(bpath) if bpath.is_file() else None
    except R.ResultsError as exc:
        raise MergeError(str(exc)) from None
    for m in machines:
        for res in m.results:
            diff = [k for k in sorted(m.facts) if k != "version" and k in res.params
                    and str(res.params[k]) != str(m.facts[k])]
            if diff and not allow_machine_mismatch:
                shown = ", ".join(f"{k}={res.params[k]!r} vs {m.facts[k]!r}" for k in diff[:4])
                raise MergeError(f"result file {res.path} was measured on another machine than "
                                 f"{m.path / 'machine.json'} describes ({shown}): refusing to merge it into "
                                 f"{m.path.name!r}'s history; move it to its machine's directory, or pass "
                                 "--allow-machine-mismatch")
    age = max((r.started_at() for m in machines for r in m.results), default=0.0)
    if age == 0.0 and bench is not None:
        age = bpath.stat().st_mtime * 1000.0  # asv's started_at is in ms since the epoch
    return _Source(path, machines, bench, age)


# ---------------------------------------------------------------------------------------- merging
def _same_json(a: Any, b: Any) -> bool:
    """Equality of two JSON documents, NaN equal to NaN (asv stores skips as NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _num(v: Any) -> float:  # a started_at value; 0 when absent or malformed
    return json_number(v) or 0.0


def _combos(row: dict[str, Any]) -> dict[tuple, int] | None:
    """params combination -> index in the row's per-combination lists; None if malformed."""
    params = row.get("params")
    if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
        return None
    return {c: i for i, c in enumerate(itertools.product(*params))}


def _merge_rows(old: list[Any], new: list[Any], cols: list[str], where: str) -> tuple[list[Any], list[str]]:
    """Merge two rows of one benchmark (see the module docstring); returns (row, kept), ``kept`` naming the
    parameter combinations whose value came from the older row because the newer one lacked it."""
    o, n = dict(zip(cols, old)), dict(zip(cols, new))
    newer, older = (n, o) if _num(n.get("started_at")) >= _num(o.get("started_at")) else (o, n)
    oc, nc = _combos(older), _combos(newer)
    if newer.get("version") != older.get("version") or oc is None or nc is None or len(o["params"]) != len(n["params"]):
        return (new if newer is n else old), []
    # the destination's order first, then values only the other has
    params = [list(po) + [v for v in pn if v not in po] for po, pn in zip(o["params"], n["params"])]

    def at(row: dict[str, Any], col: str, i: int | None) -> Any:
        c = row.get(col)
        if i is not None and col == "result" and not isinstance(c, list):
            return c
        return c[i] if i is not None and isinstance(c, list) and i < len(c) else (
            float("nan") if col == "result" else None)

    per = [c for c in cols if c in PER_COMBO_COLUMNS]
    merged: dict[str, list[Any]] = {c: [] for c in per}
    kept: list[str] = []
    for combo in itertools.product(*params):
        ni, oi = nc.get(combo), oc.get(combo)
        take_old = _is_nan(at(newer, "result", ni)) and not _is_nan(at(older, "result", oi))
        if take_old:
            kept.append(f"{where}({', '.join(map(str, combo))})")
        for c in per:
            merged[c].append(at(older, c, oi) if take_old else at(newer, c, ni))
    out = dict(newer, params=params)
    out.update({c: v if any(x is not None for x in v) or c == "result" else None for c, v in merged.items()})
    row = [out.get(c) for c in cols]
    while row and row[-1] is None:  # asv drops trailing empty columns
        row.pop()
    return row, kept


def merge_result_data(old: dict[str, Any], new: dict[str, Any], name: str,
                      kept: list[str] | None = None) -> dict[str, Any]:
    """Merge the parsed asv result files ``old`` (the destination's) and ``new`` per benchmark and
    parameter combination (module docstring); ``name`` names the file in messages; ``kept``, if given,
    receives ``"<name>: <benchmark>(<params>)"`` per value kept from the older row. MergeError: the headers
    (commit, env, params, columns) differ."""
    for key in _HEADER_KEYS:
        if not _same_json(old.get(key), new.get(key)):
            raise MergeError(f"result file {name}: {key} differs between the destination ({old.get(key)!r:.80}) and "
                             f"the source ({new.get(key)!r:.80}); refusing to mix them")
    cols = old["result_columns"]
    results = dict(old["results"])
    for bench, row in new["results"].items():
        if bench not in results:
            results[bench] = row
            continue
        results[bench], k = _merge_rows(results[bench], row, cols, f"{name}: {bench}")
        if kept is not None:
            kept.extend(k)
    i = cols.index("started_at") if "started_at" in cols else None

    def newest(doc: dict[str, Any]) -> float:
        return max((_num(r[i]) for r in doc["results"].values() if i is not None and isinstance(r, list)
                    and len(r) > i), default=0.0)

    durations = dict(old.get("durations") or {})
    new_is_newer = newest(new) >= newest(old)
    durations.update({k: v for k, v in (new.get("durations") or {}).items() if new_is_newer or k not in durations})
    return dict(old, results=results, durations=durations)


# ---------------------------------------------------------------------------------------- planning
def _plan_results(srcs: list[_Source], dest: Path, report: MergeReport, copies: dict[Path, Path],
                  writes: dict[Path, Any]) -> None:
    """Refuse two different ``machine.json`` under one name (between sources, and against ``dest``);
    plan byte copies of new result files, merges of ones the destination (or an earlier source) has."""
    facts = {p.name: (R.load_machine(p), str(p / "machine.json"))
             for p in (R.machine_dirs(dest) if dest.is_dir() else [])}
    for m in (m for s in srcs for m in s.machines):
        name = m.path.name
        if name in facts and not _same_json(facts[name][0], m.facts):
            prev, where = facts[name]
            diff = sorted(k for k in set(prev) | set(m.facts) if prev.get(k) != m.facts.get(k))
            raise MergeError(
                f"machine {name!r}: {m.path / 'machine.json'} differs from {where} (keys {', '.join(diff)}); "
                "two different machines under one name would merge into one history - rename one "
                "(asv machine --machine <name>) or fix the file. Nothing was written.")
        facts[name] = (m.facts, str(m.path / "machine.json"))
        if name not in report.machines:
            report.machines.append(name)
    for m in (m for s in srcs for m in s.machines):
        ddir = dest / m.path.name
        if not (ddir / "machine.json").exists():
            copies.setdefault(ddir / "machine.json", m.path / "machine.json")
        for res in m.results:
            target, rel = ddir / res.path.name, f"{m.path.name}/{res.path.name}"
            if target in writes:
                old = writes[target]
            elif target in copies or target.exists():
                old = R.load_asv_result(copies.get(target, target)).raw
            else:
                copies[target] = res.path
                report.copied.append(rel)
                continue
            if _same_json(old, res.raw):
                if rel not in report.copied and rel not in report.merged:
                    report.unchanged.append(rel)
                continue
            writes[target] = merge_result_data(old, res.raw, rel, report.kept)
            copies.pop(target, None)
            if rel in report.copied:
                report.copied.remove(rel)
            if rel not in report.merged:
                report.merged.append(rel)


def _plan_benchmarks(srcs: list[_Source], dest: Path, report: MergeReport, writes: dict[Path, Any]) -> None:
    """``benchmarks.json``: the union of all definitions, the newest definition of each name wins."""
    path = dest / "benchmarks.json"
    existing = R.load_benchmarks(path) if path.is_file() else None
    ages: list[tuple[float, int, dict[str, Any]]] = []
    if existing is not None:
        dage = _scan(dest, allow_machine_mismatch=True).age if R.machine_dirs(dest) else 0.0
        ages.append((dage or path.stat().st_mtime * 1000.0, -1, existing))
    for i, s in enumerate(srcs):
        if s.benchmarks is None:
            report.notes.append(f"{s.path} has no benchmarks.json: its results render only if another source "
                                "defines their benchmarks")
        else:
            ages.append((s.age, i, s.benchmarks))
    if not ages:
        return
    merged: dict[str, Any] = {}
    for *_, bench in sorted(ages, key=lambda t: t[:2]):  # oldest first: newer definitions overwrite
        merged.update((k, v) for k, v in bench.items() if k != "version")
    old = {k: v for k, v in (existing or {}).items() if k != "version"}
    report.benchmarks_added += [k for k in merged if k not in old]
    report.benchmarks_replaced += [k for k in merged if k in old and not _same_json(old[k], merged[k])]
    merged["version"] = R.ASV_BENCHMARKS_API_VERSION
    if existing is None or not _same_json(existing, merged):
        writes[path] = merged


# ---------------------------------------------------------------------------------------- applying
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False  # the file system cannot exchange
    raise OSError(err, os.strerror(err), str(b))


def remove_tree(path: Path) -> None:
    """Delete a folder tree (also read-only parts of it); no error if it is absent."""
    def onerror(func, p, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            func(p)

    if path.exists():
        shutil.rmtree(path, onerror=onerror)


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
    """Put the folder ``new`` at ``dest`` in one step where the OS allows and delete the previous ``dest``."""
    if (old := _swap_into_place(new, dest)) is not None:
        remove_tree(old)


def _snapshot(dest: Path) -> dict[str, tuple[int, int, int]]:
    """relative path -> (inode, size, mtime_ns) of every file under ``dest`` ({} if absent)."""
    return {str(p.relative_to(dest)): (st.st_ino, st.st_size, st.st_mtime_ns)
            for p in (dest.rglob("*") if dest.is_dir() else []) if p.is_file() and not p.is_symlink()
            for st in [p.stat()]}


def _rescue(previous: Path, dest: Path, seen: dict[str, tuple[int, int, int]], targets: set[str],
            report: MergeReport) -> None:
    """Carry files written into the destination during the merge (new or changed since ``seen``) from the
    previous tree into the new one; a result file the merge wrote too (``targets``) is merged again."""
    for rel, now in _snapshot(previous).items():
        if seen.get(rel) == now:
            continue
        src, dst = previous / rel, dest / rel
        if rel in targets and rel.endswith(".json") and "/" in rel and not rel.endswith("machine.json"):
            try:
                merged = merge_result_data(R.load_asv_result(dst).raw, R.load_asv_result(src).raw, rel, report.kept)
                write_json_atomic(merged, dst, indent=4, sort_keys=True)
                report.notes.append(f"{rel} was written during the merge: merged again with it")
                continue
            except (R.ResultsError, MergeError):
                pass
        if rel in targets:
            dst = dst.with_name(dst.name + ".concurrent")
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
        report.notes.append(f"{rel} was written during the merge: kept as {dst.relative_to(dest)}")


def _apply_staged(dest: Path, copies: dict[Path, Path], writes: dict[Path, Any], seen: dict[str, tuple[int, int, int]],
                  report: MergeReport) -> None:
    """Write the plan into a copy of the destination and swap it into place; files written meanwhile (not
    in ``seen``) are carried over (:func:`_rescue`). MergeError: a write failed (destination unchanged)."""
    root = dest.absolute()
    stage: Path | None = None
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{root.name}.merge-", dir=root.parent))
        if root.is_dir():
            shutil.copytree(root, stage, symlinks=True, dirs_exist_ok=True)
            shutil.copystat(root, stage)
        else:
            os.chmod(stage, umask_mode(0o777))
        for target, src_file in copies.items():
            data = src_file.read_bytes()
            write_file_atomic(stage / target.relative_to(dest), lambda f, d=data: f.write(d), binary=True)
        for target, doc in writes.items():
            write_json_atomic(doc, stage / target.relative_to(dest), indent=4, sort_keys=True)
        stage = _swap_into_place(stage, root)  # now the previous tree, if any
        if stage is not None:
            _rescue(stage, root, seen, {str(t.relative_to(dest)) for t in (*copies, *writes)}, report)
    except OSError as exc:
        raise MergeError(f"cannot write the merged results into {dest}: "
                         f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}; "
                         "the destination is unchanged") from None
    finally:
        if stage is not None:
            remove_tree(stage)


def merge_results(sources: list[str | os.PathLike], into: str | os.PathLike, *, machines: list[str] | None = None,
                  dry_run: bool = False, allow_machine_mismatch: bool = False) -> MergeReport:
    """Merge asv results (or machine) directories ``sources`` into the results directory ``into``
    (created if missing); ``machines``: only these names (each in some source); ``dry_run``: write nothing.

    Raises:
        MergeError: before anything is written: a destination that is a machine's directory or inside a
            source, conflicting ``machine.json`` for one name, a result file of another machine,
            incompatible result files, corrupt JSON (named), unknown machines; or a failed write (the
            destination is then unchanged).
    """
    if into is None or str(into).strip() == "":
        raise MergeError("--into '' is empty: give the destination results directory, e.g. results")
    dest = Path(into)
    for p in (*map(Path, sources), dest):
        try:
            p.resolve()
        except (RuntimeError, OSError) as exc:  # a symlink loop
            raise MergeError(f"{p} cannot be resolved: {exc}") from None
    if dest.exists() and not dest.is_dir():
        raise MergeError(f"destination {dest} exists and is not a directory")
    if (dest / "machine.json").exists():
        raise MergeError(f"destination {dest} is one machine's directory (it holds machine.json): give the results "
                         f"directory that holds it, e.g. {dest.parent}")
    if (inside := next((sp for sp in map(Path, sources) if sp.resolve() in dest.resolve().parents), None)) is not None:
        raise MergeError(f"destination {dest} lies inside source {inside}: the merge would write into that source; "
                         "give a destination outside every source")
    if not sources:
        raise MergeError("no source results directory given")
    try:
        with locked(dest, "destination"):
            seen = _snapshot(dest)
            report = MergeReport()
            copies: dict[Path, Path] = {}
            writes: dict[Path, Any] = {}
            srcs = []
            for sp in map(Path, sources):
                if dest.exists() and sp.exists() and sp.resolve() == dest.resolve():
                    raise MergeError(f"source {sp} is the destination itself")
                srcs.append(_scan(sp, allow_machine_mismatch=allow_machine_mismatch))
            if machines:
                have = {m.path.name for s in srcs for m in s.machines}
                if unknown := [m for m in machines if m not in have]:
                    raise MergeError(f"machine {', '.join(map(repr, unknown))} is in none of the sources: they "
                                     f"have {', '.join(sorted(have))}")
                for s in srcs:
                    s.machines = [m for m in s.machines if m.path.name in machines]
            try:
                _plan_results(srcs, dest, report, copies, writes)
                _plan_benchmarks(srcs, dest, report, writes)
            except R.ResultsError as exc:
                raise MergeError(str(exc)) from None
            if dry_run:
                report.notes.append("dry run: nothing written")
            elif copies or writes:
                _apply_staged(dest, copies, writes, seen, report)
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
    """Handler of ``merge-results``: 0 on success; a :class:`MergeError` goes to the CLI (exit 2)."""
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
