"""The one reader of stored results: asv 0.6 results directories (``benchmarks.json``, ``<machine>/machine.json``,
``<machine>/<sha8>-<env>.json``) and ``mla-fp8-bench run --json`` files. Only regular files are read; a read
error is a one-line :class:`ResultsError` naming the file. In an asv result row, ``result``, ``stats_*`` and
``samples`` are lists over ``itertools.product(*params)``: a failed combination ``null``, a skipped one ``NaN``.
"""

from __future__ import annotations

import ast
import itertools
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.jsonio import finite_number, json_number, load_json

ASV_RESULTS_API_VERSION, ASV_BENCHMARKS_API_VERSION, ASV_MACHINE_API_VERSION = 2, 2, 1
_NAME_RE = re.compile(r"([0-9a-fA-F]{8})-(.+)\.json")
_PREFIX_RE = re.compile(r"[0-9a-fA-F]{4,}")


class ResultsError(ValueError):
    """A results file or directory cannot be read; the message names the path and the problem."""


def _load(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ResultsError(f"{what} {path} {'is not a regular file' if path.exists() else 'does not exist'}")
    return load_json(path, what, ResultsError, "it may be truncated or corrupt")


def load_asv_conf(path: str | os.PathLike) -> dict[str, Any]:
    """An asv config (JSON with comments), read with json5 as asv does."""
    import json5

    return json5.loads(Path(path).read_text())


@dataclass
class RunDoc:  # a parsed ``mla-fp8-bench run --json`` file
    path: Path
    env: dict[str, Any]  # the run's environment (device, versions); {} when absent
    records: list[dict[str, Any]]  # one per (backend, case), each with ``backend`` and ``case`` strings
    ceilings: dict[str, Any] | None  # measured GEMM ceilings / datasheet peaks


def run_doc_from_data(data: Any, path: str | os.PathLike) -> RunDoc:  # an already parsed run JSON
    if not isinstance(data, dict):
        raise ResultsError(f"run JSON {path} is a JSON {type(data).__name__}, not an object with a 'records' list")
    recs, env, ceilings = data.get("records"), data.get("env"), data.get("ceilings")
    if not isinstance(recs, list):
        raise ResultsError(f"run JSON {path} has no 'records' list: not written by `mla-fp8-bench run --json`")
    for i, r in enumerate(recs):
        if not isinstance(r, dict) or not isinstance(r.get("backend"), str) or not isinstance(r.get("case"), str):
            raise ResultsError(f"run JSON {path}: record {i} is malformed ({str(r)[:60]!s}; needs an object with "
                               "'backend' and 'case' strings)")
    if env is not None and not isinstance(env, dict):
        raise ResultsError(f"run JSON {path}: 'env' is a {type(env).__name__}, not an object")
    return RunDoc(Path(path), env or {}, recs, ceilings if isinstance(ceilings, dict) else None)


def load_run_json(path: str | os.PathLike) -> RunDoc:
    return run_doc_from_data(_load(Path(path), "run JSON"), path)


def _load_versioned(path: str | os.PathLike, name: str, what: str, version: int) -> tuple[Path, dict[str, Any]]:
    f = Path(path) / name if Path(path).is_dir() else Path(path)
    data = _load(f, what)
    if not isinstance(data, dict) or data.get("version") != version:
        got = f"api version {data.get('version')!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise ResultsError(f"{what} {f} holds {got}; expected an object of api version {version} (asv 0.6.x)")
    return f, data


def load_machine(path: str | os.PathLike) -> dict[str, Any]:  # machine.json (or its directory)
    f, mj = _load_versioned(path, "machine.json", "asv machine file", ASV_MACHINE_API_VERSION)
    if not isinstance(mj.get("machine"), str) or not mj["machine"]:
        raise ResultsError(f"asv machine file {f} has no 'machine' name")
    return mj


def load_benchmarks(path: str | os.PathLike) -> dict[str, Any]:  # benchmarks.json (or its directory)
    return _load_versioned(path, "benchmarks.json", "asv benchmarks file", ASV_BENCHMARKS_API_VERSION)[1]


def is_cpu_machine(facts: dict[str, Any]) -> bool:
    """Whether asv machine facts (``machine.json``, a result's ``params``) say ``"gpu": "none"``."""
    gpu = facts.get("gpu")
    return isinstance(gpu, str) and gpu.strip().lower() in ("none", "", "cpu")


def is_machine_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "machine.json").is_file()


