"""The site ``mla-fp8-bench publish`` writes, looked at in headless chromium with the network blocked
(scripts/check_site.py drives the browser).

Skips, with the reason, when ``/usr/bin/chromium`` is missing (``apt-get install -y chromium``) or the
pinned local copies of asv's CDN scripts are not installed (``mla-fp8-bench publish --install-assets``;
tests never run npm). Everything is written under pytest's temporary directories.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main
from mla_fp8_bench.report import publish as pub

ROOT = Path(__file__).resolve().parents[1]


def _load_check_site():
    spec = importlib.util.spec_from_file_location("check_site", ROOT / "scripts" / "check_site.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cs = _load_check_site()
ASSETS = pub.assets_dir()  # resolved now: a test that points HOME elsewhere must not hide the cache


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not (os.path.isfile(cs.CHROMIUM) and os.access(cs.CHROMIUM, os.X_OK)):
        pytest.skip(f"chromium not found at {cs.CHROMIUM}: apt-get update && apt-get install -y chromium")
    problems = pub.asset_problems(ASSETS)
    if problems:
        pytest.skip(pub.missing_assets_message(ASSETS, problems))
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the synthetic results need the repository's git history")
    work = tmp_path_factory.mktemp("site")
    results, html, art = work / "results", work / "html", work / "artifacts"
    art.mkdir()
    cs.make_synthetic_results(results)
    report = pub.publish_site(ROOT / "asv.conf.json", results_dir=results, html_dir=html, assets=ASSETS)
    checks: dict = {}
    with cs.serve(html) as base:
        checks.update(cs.page_checks(base, html, art, cs.CHROMIUM, work / "profile"))
        # control: asv's own page (CDN scripts) in the same blocked browser shows asv's load-failure message
        raw = html / "cdn-index.html"
        www = Path(__import__("asv").__file__).parent / "www" / "index.html"
        raw.write_text(www.read_text())
        checks["cdn page dom"] = cs.dump_dom(f"{base}/cdn-index.html", cs.CHROMIUM, work / "profile")
        raw.unlink()
    return {"html": html, "checks": checks, "work": work, "report": report}


_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']?(?:https?:)?//", re.I)
_REMOTE_CSS = re.compile(r"<link\b[^>]*\bhref=[\"']?(?:https?:)?//[^>]*>", re.I)


def test_published_site_references_no_remote_script_or_stylesheet(site):
    pages = list(site["html"].rglob("*.html"))
    assert pages
    for page in pages:
        text = page.read_text()
        assert not _REMOTE_SCRIPT.search(text), page
        assert not [t for t in _REMOTE_CSS.findall(text) if "stylesheet" in t.lower()], page
    idx = (site["html"] / "index.html").read_text()
    for rel in ("jquery/dist/jquery.min.js", "flot/jquery.flot.js", "bootstrap/dist/css/bootstrap.min.css"):
        assert f'"_assets/{rel}"' in idx and (site["html"] / "_assets" / rel).is_file()
    assert (site["html"] / "_assets/bootstrap/dist/fonts/glyphicons-halflings-regular.woff").is_file()
    assert pub.remote_references(site["html"]) == []


def test_benchmark_list_shows_our_classes(site):
    c = site["checks"]["benchmark list names our classes"]
    assert c["found"] == {"MLAPrefill": True, "AiterPlan": True}, c
    assert "MLAPrefill.track_latency" in c["tracks_listed"]


@pytest.mark.parametrize("key", ["latency", "max-abs-error"])
def test_graph_draws_points_with_the_network_blocked(site, key):
    page = site["checks"][f"graph page {key}"]
    assert page["flot canvas"] and page["axis tick labels"], page
    assert page["no 'No data' message"] and page["no error banner"], page
    assert page["coloured_pixels"] > 200, page  # series drawn on the canvas
    assert Path(page["screenshot"]).is_file() and str(site["work"]) in page["screenshot"]


def test_every_cdn_script_has_a_local_copy(site):
    urls = [v["url"] for v in site["report"].vendored]
    assert any("jquery" in u for u in urls) and any("flot" in u for u in urls)
    assert len(urls) == len(pub.ASSETS)  # every CDN tag of asv 0.6.6's index.html
    verified = [v for v in site["report"].vendored if v["integrity"].startswith("verified")]
    assert verified, "no local copy matched its page's integrity hash"


def test_the_block_is_real_asv_cdn_page_fails_to_load(site):
    dom = site["checks"]["cdn page dom"]
    assert "continental origin of swallow" in dom  # asv's js_load_failure(): the CDN scripts did not load


def test_publish_without_assets_names_the_one_command(tmp_path, capsys):
    rc = main(["publish", "--results-dir", str(ROOT / "results"), "--html-dir", str(tmp_path / "html"),
               "--assets", str(tmp_path / "no-assets")])
    assert rc == 2
    out = "".join(capsys.readouterr().out.split())
    assert f"`mla-fp8-benchpublish--install-assets--assets{tmp_path / 'no-assets'}`" in out  # console wraps
    assert "jquery/dist/jquery.min.jsmissing" in out and not (tmp_path / "html").exists()
