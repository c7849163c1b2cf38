"""Calibrated tolerances (:mod:`mla_fp8_bench.analysis.calibrate`): the file, loading, checking records. Per
(backend, case id without seed) and (backend, quant/dist group: max over its calibrated shapes); a group covers an
uncalibrated shape with at least as many output rows (tokens x heads) as its smallest calibrated one (per-element
errors spread more on fewer elements). Rules: docs/regressions.md, section 1."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mla_fp8_bench.jsonio import json_number
from mla_fp8_bench.measure.metric_table import calibrated_metrics, zero_metrics
from mla_fp8_bench.problem.cases import CaseError, parse_case_id

SCHEMA = "mla_fp8_bench.tolerances"
SCHEMA_VERSION = 1

#: Calibrated metrics (runner record keys), from the metric table.
METRICS: tuple[str, ...] = tuple(m.record_key for m in calibrated_metrics())
#: Smallest tolerance per calibrated metric (all-zero values would give 0: one flipped element would alarm).
FLOORS: dict[str, float] = {m.record_key: float(m.tolerance_floor) for m in calibrated_metrics()}
#: Metrics that must be exactly 0 (checked always, not calibrated).
ZERO_METRICS: tuple[str, ...] = tuple(m.record_key for m in zero_metrics())


class ToleranceFileError(ValueError):
    """A tolerance file is missing, unreadable or malformed; the message names the file and the problem."""


def _case(case_id: Any):
    with contextlib.suppress(CaseError, TypeError, ValueError):
        return parse_case_id(str(case_id))


def tolerance_key(record: dict[str, Any]) -> str | None:
    """A record's ``tolerance_key`` (a probe), else its case id without the seed suffix."""
    c = None if record.get("tolerance_key") else _case(record.get("case"))
    return str(record["tolerance_key"]) if record.get("tolerance_key") else replace(c, seed=0).id if c else None


def group_of(key: str) -> str | None:
    """``"<quant>/<dist>"`` of a tolerance key (None for probes and unparsable ids)."""
    c = _case(key)
    return f"{c.quant}/{c.dist}" if c else None


@dataclass
class Tolerances:
    """A loaded tolerance file: where it came from and its validated JSON document."""

    path: str
    data: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.data.get("name", Path(self.path).stem))

    def lookup(self, backend: str, key: str | None) -> tuple[dict[str, float] | None, str]:
        """(tolerances per metric, how they were found: ``"case"``, ``"group <q>/<d> ..."`` or ``"none ..."``)."""
        by_key, grp = self.data["tolerances"].get(backend) or {}, group_of(key) if key else None
        if key in by_key:
            return by_key[key], "case"
        g = self.data.get("groups", {}).get(backend, {}).get(grp) if grp else None
        if g is None:
            return None, "none"
        rows = {k: c.total_tokens * c.num_heads for k in [*by_key, key] if (c := _case(k))}  # tokens x heads
        least = min((rows[k] for k in by_key if group_of(k) == grp), default=0)
        if rows[key] < least:
            return None, (f"none (shape not calibrated and smaller than group {grp}'s calibrated shapes: "
                          f"{rows[key]} < {least} output rows)")
        return g, f"group {grp} (extrapolated: shape not calibrated)"


def _bad(path: str, msg: str) -> ToleranceFileError:
    return ToleranceFileError(f"tolerance file {path}: {msg}")


def _check_number(path: str, where: str, v: Any) -> None:
    x = json_number(v)
    if x is None or not math.isfinite(x) or x < 0:
        raise _bad(path, f"{where} is {repr(v)[:40]}: must be a finite number >= 0")


