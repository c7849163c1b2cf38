"""Merge asv results directories from several runners into one (``mla-fp8-bench merge-results``).

Why this exists: asv has no merge command (asv#1362). The documented way to publish results from
several machines is to put their ``results/<machine>/`` directories side by side under one
``results/`` and run ``asv publish`` there (docs/asv-notes.md §9). Two things make a plain ``cp -r``
unsafe:

* ``results/benchmarks.json`` is **rewritten by every** ``asv run`` with the benchmarks *that run*
  discovered. A CPU runner and a GPU runner at different suite revisions each have their own, and
  copying one over the other drops definitions: results whose benchmark is missing from
  ``benchmarks.json`` are silently not rendered (rapidsai/asvdb#3). So the merged file is the
  **union** of all definitions, and where two sources define the same benchmark the **newest**
  definition wins (a source's age is the newest ``started_at`` of its results, else the file's
  mtime; the destination's existing file takes part like any source).
* ``results/<machine>/machine.json`` names the machine every result file in the directory belongs to
  (its keys become graph facets). Two *different* machines that happen to share a name would be
  merged into one history, so a different ``machine.json`` for an existing machine name is refused
  and nothing is written.

Result files (``<sha8>-<env>.json``) that already exist in the destination with different content
(the same commit and environment measured twice) are merged per benchmark, newest ``started_at``
wins - what ``asv run`` itself does when it re-runs a benchmark into an existing file. Files whose
header (commit, environment, params, api version) differs are refused.

Everything is checked before anything is written; every write is a temp file + rename.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.jsonio import load_json, write_file_atomic, write_json_atomic

#: asv's results/benchmarks.json api version that this code understands (asv 0.6.x).
ASV_RESULTS_API_VERSION = 2
ASV_BENCHMARKS_API_VERSION = 2
ASV_MACHINE_API_VERSION = 1
_SKIP_FILES = ("machine.json", "benchmarks.json")


class MergeError(ValueError):
    """A merge is refused (conflict, corrupt or unknown input); the message names file and reason."""


@dataclass
class MergeReport:
    """What a merge did (or, with ``dry_run``, would do)."""

    machines: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    benchmarks_added: list[str] = field(default_factory=list)
    benchmarks_replaced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- reading
def load_json_file(path: Path, what: str) -> Any:
    """Parse JSON, turning every failure into a :class:`MergeError` naming ``path`` and ``what``."""
    return load_json(path, what, MergeError, "it may be truncated")


def _check_api(data: Any, path: Path, what: str, version: int) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise MergeError(f"{what} {path} is not a JSON object")
    if data.get("version") != version:
        raise MergeError(f"{what} {path} has api version {data.get('version')!r}; this tool understands asv's "
                         f"version {version} (asv 0.6.x)")
    return data


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
    benchmarks_path: Path | None
    age: float


def _machine_dir(path: Path) -> MachineDir:
    mj = _check_api(load_json_file(path / "machine.json", "machine file"), path / "machine.json", "machine file",
                    ASV_MACHINE_API_VERSION)
    name = mj.get("machine")
    if not isinstance(name, str) or not name:
        raise MergeError(f"machine file {path / 'machine.json'} has no 'machine' name")
    if name != path.name:
        raise MergeError(f"machine file {path / 'machine.json'} names machine {name!r} but lives in directory "
                         f"{path.name!r}: asv files results under results/<machine>/, rename one of them")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".json" and p.name not in _SKIP_FILES)
    return MachineDir(name, path, mj, files)


def _result_started_at(data: dict[str, Any]) -> float:
    cols = data.get("result_columns") or []
    if "started_at" not in cols:
        return 0.0
    i = cols.index("started_at")
    best = 0.0
    for row in (data.get("results") or {}).values():
        if isinstance(row, list) and len(row) > i and isinstance(row[i], (int, float)):
            best = max(best, float(row[i]))
    return best


def _load_result(path: Path) -> dict[str, Any]:
    data = _check_api(load_json_file(path, "asv result file"), path, "asv result file", ASV_RESULTS_API_VERSION)
    for key in ("commit_hash", "env_name", "params", "result_columns", "results"):
        if key not in data:
            raise MergeError(f"asv result file {path} lacks the key {key!r}: not an asv 0.6 result file")
    return data


def scan_source(src: str | os.PathLike, machines: list[str] | None = None) -> Source:
    """Read an asv results directory (``<src>/<machine>/machine.json`` + result files, optional
    ``<src>/benchmarks.json``) or a single machine directory (``<src>/machine.json``).

    Args:
        src: the directory.
        machines: only these machine names (each must exist in ``src``).

    Raises:
        MergeError: missing directory, no machines, corrupt files, unknown machine names.
    """
    path = Path(src)
    if not path.is_dir():
        raise MergeError(f"results directory {path} does not exist or is not a directory")
    bpath: Path | None = None
    if (path / "machine.json").is_file():
        mdirs = [_machine_dir(path)]
        cand = path.parent / "benchmarks.json"
        bpath = cand if cand.is_file() else None
    else:
        mdirs = [_machine_dir(p) for p in sorted(path.iterdir()) if p.is_dir() and (p / "machine.json").is_file()]
        cand = path / "benchmarks.json"
        bpath = cand if cand.is_file() else None
    if not mdirs:
        raise MergeError(f"{path} holds no asv results: expected <machine>/machine.json directories "
                         "(an asv results_dir) or a machine.json (one machine's directory)")
    if machines:
        have = {m.name for m in mdirs}
        unknown = [m for m in machines if m not in have]
        if unknown:
            raise MergeError(f"machine {', '.join(map(repr, unknown))} is not in {path}: it has "
                             f"{', '.join(sorted(have))}")
        mdirs = [m for m in mdirs if m.name in machines]
    bench = None
    if bpath is not None:
        bench = _check_api(load_json_file(bpath, "benchmarks file"), bpath, "benchmarks file",
                           ASV_BENCHMARKS_API_VERSION)
    age = 0.0
    for m in mdirs:
        for f in m.result_files:
            age = max(age, _result_started_at(_load_result(f)))
    if age == 0.0 and bpath is not None:
        age = bpath.stat().st_mtime * 1000.0  # asv's started_at is in ms since the epoch
    return Source(path, mdirs, bench, bpath, age)


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


def merge_result_data(old: dict[str, Any], new: dict[str, Any], name: str) -> dict[str, Any]:
    """Merge two asv result files of one (machine, commit, env): per benchmark, the row with the newer
    ``started_at`` wins; benchmarks present in one only are kept.

    Raises:
        MergeError: the headers (commit, env, params, columns) differ.
    """
    for key in ("commit_hash", "env_name", "params", "result_columns", "python"):
        if not _same_json(old.get(key), new.get(key)):
            raise MergeError(f"result file {name}: {key} differs between the destination ({old.get(key)!r:.80}) and "
                             f"the source ({new.get(key)!r:.80}); refusing to mix them")
    cols = old["result_columns"]
    i = cols.index("started_at") if "started_at" in cols else None

    def started(row: Any) -> float:
        if i is None or not isinstance(row, list) or len(row) <= i or not isinstance(row[i], (int, float)):
            return 0.0
        return float(row[i])

    out = dict(old)
    results = dict(old["results"])
    for bench, row in new["results"].items():
        if bench not in results or started(row) >= started(results[bench]):
            results[bench] = row
    out["results"] = results
    new_is_newer = (max(map(started, new["results"].values()), default=0.0)
                    >= max(map(started, old["results"].values()), default=0.0))
    durations = dict(old.get("durations") or {})
    for k, v in (new.get("durations") or {}).items():
        if new_is_newer or k not in durations:
            durations[k] = v
    out["durations"] = durations
    return out


def _write_json_atomic(path: Path, data: Any) -> None:
    write_json_atomic(data, path, indent=4, sort_keys=True)


def merge_results(sources: list[str | os.PathLike], into: str | os.PathLike, *, machines: list[str] | None = None,
                  dry_run: bool = False) -> MergeReport:
    """Merge asv results directories ``sources`` into ``into`` (created if missing).

    Args:
        sources: asv results directories (or single machine directories).
        into: the destination results directory.
        machines: copy only these machine names (each must exist in some source).
        dry_run: check and report, write nothing.

    Returns:
        a :class:`MergeReport`.

    Raises:
        MergeError: conflicting ``machine.json`` for one machine name (between sources or against
            the destination), incompatible result files, corrupt JSON, unknown machine names. Raised
            before anything is written.
    """
    if not sources:
        raise MergeError("no source results directory given")
    dest = Path(into)
    if dest.exists() and not dest.is_dir():
        raise MergeError(f"destination {dest} exists and is not a directory")
    srcs: list[Source] = []
    for s in sources:
        sp = Path(s)
        if dest.exists() and sp.exists() and sp.resolve() == dest.resolve():
            raise MergeError(f"source {sp} is the destination itself")
        srcs.append(scan_source(sp))
    if machines:
        have = {m.name for s in srcs for m in s.machines}
        unknown = [m for m in machines if m not in have]
        if unknown:
            raise MergeError(f"machine {', '.join(map(repr, unknown))} is in none of the sources: they have "
                             f"{', '.join(sorted(have))}")
        for s in srcs:
            s.machines = [m for m in s.machines if m.name in machines]

    report = MergeReport()
    # -- plan: machine.json conflicts (sources against each other and against the destination)
    machine_json: dict[str, tuple[dict[str, Any], str]] = {}
    if dest.is_dir():
        for p in sorted(dest.iterdir()):
            if p.is_dir() and (p / "machine.json").is_file():
                mj = load_json_file(p / "machine.json", "machine file")
                machine_json[p.name] = (mj, str(p / "machine.json"))
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

    # -- plan: result files
    writes: dict[Path, Any] = {}
    copies: dict[Path, Path] = {}
    for s in srcs:
        for m in s.machines:
            ddir = dest / m.name
            target_mj = ddir / "machine.json"
            if not target_mj.exists() and target_mj not in copies:
                copies[target_mj] = m.path / "machine.json"
            for f in m.result_files:
                new = _load_result(f)
                target = ddir / f.name
                rel = f"{m.name}/{f.name}"
                if target in writes:
                    old = writes[target]
                elif target in copies:
                    old = _load_result(copies[target])
                elif target.exists():
                    old = _load_result(target)
                else:
                    copies[target] = f
                    report.copied.append(rel)
                    continue
                if _same_json(old, new):
                    if rel not in report.copied and rel not in report.merged:
                        report.unchanged.append(rel)
                    continue
                writes[target] = merge_result_data(old, new, rel)
                copies.pop(target, None)
                if rel in report.copied:
                    report.copied.remove(rel)
                if rel not in report.merged:
                    report.merged.append(rel)

    # -- plan: benchmarks.json union, newest definition wins
    dest_bench = dest / "benchmarks.json"
    existing: dict[str, Any] | None = None
    bench_sources: list[tuple[float, int, dict[str, Any]]] = []
    if dest_bench.is_file():
        existing = _check_api(load_json_file(dest_bench, "benchmarks file"), dest_bench, "benchmarks file",
                              ASV_BENCHMARKS_API_VERSION)
        has_machines = any(p.is_dir() and (p / "machine.json").is_file() for p in dest.iterdir())
        dage = scan_source(dest).age if has_machines else 0.0
        bench_sources.append((dage or dest_bench.stat().st_mtime * 1000.0, -1, existing))
    for idx, s in enumerate(srcs):
        if s.benchmarks is not None:
            bench_sources.append((s.age, idx, s.benchmarks))
        else:
            report.notes.append(f"{s.path} has no benchmarks.json: its results render only if another source "
                                "defines their benchmarks")
    if bench_sources:
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
            writes[dest_bench] = merged_bench

    if dry_run:
        report.notes.append("dry run: nothing written")
        return report
    # -- apply: every write is a temp file + rename; result files are copied byte for byte
    for target, src_file in copies.items():
        _copy_atomic(src_file, target)
    for target, data in writes.items():
        _write_json_atomic(target, data)
    return report


def _copy_atomic(src: Path, target: Path) -> None:
    data = src.read_bytes()
    write_file_atomic(target, lambda f: f.write(data), binary=True)


# ---------------------------------------------------------------------------------------- CLI
def add_merge_parser(subparsers) -> None:
    """Register ``merge-results`` (called from :func:`mla_fp8_bench.analysis.plot.add_parser`)."""
    p = subparsers.add_parser(
        "merge-results",
        help="merge asv results directories from several runners into one (union of benchmarks.json, "
             "machines side by side; asv has no merge command, asv#1362)")
    p.add_argument("sources", nargs="+", metavar="SRC_RESULTS_DIR",
                   help="asv results directories (results/ with <machine>/ inside) or single machine directories")
    p.add_argument("--into", required=True, help="destination results directory (e.g. results/)")
    p.add_argument("--machine", action="append", default=None,
                   help="copy only this machine (repeatable); an unknown name is an error")
    p.add_argument("--dry-run", action="store_true", help="check and report, write nothing")
    p.set_defaults(handler=cmd_merge_results)


def cmd_merge_results(args, console) -> int:
    """Handler of ``merge-results``: 0 on success, 2 on a refused merge (nothing written)."""
    try:
        rep = merge_results(args.sources, args.into, machines=args.machine, dry_run=args.dry_run)
    except MergeError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    console.print(f"machines: {', '.join(rep.machines)}", highlight=False)
    console.print(f"result files: {len(rep.copied)} copied, {len(rep.merged)} merged per benchmark "
                  f"(newest started_at wins), {len(rep.unchanged)} unchanged", highlight=False)
    console.print(f"benchmarks.json: {len(rep.benchmarks_added)} definitions added, "
                  f"{len(rep.benchmarks_replaced)} replaced by a newer one", highlight=False)
    for n in rep.notes:
        console.print(f"note: {n}", highlight=False)
    return 0
