"""Calibrated accuracy tolerances: the file format (written by :mod:`mla_fp8_bench.analysis.calibrate`),
loading and checking runner records against it.

Tolerances are stored per (backend, tolerance key: the case id without its seed) and per (backend,
quant/dist group: the max over the group's calibrated shapes, used for shapes not calibrated). Rules:
docs/regressions.md, section 1. Loading raises :class:`ToleranceFileError` naming the file and the problem.
"""

from __future__ import annotations

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
#: Smallest tolerance per calibrated metric: a metric whose calibration values are all ~0 (e.g. a
#: mismatch fraction of 0 on every seed) would otherwise get a zero tolerance, and any single flipped
#: element would alarm.
FLOORS: dict[str, float] = {m.record_key: float(m.tolerance_floor) for m in calibrated_metrics()}
#: Metrics that must be exactly 0 (checked always, not calibrated).
ZERO_METRICS: tuple[str, ...] = tuple(m.record_key for m in zero_metrics())


class ToleranceFileError(ValueError):
    """A tolerance file is missing, unreadable or malformed; the message names the file and the problem."""


def _case(case_id: Any):
    try:
        return parse_case_id(str(case_id))
    except (CaseError, TypeError, ValueError):
        return None


def tolerance_key(record: dict[str, Any]) -> str | None:
    """The key a record's tolerances are stored under: its ``tolerance_key`` field (a fault probe), else
    the case id without the seed suffix."""
    if record.get("tolerance_key"):
        return str(record["tolerance_key"])
    c = _case(record.get("case"))
    return replace(c, seed=0).id if c else None


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
        """(tolerances per metric, how they were found: ``"case"``, ``"group <q>/<d>"`` or ``"none"``)."""
        by_key = self.data["tolerances"].get(backend)
        if by_key is None or key is None:
            return None, "none"
        if key in by_key:
            return by_key[key], "case"
        grp = group_of(key)
        g = self.data.get("groups", {}).get(backend, {}).get(grp) if grp else None
        if g is not None:
            return g, f"group {grp} (extrapolated: shape not calibrated)"
        return None, "none"


def _bad(path: str, msg: str) -> ToleranceFileError:
    return ToleranceFileError(f"tolerance file {path}: {msg}")


def _check_number(path: str, where: str, v: Any) -> None:
    x = json_number(v)
    if x is None or not math.isfinite(x) or x < 0:
        raise _bad(path, f"{where} is {repr(v)[:40]}: must be a finite number >= 0")


def validate_tolerances(data: Any, path: str = "<memory>") -> dict[str, Any]:
    """Check the structure of a tolerance document; returns it.

    Raises:
        ToleranceFileError: naming ``path`` and the first problem found.
    """
    if not isinstance(data, dict):
        raise _bad(path, f"top level is a {type(data).__name__}: must be a JSON object")
    if data.get("schema") != SCHEMA:
        raise _bad(path, f"schema is {data.get('schema')!r}: must be {SCHEMA!r} (not a tolerance file?)")
    if data.get("version") != SCHEMA_VERSION:
        raise _bad(path, f"version is {data.get('version')!r}: this mla_fp8_bench reads version {SCHEMA_VERSION}")
    for key in ("method", "margin", "tolerances", "distributions"):
        if key not in data:
            raise _bad(path, f"missing key {key!r}")
    _check_number(path, "margin", data["margin"])
    for section in ("tolerances", "groups"):
        sec = data.get(section, {})
        if not isinstance(sec, dict):
            raise _bad(path, f"{section} must be an object of backend -> case -> metric -> number")
        for b, fams in sec.items():
            if not isinstance(fams, dict):
                raise _bad(path, f"{section}.{b} must be an object of case -> metric -> number")
            for f, mets in fams.items():
                if not isinstance(mets, dict) or not mets:
                    raise _bad(path, f"{section}.{b}.{f} must be a non-empty object of metric -> number")
                for m, v in mets.items():
                    _check_number(path, f"{section}.{b}.{f}.{m}", v)
    if not data["tolerances"]:
        raise _bad(path, "tolerances is empty: no backend was calibrated")
    lacking = [m.record_key for m in calibrated_metrics() if m.record_key not in data.get("metrics", FLOORS)]
    if lacking:
        raise _bad(path, f"lacks calibrated metric {lacking[0]} (its metrics: {data.get('metrics')}): "
                         "recalibrate (mla-fp8-bench calibrate)")
    return data


