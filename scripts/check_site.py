#!/usr/bin/env python3
"""Browser check of the published asv site: build it, serve it, look at it with headless chromium.

Steps:

1. ``asv publish`` into a temporary html directory, from the repository's ``results/`` when it holds
   result files, else from a synthetic results fixture (``--synthetic`` forces it): one machine,
   the repository's last two commits, plausible values for three backends on the CPU sweep and NaN
   (= skipped) elsewhere. The asv config is the repository's with absolute paths and the temporary
   directories substituted (the repository's own ``html/`` and ``.asv/`` are not touched).
2. The JavaScript/CSS that asv 0.6.6's ``index.html`` loads from CDNs (jQuery 3.3.1, flot 0.8.3 and
   plugins, flot-orderbars, stupidtable, blueimp-md5, bootstrap 3.1.1) is replaced by local copies
   (``npm install`` of the same versions into a cache, ``--fetch-vendor``), because this machine and
   the GPU runners have no internet: without it the page shows asv's "Can not determine continental
   origin of swallow" error. Where the local file's hash equals the page's ``integrity`` value the
   attribute is kept (so the browser verifies it is the very file the CDN serves); otherwise
   (stupidtable: 1.0.1 is not on npm, 1.1.3 is used) it is dropped and the report says so.
3. ``python -m http.server`` on 127.0.0.1 and a free port, serving that directory.
4. Debian's ``/usr/bin/chromium``, headless (``--dump-dom`` and ``--screenshot`` with
   ``--virtual-time-budget``, a fresh ``--user-data-dir``; no playwright), checks:

   * the benchmark list (``#/summarylist``) names our classes ``MLAPrefill`` and ``AiterPlan``;
   * the graph pages of ``MLAPrefill.track_latency`` and ``MLAPrefill.track_max_abs_error`` render:
     flot's canvas and its axis tick labels are in the DOM, asv's "No data for this combination"
     and its error banner are not, and the screenshot has coloured series pixels inside the plot
     (flot draws series on a canvas, so data points are checked in the pixels);
   * the graph data files asv wrote (``graphs/.../<benchmark>.json``) hold finite values.

5. Screenshots go to ``$MLA_FP8_BENCH_ARTIFACTS`` (default ``artifacts/``): ``site-index.png``,
   ``site-summarylist.png``, ``site-latency.png``, ``site-max-abs-error.png``; a JSON report
   ``site-check.json`` next to them.

Exit status: 0 all checks passed, 1 a check failed, 77 chromium or the local JS copies are missing
(the test skips then, with the reason).

Usage::

    python scripts/check_site.py [--synthetic] [--fetch-vendor] [--vendor DIR] [--keep] [--artifacts DIR]
                                 [--chromium PATH]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.client
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
EXIT_NO_CHROMIUM = 77
BENCH_MODULE = "bench_mla_prefill"
CLASSES = ("MLAPrefill", "AiterPlan")
GRAPH_BENCHMARKS = {
    "latency": f"{BENCH_MODULE}.MLAPrefill.track_latency",
    "max-abs-error": f"{BENCH_MODULE}.MLAPrefill.track_max_abs_error",
}
#: Where the local copies of asv's CDN scripts live (a node_modules directory).
DEFAULT_VENDOR = Path(os.environ.get("MLA_FP8_BENCH_SITE_VENDOR")
                      or Path.home() / ".cache" / "mla-fp8-bench" / "site-vendor") / "node_modules"
#: npm packages with the versions asv 0.6.6's index.html pins on its CDNs.
VENDOR_PACKAGES = ("jquery@3.3.1", "flot@0.8.3", "flot-orderbars@1.0.0", "stupid-table-plugin@1.1.3",
                   "blueimp-md5@2.19.0", "bootstrap@3.1.1")
#: CDN URL (regex on the URL) -> file under node_modules; extra directories copied along (fonts).
VENDOR_MAP = (
    (r"code\.jquery\.com/jquery-3\.3\.1\.min\.js$", "jquery/dist/jquery.min.js"),
    (r"/flot/0\.8\.3/jquery\.flot\.min\.js$", "flot/jquery.flot.js"),
    (r"/flot/0\.8\.3/jquery\.flot\.time\.min\.js$", "flot/jquery.flot.time.js"),
    (r"/flot/0\.8\.3/jquery\.flot\.selection\.min\.js$", "flot/jquery.flot.selection.js"),
    (r"/flot/0\.8\.3/jquery\.flot\.categories\.min\.js$", "flot/jquery.flot.categories.js"),
    (r"flot-orderbars@1\.0\.0/js/jquery\.flot\.orderBars\.js$", "flot-orderbars/js/jquery.flot.orderBars.js"),
    (r"/stupidtable/1\.0\.1/stupidtable\.min\.js$", "stupid-table-plugin/stupidtable.min.js"),
    (r"/blueimp-md5/2\.19\.0/js/md5\.min\.js$", "blueimp-md5/js/md5.min.js"),
    (r"bootstrap@3\.1\.1/dist/js/bootstrap\.min\.js$", "bootstrap/dist/js/bootstrap.min.js"),
    (r"bootstrap@3\.1\.1/dist/css/bootstrap\.min\.css$", "bootstrap/dist/css/bootstrap.min.css"),
)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio")


class SiteCheckError(RuntimeError):
    """A step failed (publish, server, chromium); the message says which and why."""


# ------------------------------------------------------------------------------------- asv config
def load_asv_config(path: Path) -> dict[str, Any]:
    """The repository's asv.conf.json (JSONC) as a dict, via asv's own loader."""
    from asv import util

    return util.load_json(str(path), js_comments=True)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def has_results(results_dir: Path) -> bool:
    """True when ``results_dir`` has at least one machine directory with a result file."""
    if not results_dir.is_dir():
        return False
    for m in results_dir.iterdir():
        if m.is_dir() and (m / "machine.json").is_file():
            if any(p.name != "machine.json" and p.suffix == ".json" for p in m.iterdir()):
                return True
    return False


# ------------------------------------------------------------------------------------- synthetic fixture
def make_synthetic_results(dest: Path, branch: str = "main") -> dict[str, Any]:
    """Write an asv 0.6 results tree into ``dest``: machine ``synthetic-cpu``, the branch's last two
    commits, ``MLAPrefill`` latency/accuracy tracks and ``AiterPlan`` planner time, values for
    aiter-emulated / torch-sdpa-bf16 / torch-fp8-ref on s128..s2048 and NaN (skipped) elsewhere."""
    sys.path.insert(0, str(ROOT))
    from mla_fp8_bench.harness.asv_support import ASV_BACKENDS, ASV_CASES, PLAN_BACKENDS

    commits = _git("rev-list", "--max-count=2", branch).split()
    machine = {"arch": "x86_64", "cpu": "synthetic 2-core", "gpu": "none", "machine": "synthetic-cpu",
               "num_cpu": "2", "os": "Linux", "ram": "24GB", "version": 1}
    (dest / "synthetic-cpu").mkdir(parents=True, exist_ok=True)
    (dest / "synthetic-cpu" / "machine.json").write_text(json.dumps(machine, indent=4))
    measured = {"aiter-emulated": 3.0e-6, "torch-sdpa-bf16": 9.0e-7, "torch-fp8-ref": 6.0e-7}
    err = {"aiter-emulated": 0.05, "torch-sdpa-bf16": 0.18, "torch-fp8-ref": 0.0075}
    cases = [c for c in ASV_CASES if re.fullmatch(r"s\d+", c)]

    def seq(c: str) -> int:
        return int(c[1:]) if re.fullmatch(r"s\d+", c) else 0

    def grid(backends, fn):
        return [fn(b, c) if (b in measured and c in cases and seq(c) <= 2048) else float("nan")
                for b in backends for c in ASV_CASES]

    benches = {
        "MLAPrefill.track_latency": (ASV_BACKENDS, "seconds", lambda b, c: measured[b] * seq(c) ** 1.6),
        "MLAPrefill.track_max_abs_error": (ASV_BACKENDS, "max_abs_err",
                                           lambda b, c: err[b] * (1 + 0.1 * math.log2(seq(c) / 128))),
        "MLAPrefill.track_max_abs_error_bf16_ref": (ASV_BACKENDS, "max_abs_err", lambda b, c: 0.17),
        "AiterPlan.track_planner_time": (PLAN_BACKENDS, "seconds", lambda b, c: 4e-4 + 1e-7 * seq(c)),
    }
    bench_json: dict[str, Any] = {"version": 2}
    for short, (backends, unit, _fn) in benches.items():
        name = f"{BENCH_MODULE}.{short}"
        bench_json[name] = {
            "code": f"# synthetic fixture for {name}", "name": name, "param_names": ["backend", "case"],
            "params": [[repr(b) for b in backends], [repr(c) for c in ASV_CASES]], "timeout": 3600,
            "type": "track", "unit": unit, "version": "synthetic-v1",
        }
    (dest / "benchmarks.json").write_text(json.dumps(bench_json, indent=4))
    cols = ["result", "params", "version", "started_at", "duration"]
    for i, sha in enumerate(reversed(commits)):
        results = {}
        for short, (backends, _unit, fn) in benches.items():
            drift = 1.0 + 0.05 * i
            vals = [v * drift if not math.isnan(v) else v for v in grid(backends, fn)]
            results[f"{BENCH_MODULE}.{short}"] = [vals, [[repr(b) for b in backends], [repr(c) for c in ASV_CASES]],
                                                  "synthetic-v1", 1_700_000_000_000 + i, 1.0]
        data = {"commit_hash": sha, "env_name": "existing-py_synthetic", "date": int(_git("log", "-1", "--format=%ct",
                                                                                          sha)) * 1000,
                "params": {"arch": "x86_64", "cpu": "synthetic 2-core", "gpu": "none", "machine": "synthetic-cpu",
                           "num_cpu": "2", "os": "Linux", "ram": "24GB", "python": "3.11"},
                "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": cols, "results": results,
                "durations": {}, "version": 2}
        (dest / "synthetic-cpu" / f"{sha[:8]}-existing-py_synthetic.json").write_text(json.dumps(data))
    return {"machine": "synthetic-cpu", "commits": commits}


# ------------------------------------------------------------------------------------- offline JS
def fetch_vendor(vendor: Path = DEFAULT_VENDOR) -> None:
    """``npm install`` the pinned packages into ``vendor``'s parent (a few hundred kB; npm's cache)."""
    npm = shutil.which("npm")
    if npm is None:
        raise SiteCheckError("npm is not installed: cannot fetch local copies of asv's CDN scripts")
    vendor.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(vendor.parent),
                        *VENDOR_PACKAGES], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SiteCheckError(f"npm install of {' '.join(VENDOR_PACKAGES)} failed: {(p.stderr or p.stdout)[-800:]}")


def vendor_missing(vendor: Path = DEFAULT_VENDOR) -> list[str]:
    return [rel for _pat, rel in VENDOR_MAP if not (vendor / rel).is_file()]


def _sri_matches(data: bytes, integrity: str) -> bool:
    for tok in integrity.split():
        algo, _, want = tok.partition("-")
        if algo in ("sha256", "sha384", "sha512"):
            if base64.b64encode(hashlib.new(algo, data).digest()).decode() == want:
                return True
    return False


def vendorize(html: Path, vendor: Path = DEFAULT_VENDOR) -> list[dict[str, Any]]:
    """Point every CDN ``<script src>`` / ``<link href>`` of the published pages at a local copy under
    ``html/_vendor/``; keep ``integrity`` where the copy matches it.

    Raises:
        SiteCheckError: an external URL with no local copy (asv changed its pins: update VENDOR_MAP).
    """
    out: list[dict[str, Any]] = []
    tag_re = re.compile(r"<(script|link)\b[^>]*?\b(src|href)=\"(https?://[^\"]+)\"[^>]*>", re.S)
    for page in sorted(html.glob("*.html")):
        text = page.read_text()

        def repl(m: re.Match) -> str:
            tag, url = m.group(0), m.group(3)
            for pat, rel in VENDOR_MAP:
                if re.search(pat, url):
                    break
            else:
                raise SiteCheckError(f"{page.name} loads {url} and no local copy is mapped for it (VENDOR_MAP)")
            src = vendor / rel
            dst = html / "_vendor" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            if rel.startswith("bootstrap/dist/css/"):
                shutil.copytree(vendor / "bootstrap/dist/fonts", html / "_vendor/bootstrap/dist/fonts",
                                dirs_exist_ok=True)
            integ = re.search(r'\bintegrity="([^"]+)"', tag)
            entry = {"page": page.name, "url": url, "local": f"_vendor/{rel}", "integrity": "none on the page"}
            new = tag.replace(url, f"_vendor/{rel}")
            if integ:
                if _sri_matches(dst.read_bytes(), integ.group(1)):
                    entry["integrity"] = "verified: the local copy is the CDN's file"
                else:
                    entry["integrity"] = "differs from the CDN's file (attribute dropped)"
                    new = new.replace(integ.group(0), "")
            out.append(entry)
            return new

        new_text = tag_re.sub(repl, text)
        if new_text != text:
            page.write_text(new_text)
    return out


# ------------------------------------------------------------------------------------- publish + serve
def publish(results_dir: Path, html_dir: Path, work: Path) -> dict[str, Any]:
    """``asv publish`` of ``results_dir`` into ``html_dir`` with a temporary copy of the config."""
    conf = load_asv_config(ROOT / "asv.conf.json")
    conf.update(repo=str(ROOT), results_dir=str(results_dir), html_dir=str(html_dir),
                env_dir=str(work / "env"), benchmark_dir=str(ROOT / conf.get("benchmark_dir", "benchmarks")))
    cfg = work / "asv.conf.json"
    cfg.write_text(json.dumps(conf, indent=2))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "asv", "publish", "--config", str(cfg)], cwd=work,
                          capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not (html_dir / "index.html").is_file():
        raise SiteCheckError(f"asv publish failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-1500:]}")
    return {"wall_s": round(wall, 2), "log_tail": (proc.stdout + proc.stderr)[-800:]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(directory: Path):
    """Serve ``directory`` with ``python -m http.server`` on 127.0.0.1; yields the base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/index.html")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SiteCheckError(f"http.server on port {port} did not come up")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------------------------- chromium
