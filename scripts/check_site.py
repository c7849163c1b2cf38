#!/usr/bin/env python3
"""Browser check of the published site: ``mla-fp8-bench publish --offline`` of the committed results/ into a
temporary folder, served on 127.0.0.1, opened in headless Debian chromium with every other host
unreachable. The first page must draw the GPU machine's kernel latency graph: flot's canvas and axis labels
in the page, none of asv's "No data" or load-failure messages, coloured series pixels in a screenshot.

Exit status: 0 passed, 1 failed, 77 skipped (no chromium, or the pinned CDN copies are not installed:
``mla-fp8-bench publish --install-assets``). Usage: ``python scripts/check_site.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mla_fp8_bench.report.publish import asset_problems, publish_site  # noqa: E402 - this checkout's package

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--hide-scrollbars", "--virtual-time-budget=15000",
         # no host name but 127.0.0.1 resolves, and anything proxied goes to a closed port
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--proxy-server=http://127.0.0.1:9",
         "--proxy-bypass-list=127.0.0.1")


def skip_reason() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"no chromium at {CHROMIUM} (apt-get install -y chromium)"
    if asset_problems():
        return "the pinned CDN copies are not installed (mla-fp8-bench publish --install-assets)"
    return None


@contextlib.contextmanager
def served(html: Path):
    """Serve ``html`` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(html))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()


def chromium(url: str, out: Path, *args: str) -> str:
    p = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={out / 'profile'}", *args, url], capture_output=True,
                       text=True, timeout=120)
    return p.stdout


def coloured_pixels(png: Path) -> int:
    """Saturated pixels (flot's series colours; asv's page is grey and blue-grey) inside the plot area."""
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))[..., :3]
    h, w = img.shape[:2]
    crop = img[int(0.12 * h):int(0.9 * h), int(0.16 * w):int(0.98 * w)]
    return int(((crop.max(axis=-1) - crop.min(axis=-1)) > 0.35).sum())


def check(out: Path) -> dict[str, object]:
    """Publish into ``out/html``, look at its first page; returns each check's outcome."""
    html = publish_site(ROOT / "asv.conf.json", html_dir=out / "html", offline=True)[0]
    with served(html) as base:
        dom = chromium(f"{base}/index.html", out, "--dump-dom")
        chromium(f"{base}/index.html", out, "--window-size=1400,900", f"--screenshot={out / 'first-page.png'}")
    legend = re.findall(r'legendLabel">([^<]*)<', dom)
    machines = {m: a for a, m in re.findall(r'class="btn btn-default btn-xs( active)?"[^>]*>(h200|cpu-2core)<', dom)}
    on_h200 = machines == {"h200": " active", "cpu-2core": ""}
    return {"opens on h200's latency graph": "track_latency" in dom and on_h200,
            "legend: backends, none emulated": bool(legend) and all(
                s.startswith("backend-") and "emulated" not in s for s in legend),
            "flot canvas and axis labels": "flot-base" in dom and "flot-tick-label" in dom,
            "no 'No data' or load failure": not any(s in dom for s in ("No data for this combination",
                                                                         "continental origin of swallow")),
            "series pixels": coloured_pixels(out / "first-page.png") > 200}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for the site and the screenshot (default: a new temporary one)")
    args = ap.parse_args()
    if reason := skip_reason():
        print(f"site check skipped: {reason}")
        return 77
    out = args.out or Path(tempfile.mkdtemp(prefix="mla-site-"))
    checks = check(out)
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"screenshot: {out / 'first-page.png'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
