"""``mla-fp8-bench merge-results SRC... --into DEST``: the union of asv results directories (asv has no
merge command). A destination file is never replaced by different content (refused before anything is
written); a definition that differs keeps the first found and says so. Writes are atomic, under a lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mla_fp8_bench.harness import results as R
from mla_fp8_bench.jsonio import OutputError, locked, write_file_atomic, write_json_atomic


class MergeError(ValueError):
    """A merge is refused; the message names the file and the reason (the CLI exits 2)."""


def _machines(src: Path) -> list[Path]:  # the machine folders of src, every file in them read once
    if not src.is_dir() or R.is_machine_dir(src):
        raise MergeError(f"source {src} is not an asv results directory (one holding <machine>/machine.json"
                         + (f"; it is one machine's folder: give {src.parent}" if R.is_machine_dir(src) else "") + ")")
    out = []
    for d in sorted(p for p in src.iterdir() if p.is_dir()):
        if not R.is_machine_dir(d) and any(d.glob("*.json")):
            raise MergeError(f"{d} holds JSON files but no machine.json: add it (mla-fp8-bench asv-machine) or "
                             "move the folder out of the source; nothing was written")
        if R.is_machine_dir(d):
            if R.load_machine(d)["machine"] != d.name:
                raise MergeError(f"{d / 'machine.json'} names another machine than its folder {d.name!r}")
            for f in R.list_result_files(d):
                R.load_asv_result(f.path)  # a corrupt file is refused before anything is written
            out.append(d)
    return out


def _plan(sources: list[Path], dest: Path, report: dict[str, list]) -> dict[Path, bytes]:
    """destination file -> content to write; MergeError for a destination file that differs."""
    writes: dict[Path, bytes] = {}
    for mdir in (m for src in sources for m in _machines(src)):
        report["machines"] += [mdir.name] * (mdir.name not in report["machines"])
        for f in [mdir / "machine.json", *(r.path for r in R.list_result_files(mdir))]:
            target, data, rel = dest / mdir.name / f.name, f.read_bytes(), f"{mdir.name}/{f.name}"
            have = writes.get(target, target.read_bytes() if target.is_file() else None)
            if have is None and (target.exists() or target.is_symlink()):
                raise MergeError(f"{target} exists and is not a regular file; nothing was written")
            if have is not None and have != data:
                raise MergeError(f"{f} differs from {'the same file of another source' if target in writes else target}"
                                 ": refusing to overwrite a stored result (move one of them); nothing was written")
            if have is None:
                writes[target] = data
                report["copied"].append(rel)
            elif rel not in report["copied"] + report["unchanged"]:
                report["unchanged"].append(rel)
    return writes


def _benchmarks(sources: list[Path], dest: Path, report: dict[str, list]) -> dict | None:
    """The union of the definitions (the destination's, then each source's in order); None if unchanged."""
    path = dest / "benchmarks.json"
    merged = R.load_benchmarks(path) if path.exists() else {"version": R.ASV_BENCHMARKS_API_VERSION}
    before = dict(merged)
    for src in (s / "benchmarks.json" for s in sources):
        for name, spec in (R.load_benchmarks(src) if src.exists() else {}).items():
            if name not in merged:
                merged[name] = spec
                report["added"].append(name)
            elif name != "version" and json.dumps(merged[name], sort_keys=True) != json.dumps(spec, sort_keys=True):
                report["kept"].append(f"benchmarks.json: {name} kept as first found; {src} defines it otherwise")
    return merged if merged != before else None


def merge_results(sources: list[str], into: str, *, dry_run: bool = False) -> dict[str, list]:
    """Merge ``sources`` into ``into``; returns the lists ``machines``, ``copied``, ``unchanged``, ``added``,
    ``kept``."""
    try:
        dest, srcs = Path(into), [Path(s) for s in sources]
        real = Path(os.path.realpath(into))  # realpath: no loop error
        if (dest.exists() or dest.is_symlink()) and (not dest.is_dir() or R.is_machine_dir(dest)):
            raise MergeError(f"destination {dest} is not a results directory (a file, a broken link, a machine's "
                             "folder)")
        if any((r := Path(os.path.realpath(s))) == real or r in real.parents for s in srcs):
            raise MergeError(f"destination {dest} is a source or lies inside one: give a destination outside them")
        report: dict[str, list] = {k: [] for k in ("machines", "copied", "unchanged", "added", "kept")}
        with locked(dest, "destination"):
            writes, bench = _plan(srcs, dest, report), _benchmarks(srcs, dest, report)
            if not dry_run:
                for target, data in writes.items():
                    write_file_atomic(target, lambda f, d=data: f.write(d), binary=True)
                if bench is not None:
                    write_json_atomic(bench, dest / "benchmarks.json", indent=4, sort_keys=True)
    except (R.ResultsError, OutputError, OSError) as exc:  # OSError: e.g. a name too long; nothing is replaced
        raise MergeError(" ".join(str(exc).split())[:300]) from None
    return report


def add_merge_parser(subparsers) -> None:
    p = subparsers.add_parser("merge-results", help="the union of asv results directories from several runners")
    p.add_argument("sources", nargs="+", metavar="SRC_RESULTS_DIR", help="asv results directories")
    p.add_argument("--into", required=True, help="destination results directory (e.g. results)")
    p.add_argument("--dry-run", action="store_true", help="check and report, write nothing")
    p.set_defaults(handler=cmd_merge_results)


def cmd_merge_results(args, console) -> int:
    rep = merge_results(args.sources, args.into, dry_run=args.dry_run)
    say = [f"machines: {', '.join(rep['machines']) or 'none'}", f"result files: {len(rep['copied'])} copied, "
           f"{len(rep['unchanged'])} already there" + (" (dry run: nothing written)" if args.dry_run else ""),
           f"benchmarks.json: {len(rep['added'])} definitions added", *rep["kept"]]
    console.print("\n".join(say), highlight=False, markup=False, soft_wrap=True)
    return 0
