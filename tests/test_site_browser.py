"""The published site's first page, looked at in headless chromium with the network blocked
(scripts/check_site.py); skips with the reason without chromium or the pinned CDN copies."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_site", ROOT / "scripts" / "check_site.py")
check_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_site)


def test_first_page_draws_the_h200_kernel_latency_graph(tmp_path):
    if reason := check_site.skip_reason():
        pytest.skip(reason)
    checks = check_site.check(tmp_path)
    assert all(checks.values()), checks