def load_tolerances(path: str | os.PathLike) -> Tolerances:
    """Read and validate a tolerance file.

    Raises:
        ToleranceFileError: missing or unreadable file, not UTF-8 text, invalid JSON (with line/column) or
            nested too deep to parse, wrong schema/version, or a bad value (with its JSON path).
    """
    p = str(path)
    try:
        text = Path(p).read_text()
    except FileNotFoundError:
        raise _bad(p, "not found") from None
    except OSError as exc:
        raise _bad(p, f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise _bad(p, f"is not text (byte {exc.start} is not UTF-8): not a JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(p, f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (RecursionError, ValueError) as exc:  # nested too deep; an integer of more than 4300 digits
        raise _bad(p, f"cannot be read as JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    return Tolerances(p, validate_tolerances(data, p))


@dataclass(frozen=True)
class Violation:
    """One failed accuracy check."""

    backend: str
    case: str
    metric: str
    value: float | None
    tolerance: float | None
    how: str  # "case" / "group ..." / "status" / "nonfinite"
    reason: str = ""

    @property
    def ratio(self) -> float:
        if self.value is None or self.tolerance is None:
            return math.inf
        if self.tolerance == 0:
            return math.inf if self.value > 0 else 0.0
        return self.value / self.tolerance

    def __str__(self) -> str:
        if self.metric in ("status", "nonfinite"):
            return f"{self.backend} {self.case}: {self.metric}: {self.reason}"
        return (f"{self.backend} {self.case}: {self.metric} = {self.value:.4g} > tolerance {self.tolerance:.4g} "
                f"({self.ratio:.2f}x, {self.how})")


def _measured(record: dict[str, Any], tol: Tolerances) -> tuple[list[Violation], str]:
    """(a Violation-shaped entry per calibrated metric the record holds, how the tolerances were found)."""
    b, c = str(record.get("backend")), str(record.get("case"))
    t, how = tol.lookup(b, tolerance_key(record))
    return [Violation(b, c, m, float(record[m]), lim, how) for m, lim in (t or {}).items()
            if record.get(m) is not None], how


def ratios(record: dict[str, Any], tol: Tolerances) -> tuple[dict[str, float], str]:
    """value/tolerance per calibrated metric present in the record, and how the tolerances were found."""
    vals, how = _measured(record, tol)
    return {v.metric: v.ratio if math.isfinite(v.value) else math.inf for v in vals}, how


def check(record: dict[str, Any], tolerances: Tolerances) -> list[Violation]:
    """Violations of one runner record against calibrated tolerances (empty list: healthy).

    Rules: ``status == "error"`` is a violation; ``skipped`` records are not checked; any non-finite
    output (``nonfinite_count_fp8_ref > 0`` or a non-finite metric) is a violation; every calibrated
    metric must be <= its tolerance. A record without a calibrated (backend, case or group) gets no
    violations from the metric rule (see :func:`ratios` to tell).
    """
    b, c = str(record.get("backend")), str(record.get("case"))
    status = record.get("status", "ok")
    if status == "skipped":
        return []
    if status != "ok":
        return [Violation(b, c, "status", None, None, "status", f"{status}: {record.get('reason', '')}")]
    out: list[Violation] = []
    for m in ZERO_METRICS:
        v = record.get(m)
        if v is not None and float(v) != 0:
            out.append(Violation(b, c, "nonfinite", float(v), 0.0, "nonfinite",
                                 f"{m} = {int(v)}: non-finite elements (must be 0)"))
    return out + [v for v in _measured(record, tolerances)[0] if not math.isfinite(v.value) or v.value > v.tolerance]
