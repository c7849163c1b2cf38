"""The gate's inputs: one side (BASE or HEAD) from a run JSON, an asv result file or a commit prefix under
``<results-dir>/<machine>/``, read through :mod:`mla_fp8_bench.harness.results`."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mla_fp8_bench.harness import results as R
from mla_fp8_bench.jsonio import json_number
from mla_fp8_bench.measure.metric_table import METRICS, Metric, find, record_is_emulation

#: Kinds of metric the gate judges; the SM clock and SM cycles are read for the gated figure.
JUDGED_KINDS = ("accuracy", "kernel_latency", "host_latency", "resource")
_HEX = re.compile(r"[0-9a-fA-F]{4,}")
_RANK = {"ok": 2, "failed": 1, "skipped": 0}
_READ = {m.record_key: m for m in METRICS if m.kind in JUDGED_KINDS or m.name in ("sm_clock", "sm_cycles")}


class GateUsageError(ValueError):
    """Bad gate input; the CLI prints the message and exits 2."""


@dataclass
class Value:
    """One metric of one (backend, case) on one side. ``status``: ok, failed or skipped; ``center``: the
    stored figure (floored as asv stores it); ``values``: the rounds (one per process) when two or more
    were stored, else the samples, else the stored figure alone."""

    status: str
    center: float | None = None
    values: tuple[float, ...] = ()
    version: str | None = None


@dataclass
class Side:
    label: str  # "BASE" / "HEAD"
    src: str  # the file read
    machine: str | None = None  # asv machine name
    gpu: str | None = None  # the device name; "none" on a CPU
    cpu: bool = False
    emulated: set[tuple[str, str]] = field(default_factory=set)  # (backend, case) timed by an emulation
    data: dict[tuple[str, str, str], Value] = field(default_factory=dict)  # (backend, case, record key)
    params: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # (status, reason)


def _ok(m: Metric, v: float, series: list[float] | None) -> Value:
    values = tuple(series) if series else (v,)
    return Value("ok", m.floored(v), values)


def side_from_run(doc: R.RunDoc, label: str) -> Side:
    """A side from a run JSON (GateUsageError: two different records of one (backend, case), a value that
    is not a number)."""
    vendor = str(doc.env.get("vendor") or "").lower()
    side = Side(label, str(doc.path), gpu=("none" if vendor == "cpu" else doc.env.get("device_name")) if vendor
                else None, cpu=vendor == "cpu" or str(doc.env.get("device", "")).startswith("cpu"))
    first: dict[tuple[str, str], int] = {}
    for i, r in enumerate(doc.records):
        key = (r["backend"], r["case"])
        if key in first:
            if r != doc.records[first[key]]:
                raise GateUsageError(f"{label} {doc.path}: records {first[key]} and {i} are two different records "
                                     f"of ({key[0]}, {key[1]}): which one holds is unknown")
            continue
        first[key] = i
        status = r.get("status") if r.get("status") in ("ok", "skipped") else "failed"
        side.params[key] = (status, " ".join(str(r.get("reason") or "").split()))
        if record_is_emulation(r):
            side.emulated.add(key)
        for m in _READ.values() if status == "ok" else ():
            where = f"{label} {doc.path}: record {i} ({key[0]}, {key[1]}): "
            v = _number(m.value(r), where + m.record_key)
            series = [r.get(k) for k in (m.rounds_key, m.samples_key) if k and r.get(k) is not None]
            for s in series:
                if not isinstance(s, list):
                    raise GateUsageError(f"{where}{m.rounds_key} or {m.samples_key} = {repr(s)[:40]}: allowed a "
                                         "list of numbers, or null")
            lists = [[_number(x, where + "a round or sample") for x in s] for s in series]
            if v is not None:
                side.data[(*key, m.record_key)] = _ok(m, v, next((s for s in lists if len(s) >= 2), None) or
                                                      next((s for s in lists if s), None))
    return side


def _number(x, where: str) -> float | None:
    """A stored value as a float (None when absent); GateUsageError naming it when it is not a number."""
    if x is None:
        return None
    v = json_number(x)
    if v is None:
        raise GateUsageError(f"{where} = {repr(x)[:40]} is not a number: allowed a number, or null")
    return v


def _from_asv(res: R.AsvResult, label: str) -> Side:
    from mla_fp8_bench.backends import backend_flag

    gpu = res.params.get("gpu")
    side = Side(label, str(res.path), res.machine, gpu if isinstance(gpu, str) else None, R.is_cpu_machine(res.params))
    for name in res.benchmarks():
        m = find(name.rsplit(".", 1)[-1])
        if m is None or m.record_key not in _READ:
            continue
        try:
            stored = res.measurements(name)
        except R.ResultsError as exc:
            raise GateUsageError(f"{label}: {exc}") from None
        for combo, x in stored.items():
            key = (combo[0], ", ".join(combo[1:])) if len(combo) >= 2 else (name, "")
            v = _ok(m, x.value, x.samples) if x.status == "ok" else Value(x.status)
            side.data[(*key, m.record_key)] = Value(v.status, v.center, v.values, x.version)
            if _RANK[x.status] >= _RANK[side.params.get(key, ("skipped", ""))[0]]:  # ok if any value is
                side.params[key] = (x.status, "")
    side.emulated = {k for k in side.params if backend_flag(k[0], "emulation")}
    return side


def machine_names(results_dir: str) -> list[str]:
    p = Path(results_dir)
    return sorted(q.name for q in p.iterdir() if q.is_dir() and R.is_machine_dir(q)) if p.is_dir() else []


def pick_machine(results_dir: str, machine: str | None, specs: tuple[str, ...], env: str | None) -> str | None:
    """``machine``, else the one machine of ``results_dir`` (or the one holding every commit in ``specs``
    that is not a file); None when no commit is asked for."""
    commits = [s for s in specs if not os.path.exists(s) and _HEX.fullmatch(s)]
    if machine or not commits:
        return machine
    names = machine_names(results_dir)
    if not names:
        raise GateUsageError(f"results directory {results_dir} holds no asv machine (<machine>/machine.json) to "
                             f"find commit {commits[0]} in: pass --results-dir, or give result files")
    holding = []
    for name in names:
        with contextlib.suppress(R.ResultsError):
            for s in commits:
                R.find_result(results_dir, name, s, env)
            holding.append(name)
    if len(names) == 1 or len(holding) == 1:
        return names[0] if len(names) == 1 else holding[0]
    raise GateUsageError(f"{results_dir} holds results of {len(names)} machines ({', '.join(names) or 'none'}) and "
                         f"{len(holding) or 'none'} of them hold{'s' if len(holding) == 1 else ''} both commits: "
                         "pass --machine")


def load_side(spec: str, label: str, results_dir: str, machine: str | None, env: str | None) -> Side:
    """The side ``spec`` names: a results file, or a commit prefix on ``machine`` in ``results_dir``.

    Raises:
        GateUsageError: one line naming the side and the problem (a missing, unreadable or malformed file,
            a value that is not a number, an unknown or ambiguous commit).
    """
    try:
        if os.path.exists(spec):
            doc = R.load_any(spec)
        elif machine is None or not _HEX.fullmatch(spec):
            raise GateUsageError(f"{label} {spec!r} is neither an existing file nor a commit hash prefix "
                                 "(>= 4 hex digits)")
        else:
            doc = R.load_any(R.find_result(results_dir, machine, spec, env))
    except R.ResultsError as exc:
        raise GateUsageError(f"{label}: {exc}") from None
    return _from_asv(doc, label) if isinstance(doc, R.AsvResult) else side_from_run(doc, label)


def check_same_machine(base: Side, head: Side) -> None:
    """GateUsageError when the two sides name different asv machines, or devices of which neither name
    contains the other (a run JSON's ``"AMD Instinct MI355X"`` matches asv's ``"MI355X"``)."""
    for facet in ("machine", "gpu"):
        b, h = (str(getattr(s, facet) or "").strip().lower() for s in (base, head))
        if b and h and not (b == h if facet == "machine" or "none" in (b, h) else (b in h or h in b)):
            raise GateUsageError(f"BASE and HEAD come from different machines ({facet} {getattr(base, facet)!r} vs "
                                 f"{getattr(head, facet)!r}): their latencies are not comparable; pass "
                                 "--allow-cross-machine to compare anyway")
