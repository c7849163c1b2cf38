"""asv ``track_*`` methods generated from the metric table (:mod:`mla_fp8_bench.measure.metric_table`).

An asv class in ``benchmarks/`` sets ``self.rec`` (the cached record of its (backend, case)) in ``setup``
and is decorated with :func:`with_tracks`; every metric of the table whose ``asv_class`` is the class's
name becomes a ``track_<...>`` method with the metric's ``unit``, ``pretty_name`` and docstring. The
benchmark name asv derives is ``<module>.<class>.<track>`` (the attribute name), so names and params
stay those of the hand-written methods; the class's ``version`` string is the benchmark version.
"""

from __future__ import annotations

import math
from typing import Any

from mla_fp8_bench.measure.metric_table import Metric, asv_metrics


class MissingMetricError(RuntimeError):
    """An ok record lacks an accuracy metric (asv records a failure carrying this message)."""


def track_value(rec: dict[str, Any], m: Metric) -> float | dict[str, Any]:
    """What the asv track of ``m`` returns for the record ``rec``.

    * metrics with samples: ``{"samples": [...], "number": 1}`` when the record holds samples;
    * otherwise the value, floored at ``m.floor``; an absent value is NaN (asv stores a skip, ``n/a``),
      except for accuracy metrics, where absence or a non-finite value is a failure.

    Raises:
        MissingMetricError: an accuracy metric is absent or non-finite (a non-finite error is a result,
            not a skip).
    """
    if m.samples_key:
        samples = rec.get(m.samples_key)
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


def _make_track(m: Metric):
    def track(self, cache, *params):
        return track_value(self.rec, m)

    track.__name__ = track.__qualname__ = m.track
    track.__doc__ = m.doc or m.pretty_name
    track.unit = m.unit
    track.pretty_name = m.pretty_name
    return track


def with_tracks(cls: type) -> type:
    """Class decorator: add the ``track_*`` methods of every metric whose ``asv_class`` is ``cls.__name__``.

    Raises:
        ValueError: the table has no metric for this class, or the class already defines one of the methods.
    """
    metrics = asv_metrics(cls.__name__)
    if not metrics:
        raise ValueError(f"the metric table has no asv track for class {cls.__name__}")
    for m in metrics:
        if m.track in cls.__dict__:
            raise ValueError(f"{cls.__name__}.{m.track} is defined by hand and by the metric table")
        setattr(cls, m.track, _make_track(m))
    return cls