def machine_dirs(results_dir: str | os.PathLike) -> list[Path]:  # sorted; [results_dir] when it is one
    p = Path(results_dir)
    if not p.is_dir():
        raise ResultsError(f"results directory {p} does not exist or is not a directory")
    return [p] if is_machine_dir(p) else sorted(q for q in p.iterdir() if q.is_dir() and is_machine_dir(q))


@dataclass(frozen=True)
class ResultFileName:  # asv names a result file <commit prefix>-<env name>.json
    path: Path
    commit: str  # the 8-hex-digit prefix asv puts in the name ("" when the name has none)
    env: str


def list_result_files(machine_dir: str | os.PathLike) -> list[ResultFileName]:  # sorted, not read
    p = Path(machine_dir)
    if not p.is_dir():
        raise ResultsError(f"asv machine directory {p} does not exist or is not a directory")
    names = [(f, _NAME_RE.fullmatch(f.name)) for f in sorted(p.glob("*.json"))
             if f.name not in ("machine.json", "benchmarks.json") and f.is_file()]
    return [ResultFileName(f, m.group(1).lower(), m.group(2)) if m else ResultFileName(f, "", f.stem) for f, m in names]


def find_result(results_dir: str | os.PathLike, machine: str, commit: str, env: str | None = None) -> Path:
    """The result file of commit ``commit`` (a prefix of >= 4 hex digits) on ``machine``, of the one
    environment whose name contains ``env``; ResultsError names what is missing or ambiguous."""
    if not _PREFIX_RE.fullmatch(commit):
        raise ResultsError(f"{commit!r} is not a commit hash prefix (>= 4 hex digits)")
    mdir, prefix = Path(results_dir) / machine, commit.lower()
    if not is_machine_dir(mdir):
        have = ", ".join(m.name for m in machine_dirs(results_dir)) if Path(results_dir).is_dir() else ""
        raise ResultsError(f"machine {machine!r} has no results in {results_dir}: machines present {have or 'none'}")
    files, hits = list_result_files(mdir), {}
    for rf in files:
        if rf.commit and (rf.commit.startswith(prefix[:8]) or prefix.startswith(rf.commit)):
            res = load_asv_result(rf.path)
            if res.commit_hash.lower().startswith(prefix):
                hits.setdefault(res.commit_hash, []).append((rf.path, res.env_name))
    if len(hits) != 1:
        have = ", ".join(sorted(h[:12] for h in hits) or sorted({r.commit for r in files if r.commit})) or "none"
        raise ResultsError(f"commit prefix {commit} is ambiguous in {mdir}: {have}" if hits else
                           f"commit {commit} has no asv results in {mdir}: commits present {have}")
    found = [f for f in next(iter(hits.values())) if not env or env in f[1]]
    if len(found) != 1:
        which = f"whose name contains {env!r}" if env else f"({', '.join(e for _, e in found)})"
        raise ResultsError(f"commit {commit} has results of {len(found)} environments {which} in {mdir}: choose one "
                           "(--env)")
    return found[0][0]


@dataclass(frozen=True)
class Measurement:  # one stored value: a benchmark at one parameter combination
    benchmark: str  # full asv name (bench_mla_prefill.MLAPrefill.track_latency)
    params: tuple[str, ...]  # the combination's values as strings (("aiter", "s4096")); () if unparameterised
    status: str  # ok, failed (asv stored null) or skipped (NaN)
    value: float | None = None  # the stored number (asv's median for sample-based benchmarks); None unless ok
    q25: float | None = None
    q75: float | None = None
    samples: list[float] | None = None
    version: str | None = None  # the benchmark's version string


def _literal(text: Any) -> str:  # a stored parameter value as the benchmark saw it: "'aiter'" -> "aiter"
    try:
        return str(ast.literal_eval(text)) if isinstance(text, str) else str(text)
    except (ValueError, SyntaxError):
        return text


