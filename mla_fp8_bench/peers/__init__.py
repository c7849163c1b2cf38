"""Optional peers of the AITER path (FA3, cuDNN), reached only through the backend registry's lazy imports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mla_fp8_bench.backends.base import BackendUnavailable, Verdict


def load_once(cache: dict[str, Any], key: str, load: Callable[[], Any]) -> Any:
    """``load()``'s module, cached under ``key``; its BackendUnavailable is cached and raised on every call."""
    if key not in cache:
        try:
            cache[key] = load()
        except BackendUnavailable as exc:
            cache[key] = exc
    if isinstance(cache[key], BackendUnavailable):
        raise cache[key]
    return cache[key]


def loadable(load: Callable[[], Any]) -> Verdict:
    try:
        load()
    except BackendUnavailable as exc:
        return Verdict.no(str(exc))
    return Verdict.yes()


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
