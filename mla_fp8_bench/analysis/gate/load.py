"""The gate's inputs: one side (BASE or HEAD) from a run JSON, an asv result file or a commit prefix under
``<results-dir>/<machine>/``, read through :mod:`mla_fp8_bench.harness.results`."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field

from mla_fp8_bench.harness import results as R
from mla_fp8_bench.jsonio import json_number
from mla_fp8_bench.measure import metric_table
from mla_fp8_bench.measure.metric_table import find, record_is_emulation

#: Kinds of metric the gate judges (the SM clock and SM cycles are read for the gated figure).
JUDGED_KINDS = ("accuracy", "kernel_latency", "host_latency", "resource")
_HEX = re.compile(r"[0-9a-fA-F]{4,}")


class GateUsageError(ValueError):
    """Bad gate input; the CLI prints the message and exits 2."""


@dataclass
class Value:  # a metric of a (backend, case): status, figure (floored); rounds, else samples, else figure
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

    @functools.cached_property
    def plateau(self) -> float | None:  # the highest SM clock of the side's kernel params (a light case's)
        clocks = [x.center for (b, c, k), x in self.data.items() if k == "sm_clock_mhz" and x.status == "ok"
                  and (b, c) not in self.emulated]
        return max(clocks) if clocks else None


def _number(x, where: str, absent_ok: bool = True) -> float | None:
    if (x is None and absent_ok) or (v := json_number(x)) is not None:
        return None if x is None else v
    raise GateUsageError(f"{where} = {repr(x)[:40]} is not a number: allowed a number, or null")


def _numbers(x, where: str) -> list[float]:
    if x is not None and not isinstance(x, list):
        raise GateUsageError(f"{where} = {repr(x)[:40]} is not a list: allowed a list of numbers, or null")
    return [_number(v, where, absent_ok=False) for v in x or ()]


def side_from_run(doc: R.RunDoc, label: str) -> Side:
    """A side from a run JSON; GateUsageError for two different records of a (backend, case), a non-number."""
    vendor = str(doc.env.get("vendor") or "").lower()
    side = Side(label, str(doc.path), gpu=("none" if vendor == "cpu" else doc.env.get("device_name")) if vendor
                else None, cpu=vendor == "cpu" or str(doc.env.get("device", "")).startswith("cpu"))
    first: dict[tuple[str, str], int] = {}
    for i, r in enumerate(doc.records):
        key = (r["backend"], r["case"])
        if r != doc.records[first.setdefault(key, i)]:
            raise GateUsageError(f"{label} {doc.path}: records {first[key]} and {i} are two different records of "
                                 f"({key[0]}, {key[1]}): which one holds is unknown")
        status = r.get("status") if r.get("status") in ("ok", "skipped") else "failed"
        side.params[key] = (status, " ".join(str(r.get("reason") or "").split()))
        side.emulated |= {key} if record_is_emulation(r) else set()
        for m in metric_table.METRICS if status == "ok" else ():  # the table now: a test may extend it
            where = f"{label} {doc.path}: record {i} ({key[0]}, {key[1]}): "
            lists = [_numbers(r.get(k), where + k) for k in (m.rounds_key, m.samples_key) if k]
            series = next((x for x in lists if len(x) >= 2), None) or next((x for x in lists if x), ())
            if (v := _number(m.value(r), where + m.record_key)) is not None:
                side.data[(*key, m.record_key)] = Value("ok", m.floored(v), tuple(series) or (v,))
            elif m.kind == "accuracy" and m.record_key in r:  # an ok record whose error is null: unjudgeable
                side.data[(*key, m.record_key)] = Value("missing")
    return side


def _from_asv(res: R.AsvResult, label: str) -> Side:
    from mla_fp8_bench.backends import backend_flag

    gpu = res.params.get("gpu")
    side = Side(label, str(res.path), res.machine, gpu if isinstance(gpu, str) else None, R.is_cpu_machine(res.params))
    for name in res.results:
        m = find(name.rsplit(".", 1)[-1])
        if m is None:
            continue
        for combo, x in res.measurements(name).items():
            key = (combo[0], ", ".join(combo[1:])) if len(combo) >= 2 else (name, "")
            ok = x.status == "ok"
            side.data[(*key, m.record_key)] = Value(x.status, m.floored(x.value) if ok else None,
                                                    tuple(x.samples or (x.value,)) if ok else (), x.version)
            prev = side.params.get(key, ("skipped", ""))[0]  # ok if any value is, else failed if any is
            side.params[key] = (max(prev, x.status, key=("skipped", "failed", "ok").index), "")
    side.emulated = {k for k in side.params if backend_flag(k[0], "emulation")}
    return side


def _holds(results_dir: str, machine: str, commits: list[str], env: str | None) -> bool:
    try:
        return all(R.find_result(results_dir, machine, c, env) for c in commits)
    except R.ResultsError:
        return False


def pick_machine(results_dir: str, machine: str | None, specs: tuple[str, ...], env: str | None) -> str | None:
    """``machine``, else the only machine of ``results_dir`` or the only one holding every commit in ``specs``."""
    commits = [s for s in specs if not os.path.exists(s) and _HEX.fullmatch(s)]
    if machine or not commits:
        return machine
    try:
        names = [d.name for d in R.machine_dirs(results_dir)]
    except R.ResultsError as exc:
        raise GateUsageError(str(exc)) from None
    holding = [n for n in names if _holds(results_dir, n, commits, env)]
    if len(holding) == 1 or len(names) == 1:
        return (holding or names)[0]
    raise GateUsageError(f"{results_dir} holds {len(names)} machines ({', '.join(names)}), {len(holding)} of them "
                         "with both commits: pass --machine")


def load_side(spec: str, label: str, results_dir: str, machine: str | None, env: str | None) -> Side:
    if not os.path.exists(spec) and (machine is None or not _HEX.fullmatch(spec)):
        raise GateUsageError(f"{label} {spec!r} is neither an existing file nor a commit hash prefix (>= 4 hex digits)")
    try:
        doc = R.load_any(spec if os.path.exists(spec) else R.find_result(results_dir, machine, spec, env))
        return _from_asv(doc, label) if isinstance(doc, R.AsvResult) else side_from_run(doc, label)
    except R.ResultsError as exc:
        raise GateUsageError(f"{label}: {exc}") from None


def check_same_machine(base: Side, head: Side) -> None:
    """GateUsageError for two asv machines, or devices neither of whose names contains the other's."""
    for facet in ("machine", "gpu"):
        b, h = (str(getattr(s, facet) or "").strip().lower() for s in (base, head))
        if b and h and not (b == h if facet == "machine" or "none" in (b, h) else (b in h or h in b)):
            raise GateUsageError(f"BASE and HEAD come from different machines ({facet} {getattr(base, facet)!r} vs "
                                 f"{getattr(head, facet)!r}): their latencies are not comparable; pass "
                                 "--allow-cross-machine to compare anyway")