@dataclass
class AsvResult:  # a parsed asv result file (api version 2; the format: module docstring)
    path: Path
    commit_hash: str
    env_name: str
    date: float | None
    params: dict[str, Any]
    result_columns: list[str]
    results: dict[str, list[Any]]
    raw: dict[str, Any] = field(repr=False)

    @property
    def machine(self) -> str | None:
        return m if isinstance(m := self.params.get("machine"), str) else None

    def row(self, benchmark: str) -> dict[str, Any]:  # column name -> value (absent trailing ones: None)
        if (row := self.results.get(benchmark)) is None:
            raise ResultsError(f"asv result file {self.path} has no result for benchmark {benchmark!r}")
        return {c: (row[i] if i < len(row) else None) for i, c in enumerate(self.result_columns)}

    def started_at(self) -> float:  # the newest started_at (ms) of its benchmarks; 0.0 when absent
        return max([v for n in self.results if (v := finite_number(self.row(n).get("started_at"))) is not None]
                   or [0.0])

    def measurements(self, benchmark: str) -> dict[tuple[str, ...], Measurement]:  # params -> Measurement
        d = self.row(benchmark)
        params = d.get("params") or []
        if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
            raise ResultsError(f"asv result file {self.path}: benchmark {benchmark!r} has malformed params")
        combos = [tuple(_literal(x) for x in c) for c in itertools.product(*params)] if params else [()]
        vals = d.get("result") if isinstance(d.get("result"), list) else [d.get("result")] * len(combos)
        cols = {k: d.get(k) if isinstance(d.get(k), list) else [] for k in ("stats_q_25", "stats_q_75", "samples")}
        out: dict[tuple[str, ...], Measurement] = {}
        for i, (combo, v) in enumerate(zip(combos, vals)):
            q25, q75, smp = (c[i] if i < len(c) else None for c in cols.values())
            status = "failed" if v is None else "skipped" if (isinstance(v, float) and math.isnan(v)) else "ok"
            if status == "ok" and (json_number(v) is None or any(json_number(x) is None for x in smp or ())):
                raise ResultsError(f"asv result file {self.path}: {benchmark}{combo} holds a value that is not a "
                                   f"number ({repr(v)[:40]}, samples {repr(smp)[:40]})")
            out[combo] = Measurement(benchmark, combo, status, float(v) if status == "ok" else None, finite_number(q25),
                                     finite_number(q75), [float(x) for x in smp] if isinstance(smp, list) else None,
                                     d.get("version"))
        return out


def _asv_result(data: Any, path: Path) -> AsvResult:
    cols, res = (data.get(k) if isinstance(data, dict) else None for k in ("result_columns", "results"))
    if not isinstance(data, dict) or data.get("version") != ASV_RESULTS_API_VERSION:
        raise ResultsError(f"asv result file {path} is not an asv 0.6 result file (api version "
                           f"{data.get('version') if isinstance(data, dict) else None!r}; expected 2)")
    if any(k not in data for k in ("commit_hash", "env_name", "params")) or not isinstance(cols, list) \
            or not {"result", "params"} <= set(cols) or not isinstance(res, dict) \
            or not all(isinstance(r, list) for r in res.values()):
        raise ResultsError(f"asv result file {path} lacks a key or a column, or holds malformed rows: not an asv 0.6 "
                           "result file")
    return AsvResult(path, str(data["commit_hash"]), str(data["env_name"]), finite_number(data.get("date")),
                     data["params"] if isinstance(data["params"], dict) else {}, cols, res, data)


def load_asv_result(path: str | os.PathLike) -> AsvResult:
    return _asv_result(_load(Path(path), "asv result file"), Path(path))


def load_any(path: str | os.PathLike) -> RunDoc | AsvResult:
    """A run JSON or an asv result file, told apart by content (``records`` vs ``result_columns``)."""
    data = _load(Path(path), "results file")
    if isinstance(data, dict) and "result_columns" in data:
        return _asv_result(data, Path(path))
    if isinstance(data, dict) and "records" in data:
        return run_doc_from_data(data, path)
    raise ResultsError(f"{path} is neither a run JSON ('records') nor an asv result file ('result_columns')")


def newest_result(machine_dir: str | os.PathLike, commit: str | None = None) -> AsvResult:
    """The newest result file in ``machine_dir`` (by ``date``, then ``started_at``), maybe of one commit."""
    loaded = [r for f in list_result_files(machine_dir) if (r := load_asv_result(f.path)).commit_hash.lower()
              .startswith((commit or "").lower())]
    if not loaded:
        raise ResultsError(f"no result file{f' of commit {commit}' if commit else ''} in {machine_dir}")
    return max(loaded, key=lambda r: (r.date or 0.0, r.started_at()))
