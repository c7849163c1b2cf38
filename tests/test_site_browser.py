"""The published asv site, looked at in headless chromium (scripts/check_site.py).

Skips, with the reason, when ``/usr/bin/chromium`` is missing (``apt-get install -y chromium``) or
the local copies of asv's CDN scripts cannot be had (``npm install`` into the cache; the machines
have no internet, and asv 0.6.6's pages load jQuery/flot/bootstrap from CDNs).
Screenshots go to ``$MLA_FP8_BENCH_ARTIFACTS`` (default ``artifacts/``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_check_site():
    spec = importlib.util.spec_from_file_location("check_site", ROOT / "scripts" / "check_site.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cs = _load_check_site()


@pytest.fixture(scope="module")
def report():
    if not (os.path.isfile(cs.CHROMIUM) and os.access(cs.CHROMIUM, os.X_OK)):
        pytest.skip(f"chromium not found at {cs.CHROMIUM}: apt-get update && apt-get install -y chromium")
    if cs.vendor_missing() and shutil.which("npm") is None:
        pytest.skip(f"no local copies of asv's CDN scripts under {cs.DEFAULT_VENDOR} and no npm to fetch them")
    try:
        rep = cs.run_check(fetch=True)
    except cs.SiteCheckError as exc:
        if "npm install" in str(exc):
            pytest.skip(f"cannot fetch the local JS copies: {exc}")
        raise
    if rep.get("ok") is None:
        pytest.skip(rep["skipped"])
    return rep


def test_benchmark_list_shows_our_classes(report):
    c = report["checks"]["benchmark list names our classes"]
    assert c["found"] == {"MLAPrefill": True, "AiterPlan": True}, c
    assert "MLAPrefill.track_latency" in c["tracks_listed"]


@pytest.mark.parametrize("key", ["latency", "max-abs-error"])
def test_graph_renders_with_data(report, key):
    data = report["checks"][f"graph data {key}"]
    assert data["ok"], data  # asv wrote the graph JSON with finite values
    page = report["checks"][f"graph page {key}"]
    assert page["flot canvas"] and page["axis tick labels"], page
    assert page["no 'No data' message"] and page["no error banner"], page
    assert page["coloured_pixels"] > 200, page  # series drawn on the canvas
    shot = Path(report["artifacts"][f"site-{key}.png"])
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_every_cdn_script_has_a_local_copy(report):
    urls = [v["url"] for v in report["vendored"]]
    assert any("jquery" in u for u in urls) and any("flot" in u for u in urls)
    verified = [v for v in report["vendored"] if v["integrity"].startswith("verified")]
    assert verified, "no local copy matched its page's integrity hash"
