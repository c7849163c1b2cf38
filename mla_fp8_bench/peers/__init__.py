"""Optional peers of the AITER path: FA3 and cuDNN backends, measured GPU ceilings. The core reaches them
only through the backend registry's names and lazy imports (``pip install -e '.[peers]'``)."""

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
    """Yes when ``load()`` succeeds, else no with its BackendUnavailable reason."""
    try:
        load()
    except BackendUnavailable as exc:
        return Verdict.no(str(exc))
    return Verdict.yes()


def first_line(exc: BaseException) -> str:
    """``"<ExcType>: <first line of the message, 200 chars at most>"``."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
