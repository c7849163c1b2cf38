"""The one reader of stored results (gate, plot, bisect, merge-results, publish): asv results directories
and ``mla-fp8-bench run --json`` files; a read error is a one-line :class:`ResultsError` naming the file.

asv 0.6.x layout (``results_dir`` of ``asv.conf.json``)::

    results/benchmarks.json                 {"version": 2, "<benchmark name>": {definition}, ...}
    results/<machine>/machine.json          {"version": 1, "machine": "<machine>", "arch": ..., ...}
    results/<machine>/<sha8>-<env>.json     one (commit, environment) result file, api version 2

A result file holds ``commit_hash``, ``env_name``, ``date`` and ``started_at`` (ms since the epoch),
``params`` (machine facts), ``result_columns`` (``result, params, version, started_at, duration,
stats_ci_99_a, stats_ci_99_b, stats_q_25, stats_q_75, stats_number, stats_repeat, samples, profile``) and
``results``: per benchmark one row in column order (trailing ones may be absent); ``result``, ``stats_*``
and ``samples`` are lists over ``itertools.product(*params)`` of the parameters' values as Python literals
(``"'aiter'"``), a failed combination ``null``, a skipped one ``NaN``. A run JSON is ``{"env": {...},
"records": [{"backend": str, "case": str, "status": str, ...}, ...]}``, maybe with ``ceilings``.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.jsonio import finite_number, json_number, load_json

#: asv 0.6.x api versions of the three files.
ASV_RESULTS_API_VERSION = 2
ASV_BENCHMARKS_API_VERSION = 2
ASV_MACHINE_API_VERSION = 1
_RESULT_KEYS = ("commit_hash", "env_name", "params", "result_columns", "results")
_NAME_RE = re.compile(r"([0-9a-fA-F]{8})-(.+)\.json")


class ResultsError(ValueError):
    """A results file or directory cannot be read; the message names the path and the problem."""


def _load(path: Path, what: str) -> Any:
    return load_json(path, what, ResultsError, "it may be truncated or corrupt")


def load_asv_conf(path: str | os.PathLike) -> dict[str, Any]:
    """An asv config (JSON with ``//`` comments), read with json5 as asv >= 0.6.4 does, or without json5
    with whole-line comments dropped. ValueError: not JSON/JSONC; OSError: unreadable."""
    text = Path(path).read_text()
    try:
        import json5
    except ImportError:
        return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    return json5.loads(text)


@dataclass
class RunDoc:
    """A parsed ``mla-fp8-bench run --json`` file."""

    path: Path
    env: dict[str, Any]  # the run's environment (device, versions); {} when absent
    records: list[dict[str, Any]]  # one per (backend, case), each with ``backend`` and ``case`` strings
    ceilings: dict[str, Any] | None  # measured GEMM ceilings / datasheet peaks


def run_doc_from_data(data: Any, path: str | os.PathLike) -> RunDoc:
    """:func:`load_run_json` of an already parsed document."""
    path = Path(path)
    if not isinstance(data, dict):
        raise ResultsError(f"run JSON {path} is a JSON {type(data).__name__}, not an object with a 'records' list")
    recs = data.get("records")
    if not isinstance(recs, list):
        raise ResultsError(f"run JSON {path} has no 'records' list: not written by `mla-fp8-bench run --json`")
    for i, r in enumerate(recs):
        if not isinstance(r, dict) or not isinstance(r.get("backend"), str) or not isinstance(r.get("case"), str):
            raise ResultsError(f"run JSON {path}: record {i} is malformed ({str(r)[:60]!s}; needs an object with "
                               "'backend' and 'case' strings)")
    env = data.get("env")
    if env is not None and not isinstance(env, dict):
        raise ResultsError(f"run JSON {path}: 'env' is a {type(env).__name__}, not an object")
    ceilings = data.get("ceilings")
    return RunDoc(path, env or {}, recs, ceilings if isinstance(ceilings, dict) else None)


def load_run_json(path: str | os.PathLike) -> RunDoc:
    """Read a run JSON; ResultsError: unreadable, not JSON (e.g. truncated), not an object, no ``records``
    list, or a record that is not an object with ``backend``/``case`` strings."""
    return run_doc_from_data(_load(Path(path), "run JSON"), path)


def _check_version(data: Any, path: Path, what: str, version: int) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ResultsError(f"{what} {path} is a JSON {type(data).__name__}, not an object")
    if data.get("version") != version:
        raise ResultsError(f"{what} {path} has api version {data.get('version')!r}; expected {version} (asv 0.6.x)")
    return data


def _load_in(path: str | os.PathLike, name: str, what: str, version: int) -> tuple[Path, dict[str, Any]]:
    """The file ``name`` in directory ``path`` (or the file ``path``), read and version-checked."""
    f = Path(path) / name if Path(path).is_dir() else Path(path)
    return f, _check_version(_load(f, what), f, what, version)


def load_machine(path: str | os.PathLike) -> dict[str, Any]:
    """``machine.json`` (``path``: its directory or the file); ResultsError: missing/corrupt file, wrong
    api version, no ``machine`` name."""
    f, mj = _load_in(path, "machine.json", "asv machine file", ASV_MACHINE_API_VERSION)
    if not isinstance(mj.get("machine"), str) or not mj["machine"]:
        raise ResultsError(f"asv machine file {f} has no 'machine' name")
    return mj


def load_benchmarks(path: str | os.PathLike) -> dict[str, Any]:
    """``benchmarks.json`` (``path``: the results directory or the file): name -> definition, plus
    ``version``; ResultsError: missing/corrupt file or wrong api version."""
    return _load_in(path, "benchmarks.json", "asv benchmarks file", ASV_BENCHMARKS_API_VERSION)[1]


def is_cpu_machine(facts: dict[str, Any]) -> bool:
    """True when asv machine facts (``machine.json`` or a result file's ``params``) name no GPU: their
    ``"gpu"`` is ``"none"`` (a machine without the key counts as a GPU machine; docs/extending.md)."""
    gpu = facts.get("gpu")
    return isinstance(gpu, str) and gpu.strip().lower() in ("none", "", "cpu")


def is_machine_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "machine.json").is_file()


def machine_dirs(results_dir: str | os.PathLike) -> list[Path]:
    """Machine directories of ``results_dir`` (``[results_dir]`` itself when it is one), sorted by name;
    ResultsError when ``results_dir`` is not a directory."""
    p = Path(results_dir)
    if not p.is_dir():
        raise ResultsError(f"results directory {p} does not exist or is not a directory")
    return [p] if is_machine_dir(p) else sorted(q for q in p.iterdir() if q.is_dir() and is_machine_dir(q))


@dataclass(frozen=True)
class ResultFileName:
    """A result file as named by asv: ``<commit prefix>-<env name>.json``."""

    path: Path
    commit: str  # the 8-hex-digit prefix asv puts in the name
    env: str


def list_result_files(machine_dir: str | os.PathLike) -> list[ResultFileName]:
    """The result files of one machine directory, sorted by path (not read); ResultsError when
    ``machine_dir`` is not a directory."""
    p = Path(machine_dir)
    if not p.is_dir():
        raise ResultsError(f"asv machine directory {p} does not exist or is not a directory")
    out = []
    for f in sorted(p.glob("*.json")):
        if f.name not in ("machine.json", "benchmarks.json") and f.is_file():
            m = _NAME_RE.fullmatch(f.name)
            out.append(ResultFileName(f, m.group(1).lower(), m.group(2)) if m else ResultFileName(f, "", f.stem))
    return out


def _check_commit_prefix(prefix: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{4,}", prefix):
        raise ResultsError(f"{prefix!r} is not a commit hash prefix (>= 4 hex digits)")
    return prefix.lower()


def find_result(results_dir: str | os.PathLike, machine: str, commit: str, env: str | None = None) -> Path:
    """The result file of commit ``commit`` (a prefix of >= 4 hex digits) on ``machine``, of the one
    environment whose name contains ``env``. ResultsError: bad prefix, unknown machine, corrupt candidate
    (named), no result, an ambiguous prefix, or several environments without ``env``."""
    prefix = _check_commit_prefix(commit)
    mdir = Path(results_dir) / machine
    if not is_machine_dir(mdir):
        have = ", ".join(m.name for m in machine_dirs(results_dir)) if Path(results_dir).is_dir() else ""
        raise ResultsError(f"machine {machine!r} has no results in {results_dir}: machines present {have or 'none'}")
    hits: dict[str, list[tuple[Path, str]]] = {}
    for rf in list_result_files(mdir):
        if not rf.commit or not (rf.commit.startswith(prefix[:8]) or prefix.startswith(rf.commit)):
            continue
        head = load_asv_result(rf.path)
        if head.commit_hash.lower().startswith(prefix):
            hits.setdefault(head.commit_hash, []).append((rf.path, head.env_name))
    if not hits:
        have = ", ".join(sorted({r.commit for r in list_result_files(mdir) if r.commit})) or "none"
        raise ResultsError(f"commit {commit} has no asv results in {mdir}: commits present {have}")
    if len(hits) > 1:
        raise ResultsError(f"commit prefix {commit} is ambiguous in {mdir}: {', '.join(sorted(h[:12] for h in hits))}")
    files = next(iter(hits.values()))
    if env:
        files = [f for f in files if env in f[1]]
        if not files:
            raise ResultsError(f"commit {commit} in {mdir}: no result file whose environment contains {env!r}")
    if len(files) > 1:
        raise ResultsError(f"commit {commit} has results of {len(files)} environments in {mdir} "
                           f"({', '.join(e for _, e in files)}): choose one (--env)")
    return files[0][0]


def param_literal(text: Any) -> str:
    """One stored parameter value as the benchmark saw it: ``"'aiter'"`` -> ``"aiter"``."""
    if not isinstance(text, str):
        return str(text)
    try:
        return str(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return text


@dataclass(frozen=True)
class Measurement:
    """One stored value: a benchmark at one parameter combination."""

    benchmark: str  # full asv name (bench_mla_prefill.MLAPrefill.track_latency)
    params: tuple[str, ...]  # the combination's values as strings (("aiter", "s4096")); () if unparameterised
    status: str  # ok, failed (asv stored null) or skipped (NaN)
    value: float | None = None  # the stored number (asv's median for sample-based benchmarks); None unless ok
    q25: float | None = None  # asv's statistics, None when absent
    q75: float | None = None
    ci_99_a: float | None = None
    ci_99_b: float | None = None
    samples: list[float] | None = None
    version: str | None = None  # the benchmark's version string
    started_at: float | None = None  # ms since the epoch


@dataclass
class AsvResult:
    """A parsed asv result file (api version 2; the format: module docstring)."""

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
        """The machine name asv copied from machine.json into the file's params."""
        return m if isinstance(m := self.params.get("machine"), str) else None

    def benchmarks(self) -> list[str]:
        return list(self.results)

    def row(self, benchmark: str) -> dict[str, Any]:
        """One benchmark's row as column name -> value (absent trailing columns are None)."""
        row = self.results.get(benchmark)
        if row is None:
            raise ResultsError(f"asv result file {self.path} has no result for benchmark {benchmark!r}")
        return {c: (row[i] if i < len(row) else None) for i, c in enumerate(self.result_columns)}

    def started_at(self, benchmark: str | None = None) -> float:
        """``started_at`` (ms) of one benchmark, or the newest of all; 0.0 when absent."""
        names = [benchmark] if benchmark is not None else self.results
        vals = [finite_number(self.row(n).get("started_at")) for n in names]
        return max([v for v in vals if v is not None] or [0.0])

    def param_combos(self, benchmark: str) -> list[tuple[str, ...]]:
        """The parameter combinations of one benchmark in stored order (``[()]`` if unparameterised)."""
        params = self.row(benchmark).get("params") or []
        if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
            raise ResultsError(f"asv result file {self.path}: benchmark {benchmark!r} has malformed params")
        return [tuple(param_literal(x) for x in c) for c in itertools.product(*params)] if params else [()]

    def measurements(self, benchmark: str) -> dict[tuple[str, ...], Measurement]:
        """params -> :class:`Measurement` for one benchmark (combinations without a stored value are absent)."""
        d = self.row(benchmark)
        combos = self.param_combos(benchmark)
        vals = d.get("result")
        if not isinstance(vals, list):
            vals = [vals] * len(combos)

        def col(name: str, i: int) -> Any:
            c = d.get(name)
            return c[i] if isinstance(c, list) and i < len(c) else None

        out: dict[tuple[str, ...], Measurement] = {}
        for i, (combo, v) in enumerate(zip(combos, vals)):
            status = "failed" if v is None else "skipped" if (isinstance(v, float) and math.isnan(v)) else "ok"
            if status == "ok" and json_number(v) is None:
                raise ResultsError(f"asv result file {self.path}: {benchmark}{combo} has a non-numeric value "
                                   f"{repr(v)[:60]} (a number in the float range is needed)")
            smp = col("samples", i)
            out[combo] = Measurement(
                benchmark, combo, status, float(v) if status == "ok" else None,
                *(finite_number(col(f"stats_{s}", i)) for s in ("q_25", "q_75", "ci_99_a", "ci_99_b")),
                [float(x) for x in smp if finite_number(x) is not None] if isinstance(smp, list) else None,
                d.get("version"), finite_number(d.get("started_at")))
        return out


def asv_result_from_data(data: Any, path: str | os.PathLike) -> AsvResult:
    """:func:`load_asv_result` of an already parsed document."""
    path = Path(path)
    data = _check_version(data, path, "asv result file", ASV_RESULTS_API_VERSION)
    for key in _RESULT_KEYS:
        if key not in data:
            raise ResultsError(f"asv result file {path} lacks the key {key!r}: not an asv 0.6 result file")
    cols, res = data["result_columns"], data["results"]
    if not isinstance(cols, list) or not isinstance(res, dict) or not all(isinstance(r, list) for r in res.values()):
        raise ResultsError(f"asv result file {path}: 'result_columns' must be a list and 'results' an object of rows")
    if "result" not in cols or "params" not in cols:
        raise ResultsError(f"asv result file {path}: result_columns {cols} lack 'result'/'params'")
    params = data["params"] if isinstance(data["params"], dict) else {}
    return AsvResult(path, str(data["commit_hash"]), str(data["env_name"]), finite_number(data.get("date")),
                     params, cols, res, data)


def load_asv_result(path: str | os.PathLike) -> AsvResult:
    """Read one asv result file; ResultsError: unreadable, not JSON (truncated/corrupt), wrong api version
    or missing keys."""
    return asv_result_from_data(_load(Path(path), "asv result file"), path)


def load_any(path: str | os.PathLike) -> RunDoc | AsvResult:
    """A run JSON or an asv result file, told apart by content (``records`` vs ``result_columns``);
    ResultsError: neither, or either kind's own errors."""
    data = _load(Path(path), "results file")
    if isinstance(data, dict) and "result_columns" in data:
        return asv_result_from_data(data, path)
    if isinstance(data, dict) and "records" in data:
        return run_doc_from_data(data, path)
    what = type(data).__name__ if not isinstance(data, dict) else "object without 'records' or 'result_columns'"
    raise ResultsError(f"{path} is neither a run JSON ('records') nor an asv result file ('result_columns'): "
                       f"a JSON {what}")


def newest_result(machine_dir: str | os.PathLike, commit: str | None = None) -> AsvResult:
    """The newest result file in ``machine_dir`` (by ``date``, then ``started_at``), optionally of one
    commit; ResultsError: no result files, a corrupt one (named), or no result of ``commit``."""
    files = list_result_files(machine_dir)
    if not files:
        raise ResultsError(f"asv machine directory {machine_dir} holds no result files (only machine.json)")
    loaded = [load_asv_result(f.path) for f in files]
    if commit:
        prefix = _check_commit_prefix(commit)
        sel = [r for r in loaded if r.commit_hash.lower().startswith(prefix)]
        if not sel:
            have = ", ".join(sorted({r.commit_hash[:8] for r in loaded}))
            raise ResultsError(f"no result for commit {commit!r} in {machine_dir}: commits present {have}")
        loaded = sel
    return max(loaded, key=lambda r: (r.date or 0.0, r.started_at()))
