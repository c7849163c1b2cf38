"""asv ``track_*`` methods, generated from the metric table (:mod:`mla_fp8_bench.measure.metric_table`)."""

from __future__ import annotations

import math
from typing import Any

from mla_fp8_bench.measure.metric_table import Metric, asv_metrics


class MissingMetricError(RuntimeError):
    """An ok record lacks an accuracy metric (asv records a failure carrying this message)."""


def track_value(rec: dict[str, Any], m: Metric) -> float | dict[str, Any]:
    """What the asv track of ``m`` returns for ``rec``: its rounds (two or more) or else samples as asv samples,
    else the value floored; NaN (asv's skip) when absent. MissingMetricError: an accuracy value absent or
    non-finite."""
    rounds = rec.get(m.rounds_key) if m.rounds_key else None
    samples = rounds if isinstance(rounds, list) and len(rounds) >= 2 else m.samples_key and rec.get(m.samples_key)
    if samples:
        return {"samples": [float(x) for x in samples], "number": 1}
    v = m.value(rec)
    if m.kind == "accuracy":
        if v is None:
            raise MissingMetricError(f"{m.record_key} is missing from the record of {rec.get('backend')} "
                                     f"{rec.get('case')}")
        v = float(v)
        if not math.isfinite(v):
            raise MissingMetricError(f"{m.record_key} = {v} (non-finite) for {rec.get('backend')} {rec.get('case')}")
    if v is None:
        return float("nan")  # NaN is stored as a skip (n/a); NotImplementedError outside setup would be a failure
    return m.floored(float(v))


def _make_track(m: Metric, class_version: str | None):
    def track(self, cache, *params):
        return track_value(self.rec, m)

    track.__name__ = track.__qualname__ = m.track
    if class_version is not None:
        track.version = m.asv_version(class_version)
    track.__doc__, track.unit, track.pretty_name = m.doc or m.pretty_name, m.unit, m.pretty_name
    return track


def with_tracks(cls: type) -> type:
    """Class decorator: the ``track_*`` method (reading ``self.rec``) of every metric of class ``cls``."""
    metrics = asv_metrics(cls.__name__)
    if not metrics:
        raise ValueError(f"the metric table has no asv track for class {cls.__name__}")
    for m in metrics:
        if m.track in cls.__dict__:
            raise ValueError(f"{cls.__name__}.{m.track} is defined by hand and by the metric table")
        setattr(cls, m.track, _make_track(m, getattr(cls, "version", None)))
    return cls