def validate_tolerances(data: Any, path: str = "<memory>") -> dict[str, Any]:
    """``data`` if it is a tolerance document that passed its own validation; else ToleranceFileError naming
    ``path`` and the first problem."""
    if not isinstance(data, dict):
        raise _bad(path, f"top level is a {type(data).__name__}: must be a JSON object")
    if data.get("schema") != SCHEMA:
        raise _bad(path, f"schema is {data.get('schema')!r}: must be {SCHEMA!r} (not a tolerance file?)")
    if data.get("version") != SCHEMA_VERSION:
        raise _bad(path, f"version is {data.get('version')!r}: this mla_fp8_bench reads version {SCHEMA_VERSION}")
    if lacking := [k for k in ("method", "margin", "tolerances", "distributions") if k not in data]:
        raise _bad(path, f"missing key {lacking[0]!r}")
    _check_number(path, "margin", data["margin"])
    for section in ("tolerances", "groups"):
        sec = data.get(section, {})
        if not isinstance(sec, dict) or not all(isinstance(f, dict) for f in sec.values()):
            raise _bad(path, f"{section} must be an object of backend -> case -> metric -> number")
        for b, fams in sec.items():
            for f, mets in fams.items():
                if not isinstance(mets, dict) or not mets:
                    raise _bad(path, f"{section}.{b}.{f} must be a non-empty object of metric -> number")
                for m, v in mets.items():
                    _check_number(path, f"{section}.{b}.{f}.{m}", v)
    if not data["tolerances"]:
        raise _bad(path, "tolerances is empty: no backend was calibrated")
    if lacking := [m.record_key for m in calibrated_metrics() if m.record_key not in data.get("metrics", FLOORS)]:
        raise _bad(path, f"lacks calibrated metric {lacking[0]} (its metrics: {data.get('metrics')}): "
                         "recalibrate (mla-fp8-bench calibrate)")
    val = data.get("validation")
    if isinstance(val, dict) and val.get("passed") is False:
        raise _bad(path, f"failed its own validation ({val.get('false_alarms')} false alarm(s) on held-out seeds, "
                         f"faults caught {val.get('faults_caught')}/{val.get('faults_injected')}): recalibrate")
    return data


def load_tolerances(path: str | os.PathLike) -> Tolerances:
    """Read and validate a tolerance file; ToleranceFileError: missing, not a regular file, unreadable, not
    UTF-8 or JSON (with line/column), nested too deep, or refused by :func:`validate_tolerances`."""
    p = str(path)
    if not Path(p).is_file():
        raise _bad(p, "not found" if not Path(p).exists() else "is not a regular file")
    try:
        data = json.loads(Path(p).read_text())
    except OSError as exc:
        raise _bad(p, f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise _bad(p, f"is not text (byte {exc.start} is not UTF-8): not a JSON file") from None
    except json.JSONDecodeError as exc:
        raise _bad(p, f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (RecursionError, ValueError) as exc:  # nested too deep; an integer of more than 4300 digits
        raise _bad(p, f"cannot be read as JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    return Tolerances(p, validate_tolerances(data, p))


@dataclass(frozen=True)
class Violation:
    """One failed accuracy check (``how``: ``"case"`` / ``"group ..."`` / ``"status"`` / ``"nonfinite"``)."""

    backend: str
    case: str
    metric: str
    value: float | None
    tolerance: float | None
    how: str
    reason: str = ""

    @property
    def ratio(self) -> float:
        v, t = self.value, self.tolerance
        return math.inf if v is None or t is None or not math.isfinite(v) or (t == 0 < v) else v / t if t else 0.0

    def __str__(self) -> str:
        if self.metric in ("status", "nonfinite"):
            return f"{self.backend} {self.case}: {self.metric}: {self.reason}"
        return (f"{self.backend} {self.case}: {self.metric} = {self.value:.4g} > tolerance {self.tolerance:.4g} "
                f"({self.ratio:.2f}x, {self.how})")


def measured(record: dict[str, Any], tol: Tolerances) -> list[Violation]:
    """A Violation-shaped entry (value, tolerance, how found) per calibrated metric the record holds."""
    b, c = str(record.get("backend")), str(record.get("case"))
    t, how = tol.lookup(b, tolerance_key(record))
    return [Violation(b, c, m, float(record[m]), lim, how) for m, lim in (t or {}).items() if record.get(m) is not None]


def check(record: dict[str, Any], tolerances: Tolerances) -> list[Violation]:
    """Violations of one runner record (empty: healthy): an error status, non-finite outputs or metrics, a
    calibrated metric over its tolerance; ``skipped`` and uncalibrated records pass (:func:`measured` tells)."""
    b, c, status = str(record.get("backend")), str(record.get("case")), record.get("status", "ok")
    if status != "ok":
        return [] if status == "skipped" else [Violation(b, c, "status", None, None, "status",
                                                         f"{status}: {record.get('reason', '')}")]
    out = [Violation(b, c, "nonfinite", float(record[m]), 0.0, "nonfinite",
                     f"{m} = {int(record[m])}: non-finite elements (must be 0)")
           for m in ZERO_METRICS if record.get(m) is not None and float(record[m]) != 0]
    return out + [v for v in measured(record, tolerances) if not math.isfinite(v.value) or v.value > v.tolerance]
