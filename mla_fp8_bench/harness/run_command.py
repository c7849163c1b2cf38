"""What ``run`` measures and where its records go: the cases under ``--max-seq-len``, a ``--json`` path checked
before any work, and never a stored run file replaced by records that lack what it holds."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from mla_fp8_bench.jsonio import check_output_path, finite_number, output_target
from mla_fp8_bench.problem.cases import SWEEP_SEQ_LENS, Case, default_sweep, resolve_cases


def select_cases(specs: list[str] | None, device_type: str, max_seq_len: int | None = None) -> tuple[list[Case], str]:
    """The cases of ``specs`` (ids and suites; None: the default sweep) whose queries and keys are at most
    ``max_seq_len`` long, and a note of what was left out; ValueError (or CaseError): none left, unknown spec."""
    note = ""
    if specs is None:
        specs, note = default_sweep(device_type, max_seq_len)
    cases = resolve_cases(list(specs))
    over = [c.id for c in cases if max_seq_len is not None and max(c.max_seq_len, c.max_kv_len) > max_seq_len]
    if over and len(over) == len(cases):
        raise ValueError(f"--max-seq-len {max_seq_len} leaves none of the cases asked for ({', '.join(over[:4])}"
                         f"{', ...' if len(over) > 4 else ''})")
    if not cases:
        raise ValueError(f"--max-seq-len {max_seq_len} leaves no case of the default sweep: allowed >= "
                         f"{SWEEP_SEQ_LENS[0]} (the smallest seq_len of the sweep)")
    if over:
        note = f"--max-seq-len {max_seq_len} leaves out {len(over)} case(s): {', '.join(over)}"
    return [c for c in cases if c.id not in over], note


def check_json_path(path: str) -> Path:
    """A ``run --json`` path checked writable before any work; ValueError for one inside an asv results
    directory (asv, gate and publish read every file there)."""
    p = check_output_path(path, "--json")
    if any((p.parent / marker).is_file() for marker in ("machine.json", "benchmarks.json")):
        raise ValueError(f"--json {path} lies in an asv results directory ({p.parent}), whose files asv, gate and "
                         "publish read as asv results: write the run elsewhere")
    return p


def _measured(records: list[dict]) -> dict[tuple[str, str], bool]:
    """(backend, case) of each ``ok`` record -> whether it holds a finite latency."""
    out: dict[tuple[str, str], bool] = {}
    for r in records:
        if r.get("status") == "ok":
            key = (r["backend"], r["case"])
            out[key] = out.get(key, False) or finite_number(r.get("latency_s")) is not None
    return out


def _run_loses(target: Path, data: dict) -> str | None:
    """What replacing the run file ``target`` by the run ``data`` would lose, or None: it is not a run JSON,
    was measured on another machine, or holds ``ok`` records (or latencies) that ``data`` lacks."""
    from mla_fp8_bench.harness.results import ResultsError, load_run_json

    try:
        stored = load_run_json(target)
    except ResultsError as exc:
        return f"it is not a run JSON ({exc})"
    other = [f"{k} {stored.env[k]!r}, not {data['env'].get(k)!r}" for k in ("hostname", "device_name")
             if stored.env.get(k) is not None and stored.env[k] != data["env"].get(k)]
    if other:
        return f"it was measured on another machine ({'; '.join(other)})"
    new = _measured(data["records"])
    lost = [k for k, timed in _measured(stored.records).items() if k not in new or (timed and not new[k])]
    return (f"it holds {len(lost)} measured (backend, case) record(s) this run lacks or did not measure (e.g. "
            f"{lost[0][0]} {lost[0][1]})") if lost else None


def output_path(path: str, data: dict, interrupted: bool = False) -> tuple[str, str | None]:
    """(where the run ``data`` goes, why ``path`` is kept or None): ``path``, unless replacing its file would
    lose something (an ``interrupted`` run replaces none); then the first free of ``<stem>.<tag><suffix>``,
    ``<stem>.<tag>-2<suffix>``, ... (tag ``new`` or ``interrupted``). A non-regular file is never touched."""
    def lost(candidate: str) -> str | None:
        try:
            target = output_target(candidate)
            if not os.path.lexists(target) or (target.is_file() and target.stat().st_size == 0):
                return None
            if not target.is_file():
                return "it is not a regular file"
            return "an interrupted run replaces no stored file" if interrupted else _run_loses(target, data)
        except OSError as exc:
            return f"it cannot be used ({exc})"

    why = lost(path)
    if why is None:
        return path, None
    p, tag = Path(path), "interrupted" if interrupted else "new"
    names = (str(p.with_name(f"{p.stem}.{tag}{f'-{i}' if i > 1 else ''}{p.suffix or '.json'}"))
             for i in itertools.count(1))
    return next(c for c in names if lost(c) is None), why
