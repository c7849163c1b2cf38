"""The real-vLLM tier runs only when asked for: ``-m vllm`` (a marker expression selecting ``vllm``) or
``MLA_FP8_BENCH_VLLM_TIER=1``. Otherwise every test marked ``vllm`` is skipped, so a plain ``pytest``
never starts the (slow, environment-dependent) tier."""

from __future__ import annotations

import os

import pytest

_HOW = ("real-vLLM tier not requested: run `bash scripts/vllm_envs.sh && python -m pytest -m vllm tests/vllm_tier` "
        "(or set MLA_FP8_BENCH_VLLM_TIER=1)")


def _requested(config: pytest.Config) -> bool:
    if os.environ.get("MLA_FP8_BENCH_VLLM_TIER") == "1":
        return True
    expr = (config.getoption("markexpr", "") or "").replace("(", " ").replace(")", " ").split()
    # selected when "vllm" appears and is not negated ("not vllm")
    return any(tok == "vllm" and (i == 0 or expr[i - 1] != "not") for i, tok in enumerate(expr))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _requested(config):
        return
    skip = pytest.mark.skip(reason=_HOW)
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