def chromium(args: list[str], exe: str, profile: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run headless chromium with the workplace's flags and a fresh profile directory."""
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise SiteCheckError(f"chromium timed out after {timeout}s: {' '.join(cmd[-3:])}") from exc


def dump_dom(url: str, exe: str, profile: Path, budget_ms: int = 15000) -> str:
    p = chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], exe, profile)
    if p.returncode != 0 or "<html" not in p.stdout:
        raise SiteCheckError(f"chromium --dump-dom {url} failed (exit {p.returncode}): {p.stderr[-600:]}")
    return p.stdout


def screenshot(url: str, out: Path, exe: str, profile: Path, size: str = "1400,900", budget_ms: int = 15000) -> None:
    p = chromium([f"--virtual-time-budget={budget_ms}", f"--window-size={size}", f"--screenshot={out}", url],
                 exe, profile)
    if not out.is_file():
        raise SiteCheckError(f"chromium --screenshot {url} wrote nothing (exit {p.returncode}): {p.stderr[-600:]}")


def coloured_pixels(png: Path, box: tuple[float, float, float, float] = (0.16, 0.12, 0.98, 0.9)) -> int:
    """Strongly coloured (saturated, not grey/black/white) pixels inside ``box`` (fractions of the
    image: left, top, right, bottom) - flot's series colours; the asv chrome is grey and blue-grey."""
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))[..., :3]
    h, w = img.shape[:2]
    x0, y0, x1, y1 = int(box[0] * w), int(box[1] * h), int(box[2] * w), int(box[3] * h)
    crop = img[y0:y1, x0:x1]
    sat = crop.max(axis=-1) - crop.min(axis=-1)
    return int((sat > 0.35).sum())


