"""The real-AITER tier runs only when asked for: ``-m aiter`` (a marker expression selecting ``aiter``) or
``MLA_FP8_BENCH_AITER_TIER=1``. Otherwise every test marked ``aiter`` is skipped, so a plain ``pytest`` never
starts it. Its sources come from ``AITER_SRC_DIR`` (docs/cpu-tiers.md)."""

from __future__ import annotations

import os

import pytest

_HOW = ("real-AITER tier not requested: run `AITER_SRC_DIR=<dir> python -m pytest -m aiter tests/aiter_tier` "
        "(or set MLA_FP8_BENCH_AITER_TIER=1)")


def _requested(config: pytest.Config) -> bool:
    if os.environ.get("MLA_FP8_BENCH_AITER_TIER") == "1":
        return True
    expr = (config.getoption("markexpr", "") or "").replace("(", " ").replace(")", " ").split()
    return any(tok == "aiter" and (i == 0 or expr[i - 1] != "not") for i, tok in enumerate(expr))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _requested(config):
        return
    skip = pytest.mark.skip(reason=_HOW)
    for item in items:
        if item.get_closest_marker("aiter") is not None:
            item.add_marker(skip)