def graph_url(base: str, bench: str, params: dict[str, str] | None = None) -> str:
    q = "&".join(f"{k}={v}" for k, v in (params or {}).items())
    return f"{base}/index.html#{bench}" + (f"?{q}" if q else "")


def graph_files(html: Path, bench: str) -> list[Path]:
    return sorted(html.glob(f"graphs/**/{bench}.json"))


def graph_points(path: Path) -> tuple[int, int]:
    """(finite values, all values) in one asv graph data file: ``[[date_or_rev, value|[values]|null], ...]``."""
    data = json.loads(path.read_text())
    fin = tot = 0
    for row in data:
        vals = row[1] if isinstance(row, list) and len(row) > 1 else None
        for v in (vals if isinstance(vals, list) else [vals]):
            tot += 1
            fin += isinstance(v, (int, float)) and math.isfinite(v)
    return fin, tot


# ------------------------------------------------------------------------------------- the check
def run_check(*, synthetic: bool = False, artifacts: Path | None = None, exe: str = CHROMIUM,
              keep: bool = False, vendor: Path = DEFAULT_VENDOR, fetch: bool = False) -> dict[str, Any]:
    """Build, serve and inspect the site; returns the report (``report["ok"]``: True/False, or None
    with ``report["skipped"]`` when chromium or the local JS copies are missing)."""
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return {"ok": None, "skipped": f"chromium not found at {exe} (apt-get install -y chromium)"}
    if vendor_missing(vendor) and fetch:
        fetch_vendor(vendor)
    if vendor_missing(vendor):
        return {"ok": None, "skipped": f"local copies of asv's CDN scripts are missing under {vendor} "
                f"({', '.join(vendor_missing(vendor)[:3])}...): run with --fetch-vendor (npm install "
                f"{' '.join(VENDOR_PACKAGES)})"}
    artifacts = Path(artifacts or os.environ.get("MLA_FP8_BENCH_ARTIFACTS") or ROOT / "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mla-site-"))
    report: dict[str, Any] = {"checks": {}, "artifacts": {}, "work_dir": str(work)}
    checks = report["checks"]
    try:
        results = ROOT / "results"
        if synthetic or not has_results(results):
            results = work / "results"
            report["fixture"] = make_synthetic_results(results)
            report["source"] = "synthetic results fixture" + ("" if synthetic else " (the repository's results/ is empty)")
        else:
            report["source"] = f"repository results ({results})"
        html = work / "html"
        report["publish"] = publish(results, html, work)
        report["vendored"] = vendorize(html, vendor)
        # data files behind the graphs
        for key, bench in GRAPH_BENCHMARKS.items():
            files = graph_files(html, bench)
            pts = [graph_points(f) for f in files]
            fin = sum(p[0] for p in pts)
            checks[f"graph data {key}"] = {"ok": bool(files) and fin > 0, "files": len(files), "finite_values": fin,
                                           "values": sum(p[1] for p in pts)}
        profile = work / "chromium-profile"
        with serve(html) as base:
            report["url"] = base
            dom = dump_dom(f"{base}/index.html#/summarylist", exe, profile)
            found = {c: (c in dom) for c in CLASSES}
            checks["benchmark list names our classes"] = {"ok": all(found.values()), "found": found,
                                                          "tracks_listed": sorted(set(re.findall(
                                                              r"(?:MLAPrefill|AiterPlan)\.track_\w+", dom)))}
            for name, url in (("site-index.png", f"{base}/index.html"),
                              ("site-summarylist.png", f"{base}/index.html#/summarylist")):
                screenshot(url, artifacts / name, exe, profile)
                report["artifacts"][name] = str(artifacts / name)
            for key, bench in GRAPH_BENCHMARKS.items():
                url = graph_url(base, bench)
                dom = dump_dom(url, exe, profile)
                shot = artifacts / f"site-{key}.png"
                screenshot(url, shot, exe, profile)
                report["artifacts"][shot.name] = str(shot)
                px = coloured_pixels(shot)
                c = {
                    "flot canvas": "flot-base" in dom or "<canvas" in dom,
                    "axis tick labels": "flot-tick-label" in dom or "tickLabel" in dom,
                    "no 'No data' message": "No data for this combination" not in dom,
                    "no error banner": "Error loading" not in dom and "failed to load" not in dom.lower(),
                    "series pixels in plot": px > 200,
                }
                ticks = re.findall(r'class="flot-tick-label[^"]*"[^>]*>([^<]*)<', dom)
                checks[f"graph page {key}"] = {"ok": all(c.values()), **c, "coloured_pixels": px,
                                               "tick_labels": ticks[:20], "url": url}
        report["ok"] = all(v["ok"] for v in checks.values())
    finally:
        (artifacts / "site-check.json").write_text(json.dumps(report, indent=1, default=str))
        report["artifacts"]["site-check.json"] = str(artifacts / "site-check.json")
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="use the synthetic results fixture even if results/ has data")
    ap.add_argument("--artifacts", type=Path, default=None, help="screenshot directory (default $MLA_FP8_BENCH_ARTIFACTS "
                    "or artifacts/)")
    ap.add_argument("--chromium", default=CHROMIUM, help="chromium executable (default /usr/bin/chromium)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary html directory")
    ap.add_argument("--vendor", type=Path, default=DEFAULT_VENDOR,
                    help=f"node_modules with the local JS copies (default {DEFAULT_VENDOR})")
    ap.add_argument("--fetch-vendor", action="store_true", help="npm install the local JS copies if missing")
    args = ap.parse_args(argv)
    try:
        rep = run_check(synthetic=args.synthetic, artifacts=args.artifacts, exe=args.chromium, keep=args.keep,
                        vendor=args.vendor, fetch=args.fetch_vendor)
    except (SiteCheckError, subprocess.SubprocessError, OSError) as exc:
        print(f"site check error: {exc}", file=sys.stderr)
        return 1
    if rep.get("ok") is None:
        print(f"site check skipped: {rep['skipped']}")
        return EXIT_NO_CHROMIUM
    for name, c in rep["checks"].items():
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {name}: " + ", ".join(f"{k}={v}" for k, v in c.items()
                                                                     if k not in ("ok", "url", "tick_labels")))
    print(f"source: {rep['source']}")
    for v in rep.get("vendored", []):
        print(f"local copy {v['local']} for {v['url']}: integrity {v['integrity']}")
    for n, p in rep["artifacts"].items():
        print(f"artifact {n}: {p}")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
